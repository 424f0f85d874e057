#!/usr/bin/env bash
# t2210-replay-metrics.sh -- the mismatch metrics of the replay report
# (verl's names; hi3-replay(1), MISMATCH METRICS) on real replays, and the
# per-token gap of the replay file. Their numerics against numpy are
# tests/test-mismatch's.
. "$SRCDIR/tests/lib.sh"
J() { "$BUILDDIR/tests/test-tools" json "$@"; }
T() { "$BUILDDIR/tests/test-tools" "$@"; }

REQ_SEED=4242

test_expect_success 'an exact replay: no mismatch, every weight 1' '
	make_model tiny-moe tm &&
	requests 13 37 20 >req.jsonl &&
	hi3 -q -m tm tokenize-concat req.jsonl -o c.st &&
	hi3 -q -m tm prefill c.st -o k.st --max-new 12 &&
	hi3 -q -m tm decode --stop 999 --temperature 0.9 c.st k.st -o s.st &&
	hi3 -q -m tm replay c.st s.st -o r.st >rep.json &&
	for k in kl k3_kl chi2_token chi2_seq log_ppl_diff log_ppl_abs_diff log_ratio_sum; do
		test "$(J overall/mismatch/$k <rep.json)" = 0.0 || { echo "$k"; return 1; }
	done &&
	test "$(J overall/mismatch/ppl_ratio <rep.json)" = 1.0 &&
	test "$(J overall/mismatch/is_cap <rep.json)" = 2.0 &&
	for lvl in token sequence; do
		test "$(J overall/mismatch/$lvl/rollout_is_mean <rep.json)" = 1.0 &&
		test "$(J overall/mismatch/$lvl/rollout_is_std <rep.json)" = 0.0 &&
		test "$(J overall/mismatch/$lvl/rollout_is_ratio_fraction_high <rep.json)" = 0.0 &&
		test "$(J overall/mismatch/$lvl/rollout_is_eff_sample_size <rep.json)" = 1.0000000199999999 || return 1
	done &&
	test "$(J overall/mismatch/training_log_ppl <rep.json)" = "$(J overall/mismatch/rollout_log_ppl <rep.json)" &&
	test "$(J rows/2/mismatch/kl <rep.json)" = 0.0
'

test_expect_success 'the replay file carries the per-token gap, row and position' '
	hi3 inspect --json r.st >r.json &&
	test "$(J tensors/name=dlogp/shape <r.json)" = "[36]" &&
	test "$(J tensors/name=dlogp/max <r.json)" = 0.0 &&
	hi3 inspect --tensor positions --slice 10:14 r.st | tail -n 1 >pos &&
	echo "23 24 37 38" >want && test_cmp want pos &&
	hi3 inspect --tensor rows --slice 11:13 r.st | tail -n 1 >rows &&
	echo "0 1" >want && test_cmp want rows
'

test_expect_success 'an altered token: the gap from it to its row end, and the metrics it gives' '
	cp s.st alt.st &&
	old=$(hi3 inspect --tensor tokens --slice 17 alt.st | tail -n 1) &&
	T poke alt.st tokens 17 $(( (old + 1) % 256 )) &&
	hi3 -q -m tm replay --is-cap 1.5 c.st alt.st -o ra.st >rep.json &&
	hi3 inspect --tensor dlogp ra.st | tail -n 1 >d &&
	awk "{ for (i = 1; i <= NF; i++) if ((\$i != 0) != (i >= 18 && i <= 24)) exit 1 }" d &&
	test "$(hi3 inspect --tensor positions --slice 17 ra.st | tail -n 1)" = $((37 + 5)) &&
	test "$(J rows/0/mismatch/log_ratio_sum <rep.json)" = 0.0 &&
	test "$(J overall/mismatch/is_cap <rep.json)" = 1.5 &&
	S=$(J rows/1/mismatch/log_ratio_sum <rep.json) && kl=$(J overall/mismatch/kl <rep.json) &&
	k3=$(J overall/mismatch/k3_kl <rep.json) && hi=$(J overall/mismatch/token/rollout_is_ratio_fraction_high <rep.json) &&
	lo=$(J overall/mismatch/token/rollout_is_ratio_fraction_low <rep.json) &&
	sq=$(J overall/mismatch/sequence/rollout_is_mean <rep.json) &&
	ld=$(J rows/1/mismatch/log_ppl_diff <rep.json) &&
	echo "S $S kl $kl k3 $k3 high $hi low $lo seq $sq" &&
	awk -v S="$S" -v kl="$kl" -v k3="$k3" -v hi="$hi" -v lo="$lo" -v sq="$sq" -v ld="$ld" "
	function near(a, b) { return a - b < 1e-5 && b - a < 1e-5 }
	{ n = NF; for (i = 1; i <= NF; i++) { r = \$i; s += r; e3 += exp(r) - r - 1; h += exp(r) > 1.5; l += exp(r) < 1 / 1.5 } }
	END { w = exp(S < -20 ? -20 : S > 20 ? 20 : S)
		exit !(near(s, S) && near(kl, -s / n) && near(k3, e3 / n) && k3 > 0 && hi == h / n && lo == l / n &&
		       near(sq, (12 * w + 24) / 36) && near(ld, -S / 12)) }" d
'

test_expect_success '--is-cap must exceed 1' '
	test_must_fail 2 hi3 -q -m tm replay --is-cap 1 c.st s.st -o x.st 2>err && test_grep "is-cap" err &&
	test_must_fail 2 hi3 -q -m tm replay --is-cap 0.5 c.st s.st -o x.st && test ! -e x.st
'

test_done
