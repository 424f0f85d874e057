#!/usr/bin/env bash
# t4400-cuda-graphs.sh -- decode steps replayed from CUDA graphs
# (--cuda-graphs, on by default) give bitwise the tokens, log-probs and KV
# file (cache and next logits) of the eager steps (--cuda-graphs off), at
# B = 1 and B = 8, sampled, and through graphs indeed: the emulator counts
# the kernels it ran eagerly and from graph launches (HI3_EMU_STATS), and
# refuses in a capture what it cannot replay, so the graphs cannot pass by
# running eagerly. make check-cuda runs it on the GPU (HI3_CUDA_BIN), where
# only the bitwise checks apply.
. "$SRCDIR/tests/lib.sh"
CUDA_BIN=${HI3_CUDA_BIN:-$BUILDDIR/tests/hi3-cuda-emu}
# (the GPU run's checks wait after every op, which turns graphs off)
unset HI3_CUDA_SYNC
cuda() { "$CUDA_BIN" -q -t 1 --backend cuda "$@"; }
emulated() { [ -z "${HI3_CUDA_BIN:-}" ]; }
# stat FILE NAME: the emulator's count NAME
stat() { sed -n "s/.*$2=\([0-9]*\).*/\1/p" "$1"; }

REQ_SEED=4400
SAMPLE="--temperature 0.8 --top-k 40 --top-p 0.9"

test_expect_success 'tiny-moe; one row, and 8 rows of different lengths, prefilled on cuda' '
	make_model tiny-moe tm &&
	requests 21 >one.jsonl && requests 9 23 17 5 30 12 26 3 >eight.jsonl &&
	for b in one eight; do
		hi3 -q -m tm tokenize-concat $b.jsonl -o $b.cond &&
		cuda -m tm prefill $b.cond -o $b.kv0 --max-new 9 || return 1
	done
'

# decode B: the sampled decode with graphs on and off, bitwise alike, and
# (emulated) the kernels of the graphs' run came from graph launches
decode() {
	for g in on off; do
		cp $1.kv0 $1-$g.kv && rm -f $1-$g.stats &&
		HI3_EMU_STATS=$PWD/$1-$g.stats cuda --cuda-graphs $g -m tm decode $SAMPLE $1.cond $1-$g.kv -o $1-$g.seg ||
		return 1
	done &&
	cmp $1-on.seg $1-off.seg && cmp $1-on.kv $1-off.kv &&
	if emulated; then
		cat $1-on.stats $1-off.stats &&
		test "$(stat $1-off.stats graph_launches)" = 0 && test "$(stat $1-off.stats kernels_in_graphs)" = 0 &&
		test "$(stat $1-on.stats graph_launches)" -gt 0 &&
		# most of the decode ran from graphs: fewer than half the eager launches are left
		test $(($(stat $1-on.stats kernels_eager) * 2)) -lt "$(stat $1-off.stats kernels_eager)" &&
		test "$(stat $1-on.stats kernels_in_graphs)" -gt "$(stat $1-on.stats kernels_eager)"
	fi
}

test_expect_success 'B = 1, sampled: graphs on and off give the same segment and KV file, bit for bit' '
	decode one
'
test_expect_success 'B = 8, sampled (rows finishing at different steps): the same bits, through graphs' '
	decode eight
'

test_expect_success 'greedy, B = 8, split over two calls with graphs: the bits of one eager call' '
	cp eight.kv0 split.kv && cp eight.kv0 whole.kv &&
	cuda --cuda-graphs on -m tm decode --greedy --steps 4 eight.cond split.kv -o part.seg &&
	cuda --cuda-graphs on -m tm decode --greedy eight.cond split.kv -o split.seg &&
	cuda --cuda-graphs off -m tm decode --greedy eight.cond whole.kv -o whole.seg &&
	cmp split.kv whole.kv && hi3 diff --atol 0 --tensor tokens --tensor logprobs split.seg whole.seg
'

test_expect_success '--cuda-graphs on where graphs cannot be had is refused (exit 2); a bad value too' '
	test_must_fail 2 hi3 -q --cuda-graphs on -m tm decode one.cond one-on.kv -o x.seg 2>err &&
	test_grep -q "cpu backend has no CUDA graphs" err &&
	HI3_CUDA_SYNC=1 test_must_fail 2 cuda --cuda-graphs on -m tm decode one.cond one-on.kv -o x.seg 2>err &&
	test_grep -q "HI3_CUDA_SYNC waits after every op" err &&
	test_must_fail 2 cuda --cuda-graphs maybe -m tm decode one.cond one-on.kv -o x.seg 2>err &&
	test ! -e x.seg
'

test_done
