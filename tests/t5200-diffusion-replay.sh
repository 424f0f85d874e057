#!/usr/bin/env bash
# hi3 replay of a trajectory (hi3-batching(7), IMAGES AND DIFFUSION): the
# stateless recomputation of every SDE step reproduces the captured
# log-probs (<= 1e-5; 0 on the batch-invariant CPU backend) for every
# latent dtype and with KV reuse at capture; an altered latent shows the
# gap at exactly its request and step; and the bad inputs replay refuses.
. "$SRCDIR/tests/lib.sh"
J() { "$BUILDDIR/tests/test-tools" json "$@"; }
T() { "$BUILDDIR/tests/test-tools" "$@"; }

test_expect_success 'setup: a tiny model and two gen_image requests' '
	make_model tiny tiny &&
	printf "%s\n" \
		"{\"prompt\": \"a red fox\", \"mode\": \"gen_image\", \"image_size\": \"32x48\", \"seed\": 7}" \
		"{\"prompt\": \"two cats asleep on a warm mat by the fire\", \"mode\": \"gen_image\", \"image_size\": \"32x48\", \"seed\": 9}" >req.jsonl &&
	hi3 -q -m tiny tokenize-concat --exact-size req.jsonl -o c.st
'

for dt in f32 bf16 f16; do
	test_expect_success "replay reproduces the captured SDE log-probs (latents $dt, a window 1,2,4 of 6 steps)" "
		hi3 -q -m tiny diffusion-capture --steps 6 --sampler sde --sde-steps 1,2,4 --eta 0.8 --latent-dtype $dt \
			c.st -o s.st &&
		hi3 -q -m tiny replay --threshold 1e-5 c.st s.st -o r.st >rep.json &&
		test \"\$(J mode <rep.json)\" = diffusion &&
		test \"\$(J overall/sde_steps <rep.json)\" = 6 &&
		test \"\$(J overall/max_abs_dlogp <rep.json)\" = 0.0 &&
		test \"\$(J rows/1/sde_steps <rep.json)\" = 3 &&
		hi3 inspect r.st | grep -q 'sde_logp *F32 *(2, 3)' &&
		hi3 diff --atol 0 --tensor sde_logp --tensor sde_steps s.st r.st
	"
done

test_expect_success 'guidance in fp16 (a trainer casting first) is replayed as captured' '
	hi3 -q -m tiny diffusion-capture --steps 4 --sampler sde --cfg-dtype f16 --latent-dtype f16 c.st -o s16.st &&
	hi3 -q -m tiny replay --threshold 1e-5 c.st s16.st -o r16.st >rep.json &&
	test "$(J overall/max_abs_dlogp <rep.json)" = 0.0
'

test_expect_success 'an altered x_{i+1} shows the gap at that request and step only' '
	hi3 -q -m tiny diffusion-capture --steps 6 --sampler sde --sde-steps 1,2,4 c.st -o s.st &&
	T poke s.st latents 1,3,0,0,0 5.0 &&
	test_must_fail 1 hi3 -q -m tiny replay --threshold 1e-5 c.st s.st -o r.st >rep.json &&
	test "$(J overall/worst_row <rep.json)" = 1 &&
	test "$(J overall/worst_step <rep.json)" = 2 &&
	test "$(J rows/0/max_abs_dlogp <rep.json)" = 0.0 &&
	hi3 diff --atol 0 --tensor sde_logp --row 0:0 s.st r.st &&
	test_must_fail 1 hi3 diff --atol 0 --tensor sde_logp --row 1:1 s.st r.st >d &&
	test_grep "sde_logp .*at row 1, sde step 1" d
'

test_expect_success 'an Euler trajectory has nothing to replay: an empty report' '
	hi3 -q -m tiny diffusion-capture --steps 3 c.st -o e.st &&
	hi3 -q -m tiny replay c.st e.st -o re.st >rep.json &&
	test "$(J overall/sde_steps <rep.json)" = 0
'

test_expect_success 'bad input: a trajectory of other conditions or another model (exit 3), nothing written' '
	head -n 1 req.jsonl >r0.jsonl &&
	hi3 -q -m tiny tokenize-concat --exact-size r0.jsonl -o c0.st &&
	hi3 -q -m tiny diffusion-capture --steps 3 --sampler sde c.st -o s.st &&
	echo keep >old.st &&
	test_must_fail 3 hi3 -m tiny replay c0.st s.st -o old.st 2>err &&
	test_grep "s.st: made from other conditions" err &&
	make_model tiny-moe moe &&
	hi3 -q -m moe tokenize-concat --exact-size req.jsonl -o cm.st &&
	test_must_fail 3 hi3 -m moe replay cm.st s.st -o old.st 2>err &&
	test_grep "s.st: made by model fingerprint" err &&
	test "$(cat old.st)" = keep
'

test_expect_success 'usage: the segment options are refused for a trajectory (exit 2)' '
	test_must_fail 2 hi3 -m tiny replay --batched c.st s.st -o x.st 2>err &&
	test_grep "only --threshold" err &&
	! test -e x.st
'

test_done
