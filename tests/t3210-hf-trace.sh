#!/usr/bin/env bash
# t3210-hf-trace.sh -- hi3 against the upstream PyTorch model, point by
# point: tests/fixtures/trace/hf-tiny-moe.trace is what scripts/hf-trace.py
# recorded with forward hooks on the upstream classes
# (modeling_hunyuan_image_3.py) for the tiny-moe preset (seed 1) and one row
# of tokens (tests/ref/make_trace_fixture.py). hi3's prefill trace of that
# row must agree with it at every point within 1e-5 (fp32 on both sides, the
# reductions in other orders: ~1e-6 measured), with the same experts and
# the same top-16 logits; bitwise they part at a GEMM or norm output.
. "$SRCDIR/tests/lib.sh"
J() { "$BUILDDIR/tests/test-tools" json "$@"; }
HF="$FIXTURES/trace/hf-tiny-moe.trace"

test_expect_success 'the fixture is a trace of 8 tokens with every point' '
	hi3 inspect --json "$HF" >f.json &&
	test "$(J metadata/stage <f.json)" = hf-trace &&
	test "$(J tensors/name=rows/shape <f.json)" = "[8]" &&
	test "$(J tensors/name=layer.1.expert_out/shape <f.json)" = "[8,2,128]"
'

test_expect_success 'hi3 prefill of the same row agrees with the upstream model within 1e-5' '
	make_model tiny-moe tm &&
	echo "{\"tokens\": [$(cat "$FIXTURES/trace/hf-tiny-moe.tokens")]}" >req.jsonl &&
	hi3 -q -m tm tokenize-concat req.jsonl -o c.st &&
	hi3 -q -m tm prefill --trace p.trace c.st -o k.st --max-new 1 &&
	hi3 diff --first --tol 1e-5 --json p.trace "$HF" >j &&
	test "$(J equal <j)" = true && test "$(J aligned <j)" = 8 &&
	test "$(J points/name=layer.0.experts/over <j)" = 0 && test "$(J points/name=layer.1.experts/over <j)" = 0 &&
	test "$(J points/name=logits.topk_ids/over <j)" = 0 && test "$(J points/name=embed/max_abs <j)" = 0.0
'

test_expect_success 'bitwise, the first difference is a product or a norm, not an input' '
	{ hi3 diff --first p.trace "$HF" --json >j; test $? = 1; } &&
	kind=$(J first/kind <j) && echo "first: $(J first/point <j) $(J first/a <j) $(J first/b <j)" &&
	case $kind in in_norm|q|k|v|attn|attn_out|mlp_in|router_logits|expert_out|shared_out|mlp_out|final_norm|logits) ;;
		*) false ;; esac
'

test_done
