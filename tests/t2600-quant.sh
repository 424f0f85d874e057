#!/usr/bin/env bash
# t2600-quant.sh -- quantized checkpoints as published (hi3-quant(7)):
# bitsandbytes int8 and nf4 (with and without double quantization),
# compressed-tensors fp8 (per channel, per tensor), ModelOpt fp8 and the
# mixed fp8 + nvfp4 form. The directories in tests/fixtures/quant were
# written by tests/ref/make_quant_fixtures.py from the formats' documented
# layouts, each with ref/: the same model with the quantized matrices
# dequantized into plain F32 by that script. Each format must give, to 1e-4
# in log-prob and with the same greedy tokens, what the F32 model gives,
# keep batch parity bitwise and replay at gap 0; bad metadata exits 3
# naming the tensor or field.
. "$SRCDIR/tests/lib.sh"
J() { "$BUILDDIR/tests/test-tools" json "$@"; }

FORMATS="bnb-int8 bnb-nf4 bnb-nf4-dq ct-fp8-channel ct-fp8-tensor modelopt-fp8 modelopt-mixed"
# the model the fixtures quantize (make_quant_fixtures.py's BASE_DIR): its
# unquantized tensors (embeddings, norms, router) are read from it
QUANT_MODEL="--preset tiny-moe --seed 1 --dtype bf16 --set hidden_size=64 --set num_hidden_layers=1
	--set moe_intermediate_size=32 --set intermediate_size=64 --set attention_head_dim=16"

# qdir FORMAT DIR: the fixture as a model directory beside the base model
qdir() {
	rm -rf "$2" && cp -r "$FIXTURES/quant/$1" "$2" && chmod -R u+w "$2" &&
	for d in "$2" "$2/ref"; do
		ln -s "$PWD/base/model.safetensors" "$d/base.safetensors" &&
		cp base/tokenizer.json base/tokenizer_config.json base/generation_config.json "$d/" || return 1
	done
}

REQ_SEED=777

test_expect_success 'the base model and requests' '
	hi3 -q init-model $QUANT_MODEL -o base &&
	requests 9 23 >req.jsonl
'

