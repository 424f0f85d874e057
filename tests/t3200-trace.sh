#!/usr/bin/env bash
# t3200-trace.sh -- activation traces (prefill, decode, replay --trace) and
# hi3 diff --first: what a trace holds, that a row traces the same bits
# alone and batched (batch-invariant mode) and in decode and replay, and
# that the first difference names where a known change acts: a perturbed
# o_proj weight, --batch-invariant=off, the upstream defects, bf16, forced
# routing.
. "$SRCDIR/tests/lib.sh"
J() { "$BUILDDIR/tests/test-tools" json "$@"; }
T() { "$BUILDDIR/tests/test-tools" "$@"; }

REQ_SEED=4242
# Rows of 13, 37 and 20 tokens: row 0 and 2 are padded in the batch.
test_expect_success 'a model, a ragged batch, and each row alone' '
	make_model tiny-moe tm &&
	requests 13 37 20 >req.jsonl &&
	hi3 -q -m tm tokenize-concat req.jsonl -o c.st &&
	for r in 0 1 2; do
		sed -n "$((r + 1))p" req.jsonl >r$r.jsonl &&
		hi3 -q -m tm tokenize-concat r$r.jsonl -o c$r.st || return 1
	done
'

test_expect_success 'prefill --trace: every point of row 0, named and shaped as hi3-files(5) says' '
	hi3 -q -m tm prefill --trace p.trace c.st -o k.st --max-new 8 &&
	hi3 inspect --json p.trace >p.json &&
	test "$(J metadata/format <p.json)" = hi3.trace &&
	test "$(J metadata/stage <p.json)" = prefill &&
	test "$(J metadata/backend <p.json)" = cpu &&
	test "$(J metadata/batch_invariant <p.json)" = on &&
	test "$(J metadata/forward_shapes <p.json)" = 3x37 &&
	test "$(J tensors/name=rows/shape <p.json)" = "[13]" &&
	test "$(J tensors/name=embed/shape <p.json)" = "[13,128]" &&
	test "$(J tensors/name=layer.1.q/shape <p.json)" = "[13,128]" &&
	test "$(J tensors/name=layer.1.k/shape <p.json)" = "[13,64]" &&
	test "$(J tensors/name=layer.0.router_logits/shape <p.json)" = "[13,4]" &&
	test "$(J tensors/name=layer.0.experts/dtype <p.json)" = I16 &&
	test "$(J tensors/name=layer.0.expert_out/shape <p.json)" = "[13,2,128]" &&
	test "$(J tensors/name=logits.topk_ids/shape <p.json)" = "[13,16]" &&
	test "$(J tensors/name=logits.lse/shape <p.json)" = "[13]" &&
	hi3 inspect --tensor positions p.trace | tail -n 1 >pos &&
	echo "0 1 2 3 4 5 6 7 8 9 10 11 12" >want && test_cmp want pos
'

test_expect_success 'a trace agrees with the stage files: K/V with the cache, the last logits with next_logits' '
	hi3 inspect --tensor layer.0.k --slice 12,0:64 p.trace | tail -n 1 >a &&
	hi3 inspect --tensor k.0 --slice 0,0,12,: k.st | tail -n 1 >b &&
	hi3 inspect --tensor k.0 --slice 0,1,12,: k.st | tail -n 1 >>b &&
	tr "\n" " " <b | sed "s/ $//" >b1 && echo >>b1 && test_cmp a b1 &&
	hi3 inspect --tensor logits.topk_ids --slice 12,0 p.trace | tail -n 1 >a &&
	T argmax k.st next_logits 0 >b && test_cmp a b
'

test_expect_success '--trace-rows, --trace-positions and --trace-points choose what is kept' '
	hi3 -q -m tm prefill --trace s.trace --trace-rows 1,2 --trace-positions 0,5:8,30:99 \
		--trace-points attn_out,logits c.st -o k2.st --max-new 8 &&
	hi3 inspect --tensor rows s.trace | tail -n 1 >rows &&
	hi3 inspect --tensor positions s.trace | tail -n 1 >pos &&
	echo "1 1 1 1 1 1 1 1 1 1 1 2 2 2 2" >want && test_cmp want rows &&
	echo "0 5 6 7 30 31 32 33 34 35 36 0 5 6 7" >want && test_cmp want pos &&
	hi3 inspect s.trace | sed -n "s/^\([a-z_.0-9]*\)  *[FI][0-9]* .*/\1/p" | sort >names &&
	printf "layer.0.attn_out\nlayer.1.attn_out\nlogits.lse\nlogits.topk\nlogits.topk_ids\npositions\nrows\ntokens\n" >want &&
	test_cmp want names
