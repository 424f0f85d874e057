#!/usr/bin/env bash
# prefill and decode from the command line: pipelines, crash-resume, split
# decoding, finished rows, and the bad inputs each stage must refuse (exit 3,
# nothing damaged).
. "$SRCDIR/tests/lib.sh"
J() { "$BUILDDIR/tests/test-tools" json "$@"; }
T() { "$BUILDDIR/tests/test-tools" "$@"; }

REQ_SEED=777

test_expect_success 'models and conditions' '
	make_model tiny-moe tm && make_model tiny tt &&
	requests 13 37 64 51 >req.jsonl &&
	hi3 -q -m tm tokenize-concat req.jsonl -o cond.st
'

test_expect_success 'pipeline: JSONL | tokenize-concat | prefill; decode to stdout | inspect' '
	printf "{\"prompt\": \"a red fox\"}\n{\"prompt\": \"two cats on a mat\", \"seed\": 3}\n" |
		hi3 -q -m tm tokenize-concat - -o - | tee p.cond | hi3 -q -m tm prefill - -o p.kv --max-new 6 &&
	hi3 -q -m tm decode --temperature 0.8 p.cond p.kv -o - | hi3 inspect - >seg.txt &&
	grep -q "format: hi3.segment" seg.txt && grep -q "cu_seqlens" seg.txt
'

test_expect_success 'prefill writes the KV file of hi3-files(5)' '
	hi3 -q -m tm prefill cond.st -o kv.st --max-new 20 &&
	hi3 inspect --json kv.st >kv.json &&
	test "$(J format <kv.json)" = hi3.kv &&
	test "$(J "tensors/name=k.0/shape" <kv.json)" = "[4,2,84,32]" &&
	hi3 inspect --tensor kv_len kv.st | tail -n 1 | grep -q "13 37 64 51"
'

test_expect_success 'decode: rows finish at different steps, finished rows stop, others go on' '
	cp kv.st kvf.st &&
	hi3 -q -m tm decode cond.st kv.st -o ref.seg &&
	first=$(hi3 inspect --tensor tokens --slice 0 ref.seg | tail -n 1) &&
	cp kvf.st kvs.st &&
	hi3 -q -m tm decode --stop $first cond.st kvs.st -o stop.seg 2>err &&
	! grep "2 MiB pages" err &&
	hi3 inspect --tensor stop_reason stop.seg | tail -n 1 >reason &&
	hi3 inspect --tensor cu_seqlens stop.seg | tail -n 1 >cu &&
	cat reason cu &&
	read -r r0 rest <reason && test "$r0" = 1 &&
	read -r c0 c1 rest <cu && test "$c1" = 1 &&
	grep -q " 2" reason
'

test_expect_success 'decode split with --steps, then continued, equals one run' '
	cp kvf.st k2.st &&
	hi3 -q -m tm decode --steps 3 cond.st k2.st -o part.seg &&
	hi3 inspect --tensor stop_reason part.seg | tail -n 1 | grep -q "^0 0 0 0$" &&
	hi3 -q -m tm decode cond.st k2.st -o whole.seg &&
	cmp ref.seg whole.seg
'

test_expect_success 'reference for the crash tests: an uninterrupted sampled decode' '
	cp kvf.st kref.st &&
	hi3 -q -m tm decode --temperature 0.8 --top-k 20 --top-p 0.9 cond.st kref.st -o sref.seg
'

for kill in 0:0 4:2 11:3 19:0; do
	test_expect_success "decode killed (SIGKILL at step:rows $kill) and resumed equals an uninterrupted run" "
		cp kvf.st kk.st &&
		{ HI3_TEST_KILL_AT=$kill \"\$HI3\" -q -m tm decode --temperature 0.8 --top-k 20 --top-p 0.9 \\
			cond.st kk.st -o x.seg; rc=\$?; } &&
		test \$rc = 137 && test ! -e x.seg &&
		hi3 -q -m tm decode --resume --temperature 0.8 --top-k 20 --top-p 0.9 cond.st kk.st -o res.seg &&
		cmp sref.seg res.seg
	"
done

test_expect_success 'decode killed by a real kill -9 at a random moment resumes to the same segment' '
	hi3 -q -m tm prefill cond.st -o big.kv --max-new 200 &&
	cp big.kv big2.kv &&
	hi3 -q -m tm decode --no-fsync cond.st big.kv -o bigref.seg &&
	{ "$HI3" -q -m tm decode cond.st big2.kv -o x.seg & pid=$!; sleep 0.3; kill -9 $pid; wait $pid; true; } &&
	hi3 -q -m tm decode --resume cond.st big2.kv -o bigres.seg &&
	cmp bigref.seg bigres.seg
'

