#!/usr/bin/env bash
# t5010-diffusion-trace.sh -- hi3 diffusion-capture --trace: one denoising
# step's forward pass as a hi3.trace file (hi3-files(5), TRACE), that a
# request traces the same bits alone and batched (cond and uncond rows, the
# whole sequence of step 0 and the image tokens of a later step), that KV
# reuse and the whole sequence agree where both run, that hi3 diff --first
# names the layer and point of a perturbed o_proj weight, and the usage
# errors (exit 2).
. "$SRCDIR/tests/lib.sh"
J() { "$BUILDDIR/tests/test-tools" json "$@"; }
T() { "$BUILDDIR/tests/test-tools" "$@"; }

test_expect_success 'a MoE model, two gen_image requests batched, and the first alone' '
	make_model tiny-moe tm &&
	printf "{\"prompt\": \"a red fox\", \"mode\": \"gen_image\", \"image_size\": \"32x48\", \"seed\": 7}\n" >r0.jsonl &&
	cp r0.jsonl req.jsonl &&
	printf "{\"prompt\": \"two cats asleep on a warm mat by the fire\", \"mode\": \"gen_image\", \"image_size\": \"32x48\", \"seed\": 9}\n" >>req.jsonl &&
	hi3 -q -m tm tokenize-concat --exact-size req.jsonl -o c.st &&
	hi3 -q -m tm tokenize-concat --exact-size r0.jsonl -o c0.st &&
	hi3 inspect --tensor timestep_index c.st >ts &&
	test_grep "^\[0, :\] 13$" ts && test_grep "^\[2, :\] 13$" ts
'

test_expect_success '--trace: step 0 of row 0, every real token, the points and metadata hi3-files(5) names' '
	hi3 -q -m tm diffusion-capture --steps 3 c.st -o t.st --trace a.trace &&
	hi3 inspect --json a.trace >a.json &&
	test "$(J metadata/format <a.json)" = hi3.trace &&
	test "$(J metadata/stage <a.json)" = diffusion-capture &&
	test "$(J metadata/trace_step <a.json)" = 0 &&
	test "$(J metadata/steps <a.json)" = 3 &&
	test "$(J metadata/denoised_rows <a.json)" = 4 &&
	test "$(J metadata/kv_reuse <a.json)" = on &&
	test "$(J metadata/rows <a.json)" = 4 &&
	test "$(J metadata/L <a.json)" = 53 &&
	test "$(J metadata/forward_calls <a.json)" = 1 &&
	test "$(J metadata/forward_shapes <a.json)" = 4x53 &&
	test "$(J tensors/name=rows/shape <a.json)" = "[21]" &&
	test "$(J tensors/name=embed/shape <a.json)" = "[21,128]" &&
	test "$(J tensors/name=layer.1.k/shape <a.json)" = "[21,64]" &&
	test "$(J tensors/name=layer.0.router_logits/shape <a.json)" = "[21,4]" &&
	test "$(J tensors/name=layer.1.expert_out/shape <a.json)" = "[21,2,128]" &&
	test "$(J tensors/name=final/shape <a.json)" = "[21,128]" &&
	test "$(J tensors/name=logits.lse/shape <a.json)" = "[21]" &&
	hi3 inspect --tensor positions a.trace | tail -n 1 >pos &&
	test "$(cat pos)" = "$(seq -s " " 0 20)" &&
	hi3 inspect --tensor rows a.trace | tail -n 1 | tr " " "\n" | sort -u >rows &&
	test "$(cat rows)" = 0 &&
	hi3 -q -m tm diffusion-capture --steps 3 c.st -o u.st &&
	hi3 diff --atol 0 t.st u.st >/dev/null
'

test_expect_success '--trace-step 1 with KV reuse: <timestep> and the image tokens only, as the whole sequence has them' '
	hi3 -q -m tm diffusion-capture --steps 3 c.st -o t.st --trace a1.trace --trace-step 1 &&
	hi3 inspect --json a1.trace >a1.json &&
	test "$(J metadata/trace_step <a1.json)" = 1 &&
	test "$(J metadata/forward_shapes <a1.json)" = 4x7 &&
	hi3 inspect --tensor positions a1.trace | tail -n 1 >pos &&
	test "$(cat pos)" = "$(seq -s " " 13 19)" &&
	hi3 -q -m tm diffusion-capture --steps 3 --no-kv-reuse c.st -o n.st --trace n1.trace --trace-step 1 &&
	hi3 inspect --json n1.trace >n1.json &&
	test "$(J metadata/kv_reuse <n1.json)" = off &&
	test "$(J metadata/forward_shapes <n1.json)" = 4x53 &&
	hi3 diff --first a1.trace n1.trace >out &&
	test_grep "aligned 7 tokens (positions 13-19); only in A: 0, only in B: 14; tolerance 0" out &&
	test_grep "^no difference" out
'

