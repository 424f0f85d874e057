#!/usr/bin/env bash
# demo.sh -- the main job on the embedded default: a tiny MoE model made by
# `hi3 init-model`, run through the whole pipeline, then the parity check
# with each upstream batching defect restored; then images: gen_image
# requests, their parity, an SDE trajectory and its replay, and PNGs; and the
# Instruct rollout (text stage, --continue, image stage). Needs a built tree
# (scripts/setup.sh). Work files go to ${DEMO_DIR:-/tmp/hi3-demo}.
set -euo pipefail
cd "$(dirname "$0")/.."
hi3=$PWD/bin/hi3
dir=${DEMO_DIR:-${TMPDIR:-/tmp}/hi3-demo}
rm -rf "$dir" && mkdir -p "$dir" && cd "$dir"
step() { printf '\n== %s\n' "$*" >&2; }

step "a tiny MoE model (2 layers, 4 experts top-2, shared MLP, GQA, qk-norm)"
"$hi3" init-model --preset tiny-moe --seed 1 -o tiny

cat >requests.jsonl <<'JSONL'
{"prompt": "a red fox jumps over the lazy dog", "seed": 1}
{"prompt": "two cats asleep on a warm mat", "seed": 2}
{"prompt": "why is the sky blue?", "bot_task": "think", "seed": 3}
{"tokens": [256, 72, 105], "seed": 4}
JSONL
step "requests -> conditions (right-padded batch)"
"$hi3" -m tiny tokenize-concat requests.jsonl -o cond.st
"$hi3" inspect cond.st | sed -n '1,3p;/^name/,$p'

step "prefill -> static KV cache, then decode (seeded sampling, routing recorded)"
"$hi3" -m tiny prefill cond.st -o kv.st --max-new 24
"$hi3" -m tiny decode --temperature 0.8 --top-p 0.9 --top-k 20 --record-routing cond.st kv.st -o seg.st
"$hi3" inspect --tensor cu_seqlens seg.st
"$hi3" inspect --tensor stop_reason seg.st

step "replay: teacher-forced log-probs against the rollout's (ratio report)"
"$hi3" -m tiny replay --routing=recorded --threshold 1e-5 cond.st seg.st -o replay.st | sed -n '/"overall"/,/}$/p'

step "parity: the batch against each row alone"
"$hi3" -m tiny parity requests.jsonl --steps 3,5 --greedy-only
for defect in pos-pad decode-mask token-placement; do
	step "parity with the upstream defect '$defect' restored: must break"
	"$hi3" -m tiny parity requests.jsonl --steps 3 --greedy-only --ablate "$defect" | head -n 4
done
cat >images.jsonl <<'JSONL'
{"prompt": "a red fox in the snow", "mode": "gen_image", "image_size": "96x128", "seed": 1}
{"prompt": "a lighthouse on a cliff at dusk, waves below", "mode": "gen_image", "image_size": "96x128", "seed": 2}
JSONL
step "images: gen_image requests -> conditions (cond and uncond rows, 2-D RoPE, a full-attention image block)"
"$hi3" -m tiny tokenize-concat --exact-size images.jsonl -o icond.st
"$hi3" inspect icond.st | sed -n '1,3p;/^name/,$p'

step "image parity: each request of the ragged batch gives, bitwise, the trajectory it gives alone"
"$hi3" -m tiny parity --exact-size images.jsonl --steps 4
step "image parity with UniRL's zero-padded RoPE restored: must break"
"$hi3" -m tiny parity --exact-size images.jsonl --steps 4 --greedy-only --ablate rope-pad | head -n 2

step "an SDE window for RL, replayed statelessly as a trainer does (log-prob gap)"
"$hi3" -m tiny diffusion-capture --steps 8 --sampler sde --sde-steps 2,3,4 icond.st -o sde.st
"$hi3" -m tiny replay --threshold 1e-5 icond.st sde.st -o sde-replay.st | sed -n '/"overall"/,/}$/p'

step "text-to-image: flow matching with CFG and KV reuse, the VAE decoder, one PNG per request"
"$hi3" -m tiny diffusion-capture --steps 8 icond.st -o traj.st --png png
"$hi3" inspect traj.st | sed -n '/^name/,$p'

step "the Instruct rollout: think, recaption and the ratio token (text stage), then the image of that size"
"$hi3" init-model --preset tiny-instruct --seed 1 -o ti
cat >auto.jsonl <<'JSONL'
{"prompt": "a red fox in the snow", "mode": "gen_image", "image_size": "auto", "system": "None", "seed": 3}
{"prompt": "a boat at dawn", "mode": "gen_image", "image_size": "auto", "bot_task": "recaption", "system": "You draw.", "seed": 12}
JSONL
"$hi3" -m ti tokenize-concat auto.jsonl -o text.st
"$hi3" -m ti prefill -n 64 text.st -o text-kv.st
"$hi3" -m ti decode text.st text-kv.st -o text-seg.st
"$hi3" -m ti replay text.st text-seg.st -o text-replay.st | sed -n '/"stage"/,/}$/p'
"$hi3" -m ti tokenize-concat --continue --by-size text.st text-seg.st -o img >sizes
while read -r f; do
	"$hi3" -m ti diffusion-capture --steps 4 --sampler sde "$f" -o "${f%.st}-traj.st" --png "${f%.st}-png"
	"$hi3" -m ti replay "$f" "${f%.st}-traj.st" -o "${f%.st}-replay.st" | sed -n '/"overall"/,/}$/p'
done <sizes
step "done: stage files are in $dir, the images in $dir/png/row-0.png and row-1.png, the rollout's in $dir/img-*-png"