'

# hi3-batching(7), rule 8: a row gives the same bits alone and batched.
for stage in prefill decode replay; do
	test_expect_success "$stage: a row alone and in the batch trace bitwise the same (batch-invariant)" '
		for r in 0 1 2; do hi3 -q -m tm prefill c$r.st -o k$r.st --max-new 6 || return 1; done &&
		hi3 -q -m tm prefill c.st -o kb.st --max-new 6 &&
		if test '$stage' = prefill; then
			hi3 -q -m tm prefill --trace b.trace --trace-rows 0,1,2 c.st -o kb.st --max-new 6 &&
			hi3 -q -m tm prefill --trace a.trace c2.st -o k2.st --max-new 6
		elif test '$stage' = decode; then
			hi3 -q -m tm decode --trace b.trace --trace-rows 0,1,2 c.st kb.st -o sb.st &&
			hi3 -q -m tm decode --trace a.trace c2.st k2.st -o s2.st
		else
			hi3 -q -m tm decode c.st kb.st -o sb.st && hi3 -q -m tm decode c2.st k2.st -o s2.st &&
			hi3 -q -m tm replay --batched --trace b.trace --trace-rows 0,1,2 c.st sb.st -o rb.st >/dev/null &&
			hi3 -q -m tm replay --trace a.trace c2.st s2.st -o r2.st >/dev/null
		fi &&
		hi3 diff --first --row 2:0 b.trace a.trace >out &&
		test_grep "^no difference: every point of the [0-9]* aligned tokens agrees bitwise" out &&
		test_grep "^summary: equal (35 points)" out
	'
done

test_expect_success 'decode against the replay of its segment: bitwise the same' '
	hi3 -q -m tm prefill c.st -o kd.st --max-new 8 &&
	hi3 -q -m tm decode --trace d.trace --trace-rows 0,1,2 c.st kd.st -o sd.st &&
	hi3 -q -m tm replay --trace r.trace --trace-rows 0,1,2 c.st sd.st -o rd.st >/dev/null &&
	hi3 diff --first --json d.trace r.trace >j &&
	test "$(J equal <j)" = true && test "$(J aligned <j)" = 21 && test "$(J only_b <j)" = 73 &&
	hi3 -q -m tm replay --trace p2.trace --trace-positions 0:13 c.st sd.st -o rd.st >/dev/null &&
	hi3 diff --first p.trace p2.trace >/dev/null
'

test_expect_success 'a perturbed o_proj weight is found at exactly that layer and point' '
	cp -r tm bad && T poke bad/model.safetensors model.layers.1.self_attn.o_proj.weight 5,17 0.5 &&
	hi3 -q -m bad prefill --trace bad.trace c.st -o kbad.st --max-new 8 &&
	test_must_fail 1 hi3 diff --first --json p.trace bad.trace >j &&
	test "$(J first/point <j)" = layer.1.attn_out &&
	test "$(J first/index <j)" = "[5]" &&
	test "$(J first/pos <j)" = 0 &&
	test "$(J points/name=layer.1.attn/status <j)" = ok &&
	test "$(J points/name=layer.1.attn/max_abs <j)" = 0.0 &&
	test "$(J points/name=layer.0.mlp_out/status <j)" = ok &&
	test_must_fail 1 hi3 diff --first p.trace bad.trace >out &&
	test_grep "^first difference: layer.1.attn_out at row 0, pos 0, index 5: " out &&
	test_grep "o_proj" out &&
	test_grep "^1 .* 0  *[0-9.e+-]*\*" out
'

test_expect_success '--batch-invariant=off: the first difference is at a GEMM output' '
	hi3 -q --batch-invariant=off -m tm prefill --trace ob.trace --trace-rows 1 c.st -o kob.st --max-new 8 &&
	hi3 -q --batch-invariant=off -m tm prefill --trace oa.trace c1.st -o koa.st --max-new 8 &&
	{ hi3 diff --first --json --row 1:0 ob.trace oa.trace >j; test $? = 1; } &&
	kind=$(J first/kind <j) && echo "first: $(J first/point <j)" &&
	case $kind in q|k|v|attn_out|router_logits|expert_out|shared_out|mlp_out|logits) ;; *) false ;; esac &&
	test "$(J points/name=embed/status <j)" = ok
