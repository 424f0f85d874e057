#!/bin/sh
# gpu-check.sh -- everything hi3 checks and measures on a GPU, in one run
# that fits a short GPU slot (about 4 minutes on an H200 with the tree
# already built, under 8 with a build from scratch):
#
#   1. build (configure and make only what is missing; the CUDA kernels and
#      every test program compile on a CPU machine too),
#   2. make check-cuda: each CUDA op against the CPU op, whole forward passes
#      and the sampling kernels against the CPU, prefill/decode/parity
#      through `hi3 --backend cuda` against the CPU (tests/t4000-cuda-pipeline.sh),
#      and the parity suite on tiny-moe with --backend cuda,
#   3. what the GPU reaches: device-to-device copy bandwidth and cuBLAS bf16
#      GEMM throughput (tests/bench-cuda-peak), measured in this run,
#   4. prefill and decode on `small` and on a wide model with the real layer
#      shape (hidden 4096, 32 heads / 8 kv heads of 128, 64 experts top-8 of
#      width 3072, shared MLP; 2 layers), through tests/bench-cuda,
#   5. scale-out: the NCCL communicator's collectives on every GPU
#      (tests/test-comm-nccl-mpi) and an ep=2 layout on cuda against one process,
#   6. a table, last: decode at B = 1 as a fraction of the copy bandwidth
#      (bytes it must read: active weights + KV), prefill GEMMs as a fraction
#      of the GEMM peak.
#
#   scripts/gpu-check.sh [WORKDIR]     (models go to WORKDIR, default /tmp/hi3-gpu-check)
#
# Exit status: 0 when every check passed, 1 otherwise (the benchmarks run
# either way). HI3_GPU_CHECK_QUICK=1 skips the wide model.
set -u
cd "$(dirname "$0")/.." || exit 1
WORK=${1:-/tmp/hi3-gpu-check}
JOBS=$(nproc 2>/dev/null || echo 4)
HI3=./bin/hi3
T0=$(date +%s)
status=0
mkdir -p "$WORK" || exit 1
RESULTS="$WORK/results.txt"
: >"$RESULTS"

step() { printf '\n== %s  [%ds]\n' "$*" $(($(date +%s) - T0)); }
fail() { echo "gpu-check: FAILED: $*"; status=1; }

step "build"
if [ ! -x configure ]; then autoreconf -fi || exit 1; fi
if [ ! -f Makefile ]; then ./configure -q || exit 1; fi
if ! grep -q '^#define HI3_HAVE_CUDA 1' config.h; then
	echo "gpu-check: this tree was configured without CUDA (see config.log)"
	exit 1
fi
if ! { make -j"$JOBS" && make -j"$JOBS" check TESTS=; } >"$WORK/build.log" 2>&1; then
	tail -n 30 "$WORK/build.log"
	echo "gpu-check: build failed (log: $WORK/build.log)"
	exit 1
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>/dev/null ||
	echo "(no nvidia-smi)"

step "make check-cuda (ops, forward passes, sampling, the pipeline and parity with --backend cuda)"
HI3_CUDA_SYNC=1 timeout 300 make -s check-cuda || fail "make check-cuda"

step "scale-out: the NCCL communicator on every GPU, and ep=2 on cuda against one process"
# tests/test-comm.c through NCCL (device buffers: cudaMalloc), one
# rank per GPU (1 included), then tiny-moe prefill and decode as 2 ranks of
# --parallel ep=2 on the cuda backend, with either expert dispatch (2 ranks
# share a GPU when there is one), which must equal one cuda process within
# the pipeline's tolerance.
if [ -x bin/hi3-mpi ] && command -v mpirun >/dev/null 2>&1 && grep -q '^#define HI3_HAVE_NCCL 1' config.h; then
	export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
	ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU') || ngpu=0
	[ "$ngpu" -ge 1 ] || ngpu=1
	if timeout 120 mpirun -np "$ngpu" tests/test-comm-nccl-mpi >"$WORK/nccl.tap" 2>&1 &&
		! grep -q '^not ok' "$WORK/nccl.tap" && grep -q "^ok .* $ngpu ranks: alltoallv" "$WORK/nccl.tap"; then
		echo "NCCL communicator: $(grep -c '^ok' "$WORK/nccl.tap") checks on $ngpu GPU(s) passed" | tee -a "$RESULTS"
	else
		cat "$WORK/nccl.tap"; fail "the NCCL communicator (tests/test-comm-nccl-mpi)"
	fi
	pm="$WORK/par-tm" pc="$WORK/par.cond"
	[ -f "$pm/config.json" ] || $HI3 -q init-model --preset tiny-moe --seed 1 -o "$pm"
	printf '{"prompt": "a red fox"}\n{"prompt": "two cats on a mat", "seed": 3}\n' |
		$HI3 -q -m "$pm" tokenize-concat - -o "$pc"
	$HI3 -q --backend cuda --batch-invariant=off -m "$pm" prefill "$pc" -o "$WORK/par1.kv" --max-new 8 &&
		$HI3 -q --backend cuda --batch-invariant=off -m "$pm" decode "$pc" "$WORK/par1.kv" -o "$WORK/par1.seg" ||
		fail "one cuda process, the reference of the ep=2 layouts"
	# both expert dispatches: the experts' rows gathered, and sent to their tokens' ranks
	for lay in ep=2 ep=2,dispatch=alltoall; do
		if timeout 120 mpirun -np 2 bin/hi3-mpi -q --backend cuda --batch-invariant=off -m "$pm" --parallel $lay \
			prefill "$pc" -o "$WORK/par2.kv" --max-new 8 &&
			timeout 120 mpirun -np 2 bin/hi3-mpi -q --backend cuda --batch-invariant=off -m "$pm" --parallel $lay \
			decode "$pc" "$WORK/par2.kv" -o "$WORK/par2.seg" &&
			$HI3 diff "$WORK/par1.seg" "$WORK/par2.seg" && $HI3 diff --valid-only "$WORK/par1.kv" "$WORK/par2.kv"; then
			echo "$lay on cuda: segment and KV equal one process" | tee -a "$RESULTS"
		else
			fail "$lay on cuda against one process"
		fi
		rm -f "$WORK/par2.kv" "$WORK/par2.seg"
	done