test_expect_success 'a request traces the same bits batched and alone: cond and uncond rows, steps 0 and 2' '
	hi3 -q -m tm diffusion-capture --steps 3 c0.st -o t0.st --trace b.trace &&
	hi3 diff --first a.trace b.trace >out &&
	test_grep "aligned 21 tokens (positions 0-20); only in A: 0, only in B: 0; tolerance 0 (bitwise)" out &&
	test_grep "^summary: equal" out &&
	hi3 -q -m tm diffusion-capture --steps 3 c.st -o t.st --trace a2.trace --trace-step 2 --trace-rows 0,2 &&
	hi3 -q -m tm diffusion-capture --steps 3 c0.st -o t0.st --trace b2.trace --trace-step 2 --trace-rows 0,1 &&
	hi3 diff --first --row 0:0 a2.trace b2.trace >out &&
	test_grep "aligned 7 tokens (row 0 of A with row 0 of B, positions 13-19)" out &&
	test_grep "^summary: equal" out &&
	hi3 diff --first --row 2:1 a2.trace b2.trace >out &&
	test_grep "aligned 7 tokens (row 2 of A with row 1 of B, positions 13-19)" out &&
	test_grep "^summary: equal" out &&
	test_must_fail 1 hi3 diff --first --row 0:1 a2.trace b2.trace >/dev/null &&
	test_must_fail 1 hi3 diff --first a2.trace a1.trace >/dev/null
'

test_expect_success 'g <= 1 runs the cond rows alone: an uncond row is not traced, and the trace says so' '
	hi3 -q -m tm diffusion-capture --steps 2 --guidance 1 c.st -o g.st --trace g.trace --trace-rows 2 2>err &&
	test_grep "no token of the rows and positions asked for was run" err &&
	hi3 inspect --json g.trace | J metadata/denoised_rows >dr &&
	test "$(cat dr)" = 2
'

test_expect_success 'a perturbed o_proj weight: step 0 differs first there, step 1 at <timestep> there, then the latents' '
	cp -r tm bad && T poke bad/model.safetensors model.layers.1.self_attn.o_proj.weight 5,17 0.5 &&
	hi3 -q -m bad diffusion-capture --steps 3 c.st -o tb.st --trace bad.trace &&
	test_must_fail 1 hi3 diff --first --json a.trace bad.trace >j &&
	test "$(J first/point <j)" = layer.1.attn_out &&
	test "$(J first/index <j)" = "[5]" &&
	test "$(J first/pos <j)" = 0 &&
	test "$(J points/name=layer.1.attn/status <j)" = ok &&
	test "$(J points/name=embed/status <j)" = ok &&
	test_must_fail 1 hi3 diff --first a.trace bad.trace >out &&
	test_grep "^first difference: layer.1.attn_out at row 0, pos 0, index 5: " out &&
	hi3 -q -m bad diffusion-capture --steps 3 c.st -o tb.st --trace bad1.trace --trace-step 1 &&
	test_must_fail 1 hi3 diff --first --json a1.trace bad1.trace >j &&
	test "$(J first/point <j)" = layer.1.attn_out &&
	test "$(J first/pos <j)" = 13 &&
	test "$(J first/index <j)" = "[5]" &&
	test "$(J points/name=embed/status <j)" = over
'

test_expect_success 'usage errors (exit 2): --trace naming COND, TRAJ or the noise file, a step past the last, no --trace' '
	echo keep >keep.st &&
	test_must_fail 2 hi3 -m tm diffusion-capture --steps 2 c.st -o x.st --trace ./c.st 2>err &&
	test_grep "is .c.st., a file this command also reads or writes" err &&
	test_must_fail 2 hi3 -m tm diffusion-capture --steps 2 c.st -o x.st --trace x.st 2>err &&
	test_grep "a file this command also reads or writes" err &&
	test_must_fail 2 hi3 -m tm diffusion-capture --steps 3 --noise t.st c.st -o x.st --trace t.st 2>err &&
	test_grep "a file this command also reads or writes" err &&
	test_must_fail 2 hi3 -m tm diffusion-capture --steps 3 c.st -o x.st --trace x.trace --trace-step 3 2>err &&
	test_grep "trace-step 3: expected a step in \[0, 3)" err &&
	test_must_fail 2 hi3 -m tm diffusion-capture --steps 3 c.st -o x.st --trace-step 1 2>err &&
	test_grep "trace-step needs --trace" err &&
	test_must_fail 2 hi3 -m tm diffusion-capture --steps 3 c.st -o x.st --trace-rows 1 2>err &&
	test_grep "need --trace FILE" err &&
	test_must_fail 2 hi3 -m tm diffusion-capture --steps 3 c.st -o x.st --trace - 2>err &&
	test_must_fail 2 hi3 -m tm diffusion-capture --decode t.st --png p --trace x.trace 2>err &&
	test_grep "takes no --trace" err &&
	! test -e x.st && ! test -e x.trace && ! test -e p
'

test_done
