#!/usr/bin/env bash
# t4310-cuda-diffusion.sh -- diffusion-capture with --backend cuda gives the
# trajectory and the PNG the CPU gives (latents and log-probs within 1e-5:
# cuBLAS is not batch invariant), and replays its own SDE steps. In make
# check the CUDA backend runs on the emulator (tests/hi3-cuda-emu); make
# check-cuda runs this file on the GPU with HI3_CUDA_BIN naming the real hi3.
. "$SRCDIR/tests/lib.sh"
CUDA_BIN=${HI3_CUDA_BIN:-$BUILDDIR/tests/hi3-cuda-emu}
cuda() { "$CUDA_BIN" -q --backend cuda --batch-invariant=off "$@"; }

test_expect_success 'a model and two gen_image requests of different lengths' '
	make_model tiny tiny &&
	printf "%s\n" \
		"{\"prompt\": \"a red fox\", \"mode\": \"gen_image\", \"image_size\": \"32x48\", \"seed\": 7}" \
		"{\"prompt\": \"two cats asleep on a warm mat\", \"mode\": \"gen_image\", \"image_size\": \"32x48\", \"seed\": 9}" \
		>req.jsonl &&
	hi3 -q -m tiny tokenize-concat --exact-size req.jsonl -o c.st
'

test_expect_success 'cuda: the CPU trajectory (KV reuse, CFG, an SDE step) within 1e-5, and its PNG' '
	hi3 -q -m tiny diffusion-capture --steps 3 --sampler sde --sde-steps 1 c.st -o cpu.st --png pcpu &&
	cuda -m tiny diffusion-capture --steps 3 --sampler sde --sde-steps 1 c.st -o gpu.st --png pgpu &&
	hi3 diff --atol 1e-5 cpu.st gpu.st &&
	"$BUILDDIR/tests/test-tools" pnginfo pgpu/row-1.png >size && test "$(cat size)" = "48 32"
'

test_expect_success 'cuda: the stateless replay of its own SDE step (within 1e-5)' '
	cuda -m tiny replay --threshold 1e-5 c.st gpu.st -o r.st >/dev/null
'

test_done