'

test_expect_success 'pos-pad: prefill activations agree; decode first differs at layer 0 attention, q/k/v agreeing' '
	hi3 -q -m tm tokenize-concat --pad-positions=zero req.jsonl -o cz.st 2>/dev/null &&
	hi3 -q -m tm prefill --trace zp.trace cz.st -o kz.st --max-new 6 &&
	hi3 -q -m tm prefill --trace ap.trace c0.st -o k0.st --max-new 6 &&
	hi3 diff --first zp.trace ap.trace >/dev/null &&
	{ hi3 diff --row 0:0 kz.st k0.st >kd; test $? = 1; } &&
	test_grep "^summary: .*; first: k\.0; worst: .* at row 0, head [0-9], slot 0, col" kd &&
	hi3 -q -m tm decode --trace zd.trace cz.st kz.st -o sz.st &&
	hi3 -q -m tm decode --trace ad.trace c0.st k0.st -o s0.st &&
	test_must_fail 1 hi3 diff --first --json zd.trace ad.trace >j &&
	test "$(J first/point <j)" = layer.0.attn && test "$(J first/pos <j)" = 13 &&
	test_must_fail 1 hi3 diff --first zd.trace ad.trace >out &&
	test_grep "q, k and v agree but the attention output does not: the keys and values it read" out
'

test_expect_success 'decode-mask=none: layer 0 attention of the first new token; token-placement=tail: its token' '
	hi3 -q -m tm prefill c.st -o km.st --max-new 6 &&
	hi3 -q -m tm decode --decode-mask=none --trace m.trace c.st km.st -o sm.st 2>/dev/null &&
	test_must_fail 1 hi3 diff --first --json m.trace ad.trace >j &&
	test "$(J first/point <j)" = layer.0.attn && test "$(J first/pos <j)" = 13 &&
	hi3 -q -m tm prefill c.st -o kt.st --max-new 6 &&
	hi3 -q -m tm decode --token-placement=tail --trace t.trace c.st kt.st -o st.st 2>/dev/null &&
	test_must_fail 1 hi3 diff --first --json t.trace ad.trace >j &&
	test "$(J first/point <j)" = tokens && test "$(J first/pos <j)" = 13 &&
	test "$(J first/a <j)" = "$(hi3 inspect --tensor input_ids --slice 0,13 c.st | tail -n 1)"
'

test_expect_success 'a bf16 cache: decode first differs at attention (it reads rounded K/V), q/k/v agreeing' '
	hi3 -q -m tm prefill --kv-dtype bf16 c0.st -o kbf.st --max-new 6 &&
	hi3 -q -m tm decode --trace bf.trace c0.st kbf.st -o sbf.st &&
	test_must_fail 1 hi3 diff --first --json bf.trace ad.trace >j &&
	test "$(J first/point <j)" = layer.0.attn && test "$(J first/pos <j)" = 13
'

test_expect_success 'bf16 weights against f32: the embedding differs first; the report names both models' '
	make_model tiny-moe tmb --dtype bf16 &&
	hi3 -q -m tmb tokenize-concat r0.jsonl -o cb.st &&
	hi3 -q -m tmb prefill --trace wb.trace cb.st -o kwb.st --max-new 6 &&
	test_must_fail 1 hi3 diff --first wb.trace ap.trace >out &&
	test_grep "^first difference: embed at row 0, pos 0" out &&
	test_grep "^note: the traces come from different models" out &&
	test_grep "^A: .*BF16 weights" out
'

