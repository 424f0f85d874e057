#!/usr/bin/env bash
# hi3 diffusion-capture --noise against the PyTorch reference
# (tests/ref/diffusion_ref.py: upstream's heads and FlowMatchDiscreteScheduler,
# UniRL's FlowSDEStrategy, hi3ref's backbone, the whole sequence every step)
# given the same noise: the fixtures of tests/ref/diffusion_fixtures.sh on the
# tiny model at seed 1. Tolerance: max |d| <= 1e-5 on latents of magnitude
# about 1 to 5 (fp32 sums in another order: PyTorch's), and on the SDE
# log-probs; bitwise for bf16 latents (the rounding absorbs the fp32 noise).
# Image editing: the release-shaped preset (with the image tests' quick VAE)
# on JPEG pictures (EXIF orientation 6, CMYK, progressive), the reference
# making both views from the files with upstream's own image processor
# (Pillow's decoding, resize_and_crop, the SigLIP2 processor) and running
# upstream's VAE encoder, patch_embed, timestep_emb, SigLIP2 and aligner:
# hi3's own decoding of the JPEGs is in the comparison.
. "$SRCDIR/tests/lib.sh"
FX=$FIXTURES/diffusion

test_expect_success 'setup: the tiny model and the conditions of the fixtures, with other seeds' '
	make_model tiny tiny &&
	sed "s/\"seed\": 7/\"seed\": 70/; s/\"seed\": 9/\"seed\": 90/" "$FX/ref-requests.jsonl" >req.jsonl &&
	hi3 -q -m tiny tokenize-concat --exact-size req.jsonl -o c.st
'

test_expect_success 'CFG, Euler and SDE steps: --noise reproduces the reference trajectory (max |d| <= 1e-5)' '
	hi3 -q -m tiny diffusion-capture --steps 5 --guidance 4.5 --sampler sde --sde-steps 1,3 --eta 0.9 \
		--noise "$FX/ref-noise.safetensors" c.st -o t.st &&
	hi3 diff --atol 1e-5 --tensor latents --tensor sde_logp --tensor sigmas --tensor timesteps \
		t.st "$FX/ref-trajectory.safetensors" &&
	hi3 diff --atol 0 --tensor sigmas --tensor timesteps --tensor sde_steps t.st "$FX/ref-trajectory.safetensors"
'

test_expect_success 'without the noise file the seeds give another trajectory (the check can fail)' '
	hi3 -q -m tiny diffusion-capture --steps 5 --guidance 4.5 --sampler sde --sde-steps 1,3 --eta 0.9 \
		c.st -o own.st &&
	test_must_fail 1 hi3 diff --atol 1e-5 --tensor latents own.st "$FX/ref-trajectory.safetensors" >/dev/null
'

test_expect_success 'bf16 latents, Euler, g = 1: --noise reproduces the reference bitwise' '
	hi3 -q -m tiny diffusion-capture --steps 3 --guidance 1 --latent-dtype bf16 \
		--noise "$FX/ref-noise-bf16.safetensors" c.st -o tb.st &&
	hi3 diff --atol 0 --tensor latents tb.st "$FX/ref-trajectory-bf16.safetensors"
'

test_expect_success 'KV reuse and the whole sequence both match the reference' '
	hi3 -q -m tiny diffusion-capture --steps 5 --guidance 4.5 --sampler sde --sde-steps 1,3 --eta 0.9 \
		--no-kv-reuse --noise "$FX/ref-noise.safetensors" c.st -o tn.st &&
	hi3 diff --atol 1e-5 --tensor latents --tensor sde_logp tn.st "$FX/ref-trajectory.safetensors"
'

test_expect_success 'image editing: the cond images through upstream encoders; --noise reproduces it (<= 1e-5)' '
	make_model tiny-release edit --set "vae=$QUICK_VAE" &&
	mkdir -p ref/x && cp "$FX/ref-edit.jsonl" ref/x/ && cp -r "$FIXTURES/image" ref/image &&
	hi3 -q -m edit tokenize-concat ref/x/ref-edit.jsonl -o ce.st &&
	hi3 -q -m edit diffusion-capture --steps 3 --guidance 4.5 --sampler sde --sde-steps 1 --eta 0.9 \
		--noise "$FX/ref-edit-noise.safetensors" ce.st -o te.st &&
	hi3 diff --atol 1e-5 --tensor latents --tensor sde_logp te.st "$FX/ref-edit-trajectory.safetensors"
'

test_expect_success 'image editing: the check can fail (the cond images changed: other latents)' '
	sed "s/exif6.jpg\"\]/photo.jpg\"]/" ref/x/ref-edit.jsonl >ref/x/other.jsonl &&
	! cmp -s ref/x/ref-edit.jsonl ref/x/other.jsonl &&
	hi3 -q -m edit tokenize-concat ref/x/other.jsonl -o co.st &&
	hi3 -q -m edit diffusion-capture --steps 3 --guidance 4.5 --sampler sde --sde-steps 1 --eta 0.9 \
		--noise "$FX/ref-edit-noise.safetensors" co.st -o to.st &&
	test_must_fail 1 hi3 diff --atol 1e-5 --tensor latents to.st "$FX/ref-edit-trajectory.safetensors" >/dev/null
'

test_done
