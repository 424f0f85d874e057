#!/usr/bin/env bash
# t2220-import-rollout.sh -- hi3 import-rollout: other engines' rollouts
# (vLLM RequestOutput, OpenAI-style choices, SGLang /generate; the fields
# of hi3-import-rollout(1)) into conditions and a segment. hi3's own rollout
# exported in each engine's fields imports to a zero gap, routing included;
# hand-written rollouts (tests/fixtures/rollout) import to the tokens,
# log-probs, finish reasons and experts they hold; bad input is refused.
. "$SRCDIR/tests/lib.sh"
J() { "$BUILDDIR/tests/test-tools" json "$@"; }
T() { "$BUILDDIR/tests/test-tools" "$@"; }
R="$FIXTURES/rollout"
# every value of a tensor on one line
vals() { hi3 inspect --tensor "$1" "$2" | sed 1d | sed "s/^\[[^]]*\] //" | tr "\n" " " | sed "s/ $//"; }

REQ_SEED=4242

test_expect_success 'a rollout of hi3 with its routing' '
	make_model tiny-moe tm &&
	requests 13 37 20 >req.jsonl &&
	hi3 -q -m tm tokenize-concat req.jsonl -o c.st &&
	hi3 -q -m tm prefill c.st -o k.st --max-new 10 &&
	hi3 -q -m tm decode --temperature 0.8 --stop 7,11,42 --record-routing c.st k.st -o s.st
'

for fmt in vllm openai sglang; do
	test_expect_success "$fmt: hi3's own rollout imports to a zero gap, its routing replayed without a flip" '
		T rollout c.st s.st '$fmt' >'$fmt'.jsonl &&
		hi3 -q -m tm import-rollout --json '$fmt'.jsonl -o ic.st --segment is.st >sum.json &&
		test "$(J rows <sum.json)" = 3 && test "$(J source <sum.json)" = '$fmt' &&
		test "$(J routed_experts <sum.json)" = true &&
		hi3 diff --tensor input_ids --tensor real_pos --tensor rope_pos --tensor seeds c.st ic.st >/dev/null &&
		hi3 diff --atol 0 --tensor tokens --tensor logprobs --tensor cu_seqlens --tensor stop_reason \
			--tensor routing_experts s.st is.st >/dev/null &&
		hi3 -q -m tm replay --threshold 0 ic.st is.st -o r.st >rep.json &&
		test "$(J overall/max_abs_dlogp <rep.json)" = 0.0 && test "$(J overall/mismatch/k3_kl <rep.json)" = 0.0 &&
		hi3 -q -m tm replay --routing=recorded ic.st is.st -o rr.st >rep.json &&
		test "$(J overall/routing_flips <rep.json)" = 0 && test "$(J overall/max_abs_dlogp <rep.json)" = 0.0
	'
done

test_expect_success 'an imported rollout replays and traces like hi3 own' '
	hi3 -q -m tm replay --trace a.trace --trace-rows 1 c.st s.st -o ra.st >/dev/null &&
	hi3 -q -m tm replay --trace b.trace --trace-rows 1 ic.st is.st -o rb.st >/dev/null &&
	hi3 diff --first a.trace b.trace >/dev/null
'

test_expect_success 'vLLM RequestOutput: every output a row; logprob dicts, plain numbers; experts from row P + j' '
	hi3 -q -m tm import-rollout "$R/vllm.jsonl" -o vc.st --segment vs.st &&
	test "$(hi3 inspect --tensor tokens vs.st | tail -n 1)" = "5 8 300 7" &&
	test "$(hi3 inspect --tensor logprobs vs.st | tail -n 1)" = "-0.25 -1.5 -1.25 -0.125" &&
	test "$(hi3 inspect --tensor stop_reason vs.st | tail -n 1)" = "1 2" &&
	test "$(hi3 inspect --tensor seeds vc.st | tail -n 1)" = "11 11" &&
	test "$(vals routing_experts vs.st)" = "0 2 1 3 1 3 0 2 -1 -1 -1 -1 -1 -1 -1 -1" &&
	hi3 inspect --json vs.st >v.json && test "$(J metadata/routing_weights <v.json)" = none &&
	test "$(J tensors/name=routing_weights/nan <v.json)" = 16
'

test_expect_success 'OpenAI choices: token_logprobs and content[]; prompt_routed_experts beside routed_experts' '
	hi3 -q -m tm import-rollout "$R/openai.jsonl" -o oc.st --segment os.st &&
	test "$(hi3 inspect --tensor logprobs os.st | tail -n 1)" = "-0.25 -1.5 -1.25 -2 -0.0625" &&
	test "$(hi3 inspect --tensor real_pos oc.st | tail -n 1)" = "4 2" &&
	test "$(vals routing_experts os.st)" = \
		"0 2 1 3 1 3 0 2 -1 -1 -1 -1 1 0 3 2 -1 -1 -1 -1"