else
	echo "gpu-check: scale-out skipped: no hi3-mpi, mpirun or NCCL in this build" | tee -a "$RESULTS"
fi

step "peaks: copy bandwidth and cuBLAS bf16 GEMM (prefill shapes of the wide model, 4096 tokens)"
# qkv and shared gate_up (4096 x 6144 x 4096), o (4096 x 4096 x 4096),
# shared down (4096 x 4096 x 3072), one expert's gate_up and down at the
# mean 512 tokens per expert (4096 x 8 / 64)
timeout 120 tests/bench-cuda-peak --shape 4096,6144,4096 --shape 4096,4096,4096 --shape 4096,4096,3072 \
	--shape 512,6144,4096 --shape 512,4096,3072 | tee "$WORK/peak.txt"
grep -q '^PEAK' "$WORK/peak.txt" || fail "bench-cuda-peak"

bench() { # bench LABEL DIR ARGS...
	label=$1 dir=$2
	shift 2
	timeout 300 tests/bench-cuda -m "$dir" --label "$label" "$@" | tee -a "$WORK/bench.txt" | grep '^RESULT' >>"$RESULTS" ||
		fail "bench $label $*"
}

step "small (bf16 and f32): prefill 8 x 512 tokens, decode 64 steps at B = 1 and 8"
[ -f "$WORK/small-bf16/config.json" ] || $HI3 -q init-model --preset small --seed 1 --dtype bf16 -o "$WORK/small-bf16"
[ -f "$WORK/small-f32/config.json" ] || $HI3 -q init-model --preset small --seed 1 --dtype f32 -o "$WORK/small-f32"
bench small-bf16 "$WORK/small-bf16" -B 8 -L 512 -D 1 -n 64
bench small-bf16 "$WORK/small-bf16" -B 8 -L 512 -D 8 -n 64
bench small-f32 "$WORK/small-f32" -B 8 -L 512 -D 1 -n 64 --kv-dtype f32

if [ "${HI3_GPU_CHECK_QUICK:-0}" != 1 ]; then
	step "wide (hidden 4096, 64 experts top-8, 2 layers, bf16): prefill 8 x 512 tokens, decode at B = 1 and 16"
	[ -f "$WORK/wide/config.json" ] || timeout 300 $HI3 -q init-model --preset small --seed 1 --dtype bf16 \
		--set hidden_size=4096 --set num_hidden_layers=2 --set num_experts=64 --set moe_topk=8 \
		--set moe_intermediate_size=3072 --set num_attention_heads=32 --set num_key_value_heads=8 \
		--set attention_head_dim=128 -o "$WORK/wide" || fail "init-model wide"
	bench wide-bf16 "$WORK/wide" -B 8 -L 512 -D 1 -n 32 --reps 2
	if [ $(($(date +%s) - T0)) -lt 330 ]; then    # time left: long context, larger decode batch
		bench wide-bf16 "$WORK/wide" -B 1 -L 4096 -D 1 -n 16 --reps 2
		bench wide-bf16 "$WORK/wide" -B 16 -L 256 -D 16 -n 16 --reps 2
	fi
fi

step "table"
PEAK=$(grep '^PEAK' "$WORK/peak.txt" 2>/dev/null)
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)"
echo "measured in this run: ${PEAK:-no peak figures}"
awk -v peak="$PEAK" '
function val(key,   i, kv) { for (i = 2; i <= NF; i++) { split($i, kv, "="); if (kv[1] == key) return kv[2] } return "" }
BEGIN {
	n = split(peak, p, " "); copy = 0; gemm = 0
	for (i = 1; i <= n; i++) { split(p[i], kv, "="); if (kv[1] == "copy_gbs") copy = kv[2]; if (kv[1] == "gemm_bf16_tflops") gemm = kv[2] }
	printf "%-10s %9s | %10s %9s %7s | %3s %9s %9s %8s %8s\n", "model", "B x L", "prefill/s", "GEMM TF/s",
		"%peak", "D", "decode ms", "tokens/s", "GB/s", "%copy"
}
/^RESULT/ {
	tf = val("prefill_tflops"); gbs = val("decode_gbs")
	printf "%-10s %9s | %10.0f %9.2f %6.1f%% | %3s %9.3f %9.1f %8.1f %7.1f%%\n", val("label"),
		val("B") "x" val("L"), val("prefill_tok_s"), tf, (gemm > 0 ? 100 * tf / gemm : 0), val("D"), val("decode_ms"),
		val("decode_tok_s"), gbs, (copy > 0 ? 100 * gbs / copy : 0)
}' "$RESULTS"
echo "(B x L: the prefill; D: the rows decoded from it."
echo " prefill GEMM TF/s: matrix FLOPs of the prefill over its wall time, attention and routing included;"
echo " decode GB/s: bytes a step must read -- weights of the experts it routed to, all other weights once,"
echo " the KV slots each row attends -- over the step's wall time; %copy is against the copy bandwidth above.)"
printf 'gpu-check: %s in %ds\n' "$([ $status = 0 ] && echo "all checks passed" || echo "SOME CHECKS FAILED")" \
	$(($(date +%s) - T0))
exit $status
