#!/bin/sh
# t4100-cuda-bench.sh -- the benchmark driver that scripts/gpu-run.sh runs on
# the GPU reports every figure its table needs (run here on the CPU), and
# the batch invariance it ran with.
. "$SRCDIR/tests/lib.sh"
BENCH="$BUILDDIR/tests/bench-cuda"

test_expect_success 'bench-cuda prints a RESULT line with every figure' '
	make_model tiny-moe m &&
	"$BENCH" -m m --backend cpu -B 3 -L 16 -D 1 -n 3 --reps 1 --kv-dtype f32 --label t >out &&
	test_grep "^RESULT label=t backend=cpu B=3 L=16 D=1 " out &&
	for k in prefill_s prefill_tok_s prefill_tflops attn_tflop decode_ms decode_tok_s decode_gb decode_gbs; do
		test_grep " $k=[0-9][0-9.]*" out || return 1
	done &&
	test_grep " graphs=default invariant=on$" out &&
	"$BENCH" -m m --backend cpu -B 1 -L 8 -n 2 --reps 1 --cuda-graphs off --batch-invariant off >out &&
	test_grep " graphs=off invariant=off$" out
'

test_expect_success 'bench-cuda refuses a bad option value' '
	test_must_fail 2 "$BENCH" -m m -B zero 2>err &&
	test_grep "\-B: expected an integer" err &&
	test_must_fail 2 "$BENCH" -m m -B 2 -D 3 2>err &&
	test_grep "cannot decode more rows" err &&
	test_must_fail 2 "$BENCH" -m m --cuda-graphs sometimes 2>err &&
	test_grep "cuda-graphs: expected on or off" err &&
	test_must_fail 2 "$BENCH" -m m --batch-invariant maybe 2>err &&
	test_grep "batch-invariant: expected on or off" err
'

test_done
