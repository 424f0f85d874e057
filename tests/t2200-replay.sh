#!/usr/bin/env bash
# hi3 replay: teacher-forced log-probs equal the rollout's, per row and
# batched, greedy and sampled; an altered token shows the gap exactly there;
# routing replay; and the bad inputs replay refuses.
. "$SRCDIR/tests/lib.sh"
J() { "$BUILDDIR/tests/test-tools" json "$@"; }
T() { "$BUILDDIR/tests/test-tools" "$@"; }

REQ_SEED=4242

for preset in tiny tiny-moe; do
	for new in 5 20; do
		for mode in greedy sampled; do
			case $mode in greedy) samp= ;; sampled) samp="--temperature 0.8 --top-p 0.9 --top-k 20" ;; esac
			test_expect_success "$preset, $new new tokens, $mode: replay reproduces the rollout log-probs" "
				make_model $preset $preset &&
				requests 13 37 64 51 >req.jsonl &&
				hi3 -q -m $preset tokenize-concat req.jsonl -o c.st &&
				hi3 -q -m $preset prefill c.st -o k.st --max-new $new &&
				hi3 -q -m $preset decode $samp --stop 7,11,42,99,128,200 c.st k.st -o s.st &&
				hi3 -q -m $preset replay --threshold 1e-5 c.st s.st -o r.st >rep.json &&
				test \"\$(J overall/tokens <rep.json)\" -gt 4 &&
				test \"\$(J overall/max_abs_dlogp <rep.json)\" = 0.0 &&
				test \"\$(J overall/ratio/min <rep.json)\" = 1.0 &&
				hi3 -q -m $preset replay --batched c.st s.st -o rb.st >repb.json &&
				hi3 diff --atol 0 r.st rb.st >/dev/null &&
				hi3 diff --atol 0 --tensor logprobs s.st r.st >/dev/null
			"
		done
	done
done

test_expect_success 'rows finishing at different steps are reported per row; empty responses as such' '
	requests 13 37 64 51 >req.jsonl &&
	hi3 -q -m tiny-moe tokenize-concat req.jsonl -o c.st &&
	hi3 -q -m tiny-moe prefill c.st -o k.st --max-new 20 &&
	hi3 -q -m tiny-moe decode --steps 1 c.st k.st -o s1.st &&
	stop=$(hi3 inspect --tensor tokens --slice 2 s1.st | tail -n 1) &&
	hi3 -q -m tiny-moe prefill c.st -o k.st --max-new 20 &&
	hi3 -q -m tiny-moe decode --stop $stop c.st k.st -o s.st &&
	hi3 -q -m tiny-moe replay c.st s.st -o r.st >rep.json &&
	set -- $(hi3 inspect --tensor cu_seqlens s.st | tail -n 1) &&
	test "$(J rows/0/tokens <rep.json)" = $(($2 - $1)) && test "$(J rows/1/tokens <rep.json)" = $(($3 - $2)) &&
	test "$(J rows/2/tokens <rep.json)" = 1 && test "$(J rows/3/tokens <rep.json)" = $(($5 - $4)) &&
	test $(($5 - $1)) -gt 4 &&
	hi3 -q -m tiny-moe prefill c.st -o k0.st --max-new 0 &&
	hi3 -q -m tiny-moe decode c.st k0.st -o s0.st 2>/dev/null &&
	hi3 -q -m tiny-moe replay c.st s0.st -o r0.st >rep0.json &&
	test "$(J rows/0/empty <rep0.json)" = true && test "$(J overall/empty_rows <rep0.json)" = 4
'

test_expect_success 'an altered token shows the gap at exactly that token' '
	hi3 -q -m tiny-moe prefill c.st -o k.st --max-new 20 &&
	hi3 -q -m tiny-moe decode --stop 999 c.st k.st -o s.st &&
	set -- $(hi3 inspect --tensor cu_seqlens s.st | tail -n 1) &&
	test $(($3 - $2)) -gt 5 &&
	at=$(($2 + 5)) &&
	cp s.st alt.st &&
	old=$(hi3 inspect --tensor tokens --slice $at alt.st | tail -n 1) &&
	T poke alt.st tokens $at $(( (old + 1) % 256 )) &&
	hi3 -q -m tiny-moe replay c.st alt.st -o ra.st >rep.json &&
	test "$(J overall/worst_row <rep.json)" = 1 &&
	test "$(J rows/0/max_abs_dlogp <rep.json)" = 0.0 &&
	{ hi3 diff --tensor logprobs alt.st ra.st >d.txt; test $? = 1; } &&
	grep -q "first at row 1, pos 5)" d.txt &&
	test_must_fail 1 hi3 -m tiny-moe replay --threshold 1e-5 c.st alt.st -o ra2.st >/dev/null
