#!/bin/bash
# t3300-bench.sh -- hi3 bench: its JSON and table, and a decode step split
# by op on the CPU (products, attention, the rest), which adds up to the step.
. "$SRCDIR/tests/lib.sh"
TT="$BUILDDIR/tests/test-tools"

# near A B RELTOL: numbers equal within a relative tolerance
near() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b; exit !(d <= t * m) }'; }
# le A B: A <= B
le() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 <= b + 0) }'; }

(cd "$TRASH" && make_model tiny-moe m --dtype bf16) || exit 1

test_expect_success 'one decode step: products, attention and the rest add up to the step' '
	hi3 -q -t 2 -m m bench --prompt-len 16 --new 1 --reps 1 --json >j &&
	"$TT" json <j &&
	step=$("$TT" json decode_step_median_ms <j) &&
	p=$("$TT" json decode_products_median_ms <j) &&
	a=$("$TT" json decode_attention_median_ms <j) &&
	o=$("$TT" json decode_other_median_ms <j) &&
	le 1e-6 "$p" && le 1e-6 "$a" && le 0 "$o" &&
	near "$(awk -v p="$p" -v a="$a" -v o="$o" "BEGIN { printf \"%.9g\", p + a + o }")" "$step" 1e-6 &&
	near "$step" "$("$TT" json decode_step_ms <j)" 1e-6
'

# Each part of a step is at most the step, so each part's median is at
# most the step's: a clock not reset between steps would break it.
test_expect_success 'five steps at B = 2: each part'"'"'s median is at most the step'"'"'s' '
	hi3 -q -t 2 -m m bench --batch 2 --prompt-len 16 --new 5 --reps 1 --json >j &&
	step=$("$TT" json decode_step_median_ms <j) &&
	le 1e-6 "$step" &&
	for k in decode_products_median_ms decode_attention_median_ms; do
		v=$("$TT" json $k <j) && le 1e-6 "$v" && le "$v" "$step" || exit 1
	done &&
	v=$("$TT" json decode_other_median_ms <j) && le 0 "$v" && le "$v" "$step"
'

test_expect_success 'the OpenBLAS path is split too' '
	hi3 -q -t 1 --batch-invariant=off -m m bench --prompt-len 8 --new 2 --reps 1 --json >j &&
	test "$("$TT" json batch_invariant <j)" = false &&
	le 1e-6 "$("$TT" json decode_products_median_ms <j)"
'

test_expect_success 'the table has the split line; no decode steps, no split' '
	hi3 -q -t 2 -m m bench --prompt-len 8 --new 3 --reps 1 >t &&
	test_grep "^  a decode step by op (medians) products [0-9.]* ms, attention [0-9.]* ms, other [0-9.]* ms" t &&
	hi3 -q -m m bench --prompt-len 8 --new 0 --reps 1 >t0 &&
	! grep "by op" t0 &&
	hi3 -q -m m bench --prompt-len 8 --new 0 --reps 1 --json >j0 &&
	! grep decode_products j0
'

test_expect_success 'a bf16 cache: named in the JSON, its bytes in the floor' '
	hi3 -q -t 2 -m m bench --prompt-len 16 --new 2 --reps 1 --json >j32 &&
	hi3 -q -t 2 -m m bench --prompt-len 16 --new 2 --reps 1 --kv-dtype bf16 --json >j16 &&
	test "$("$TT" json kv_dtype <j32)" = F32 &&
	test "$("$TT" json kv_dtype <j16)" = BF16 &&
	b32=$("$TT" json step_bytes_mb <j32) && b16=$("$TT" json step_bytes_mb <j16) &&
	le "$b16" "$b32" && ! le "$b32" "$b16" &&
	test_must_fail 2 hi3 -m m bench --kv-dtype f16 --new 1 2>err &&
	test_grep "kv-dtype" err
'

