#!/usr/bin/env bash
# The batching contract (hi3-batching(7), rule 8): a right-padded batch gives each row what
# that row gives alone, on tiny and tiny-moe, fp32, greedy and seeded
# sampling; each upstream defect restored breaks it, and pos-pad breaks it
# at slot 0 of short rows only.
. "$SRCDIR/tests/lib.sh"
J() { "$BUILDDIR/tests/test-tools" json "$@"; }


for preset in tiny tiny-moe; do
	test_expect_success "$preset: model" "make_model $preset $preset"

	test_expect_success "$preset: lengths 13,37,64,51, 3 and 5 steps, greedy and sampled: bitwise parity" "
		requests 13 37 64 51 >req.jsonl &&
		hi3 -m $preset parity req.jsonl --steps 3,5 --temperature 0.8 --top-p 0.9 --top-k 20 >out 2>err &&
		test \$(grep -c '^\[PASS\]' out) = 12 && ! grep -q '^\[FAIL\]' out &&
		grep -q 'logp max|d|=0 prefill-KV max|d|=0' out
	"

	test_expect_success "$preset: OpenBLAS path (--batch-invariant=off): parity within 1e-5" "
		hi3 -m $preset --batch-invariant=off parity req.jsonl --steps 5 --greedy-only --tol 1e-5 >out &&
		test \$(grep -c '^\[PASS\]' out) = 3
	"

	test_expect_success "$preset: extreme skew (1 and 200 tokens)" "
		requests 1 200 >skew.jsonl &&
		hi3 -m $preset parity skew.jsonl --steps 3,5 >out &&
		test \$(grep -c '^\[PASS\]' out) = 12
	"

	test_expect_success "$preset: every row padded (batch padded to 80 columns) and right-padded B = 1" "
		requests 13 37 64 51 >req.jsonl &&
		hi3 -m $preset parity req.jsonl --steps 3 --pad-to 80 --json >out.json &&
		test \"\$(J ok <out.json)\" = true &&
		test \"\$(J cases/0/L <out.json)\" = 80 &&
		test \"\$(J 'cases/construction=padded B=1/L' <out.json)\" = 80 &&
		requests 20 >one.jsonl &&
		hi3 -m $preset parity one.jsonl --steps 4 --pad-to 33 >out &&
		test \$(grep -c '^\[PASS\]' out) = 6
	"

	for ablation in decode-mask token-placement pos-pad; do
		test_expect_success "$preset: --ablate $ablation breaks parity in every case" "
			hi3 -m $preset parity req.jsonl --steps 3 --ablate $ablation >out 2>err &&
			! grep -q '^\[PASS\]' out && test \$(grep -c 'expect FAIL\$' out) = 6 &&
			grep -q 'reproduces\|as upstream did' err
		"
	done

	test_expect_success "$preset: pos-pad breaks the prefill cache at slot 0 of short rows only" "
		hi3 -m $preset parity req.jsonl --steps 3 --greedy-only --ablate pos-pad --json >pp.json &&
		for r in 0 1 3; do
			test \"\$(J cases/0/rows/\$r/kv_other_slots_max_abs <pp.json)\" = 0.0 &&
			! test \"\$(J cases/0/rows/\$r/kv_slot0_max_abs <pp.json)\" = 0.0 || return 1
		done &&
		test \"\$(J cases/0/rows/2/kv_max_abs <pp.json)\" = 0.0 &&
		test \"\$(J cases/0/rows/2/tokens_equal <pp.json)\" = true
	"
done

test_expect_success 'parity: an ablation that cannot break equal-length rows fails (exit 1)' '
	requests 9 9 >eq.jsonl &&
	test_must_fail 1 hi3 -m tiny parity eq.jsonl --steps 2 --greedy-only --ablate pos-pad >out &&
	grep -q "NOT BROKEN" out
'

test_expect_success 'parity: bad usage' '
	test_must_fail 2 hi3 -m tiny parity req.jsonl --ablate nonsense &&
	test_must_fail 2 hi3 -m tiny parity req.jsonl --greedy-only --sampled-only &&
	test_must_fail 2 hi3 parity req.jsonl &&
	printf "{\"tokens\": [1, 2,\n" >bad.jsonl &&
	test_must_fail 3 hi3 -m tiny parity bad.jsonl 2>err && grep -q "bad.jsonl:1" err
'

test_done