'

test_expect_success 'recorded routing round-trips: forcing it changes nothing in f32' '
	hi3 -q -m tiny-moe prefill c.st -o k.st --max-new 20 &&
	hi3 -q -m tiny-moe decode --record-routing --temperature 0.8 c.st k.st -o sr.st &&
	hi3 inspect --json sr.st >sr.json &&
	test "$(J "tensors/name=routing_experts/dtype" <sr.json)" = I16 &&
	hi3 -q -m tiny-moe replay --routing=recorded c.st sr.st -o rr.st >rep.json &&
	test "$(J overall/routing_flips <rep.json)" = 0 &&
	test "$(J overall/max_abs_dlogp <rep.json)" = 0.0 &&
	test "$(J overall/max_abs_dlogp_free_routing <rep.json)" = 0.0 &&
	hi3 -q -m tiny-moe replay --routing=recorded --routing-weights=recorded c.st sr.st -o rw.st >rep2.json &&
	test "$(J overall/max_abs_dlogp <rep2.json)" = 0.0
'

test_expect_success 'prompt routing: prefill --record-routing equals replay --record-routing' '
	hi3 -q -m tiny-moe prefill --record-routing c.st -o kr.st --max-new 6 &&
	hi3 -q -m tiny-moe decode --record-routing c.st kr.st -o sr.st &&
	hi3 -q -m tiny-moe replay --record-routing c.st sr.st -o rr.st >/dev/null &&
	set -- $(hi3 inspect --tensor prompt_cu_seqlens rr.st | tail -n 1) &&
	hi3 inspect --tensor prompt_route_ids --slice 1,0:12 kr.st | sed 1d | sed "s/^.*\] //" >a &&
	hi3 inspect --tensor prompt_routing_experts --slice $2:$(($2 + 12)) rr.st | sed 1d | sed "s/^.*\] //" >b &&
	test -s a && test_cmp a b
'

test_expect_success 'bf16 weights and cache: finite figures; routing replay never increases the max gap' '
	make_model tiny-moe tmb --dtype bf16 &&
	hi3 -q -m tmb tokenize-concat req.jsonl -o cb.st &&
	hi3 -q -m tmb prefill --kv-dtype bf16 cb.st -o kb.st --max-new 20 &&
	hi3 -q -m tmb decode --record-routing --temperature 0.8 cb.st kb.st -o sb.st &&
	hi3 -q -m tmb replay --routing=recorded cb.st sb.st -o rb.st >rep.json &&
	free=$(J overall/max_abs_dlogp_free_routing <rep.json) &&
	forced=$(J overall/max_abs_dlogp <rep.json) &&
	echo "free $free forced $forced flips $(J overall/routing_flips <rep.json)" &&
	awk -v f="$free" -v r="$forced" "BEGIN { exit !(f == f + 0 && r == r + 0 && f < 1e30 && r <= f) }" &&
	test "$(J overall/ratio/mean <rep.json)" != null
'

test_expect_success 'bad input: segment from another model, other conditions, another B' '
	make_model tiny tt &&
	test_must_fail 3 hi3 -m tt replay c.st s.st -o x.st 2>err && grep -q fingerprint err &&
	requests 13 37 64 50 >req2.jsonl && hi3 -q -m tiny-moe tokenize-concat req2.jsonl -o c2.st &&
	test_must_fail 3 hi3 -m tiny-moe replay c2.st s.st -o x.st 2>err && grep -q "other conditions" err &&
	requests 13 37 >req3.jsonl && hi3 -q -m tiny-moe tokenize-concat req3.jsonl -o c3.st &&
	test_must_fail 3 hi3 -m tiny-moe replay c3.st s.st -o x.st 2>err && grep -q "4 rows" err &&
	test ! -e x.st
'

test_expect_success 'bad input: a token outside the vocabulary, a truncated segment' '
	cp s.st oov.st && T poke oov.st tokens 3 70000 &&
	test_must_fail 3 hi3 -m tiny-moe replay c.st oov.st -o x.st 2>err && grep -q "outside the vocabulary" err &&
	head -c 300 s.st >trunc.st &&
	test_must_fail 3 hi3 -m tiny-moe replay c.st trunc.st -o x.st 2>err && grep -q "trunc.st" err &&
	echo keep >x.st && test_must_fail 3 hi3 -m tiny-moe replay c.st trunc.st -o x.st &&
	test "$(cat x.st)" = keep
'

test_expect_success 'routing replay without a recording is refused' '
	test_must_fail 3 hi3 -m tiny-moe replay --routing=recorded c.st s.st -o x2.st 2>err &&
	grep -q "record-routing" err &&
	test_must_fail 2 hi3 -m tiny-moe replay --routing-weights=recorded c.st s.st -o x2.st
'

test_done