test_expect_success 'a KV file another process holds locked is refused, untouched' '
	hi3 -q -m tm prefill cond.st -o lk.kv --max-new 20 && cp lk.kv lk.orig &&
	{ flock -x lk.kv -c "touch held; sleep 3" & pid=$!; } &&
	for i in 1 2 3 4 5 6 7 8 9 10; do test -e held && break; sleep 0.2; done &&
	{ "$HI3" -m tm decode cond.st lk.kv -o lk2.seg 2>err; rc=$?; } &&
	wait $pid &&
	test $rc = 1 && grep -q "locked" err && test ! -e lk2.seg && cmp lk.kv lk.orig
'

test_expect_success 'decode on a finished batch: nothing to do, exit 0, says so' '
	hi3 -m tm decode cond.st kv.st -o again.seg 2>err &&
	grep -q "nothing to decode" err &&
	cmp ref.seg again.seg
'

test_expect_success 'bf16 cache: prefill and decode run, parity within the bf16 rounding' '
	hi3 -q -m tm prefill --kv-dtype bf16 cond.st -o b.kv --max-new 5 &&
	hi3 -q -m tm decode cond.st b.kv -o b.seg &&
	hi3 inspect --json b.kv >b.json && test "$(J "tensors/name=k.0/dtype" <b.json)" = BF16
'

# ---- bad input: exit 3, and the files stay as they were
test_expect_success 'KV file from another model is refused, untouched' '
	cp kvf.st other.kv && cp other.kv other.orig &&
	test_must_fail 3 hi3 -m tt decode cond.st other.kv -o o.seg 2>err &&
	grep -q "fingerprint" err && cmp other.kv other.orig && test ! -e o.seg
'

test_expect_success 'KV file of other conditions, or another B, is refused' '
	requests 13 37 64 52 >req2.jsonl && hi3 -q -m tm tokenize-concat req2.jsonl -o cond2.st &&
	test_must_fail 3 hi3 -m tm decode cond2.st other.kv -o o.seg 2>err &&
	grep -q "other conditions" err &&
	requests 13 37 >req3.jsonl && hi3 -q -m tm tokenize-concat req3.jsonl -o cond3.st &&
	test_must_fail 3 hi3 -m tm decode cond3.st other.kv -o o.seg 2>err &&
	grep -q "B = 4 rows" err && cmp other.kv other.orig && test ! -e o.seg
'

test_expect_success '--max-new larger than the cache is refused' '
	test_must_fail 3 hi3 -m tm decode --max-new 21 cond.st other.kv -o o.seg 2>err &&
	grep -q "larger than the cache" err && cmp other.kv other.orig
'

test_expect_success 'truncated KV file is refused, naming the file and tensor' '
	head -c 20000 other.kv >trunc.kv &&
	test_must_fail 3 hi3 -m tm decode cond.st trunc.kv -o o.seg 2>err &&
	grep -q "trunc.kv" err && test ! -e o.seg
'

test_expect_success 'conflicting sampling options are a usage error' '
	test_must_fail 2 hi3 -m tm decode --greedy --temperature 0.5 cond.st other.kv -o o.seg 2>err &&
	grep -q "conflicts" err && cmp other.kv other.orig
'

test_expect_success 'conditions made for another model are refused by prefill' '
	echo "x" >seg.out && cp seg.out seg.orig &&
	test_must_fail 3 hi3 -m tt prefill cond.st -o seg.out 2>err &&
	grep -q "fingerprint" err && cmp seg.out seg.orig
'

test_expect_success 'a token id outside the vocabulary is refused before prefill' '
	cp cond.st badtok.st && T poke badtok.st input_ids 1,3 99999 &&
	test_must_fail 3 hi3 -m tm prefill badtok.st -o bt.kv 2>err && test ! -e bt.kv
'

test_expect_success 'the ablation options warn that they reproduce a defect' '
	cp kvf.st w.kv && hi3 -m tm decode --decode-mask=none cond.st w.kv -o w.seg 2>err &&
	grep -q "reproduces a known upstream defect" err &&
	cp kvf.st w.kv && hi3 -m tm decode --token-placement=tail cond.st w.kv -o w.seg 2>err &&
	grep -q "reproduces a known upstream defect" err
'

test_expect_success 'an MoE layer of 2000 experts prefills and decodes (routing scratch sized by E)' '
	hi3 -q init-model --preset tiny-moe --seed 1 --set num_experts=2000 --set moe_intermediate_size=8 \
		--set num_hidden_layers=1 -o e2k &&
	requests 5 3 >e2k.jsonl &&
	hi3 -q -m e2k tokenize-concat e2k.jsonl -o e2k.st &&
	hi3 -q -m e2k prefill e2k.st -o e2k.kv --max-new 3 &&
	hi3 -q -m e2k decode --record-routing e2k.st e2k.kv -o e2k.seg &&
	hi3 inspect --json e2k.seg >e2k.json && grep -q routing_experts e2k.json
'

test_expect_success 'more experts than 16-bit routing ids hold is a config error naming the field' '
	test_must_fail 3 hi3 -q init-model --preset tiny-moe --set num_experts=40000 --set moe_intermediate_size=8 \
		--set num_hidden_layers=1 -o e40k 2>err &&
	grep -q "num_experts 40000" err && test ! -e e40k/model.safetensors
'

test_done