'

test_expect_success 'SGLang /generate: output_token_logprobs, finish_reason type, base64 routed experts' '
	hi3 -q -m tm import-rollout --json "$R/sglang.jsonl" -o sc.st --segment ss.st >sum.json &&
	test "$(J source <sum.json)" = sglang &&
	test "$(hi3 inspect --tensor logprobs ss.st | tail -n 1)" = "-0.25 -1.5 -1.25" &&
	test "$(vals routing_experts ss.st)" = "0 2 1 3 1 3 0 2 -1 -1 -1 -1" &&
	hi3 -q -m tm replay --routing=recorded sc.st ss.st -o sr.st >rep.json &&
	test "$(J overall/tokens <rep.json)" = 3 && test "$(J overall/mismatch/kl <rep.json)" != null &&
	test_must_fail 3 hi3 -q -m tm replay --routing=recorded --routing-weights=recorded sc.st ss.st -o x.st 2>err &&
	test_grep "no routing weights" err
'

test_expect_success 'bad rollouts: exit 3 naming the file and line, nothing written' '
	bad() { printf "%s\n" "$@" >bad.jsonl; test_must_fail 3 hi3 -q -m tm import-rollout bad.jsonl -o x.st --segment y.st 2>err; }
	ok1="{\"prompt_token_ids\": [1, 2], \"token_ids\": [3], \"logprobs\": [-1]}" &&
	bad "$ok1" "{\"prompt_token_ids\": [1, 2" && test_grep "bad.jsonl:2: not a JSON object" err &&
	bad "{\"token_ids\": [3], \"logprobs\": [-1]}" && test_grep "bad.jsonl:1: no prompt token ids" err &&
	bad "{\"prompt_token_ids\": [1], \"token_ids\": [3, 4], \"logprobs\": [-1]}" && test_grep "1 log-probs for 2" err &&
	bad "{\"prompt_token_ids\": [1], \"token_ids\": [600], \"logprobs\": [-1]}" && test_grep "\[0, 512)" err &&
	bad "{\"prompt_token_ids\": [1], \"token_ids\": [3], \"logprobs\": [{\"4\": -1}]}" &&
	test_grep "the sampled token is not among" err &&
	bad "{\"prompt_token_ids\": [1], \"token_ids\": [3], \"logprobs\": [0.5]}" && test_grep "finite log-prob" err &&
	bad "{\"prompt_token_ids\": [1], \"output_ids\": [3], \"meta_info\": {\"output_token_logprobs\": [[-1, 4, null]]}}" &&
	test_grep "given for another token id" err &&
	bad "{\"prompt_token_ids\": [1], \"token_ids\": [3, 4], \"logprobs\": [-1, -1], \"routed_experts\": [[[0, 1, 2], [0, 1, 2]], [[0, 1, 2], [0, 1, 2]]]}" &&
	test_grep "top-3); the model has 2 layers, 2 of them MoE, top-2" err &&
	bad "{\"prompt_token_ids\": [1], \"token_ids\": [3, 4], \"logprobs\": [-1, -1], \"routed_experts\": [[[0, 1], [0, 1]], [[0, 1], [0, 9]]]}" &&
	test_grep "expert 9 of 4" err &&
	bad "$ok1" "{\"prompt_token_ids\": [1], \"token_ids\": [3], \"logprobs\": [-1], \"routed_experts\": [[[0, 1], [0, 1]]]}" &&
	test_grep "2 of 2 rows carry routed experts\|1 of 2 rows carry routed experts" err &&
	test ! -e x.st && test ! -e y.st &&
	test_must_fail 3 hi3 -q -m tm import-rollout no-such.jsonl -o x.st --segment y.st 2>err && test_grep "no-such.jsonl" err &&
	test_must_fail 2 hi3 -q -m tm import-rollout "$R/vllm.jsonl" -o x.st 2>err
'

test_expect_success 'a bad rollout leaves existing outputs as they were; one file for both is refused' '
	echo old-cond >x.st && echo old-seg >y.st && cp x.st x0 && cp y.st y0 &&
	printf "%s\n" "{\"prompt_token_ids\": [1], \"token_ids\": [3], \"logprobs\": [-1]}" "{\"prompt_token_ids\": [1" >bad.jsonl &&
	test_must_fail 3 hi3 -q -m tm import-rollout bad.jsonl -o x.st --segment y.st 2>err &&
	test_grep "bad.jsonl:2" err && test_cmp x0 x.st && test_cmp y0 y.st &&
	test_must_fail 2 hi3 -q -m tm import-rollout "$R/vllm.jsonl" -o x.st --segment x.st 2>err &&
	test_grep "three different files" err && test_cmp x0 x.st &&
	test_must_fail 2 hi3 -q -m tm import-rollout "$R/vllm.jsonl" -o x.st --segment ./x.st 2>err && test_cmp x0 x.st
'

test_done
