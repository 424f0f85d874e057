#!/usr/bin/env bash
# Upstream's batching defects reproduced by stage (hi3-batching(7), IMAGES
# AND DIFFUSION; hi3-diffusion-capture(1) --ablate): a capture with a defect
# restored records it; hi3 replay restores it too, reports the stateless
# gap of a defect that acts through the KV cache (pos-pad, rope-pad, eoi: the
# bug's own rollout/replay mismatch) and says so, and --as-captured follows
# the capture's path to gap 0; hi3 diff --first on traces of a clean and an
# ablated step names where the defect first acts; conditions made with
# --pad-positions=zero are recorded as pos-pad.
. "$SRCDIR/tests/lib.sh"
J() { "$BUILDDIR/tests/test-tools" json "$@"; }

test_expect_success 'setup: a tiny model, two gen_image requests, the first one padded' '
	make_model tiny tiny &&
	printf "%s\n" \
		"{\"prompt\": \"a red fox\", \"mode\": \"gen_image\", \"image_size\": \"32x48\", \"seed\": 7}" \
		"{\"prompt\": \"two cats asleep on a warm mat by the fire\", \"mode\": \"gen_image\", \"image_size\": \"32x48\", \"seed\": 9}" >req.jsonl &&
	hi3 -q -m tiny tokenize-concat --exact-size req.jsonl -o c.st &&
	test "$(hi3 inspect --tensor real_pos c.st | tail -n 1)" = "21 53 21 53" &&
	hi3 -q -m tiny diffusion-capture --steps 5 --sampler sde --sde-steps 1,2,4 c.st -o clean.st &&
	hi3 -q -m tiny replay c.st clean.st -o r.st >rep.json 2>err &&
	test "$(J ablate <rep.json)" = none && ! test -s err
'

for a in pos-pad rope-pad eoi; do
	test_expect_success "$a: recorded; replay restores it and reports its stateless gap; --as-captured: gap 0" "
		hi3 -q -m tiny diffusion-capture --steps 5 --sampler sde --sde-steps 1,2,4 --ablate $a c.st -o $a.st \
			2>err &&
		test_grep \"ablate $a: .*the trajectory records it\" err &&
		test \"\$(hi3 inspect --json $a.st | J metadata/ablate)\" = $a &&
		test_must_fail 1 hi3 diff --atol 0 --tensor latents $a.st clean.st >/dev/null &&
		test_must_fail 1 hi3 -q -m tiny replay --threshold 1e-6 c.st $a.st -o r.st >rep.json 2>err &&
		test \"\$(J ablate <rep.json)\" = $a && test \"\$(J forward <rep.json)\" = stateless &&
		test_grep \"captured with the $a defect restored .*the defect's own rollout/replay mismatch\" err &&
		hi3 -q -m tiny replay --as-captured --threshold 0 c.st $a.st -o ra.st >rep.json 2>err &&
		test \"\$(J forward <rep.json)\" = as-captured &&
		test \"\$(J overall/max_abs_dlogp <rep.json)\" = 0.0 &&
		test_grep \"replayed with it too, along the capture's path\" err &&
		hi3 diff --atol 0 --tensor sde_logp $a.st ra.st
	"
done

test_expect_success 'pos-pad, rope-pad: the stateless gap is in the padded request alone' '
	for a in pos-pad rope-pad; do
		{ hi3 -q -m tiny replay c.st $a.st -o r.st >rep.json 2>/dev/null; } &&
		test "$(J rows/1/max_abs_dlogp <rep.json)" = 0.0 &&
		test "$(J overall/worst_row <rep.json)" = 0 || exit 1
	done
'

test_expect_success 'rope-1d acts alike with and without the cache: replay gap 0 either way, and it says so' '
	hi3 -q -m tiny diffusion-capture --steps 5 --sampler sde --sde-steps 1,2,4 --ablate rope-1d c.st -o 1d.st \
		2>/dev/null &&
	test_must_fail 1 hi3 diff --atol 0 --tensor latents 1d.st clean.st >/dev/null &&
	hi3 -q -m tiny replay --threshold 0 c.st 1d.st -o r.st >rep.json 2>err &&
	test "$(J ablate <rep.json)" = rope-1d &&
	test_grep "defect acts alike with and without the KV cache" err &&
	hi3 -q -m tiny replay --as-captured --threshold 0 c.st 1d.st -o r.st >/dev/null 2>&1
