#!/usr/bin/env bash
# sde_fixtures.sh OUTDIR -- the SDE kernel fixtures of tests/test-sde.c: on
# the tiny model (hi3 init-model --preset tiny --seed 1), the conditions of
# OUTDIR/requests.jsonl (two requests of other lengths: a ragged batch with
# CFG), hi3's trajectory of each case (KV reuse, an SDE window with the first
# and the last step, --capture-velocity) as CASE.traj, and what
# sde_kernels_ref.py makes of its stored latents, velocities, sigmas and
# noise as CASE.ref; then each case through the projects' own functions
# (sde_kernels_ref.py upstream), which must agree with the re-implementation.
# Needs HI3 (the hi3 binary) and PYTHON_REF (a Python with torch; see tests/README), and
# for the upstream check the mirrors of UniRL, FlowCPS and DanceGRPO
# (UPSTREAM_MIRRORS) and, optionally, FLOW_GRPO_SDE (sde_kernels_ref.py).
set -euo pipefail
out=$1
here=$(cd "$(dirname "$0")" && pwd)
: "${HI3:?HI3 must name the hi3 binary}"
py=${PYTHON_REF:-python3}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hi3-sde-fixtures.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
"$HI3" -q init-model --preset tiny --seed 1 -o "$tmp/tiny"
"$HI3" -q -m "$tmp/tiny" tokenize-concat --exact-size "$out/requests.jsonl" -o "$tmp/c.st"
# case: kernel, then the other options
while read -r name opts; do
	# shellcheck disable=SC2086
	"$HI3" -q -m "$tmp/tiny" diffusion-capture --steps 6 --guidance 4.5 --sampler sde --sde-steps 0,1,2,5 \
		--capture-velocity $opts "$tmp/c.st" -o "$out/$name.traj"
	"$py" "$here/sde_kernels_ref.py" fixture "$out/$name.traj" "$out/$name.ref"
	if [ "${SKIP_UPSTREAM:-}" = "" ]; then
		"$py" "$here/sde_kernels_ref.py" upstream "$out/$name.traj"
	fi
done <<'CASES'
flow-grpo-f32 --sde-kernel flow-grpo
cps-f32 --sde-kernel cps
dance-grpo-f32 --sde-kernel dance-grpo
flow-grpo-bf16-sum --sde-kernel flow-grpo --eta 0.7 --latent-dtype bf16 --logprob-reduce sum
cps-f16-sum --sde-kernel cps --eta 1 --latent-dtype f16 --logprob-reduce sum
dance-grpo-bf16-cfg16 --sde-kernel dance-grpo --latent-dtype bf16 --cfg-dtype f16
CASES
