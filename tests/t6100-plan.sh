#!/usr/bin/env bash
# t6100-plan.sh -- hi3 plan (hi3-plan(1)): per-rank bytes of a layout from
# config.json alone, and the refusal at model open of a layout that cannot
# fit (HI3_MEM_LIMIT), before any file is made.
. "$SRCDIR/tests/lib.sh"
J() { "$BUILDDIR/tests/test-tools" json "$@"; }
REL="$SRCDIR/tests/fixtures/released"

test_expect_success 'the released config alone (no weights): 150.81 GiB of bf16 weights; one H200 is too small' '
	mkdir rel && cp "$REL/config.json" rel/ &&
	test_must_fail 1 hi3 -m rel plan --ranks 1 --batch 1 --max-len 4096 --mem 141G >one.txt &&
	test_grep -q "weights        150.81 GiB" one.txt && test_grep -q "does not fit" one.txt &&
	hi3 -m rel plan --ranks 2 --batch 1 --max-len 4096 --mem 141G >two.txt &&
	test_grep -q "2 ranks (tp=2, ep=1)" two.txt && test_grep -q ": fits" two.txt
'

test_expect_success 'weights per rank: tp splits all but the replicated part; the JSON adds up' '
	hi3 -m rel plan --ranks 8 --batch 8 --max-len 4096 --json >p8.json &&
	hi3 -m rel plan --ranks 1 --batch 8 --max-len 4096 --json >p1.json &&
	w1=$(J per_rank/weights <p1.json) && s8=$(J per_rank/weights_split <p8.json) &&
	r8=$(J per_rank/weights_replicated <p8.json) && w8=$(J per_rank/weights <p8.json) &&
	test $((s8 + r8)) = "$w8" && test "$(J weights_all <p8.json)" = "$w1" &&
	test $(( (w1 - r8) / 8 <= s8 && s8 <= (w1 - r8) / 8 + 1024 * 1024 )) = 1 &&
	t8=$(J per_rank/total <p8.json) &&
	test $((w8 + $(J per_rank/kv <p8.json) + $(J per_rank/activations <p8.json))) = "$t8" &&
	test "$(J fits <p8.json)" = null
'

test_expect_success 'the layout: --parallel, or the largest tp dividing the ranks and the kv heads' '
	hi3 -m rel plan --ranks 8 --parallel ep=8 --batch 1 --max-len 64 --json >ep.json &&
	test "$(J tp <ep.json)" = 1 && test "$(J ep <ep.json)" = 8 &&
	hi3 -m rel plan --ranks 16 --batch 1 --max-len 64 --json >p16.json &&
	test "$(J tp <p16.json)" = 8 && test "$(J ep <p16.json)" = 2
'

test_expect_success '--backend cuda: one GPU a rank; the decode record stays on the host; the pods fit' '
	hi3 -m rel plan --ranks 8 --batch 8 --max-len 4096 --json >c8.json &&
	hi3 --backend cuda -m rel plan --ranks 8 --batch 8 --max-len 4096 --json >g8.json &&
	test "$(J backend <c8.json)" = cpu && test "$(J backend <g8.json)" = cuda &&
	test "$(J per_rank/weights <g8.json)" = "$(J per_rank/weights <c8.json)" &&
	test $(($(J per_rank/kv <c8.json) - $(J per_rank/kv <g8.json))) = $((8 * 133120 * 4 * 2)) &&
	cp -r "$REL/instruct" inst &&
	for pod in 2:141G 4:80G 8:96G; do
		for m in rel inst; do
			hi3 --backend cuda -m $m plan --ranks ${pod%%:*} --batch 8 --max-len 4096 --mem ${pod#*:} >pod.txt &&
			test_grep -q "cuda (one GPU a rank)" pod.txt && test_grep -q ": fits" pod.txt || return 1
		done
	done
'

test_expect_success 'bad layouts and sizes: exit 2, saying which' '
	test_must_fail 2 hi3 -m rel plan --ranks 3 --parallel tp=3 --batch 1 --max-len 64 2>err &&
	test_grep -q "tp=3 does not divide num_key_value_heads 8" err &&
	test_must_fail 2 hi3 -m rel plan --ranks 2 --parallel tp=4 --batch 1 --max-len 64 2>err &&
	test_grep -q "is 4 ranks, not --ranks 2" err &&
	test_must_fail 2 hi3 -m rel plan --ranks 1 --batch 1 --max-len 64 --mem 12X 2>err &&
	test_grep -q "is not a size" err
'

test_expect_success 'a layout whose weights do not fit a rank is refused before any file is made' '
	make_model tiny-moe tm &&
	requests 5 7 >req.jsonl && hi3 -q -m tm tokenize-concat req.jsonl -o c.st &&
	HI3_MEM_LIMIT=100K test_must_fail 1 hi3 -q -m tm prefill c.st -o kv.st 2>err &&
	test_grep -q "holds 2.29 MiB of weights, more than HI3_MEM_LIMIT (100.00 KiB)" err &&
	test ! -e kv.st && ! ls kv.st.* 2>/dev/null &&
	HI3_MEM_LIMIT=1G hi3 -q -m tm prefill c.st -o kv.st
'

test_expect_success 'quantized layouts (hi3-quant(7)): the released model on one H200 at batch 8, 4096 slots' '
	for d in bf16 fp8 int8 nf4 nvfp4-mixed; do
		hi3 plan -m "$REL" --ranks 1 --batch 8 --max-len 4096 --kv-dtype bf16 --dtype $d --mem 141G --json >$d.json
		echo $? >$d.rc
		echo "$d $(J per_rank/weights <$d.json) $(cat $d.rc)"
	done &&
	test "$(J dtype <nf4.json)" = nf4 &&
	test $(cat bf16.rc) = 1 && test $(cat fp8.rc) = 0 && test $(cat nf4.rc) = 0 && test $(cat nvfp4-mixed.rc) = 0 &&
	test $(J per_rank/weights <fp8.json) = $(J per_rank/weights <int8.json) &&
	test $(J per_rank/weights <nf4.json) -lt $(J per_rank/weights <nvfp4-mixed.json) &&
	test $(J per_rank/weights <nvfp4-mixed.json) -lt $(J per_rank/weights <fp8.json) &&
	test $(( $(J per_rank/weights <fp8.json) * 100 / $(J per_rank/weights <bf16.json) )) -ge 50 &&
	test $(( $(J per_rank/weights <fp8.json) * 100 / $(J per_rank/weights <bf16.json) )) -le 52 &&
	test $(J per_rank/kv <fp8.json) = $(J per_rank/kv <bf16.json)
'

test_done
