#!/usr/bin/env bash
# diffusion_fixtures.sh OUTDIR -- the trajectory fixtures of
# tests/t5300-diffusion-reference.sh: on the tiny model (hi3 init-model
# --preset tiny --seed 1), the conditions of tests/fixtures/diffusion/
# ref-requests.jsonl, the noise hi3 drew for them (a trajectory: x_T,
# sde_noise), and what the PyTorch reference (diffusion_ref.py trajectory:
# upstream's heads and scheduler, UniRL's SDE step, hi3ref's backbone, the
# whole sequence every step) makes of that noise.
# Needs HI3 (the hi3 binary) and PYTHON_REF (a Python with torch; see tests/README), with
# the mirrors of upstream and UniRL; upstream's modules import torchvision and
# transformers 4 (transformers.modeling_attn_mask_utils; upstream pins 4.57.1)
# and diffusers: where the venv's are newer, name older ones in PYTHONPATH
# (made last with torch 2.15, torchvision 0.29.2, transformers 4.57.1,
# tokenizers 0.22.1, diffusers 0.35.2, Pillow 13.0.0).
set -euo pipefail
out=$1
here=$(cd "$(dirname "$0")" && pwd)
: "${HI3:?HI3 must name the hi3 binary}"
py=${PYTHON_REF:-python3}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hi3-diffusion-fixtures.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
"$HI3" -q init-model --preset tiny --seed 1 -o "$tmp/tiny"
"$HI3" -q -m "$tmp/tiny" tokenize-concat --exact-size "$out/ref-requests.jsonl" -o "$tmp/c.st"
# case: CFG (g 4.5), 5 steps, SDE at 1 and 3, the rest Euler, f32 latents
"$HI3" -q -m "$tmp/tiny" diffusion-capture --steps 5 --guidance 4.5 --sampler sde --sde-steps 1,3 --eta 0.9 \
	"$tmp/c.st" -o "$out/ref-noise.safetensors"
"$py" "$here/diffusion_ref.py" trajectory --model "$tmp/tiny" --cond "$tmp/c.st" \
	--noise "$out/ref-noise.safetensors" --out "$out/ref-trajectory.safetensors" \
	--steps 5 --guidance 4.5 --sampler sde --sde-steps 1,3 --eta 0.9
# case: bf16 latents, Euler, g 1 (the cond rows alone)
"$HI3" -q -m "$tmp/tiny" diffusion-capture --steps 3 --guidance 1 --latent-dtype bf16 \
	"$tmp/c.st" -o "$out/ref-noise-bf16.safetensors"
"$py" "$here/diffusion_ref.py" trajectory --model "$tmp/tiny" --cond "$tmp/c.st" \
	--noise "$out/ref-noise-bf16.safetensors" --out "$out/ref-trajectory-bf16.safetensors" \
	--steps 3 --guidance 1 --latent-dtype bf16
# case: image editing (requests with images: JPEGs, one with EXIF
# orientation 6, one CMYK, one progressive) on the release-shaped preset
# with the quick VAE of the image tests: CFG (g 4.5), 3 steps, SDE at 1; the
# reference makes both views from the picture files with upstream's own
# processor (load_image: Pillow's decoding; resize_and_crop; the SigLIP2
# processor under ATEN_CPU_CAPABILITY=avx2, torchvision's uint8 kernel,
# hi3's default) and runs upstream's VAE encoder, patch_embed, ViT and
# aligner on them; it says how many values of each view differ from the
# conditions' (0 when made)
"$HI3" -q init-model --preset tiny-release --seed 1 --set "vae=$(cat "$here/../fixtures/quick-vae.json")" \
	-o "$tmp/edit"
"$HI3" -q -m "$tmp/edit" tokenize-concat "$out/ref-edit.jsonl" -o "$tmp/ce.st"
"$HI3" -q -m "$tmp/edit" diffusion-capture --steps 3 --guidance 4.5 --sampler sde --sde-steps 1 --eta 0.9 \
	"$tmp/ce.st" -o "$out/ref-edit-noise.safetensors"
ATEN_CPU_CAPABILITY=avx2 "$py" "$here/diffusion_ref.py" trajectory --model "$tmp/edit" --cond "$tmp/ce.st" \
	--noise "$out/ref-edit-noise.safetensors" --out "$out/ref-edit-trajectory.safetensors" \
	--steps 3 --guidance 4.5 --sampler sde --sde-steps 1 --eta 0.9 --images "$out/ref-edit.jsonl"
