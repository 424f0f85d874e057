#!/usr/bin/env bash
# t4500-cuda-quant.sh -- quantized checkpoints as published (hi3-quant(7))
# on the CUDA backend: each directory of tests/fixtures/quant (bitsandbytes
# int8, nf4 with and without double quantization, compressed-tensors fp8
# per channel and per tensor, ModelOpt fp8 and fp8 + nvfp4) gives with
# --backend cuda the greedy tokens the CPU gives, and its log-probs and KV
# within t4000's CUDA-vs-CPU tolerance (hi3 diff's 1e-5); the quantized
# matrices keep their bits however the rows are batched (parity's
# prefill KV, whose one layer comes from the quantized qkv alone, is
# bitwise even with cuBLAS for the rest), and with --batch-invariant=on
# the whole run does: parity bitwise, a sampled rollout replayed at gap 0.
# The unquantized tensors (embeddings, norms, router, lm_head)
# are read in F32 here: the CUDA backend rounds activations to bf16 for
# BF16 matrices, which the CPU does not, and that rounding is t4000's
# business, not this file's. In make check the backend runs on the
# emulator (tests/hi3-cuda-emu); make check-cuda runs it on the GPU.
. "$SRCDIR/tests/lib.sh"
CUDA_BIN=${HI3_CUDA_BIN:-$BUILDDIR/tests/hi3-cuda-emu}
cuda() { "$CUDA_BIN" -q --backend cuda "$@"; }
J() { "$BUILDDIR/tests/test-tools" json "$@"; }

FORMATS="bnb-int8 bnb-nf4 bnb-nf4-dq ct-fp8-channel ct-fp8-tensor modelopt-fp8 modelopt-mixed"
# make_quant_fixtures.py's base model, in F32 (its unquantized tensors)
QUANT_MODEL="--preset tiny-moe --seed 1 --dtype f32 --set hidden_size=64 --set num_hidden_layers=1
	--set moe_intermediate_size=32 --set intermediate_size=64 --set attention_head_dim=16"

# qdir FORMAT: the fixture as a model directory beside the base model
qdir() {
	rm -rf "$1" && cp -r "$FIXTURES/quant/$1" "$1" && chmod -R u+w "$1" && rm -rf "$1/ref" &&
	ln -s "$PWD/base/model.safetensors" "$1/base.safetensors" &&
	cp base/tokenizer.json base/tokenizer_config.json base/generation_config.json "$1/"
}

REQ_SEED=4500

test_expect_success 'the base model and requests' '
	hi3 -q init-model $QUANT_MODEL -o base &&
	requests 9 23 5 >req.jsonl
'

for f in $FORMATS; do
	test_expect_success "$f on cuda: the CPU's greedy tokens, log-probs and KV (1e-5)" "
		qdir $f &&
		hi3 -q -m $f tokenize-concat req.jsonl -o $f.c.st &&
		hi3 -q -m $f prefill $f.c.st -o $f.cpu.kv --max-new 6 &&
		cuda -m $f prefill $f.c.st -o $f.gpu.kv --max-new 6 &&
		hi3 diff --valid-only $f.cpu.kv $f.gpu.kv &&
		hi3 -q -m $f decode --greedy $f.c.st $f.cpu.kv -o $f.cpu.seg &&
		cuda -m $f decode --greedy $f.c.st $f.gpu.kv -o $f.gpu.seg &&
		hi3 diff $f.cpu.seg $f.gpu.seg &&
		hi3 diff --valid-only $f.cpu.kv $f.gpu.kv
	"
done

# int8, nf4 with double quantization, fp8 + nvfp4: every kernel
for f in bnb-int8 bnb-nf4-dq modelopt-mixed; do
	test_expect_success "$f: parity on cuda, the quantized prefill KV bitwise; with --batch-invariant=on all bitwise, replay gap 0" "
		cuda -m $f parity req.jsonl --steps 2 --greedy-only >out &&
		test \$(grep -c '^\[PASS\]' out) = 3 && test \$(grep -c 'prefill-KV max|d|=0 (' out) = 3 &&
		cuda --batch-invariant=on -m $f parity req.jsonl --steps 2 --greedy-only >out &&
		cat out && test \$(grep -c 'logp max|d|=0 prefill-KV max|d|=0 (' out) = 3 &&
		cuda --batch-invariant=on -m $f prefill $f.c.st -o inv.kv --max-new 6 &&
		cuda --batch-invariant=on -m $f decode $f.c.st inv.kv -o inv.seg &&
		cuda --batch-invariant=on -m $f replay $f.c.st inv.seg -o r.st >rep.json &&
		test \"\$(J overall/mismatch/k3_kl <rep.json)\" = 0.0 && test \"\$(J overall/max_abs_dlogp <rep.json)\" = 0.0
	"
done

test_done