'

test_expect_success 'a clean trajectory replays as captured too: gap 0 both ways' '
	hi3 -q -m tiny replay --as-captured --threshold 0 c.st clean.st -o r.st >rep.json &&
	test "$(J forward <rep.json)" = as-captured
'

test_expect_success 'diff --first, pos-pad and rope-pad: step 0 agrees; at step 1 the padded row reads other K/V' '
	hi3 -q -m tiny diffusion-capture --steps 3 c.st -o x.st --trace c0.trace &&
	hi3 -q -m tiny diffusion-capture --steps 3 c.st -o x.st --trace c1.trace --trace-step 1 --trace-rows 0,1 &&
	for a in pos-pad rope-pad; do
		hi3 -q -m tiny diffusion-capture --steps 3 --ablate $a c.st -o x.st --trace a0.trace 2>/dev/null &&
		hi3 diff --first c0.trace a0.trace >/dev/null &&
		hi3 -q -m tiny diffusion-capture --steps 3 --ablate $a c.st -o x.st --trace a1.trace --trace-step 1 \
			--trace-rows 0,1 2>/dev/null &&
		test_must_fail 1 hi3 diff --first --json c1.trace a1.trace >j &&
		test "$(J first/point <j)" = layer.0.attn && test "$(J first/row_a <j)" = 0 &&
		test "$(J first/pos <j)" = 13 &&
		test "$(J points/name=layer.0.k/status <j)" = ok && test "$(J points/name=layer.0.v/status <j)" = ok &&
		test_must_fail 1 hi3 diff --first c1.trace a1.trace >out &&
		test_grep "^B: a1.trace (diffusion-capture, .*ablate $a, step 1" out &&
		test_grep "the cache as step 0.s whole-sequence pass left it: pads writing slot 0" out &&
		hi3 diff --first --row 1:1 c1.trace a1.trace >out &&
		test_grep "^no difference" out || exit 1
	done
'

test_expect_success 'diff --first, rope-1d: q of the first image token at step 0; eoi: its attention' '
	hi3 -q -m tiny diffusion-capture --steps 3 --ablate rope-1d c.st -o x.st --trace a.trace 2>/dev/null &&
	test_must_fail 1 hi3 diff --first --json c0.trace a.trace >j &&
	test "$(J first/point <j)" = layer.0.q && test "$(J first/pos <j)" = 14 &&
	test "$(J points/name=embed/status <j)" = ok &&
	hi3 -q -m tiny diffusion-capture --steps 3 --ablate eoi c.st -o x.st --trace a.trace 2>/dev/null &&
	test_must_fail 1 hi3 diff --first --json c0.trace a.trace >j &&
	test "$(J first/point <j)" = layer.0.attn && test "$(J first/pos <j)" = 14
'

test_expect_success 'conditions with --pad-positions=zero carry pos-pad: the trajectory says so' '
	hi3 -q -m tiny tokenize-concat --exact-size --pad-positions=zero req.jsonl -o cz.st 2>/dev/null &&
	hi3 -q -m tiny diffusion-capture --steps 5 --sampler sde --sde-steps 1,2,4 cz.st -o z.st &&
	test "$(hi3 inspect --json z.st | J metadata/ablate)" = pos-pad &&
	hi3 diff --atol 0 --tensor latents --tensor sde_logp z.st pos-pad.st &&
	hi3 -q -m tiny replay --as-captured --threshold 0 cz.st z.st -o r.st >/dev/null 2>&1
'

test_expect_success 'usage errors (exit 2): a decode defect, --as-captured with a segment' '
	test_must_fail 2 hi3 -m tiny diffusion-capture --ablate decode-mask c.st -o no.st 2>err &&
	test_grep "expected pos-pad, rope-pad, rope-1d or eoi" err && ! test -e no.st &&
	requests 5 7 >t.jsonl && hi3 -q -m tiny tokenize-concat t.jsonl -o ct.st &&
	hi3 -q -m tiny prefill ct.st -o kv.st --max-new 3 && hi3 -q -m tiny decode ct.st kv.st -o s.st &&
	test_must_fail 2 hi3 -m tiny replay --as-captured ct.st s.st -o x.st 2>err &&
	test_grep "as-captured is for a trajectory" err
'

test_done