test_expect_success 'routing replayed from a record that differs: the experts of that token differ first' '
	hi3 -q -m tm prefill c.st -o kr.st --max-new 8 &&
	hi3 -q -m tm decode --record-routing c.st kr.st -o sr.st &&
	hi3 -q -m tm replay --routing=recorded --trace rr.trace c.st sr.st -o rr.st >/dev/null &&
	hi3 -q -m tm replay --trace rf.trace c.st sr.st -o rf.st >/dev/null &&
	hi3 diff --first rr.trace rf.trace >/dev/null &&
	e=$(hi3 inspect --tensor routing_experts --slice 2,1,0 sr.st | tail -n 1) &&
	o=$(hi3 inspect --tensor routing_experts --slice 2,1,1 sr.st | tail -n 1) &&
	cp sr.st alt.st && T poke alt.st routing_experts 2,1,0 $(( (e + 1) % 4 == o ? (e + 2) % 4 : (e + 1) % 4 )) &&
	hi3 -q -m tm replay --routing=recorded --trace ra.trace c.st alt.st -o ra.st >/dev/null &&
	test_must_fail 1 hi3 diff --first --json ra.trace rf.trace >j &&
	test "$(J first/point <j)" = layer.1.experts && test "$(J first/pos <j)" = 15 &&
	test_must_fail 1 hi3 diff --first ra.trace rf.trace >out &&
	test_grep "the router logits agree but other experts were chosen" out
'

test_expect_success '--png plots the growth: a PNG with the plot and its legend' '
	test_must_fail 1 hi3 diff --first --png g.png p.trace bad.trace >/dev/null &&
	set -- $(T pnginfo g.png) && test "$1" -gt 400 && test "$2" -gt 400 &&
	cp bad.trace bad2.trace && test_must_fail 2 hi3 diff --first --png bad2.trace p.trace bad2.trace 2>err &&
	test_grep "names a trace it compares" err && cmp bad.trace bad2.trace &&
	hi3 diff --first --png g0.png p.trace p.trace >/dev/null && T pnginfo g0.png >/dev/null
'

test_expect_success 'diff without --first names a trace element by row and position' '
	test_must_fail 1 hi3 diff --tensor layer.1.attn_out p.trace bad.trace >out &&
	test_grep "^layer.1.attn_out .* at row 0, pos [0-9]*, col [0-9]* " out
'

test_expect_success 'usage errors and unreadable traces' '
	test_must_fail 2 hi3 diff --tol 1e-3 p.trace bad.trace 2>err && test_grep "need --first" err &&
	test_must_fail 2 hi3 diff --first --atol 1 p.trace bad.trace 2>err && test_grep "tensor by tensor" err &&
	test_must_fail 2 hi3 diff --first --row 5:0 p.trace bad.trace 2>err && test_grep "traces no row 5" err &&
	test_must_fail 2 hi3 diff --first s.trace p.trace 2>err && test_grep "no (row, position) in common" err &&
	test_must_fail 3 hi3 diff --first k.st p.trace 2>err && test_grep "k.st" err &&
	head -c 2000 p.trace >trunc.trace && test_must_fail 3 hi3 diff --first trunc.trace p.trace 2>err &&
	test_grep "trunc.trace" err &&
	test_must_fail 2 hi3 -m tm prefill --trace-rows 1 c.st -o x.st 2>err && test_grep "need --trace FILE" err &&
	test_must_fail 2 hi3 -m tm prefill --trace x.trace --trace-points attn,nope c.st -o x.st 2>err &&
	test_grep "nope" err &&
	test_must_fail 2 hi3 -m tm prefill --trace x.trace --trace-positions 5:5 c.st -o x.st 2>err &&
	test_grep "empty" err &&
	test ! -e x.st && test ! -e x.trace
'

test_expect_success '--trace naming a file the stage reads or writes is refused, the file untouched' '
	cp k.st kk.st && cp c.st cc.st && ln -s kk.st kl.st &&
	test_must_fail 2 hi3 -q -m tm prefill --trace kk.st cc.st -o kk.st 2>err &&
	test_grep "kk.st. is a file this command also reads or writes" err &&
	test_must_fail 2 hi3 -q -m tm prefill --trace cc.st cc.st -o y.st 2>err && test_grep "cc.st" err &&
	test_must_fail 2 hi3 -q -m tm decode --trace kl.st cc.st kk.st -o y.st 2>err && test_grep "kl.st. is .kk.st." err &&
	cmp k.st kk.st && cmp c.st cc.st &&
	hi3 -q -m tm prefill c.st -o k3.st --max-new 8 && hi3 -q -m tm decode c.st k3.st -o sg.st && cp sg.st sgc.st &&
	test_must_fail 2 hi3 -q -m tm replay --trace sgc.st c.st sgc.st -o y.st 2>err && test_grep "sgc.st" err &&
	cmp c.st cc.st && cmp sg.st sgc.st && test ! -e y.st
'

test_done