for f in $FORMATS; do
	test_expect_success "$f: greedy tokens and log-probs of the F32-dequantized model (1e-4)" "
		qdir $f $f &&
		for d in $f $f/ref; do
			hi3 -q -m \$d tokenize-concat req.jsonl -o \$d.c.st &&
			hi3 -q -m \$d prefill \$d.c.st -o \$d.k.st --max-new 6 &&
			hi3 -q -m \$d decode --greedy \$d.c.st \$d.k.st -o \$d.s.st || return 1
		done &&
		hi3 inspect --tensor tokens $f.s.st | tail -n 1 >tq &&
		hi3 inspect --tensor tokens $f/ref.s.st | tail -n 1 >tr &&
		test_cmp tr tq &&
		hi3 inspect --tensor logprobs $f.s.st | tail -n 1 >lq &&
		hi3 inspect --tensor logprobs $f/ref.s.st | tail -n 1 >lr &&
		paste lq lr | awk '{ n = NF / 2; for (i = 1; i <= n; i++) { d = \$i - \$(i + n); if (d < 0) d = -d;
			if (d > m) m = d } } END { print \"max |dlogp|\", m + 0; exit !(m <= 1e-4) }'
	"

	test_expect_success "$f: batch parity bitwise; its own replay at gap 0" "
		hi3 -q -m $f parity req.jsonl --steps 2 --greedy-only >out &&
		test \$(grep -c '^\[PASS\]' out) = 3 && grep -q 'logp max|d|=0 prefill-KV max|d|=0' out &&
		hi3 -q -m $f replay $f.c.st $f.s.st -o r.st >rep.json &&
		test \"\$(J overall/mismatch/k3_kl <rep.json)\" = 0.0 &&
		test \"\$(hi3 inspect --json r.st | \"$BUILDDIR/tests/test-tools\" json tensors/name=dlogp/max)\" = 0.0
	"
done

test_expect_success 'inspect names the format, what is quantized per module kind, the activations asked for' '
	hi3 inspect bnb-nf4-dq >out &&
	test_grep "quantization: bitsandbytes nf4 (double quantization)" out &&
	test_grep "routed experts: 8 nf4" out && test_grep "router: 1 F32" out && test_grep "lm_head: 1 BF16" out &&
	hi3 inspect ct-fp8-channel >out &&
	test_grep "compressed-tensors fp8 e4m3 (per-channel weight scales, float-quantized)" out &&
	test_grep "asks for FP8 e4m3 dynamic per-token input activations (W8A8); not applied" out &&
	hi3 inspect modelopt-mixed >out &&
	test_grep "routed experts: 8 nvfp4" out && test_grep "attention: 2 fp8" out
'

test_expect_success 'the quantized model is not the bf16 one it came from' '
	hi3 -q -m base tokenize-concat req.jsonl -o b.c.st &&
	hi3 -q -m base prefill b.c.st -o b.k.st --max-new 6 &&
	hi3 -q -m base decode --greedy b.c.st b.k.st -o b.s.st &&
	hi3 inspect --tensor logprobs b.s.st | tail -n 1 >lb &&
	hi3 inspect --tensor logprobs bnb-nf4.s.st | tail -n 1 >lq &&
	! cmp -s lb lq
'

refused() { # refused DIR PATTERN: prefill exits 3 naming PATTERN and writes nothing
	test_must_fail 3 hi3 -q -m "$1" prefill bnb-int8.c.st -o bad.k.st 2>err &&
	test_grep "$2" err && test ! -e bad.k.st
}

test_expect_success 'an unknown quantization method is refused by name' '
	qdir bnb-int8 x &&
	sed -i "s/\"quant_method\": \"bitsandbytes\"/\"quant_method\": \"gptq\"/" x/config.json &&
	refused x "quant_method .gptq. is not read"
'

test_expect_success 'an unknown field of quantization_config is refused by name' '
	qdir ct-fp8-channel x &&
	sed -i "s/\"ignore\":/\"zero_point_mode\": 1, \"ignore\":/" x/config.json &&
	refused x "unknown field .zero_point_mode." &&
	qdir ct-fp8-channel x &&
	sed -i "s/\"strategy\": \"channel\"/\"strategy\": \"group\"/" x/config.json &&
	refused x "strategy"
'

test_expect_success 'a scale shape the declared scheme does not allow: exit 3 naming the tensor' '
	qdir ct-fp8-tensor x &&
	sed -i "s/\"strategy\": \"tensor\"/\"strategy\": \"channel\"/" x/config.json &&
	refused x "tensor .model.layers.0.self_attn.qkv_proj.weight_scale.: shape (1,); the checkpoint.s scheme wants one scale per output channel"
'

test_expect_success 'a packed nf4 size that disagrees with its quant state: exit 3 naming the tensor' '
	qdir bnb-nf4 x &&
	rm x/quant.safetensors && cp "$FIXTURES/quant/bnb-nf4/quant.safetensors" x/ && chmod u+w x/quant.safetensors &&
	sed -i "0,/\"shape\": \[128, 64\]/s//\"shape\": [128, 66]/" x/quant.safetensors &&
	refused x "quant.safetensors: tensor .model.layers.0.self_attn.qkv_proj.weight.: holds 4096 bytes; the quant state.s shape \[128, 66\] packs into 4224"
'

test_expect_success 'a missing scale tensor, an int8 weight in a 4-bit checkpoint: exit 3 naming them' '
	qdir bnb-int8 x &&
	grep -v "layers.0.self_attn.o_proj.SCB" x/model.safetensors.index.json >i && mv i x/model.safetensors.index.json &&
	refused x "o_proj.weight. is quantized (I8) but .model.layers.0.self_attn.o_proj.SCB. is missing" &&
	qdir bnb-int8 x &&
	sed -i "s/\"load_in_8bit\": true/\"load_in_8bit\": false/; s/\"_load_in_8bit\": true/\"_load_in_8bit\": false/; s/\"load_in_4bit\": false/\"load_in_4bit\": true/; s/\"fp4\"/\"nf4\"/" x/config.json &&
	refused x "an int8 weight in a 4-bit"
'

test_expect_success 'modelopt: a layer stored in another form than quantized_layers says: exit 3' '
	qdir modelopt-mixed x &&
	sed -i "0,/\"NVFP4\"/s//\"FP8\"/" x/hf_quant_config.json &&
	refused x "is stored packed U8 but its quant_algo is FP8"
'

test_done