# The checkpoint's resident bytes in its maps, and the share of them in
# 2 MiB pages: at most the files' size, a share in [0, 1]; a model this
# small draws no warning (under 64 MB).
test_expect_success 'the checkpoint in memory, and its share in 2 MiB pages' '
	hi3 -q -t 2 -m m bench --prompt-len 8 --new 2 --reps 1 --json >j 2>err &&
	mb=$("$TT" json weights_resident_mb <j) &&
	hm=$("$TT" json weights_huge_mapped <j) &&
	files=$(cat m/*.safetensors | wc -c) &&
	le 1e-6 "$mb" && le "$mb" "$(awk -v b="$files" "BEGIN { print b / 1e6 }")" &&
	le 0 "$hm" && le "$hm" 1 &&
	! grep "2 MiB pages" err &&
	hi3 -q -t 2 -m m bench --prompt-len 8 --new 2 --reps 1 >t 2>err &&
	test_grep "^  checkpoint in memory  *[0-9.]* MB, [0-9]*% of it mapped in 2 MiB pages" t &&
	! grep "2 MiB pages" err
'

# The step's weights read again (B = 1): the weights its products read,
# as stored, not the KV cache, so the same bytes whatever the cache's
# dtype, and fewer than the step's bytes by more when the cache is wider.
test_expect_success 'the step'"'"'s weights read again: its weights, not its cache' '
	hi3 -q -t 2 -m m bench --prompt-len 16 --new 3 --reps 1 --json >j32 &&
	hi3 -q -t 2 -m m bench --prompt-len 16 --new 3 --reps 1 --kv-dtype bf16 --json >j16 &&
	w32=$("$TT" json decode_weights_mb <j32) && w16=$("$TT" json decode_weights_mb <j16) &&
	near "$w32" "$w16" 1e-9 &&
	b32=$("$TT" json step_bytes_mb <j32) && b16=$("$TT" json step_bytes_mb <j16) &&
	r32=$(awk -v b="$b32" -v w="$w32" "BEGIN { print b - w }") &&
	r16=$(awk -v b="$b16" -v w="$w16" "BEGIN { print b - w }") &&
	le 1e-6 "$r16" && le "$r16" "$r32" && ! le "$r32" "$r16" &&
	le 1e-6 "$("$TT" json decode_weights_again_median_ms <j32)" &&
	hi3 -q -t 2 -m m bench --prompt-len 16 --new 3 --reps 1 >t &&
	test_grep "^  the step'"'"'s weights read again  *[0-9.]* ms/step (median; [0-9.]* MB), [0-9.]*x the floor between; products [0-9.]*x it" t &&
	hi3 -q -t 2 -m m bench --batch 2 --prompt-len 16 --new 3 --reps 1 --json >j2 &&
	! grep decode_weights j2
'

# The figures are the machine's: the bench names its processor (as
# /proc/cpuinfo does, where there is one) and the threads the steps ran on.
test_expect_success 'the processor and the threads are named, in the JSON and the table' '
	hi3 -q -t 2 -m m bench --prompt-len 16 --new 1 --reps 1 --json >j &&
	test "$("$TT" json threads <j)" = 2 &&
	cpu=$("$TT" json cpu <j) && test -n "$cpu" &&
	if name=$(sed -n "s/^model name[[:space:]]*: *//p" /proc/cpuinfo 2>/dev/null | head -n 1) && test -n "$name"
	then
		case "$cpu" in "$name"*) ;; *) echo "cpu \"$cpu\" is not /proc/cpuinfo'"'"'s \"$name\""; false ;; esac
	fi &&
	hi3 -q -t 1 -m m bench --prompt-len 16 --new 1 --reps 1 >t &&
	test_grep "^  processor  *.*, 1 thread\$" t
'

test_expect_success 'a missing model: exit 3, the file named' '
	test_must_fail 3 hi3 -m nowhere bench --new 1 2>err &&
	test_grep "nowhere/config.json" err
'

# The threads' round trip (B = 1, after each step's floor read): a time,
# the median at most the largest; none with one thread or at B > 1.
test_expect_success 'the threads'"'"' round trip: two threads at B = 1 only' '
	hi3 -q -t 2 -m m bench --prompt-len 8 --new 3 --reps 1 --json >j &&
	rt=$("$TT" json core_round_trip_ns <j) && mx=$("$TT" json core_round_trip_max_ns <j) &&
	le 1 "$rt" && le "$rt" "$mx" &&
	hi3 -q -t 2 -m m bench --prompt-len 8 --new 3 --reps 1 >t &&
	test_grep "^  threads'"'"' round trip  *[0-9]* ns (median after the steps; largest [0-9]* ns)" t &&
	hi3 -q -t 1 -m m bench --prompt-len 8 --new 3 --reps 1 --json >j1 &&
	! grep core_round_trip j1 &&
	hi3 -q -t 2 -m m bench --batch 2 --prompt-len 8 --new 3 --reps 1 --json >j2 &&
	! grep core_round_trip j2
'

test_done
