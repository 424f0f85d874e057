#!/usr/bin/env bash
# t4300-cuda-trace.sh -- traces on the CUDA backend (the emulator in make
# check, the GPU in make check-cuda): the points are gathered and copied for
# traced tokens only, and agree with the CPU's within the 1e-5 of
# hi3-batching(7), rule 8 scaled to the activations (1e-4 here: the
# backends reduce in other orders); hi3 diff --first names where they part.
. "$SRCDIR/tests/lib.sh"
CUDA_BIN=${HI3_CUDA_BIN:-$BUILDDIR/tests/hi3-cuda-emu}
cuda() { "$CUDA_BIN" -q --backend cuda --batch-invariant=off "$@"; }
J() { "$BUILDDIR/tests/test-tools" json "$@"; }

REQ_SEED=4242

test_expect_success 'a model and a ragged batch' '
	make_model tiny-moe tm &&
	requests 13 29 >req.jsonl &&
	hi3 -q -m tm tokenize-concat req.jsonl -o c.st
'

test_expect_success 'prefill on cuda traces what the CPU traces, within 1e-4; bitwise a first point is named' '
	hi3 -q -m tm prefill --trace cpu.trace --trace-rows 0,1 c.st -o cpu.kv --max-new 6 &&
	cuda -m tm prefill --trace gpu.trace --trace-rows 0,1 c.st -o gpu.kv --max-new 6 &&
	hi3 inspect --json gpu.trace >g.json && test "$(J metadata/backend <g.json)" = cuda &&
	hi3 diff --first --tol 1e-4 cpu.trace gpu.trace >out &&
	test_grep "^no difference: every point of the 42 aligned tokens agrees within tolerance" out &&
	{ hi3 diff --first --json cpu.trace gpu.trace >j; test $? -le 1; }
'

test_expect_success 'decode on cuda: the same tokens, and points within 1e-4 of the CPU' '
	hi3 -q -m tm decode --trace cd.trace --trace-rows 0,1 c.st cpu.kv -o cpu.seg &&
	cuda -m tm decode --trace gd.trace --trace-rows 0,1 c.st gpu.kv -o gpu.seg &&
	hi3 diff --first --tol 1e-4 --json cd.trace gd.trace >j &&
	test "$(J equal <j)" = true && test "$(J aligned <j)" = 10
'

test_expect_success 'replay on cuda: a row batched and alone agree within 1e-4' '
	cuda -m tm replay --batched --trace b.trace --trace-rows 1 c.st gpu.seg -o rb.st >/dev/null &&
	cuda -m tm replay --trace a.trace --trace-rows 1 c.st gpu.seg -o ra.st >/dev/null &&
	hi3 diff --first --tol 1e-4 a.trace b.trace >/dev/null
'

test_done
