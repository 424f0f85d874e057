#!/usr/bin/env bash
# The SDE kernels of diffusion-capture (hi3-diffusion-capture(1), SDE
# KERNELS: flow-grpo, cps, dance-grpo): recorded in the trajectory with eta
# and the reduction; a request gives the same trajectory batched and alone,
# bitwise, with every kernel (hi3-batching(7), rule 8); hi3 replay recomputes
# every kernel's log-probs exactly for every latent dtype; the capture of
# the reference fixtures' cases (tests/test-sde.c holds the kernels to the
# PyTorch reference) is reproduced from their noise; the defaults are
# unchanged; and the usage errors.
. "$SRCDIR/tests/lib.sh"
J() { "$BUILDDIR/tests/test-tools" json "$@"; }
FX=$FIXTURES/diffusion/sde

test_expect_success 'setup: a tiny model, two gen_image requests of other lengths, each alone' '
	make_model tiny tiny &&
	printf "%s\n" \
		"{\"prompt\": \"a red fox\", \"mode\": \"gen_image\", \"image_size\": \"32x48\", \"seed\": 7}" \
		"{\"prompt\": \"two cats asleep on a warm mat by the fire\", \"mode\": \"gen_image\", \"image_size\": \"32x48\", \"seed\": 9}" >req.jsonl &&
	hi3 -q -m tiny tokenize-concat --exact-size req.jsonl -o c.st &&
	head -n 1 req.jsonl >r0.jsonl && tail -n 1 req.jsonl >r1.jsonl &&
	hi3 -q -m tiny tokenize-concat --exact-size r0.jsonl -o c0.st &&
	hi3 -q -m tiny tokenize-concat --exact-size r1.jsonl -o c1.st
'

for k in flow-grpo cps dance-grpo; do
	test_expect_success "$k: recorded with its own eta; each request batched equals itself alone, bitwise" "
		hi3 -q -m tiny diffusion-capture --steps 5 --guidance 4.5 --sampler sde --sde-kernel $k --sde-steps 0,2,4 \
			c.st -o $k.st &&
		hi3 inspect --json $k.st >m.json &&
		test \"\$(J metadata/sde_kernel <m.json)\" = $k &&
		test \"\$(J metadata/logprob_reduce <m.json)\" = mean &&
		case $k in flow-grpo) e=1 ;; cps) e=0.69999999999999996 ;; dance-grpo) e=0.29999999999999999 ;; esac &&
		test \"\$(J metadata/eta <m.json)\" = \$e &&
		hi3 -q -m tiny diffusion-capture --steps 5 --guidance 4.5 --sampler sde --sde-kernel $k --sde-steps 0,2,4 \
			c0.st -o $k-0.st &&
		hi3 -q -m tiny diffusion-capture --steps 5 --guidance 4.5 --sampler sde --sde-kernel $k --sde-steps 0,2,4 \
			c1.st -o $k-1.st &&
		hi3 diff --atol 0 --row 0:0 --tensor latents --tensor sde_logp $k.st $k-0.st &&
		hi3 diff --atol 0 --row 1:0 --tensor latents --tensor sde_logp $k.st $k-1.st
	"
done

test_expect_success 'the kernels differ: the same noise gives other samples and log-probs' '
	test_must_fail 1 hi3 diff --atol 1e-3 --tensor latents flow-grpo.st cps.st >/dev/null &&
	test_must_fail 1 hi3 diff --atol 1e-3 --tensor latents flow-grpo.st dance-grpo.st >/dev/null &&
	test_must_fail 1 hi3 diff --atol 1e-3 --tensor sde_logp cps.st dance-grpo.st >/dev/null
'

for k in flow-grpo cps dance-grpo; do
	for dt in f32 bf16 f16; do
		test_expect_success "$k, latents $dt: replay recomputes the captured log-probs exactly (gap 0)" "
			hi3 -q -m tiny diffusion-capture --steps 5 --sampler sde --sde-kernel $k --sde-steps 1,2,4 \
				--latent-dtype $dt c.st -o s.st &&
			hi3 -q -m tiny replay --threshold 0 c.st s.st -o r.st >rep.json &&
			test \"\$(J sde_kernel <rep.json)\" = $k &&
			test \"\$(J overall/max_abs_dlogp <rep.json)\" = 0.0 &&
			hi3 diff --atol 0 --tensor sde_logp s.st r.st
		"
	done
