#!/bin/bash
# t3100-diff.sh -- hi3 diff: locations, tolerances, --valid-only, --row,
# segments, JSON, bad input.
. "$SRCDIR/tests/lib.sh"
TT="$BUILDDIR/tests/test-tools"

# Two rows (identities 7 and 9, prompts 8 and 5, 2 generated each), L 8, C 12.
# Rows are made from their identity: a B = 1 file of row 9 agrees with row 1
# on the valid slots. Invalid slots depend on the salt.
mkkv() { "$TT" kv "$@"; }

test_expect_success 'identical kv files: exit 0, every tensor within tolerance' '
	mkkv a.kv ids=7,9 lens=8,5 gen=2,2 L=8 C=12 salt=1 &&
	mkkv b.kv ids=7,9 lens=8,5 gen=2,2 L=8 C=12 salt=1 &&
	hi3 diff a.kv b.kv >out &&
	test "$(grep -c "max|d|=0.00e+00  (0/" out)" = 10 &&
	test_grep "^summary: all 10 tensors within tolerance" out
'

test_expect_success 'a difference at slot 0 of row 1: exit 1, the place named row, head, slot, col' '
	cp b.kv p.kv && "$TT" poke p.kv k.0 1,0,0,5 3.81 &&
	test_must_fail 1 hi3 diff a.kv p.kv >out &&
	test_grep "^k\.0  *max|d|=[0-9.e+]* at row 1, head 0, slot 0, col 5 (a=[-0-9.e]* b=3\.81)  (1/384 over tol)\$" out &&
	test_grep "^summary: 1 of 10 tensors differ .*; first: k\.0; worst: k\.0 max|d|=.* at row 1, head 0, slot 0, col 5\$" out &&
	test "$(grep -c "(0/" out)" = 9
'

test_expect_success '--json names the same place' '
	test_must_fail 1 hi3 diff --json a.kv p.kv >j &&
	"$TT" json <j &&
	test "$("$TT" json equal <j)" = false &&
	test "$("$TT" json first <j)" = k.0 &&
	test "$("$TT" json tensors/name=k.0/status <j)" = over &&
	test "$("$TT" json tensors/name=k.0/worst/where <j)" = "{\"row\":1,\"head\":0,\"slot\":0,\"col\":5}" &&
	test "$("$TT" json tensors/name=k.0/worst/index <j)" = "[1,0,0,5]" &&
	test "$("$TT" json tensors/name=k.0/over <j)" = 1 &&
	test "$("$TT" json tensors/name=v.0/status <j)" = ok
'

test_expect_success 'the worst place is reported, and the first over tolerance when elsewhere' '
	cp b.kv q.kv && "$TT" poke q.kv v.1 0,1,3,2 100 && "$TT" poke q.kv v.1 1,0,6,7 200 &&
	test_must_fail 1 hi3 diff q.kv a.kv >out &&
	test_grep "^v\.1 .* at row 1, head 0, slot 6, col 7 .*(2/384 over tol; first at row 0, head 1, slot 3, col 2)\$" out
'

test_expect_success 'layers are listed first, in pipeline order' '
	hi3 diff a.kv b.kv | cut -d" " -f1 | head -4 >order &&
	printf "k.0\nv.0\nk.1\nv.1\n" >want && test_cmp want order
'

test_expect_success 'pads differ: a plain diff finds them, --valid-only ignores them' '
	mkkv c.kv ids=7,9 lens=8,5 gen=2,2 L=8 C=12 salt=2 &&
	test_must_fail 1 hi3 diff a.kv c.kv >out &&
	test_grep "^k\.0 .*first at row 0, head 0, slot 10, col 0)" out &&
	test_grep "^gen_tokens .* at row 0, step 2 " out &&
	hi3 diff --valid-only a.kv c.kv >out &&
	test_grep "^summary: all 10 tensors within tolerance (atol=1e-05 rtol=0, valid slots only)" out &&
	test_grep "^k\.0  *max|d|=0.00e+00  (0/272 over tol)" out
'

test_expect_success '--valid-only still finds a difference in a valid slot' '
	cp c.kv cv.kv && "$TT" poke cv.kv v.0 1,1,6,0 5 &&
	test_must_fail 1 hi3 diff --valid-only a.kv cv.kv >out &&
	test_grep "^v\.0 .* at row 1, head 1, slot 6, col 0 " out
'

test_expect_success '--row 1:0 against a B = 1 file: equal over the valid slots' '
	mkkv one.kv ids=9 lens=5 gen=2 L=5 C=9 salt=3 &&
	hi3 diff --row 1:0 a.kv one.kv >out &&
	test_grep "^summary: all 10 tensors within tolerance (atol=1e-05 rtol=0, valid slots only, row 1 of A vs row 0 of B)" out &&
	test_grep "^k\.0  *max|d|=0.00e+00  (0/112 over tol)" out &&
	test_must_fail 1 hi3 diff --row 0:0 a.kv one.kv >out
'

test_expect_success '--row 1:0 reports a planted difference in A coordinates' '
	cp one.kv one-p.kv && "$TT" poke one-p.kv k.1 0,1,3,2 -9 &&
	test_must_fail 1 hi3 diff --row 1:0 a.kv one-p.kv >out &&
	test_grep "^k\.1 .* at row 1, head 1, slot 3, col 2 (a=[-0-9.e]* b=-9)  (1/112 over tol)" out &&
	test_must_fail 1 hi3 diff --row 1:0 --json a.kv one-p.kv >j &&
	test "$("$TT" json rows <j)" = "[1,0]" &&
	test "$("$TT" json tensors/name=k.1/worst/index <j)" = "[1,1,3,2]"
'

test_expect_success '--row: a row with other valid lengths shows in kv_len' '
	mkkv short.kv ids=9 lens=5 gen=1 L=5 C=9 salt=3 &&
	test_must_fail 1 hi3 diff --row 1:0 a.kv short.kv >out &&
	test_grep "^kv_len .* at row 1 (a=7 b=6)" out &&
	test_grep "^k\.0  *max|d|=0.00e+00  (0/96 over tol)" out
'

test_expect_success '--tensor restricts the comparison' '
	test_must_fail 1 hi3 diff --tensor k.0 a.kv p.kv >out &&
	test "$(wc -l <out)" = 2 &&
	hi3 diff --tensor v.0 --tensor kv_len a.kv p.kv >out &&
	test "$(wc -l <out)" = 3 &&
	test_must_fail 2 hi3 diff --tensor nope a.kv p.kv 2>e && test_grep "nope" e
'

test_expect_success '--atol and --rtol: |a-b| > atol + rtol |b|' '
	"$TT" kv n1.kv ids=7,9 lens=8,5 gen=2,2 L=8 C=12 salt=1 &&
	hi3 inspect --json --tensor next_logits --slice 0,3 n1.kv >v && x=$("$TT" json values <v) &&
	cp n1.kv n2.kv && "$TT" poke n2.kv next_logits 0,3 "$(awk -v x="$x" "BEGIN { printf \"%.9g\", x + 0.001 }")" &&
	test_must_fail 1 hi3 diff --tensor next_logits n1.kv n2.kv &&
	hi3 diff --tensor next_logits --atol 0.002 n1.kv n2.kv &&
	test_must_fail 1 hi3 diff --tensor next_logits --atol 0.0005 n1.kv n2.kv &&
	hi3 diff --tensor next_logits --atol 0 --rtol 1 n1.kv n2.kv
'

test_expect_success 'NaN equals NaN; NaN against a number differs' '
	cp b.kv na.kv && cp b.kv nb.kv &&
	"$TT" poke na.kv k.0 0,0,0,0 nan && "$TT" poke nb.kv k.0 0,0,0,0 nan &&
	hi3 diff na.kv nb.kv &&
	test_must_fail 1 hi3 diff na.kv b.kv >out &&
	test_grep "^k\.0  *max|d|=inf at row 0, head 0, slot 0, col 0 (a=nan b=" out
'

test_expect_success 'a tensor only in one file, or of another dtype or shape, differs' '
	mkkv bf.kv ids=7,9 lens=8,5 gen=2,2 L=8 C=12 salt=1 bf16 &&
	test_must_fail 1 hi3 diff a.kv bf.kv >out &&
	test_grep "^k\.0  *dtype differs: A F32, B BF16\$" out &&
	test_must_fail 1 hi3 diff a.kv one.kv >out &&
	test_grep "^k\.0  *shape differs: A (2, 2, 12, 8), B (1, 2, 9, 8)\$" out &&
	"$TT" seg s.seg 7,9 3,5 &&
	test_must_fail 1 hi3 diff a.kv s.seg >out &&
	test_grep "^format differs: A .hi3\.kv., B .hi3\.segment.\$" out &&
	test_grep "^tokens  *only in B" out && test_grep "^k\.0  *only in A" out
'

test_expect_success 'segments: places named row and pos through cu_seqlens' '
	"$TT" seg s2.seg 7,9 3,5 && "$TT" poke s2.seg logprobs 4 0.5 &&
	test_must_fail 1 hi3 diff s.seg s2.seg >out &&
	test_grep "^logprobs .* at row 1, pos 1 " out &&
	test_must_fail 1 hi3 diff --json s.seg s2.seg >j &&
	test "$("$TT" json tensors/name=logprobs/worst/where <j)" = "{\"row\":1,\"pos\":1}"
'

test_expect_success 'segments: --row I:J compares the rows spans' '
	"$TT" seg s1.seg 9 5 && hi3 diff --row 1:0 s.seg s1.seg >out &&
	test_grep "^cu_seqlens  *skipped" out &&
	cp s1.seg s1p.seg && "$TT" poke s1p.seg tokens 2 499 &&
	test_must_fail 1 hi3 diff --row 1:0 s.seg s1p.seg >out &&
	test_grep "^tokens .* at row 1, pos 2 (a=[0-9]* b=499)  (1/5 over tol)" out &&
	"$TT" seg s4.seg 9 4 &&
	test_must_fail 1 hi3 diff --row 1:0 s.seg s4.seg >out &&
	test_grep "^tokens  *row length differs: A 5, B 4; over the first 4: max|d|=0.00e+00  (0/4 over tol)" out
'

test_expect_success 'usage errors exit 2' '
	test_must_fail 2 hi3 diff a.kv &&
	test_must_fail 2 hi3 diff --row 2:0 a.kv one.kv 2>e && test_grep "rows 0 to 1" e &&
	test_must_fail 2 hi3 diff --row 1 a.kv one.kv &&
	test_must_fail 2 hi3 diff --row 1:x a.kv one.kv &&
	test_must_fail 2 hi3 diff --atol -1 a.kv b.kv &&
	test_must_fail 2 hi3 diff --rtol nan a.kv b.kv &&
	test_must_fail 2 hi3 diff --valid-only s.seg s1.seg 2>e && test_grep "hi3\.kv" e
'

test_expect_success 'an unreadable file: exit 3 naming it, nothing on standard output' '
	head -c 1000 a.kv >trunc.kv &&
	test_must_fail 3 hi3 diff a.kv trunc.kv >o 2>e &&
	test ! -s o && test_grep "trunc\.kv" e &&
	test_must_fail 3 hi3 diff --json trunc.kv a.kv >o 2>e &&
	test ! -s o && test_grep "trunc\.kv" e &&
	test_must_fail 3 hi3 diff a.kv nowhere.kv 2>e && test_grep "nowhere\.kv" e &&
	ls >after && test_grep -vc "\.tmp\." after
'

test_expect_success 'a kv file whose kv_len is out of range is refused with --valid-only' '
	cp a.kv badlen.kv && "$TT" poke badlen.kv kv_len 1 13 &&
	test_must_fail 3 hi3 diff --valid-only badlen.kv a.kv 2>e &&
	test_grep "badlen\.kv: tensor .kv_len.: row 1: 13 is outside \[0, 12\]" e
'

test_expect_success 'model checkpoints: other seeds differ everywhere, places are plain indices' '
	make_model tiny m1 && make_model tiny m2 --seed 2 &&
	hi3 diff m1/model.safetensors m1/model.safetensors >out &&
	test_grep "^summary: all [0-9]* tensors within tolerance" out &&
	test_must_fail 1 hi3 diff m1/model.safetensors m2/model.safetensors >out &&
	test_grep "^model\.wte\.weight  *max|d|=[0-9.e+]* at \[[0-9]*, [0-9]*\] " out &&
	test_grep "^lm_head\.weight " out
'

test_expect_success '--help shows the usage line that the man page synopsis has' '
	hi3 diff --help >h &&
	u=$(head -1 h | sed "s/^usage: //") &&
	sed -n "/^\.SH SYNOPSIS/,/^\.SH DESCRIPTION/p" "$SRCDIR/man/hi3-diff.1" | sed "s/\\\\-/-/g" >syn &&
	grep -Fx "$u" syn
'

test_done