done

test_expect_success '--logprob-reduce sum: the sum over the elements, recorded, replayed with gap 0' '
	hi3 -q -m tiny diffusion-capture --steps 5 --sampler sde --sde-kernel dance-grpo --sde-steps 1,2 c.st -o mean.st &&
	hi3 -q -m tiny diffusion-capture --steps 5 --sampler sde --sde-kernel dance-grpo --sde-steps 1,2 \
		--logprob-reduce sum c.st -o sum.st &&
	test "$(hi3 inspect --json sum.st | J metadata/logprob_reduce)" = sum &&
	hi3 diff --atol 0 --tensor latents mean.st sum.st &&
	hi3 inspect --tensor sde_logp mean.st | tail -n 2 | cut -d" " -f3- >m &&
	hi3 inspect --tensor sde_logp sum.st | tail -n 2 | cut -d" " -f3- >s &&
	paste -d" " m s | awk "{ for (i = 1; i <= 2; i++) { d = \$(i + 2) - 96 * \$i; if (d < 0) d = -d
		if (d > 1e-5 * (\$(i + 2) < 0 ? -\$(i + 2) : \$(i + 2))) exit 1 } }" &&
	hi3 -q -m tiny replay --threshold 0 c.st sum.st -o r.st >rep.json &&
	test "$(J logprob_reduce <rep.json)" = sum
'

# The fixtures are hi3's captures: their noise gives them again, within what
# a change of the tiny model's last bits moves an f32 trajectory (the bf16
# and f16 cases are left out: one element rounding the other way there is a
# whole ulp of bf16 that the later steps carry; test-sde holds their kernels
# bitwise to the stored samples, whatever made them).
test_expect_success 'the fixtures of tests/test-sde.c: their noise gives their trajectory again (<= 1e-5)' '
	hi3 -q -m tiny tokenize-concat --exact-size "$FX/requests.jsonl" -o cf.st &&
	for k in cps dance-grpo; do
		hi3 -q -m tiny diffusion-capture --steps 6 --guidance 4.5 --sampler sde --sde-steps 0,1,2,5 --sde-kernel $k \
			--capture-velocity --noise "$FX/$k-f32.traj" cf.st -o f.st &&
		hi3 diff --atol 1e-5 --tensor latents --tensor sde_logp --tensor velocity f.st "$FX/$k-f32.traj" || exit 1
	done
'

test_expect_success 'the default kernel is flow-grpo at eta 1: the same bits as --sde-kernel flow-grpo --eta 1' '
	hi3 -q -m tiny diffusion-capture --steps 4 --sampler sde c.st -o d.st &&
	hi3 -q -m tiny diffusion-capture --steps 4 --sampler sde --sde-kernel flow-grpo --eta 1 c.st -o e.st &&
	cmp d.st e.st &&
	hi3 -q -m tiny diffusion-capture --steps 4 c.st -o eu.st &&
	hi3 inspect --json eu.st >m.json &&
	test "$(J metadata/sde_kernel <m.json)" = "" && test "$(J metadata/ablate <m.json)" = ""
'

test_expect_success 'usage errors (exit 2): kernel options without the SDE, eta 0 where the std divides' '
	test_must_fail 2 hi3 -m tiny diffusion-capture --sde-kernel cps c.st -o x.st 2>err &&
	test_grep "sde-kernel needs --sampler sde" err &&
	test_must_fail 2 hi3 -m tiny diffusion-capture --logprob-reduce sum c.st -o x.st 2>err &&
	test_grep "logprob-reduce needs --sampler sde" err &&
	test_must_fail 2 hi3 -m tiny diffusion-capture --sde-kernel dance --sampler sde c.st -o x.st 2>err &&
	for k in flow-grpo dance-grpo; do
		test_must_fail 2 hi3 -m tiny diffusion-capture --sampler sde --sde-kernel $k --eta 0 c.st -o x.st 2>err &&
		test_grep "eta 0 with SDE steps" err || exit 1
	done &&
	! test -e x.st &&
	hi3 -q -m tiny diffusion-capture --steps 3 --sampler sde --sde-kernel cps --eta 0 c.st -o z.st &&
	hi3 -q -m tiny replay --threshold 0 c.st z.st -o r.st >/dev/null
'

test_done
