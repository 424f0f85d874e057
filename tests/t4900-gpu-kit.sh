#!/usr/bin/env bash
# t4900-gpu-kit.sh -- the kit of a GPU run (scripts/gpu-kit.sh,
# docs/PERFORMANCE.md): built from this tree, it holds what a bare CUDA
# machine lacks and no more than 48 MiB; and its rehearsal here, with the
# system's copies of its libraries hidden, starts every program from the
# kit alone, runs the CPU steps (the pipeline to a replay gap of 0), skips
# the GPU steps, and builds the fallback from the tarball and the kit's
# packages alone.
#
# Two builds (the kit's, the fallback's): minutes, so not part of make
# check; .ci/run runs it as a stage of its own (tests/README). Skipped where
# unshare -m is refused or there is no nvcc.
. "$SRCDIR/tests/lib.sh"
if ! unshare -m true 2>/dev/null; then
	echo "1..0 # SKIP unshare -m is refused here ($(unshare -m true 2>&1 | head -n 1)): no rehearsal"
	exit 0
fi
if ! command -v nvcc >/dev/null 2>&1 && [ ! -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]; then
	echo "1..0 # SKIP no nvcc: the kit's programs are built with CUDA"
	exit 0
fi
KIT=$TRASH/kit
# the builds, the rehearsal's runs and their logs (hundreds of MB) go in the
# scratch directory, removed at the end
export TMPDIR=$TRASH
BASE='^(linux-vdso|ld-linux-x86-64|libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|libz|libcuda|libcudart|libcublas|libcublasLt|libnccl)\.so'
J() { sed -n "s/.*\"name\": \"$2\", \"group\": \"[a-z]*\", \"status\": \"\([a-z]*\)\".*\"detail\": \"\(.*\)\"}.*/\1: \2/p" "$1"; }

test_expect_success 'scripts/gpu-kit.sh builds the kit from this tree' '
	"$SRCDIR/scripts/gpu-kit.sh" "$KIT" >"$TRASH/build.out" 2>&1 &&
	test -x "$KIT/run" && test -f "$KIT/kit.info" && test -x "$KIT/bin/hi3" &&
	ls "$KIT"/src/hi3-*.tar.gz && ls "$KIT"/debs/libjansson-dev_*.deb "$KIT"/debs/make_*.deb
'
sed 's/^/# /' "$TRASH/build.out"

test_expect_success 'bin/ holds the programs of make check-cuda and the benchmarks (GPU_RUN_TARGETS)' '
	# (the last line: make may first say that it regenerates the Makefile)
	for p in $(make -s --no-print-directory -C "$BUILDDIR" print-gpu-run-programs | tail -n 1); do
		echo "${p##*/}"
	done | sort >want &&
	ls "$KIT/bin" | sort >have &&
	test_cmp want have
'

test_expect_success 'the kit is at most 48 MiB' '
	size=$(du -sb "$KIT" | cut -f1) && echo "$size bytes" &&
	test "$size" -le $((48 * 1048576))
'

test_expect_success 'the CUDA programs hold sm_90 machine code and compute_90 PTX' '
	test_grep "^ *hi3 .*cubin sm_90.*ptx compute_90" "$TRASH/build.out" &&
	test_grep "^ *test-cuda-ops .*cubin sm_90.*ptx compute_90" "$TRASH/build.out" &&
	! grep "FAILED" "$TRASH/build.out" &&
	c=${CUOBJDUMP:-$(command -v cuobjdump || true)} &&
	if [ -n "$c" ]; then "$c" --list-elf "$KIT/bin/hi3" | grep -q "sm_90\.cubin" &&
		"$c" --list-ptx "$KIT/bin/hi3" | grep -q "sm_90\.ptx"; fi
'

# The loader, asked by ldd, with the kit's LD_LIBRARY_PATH (lib/ and the
# unpacked OpenBLAS): every library in the kit or on the base list. The
# system's copies are not hidden here, so a library the kit lacks shows up
# resolved to /usr/lib.
test_expect_success 'ldd: every library of every program inside the kit or on the base list' '
	. "$KIT/kit.info" && mkdir -p unpacked &&
	for p in $KIT_UNPACK; do dpkg-deb -x "$KIT"/debs/${p}_*.deb unpacked || exit 1; done &&
	ll=$KIT/lib:$(find "$TRASH/unpacked" -name "lib*.so*" -exec dirname {} \; | sort -u | tr "\n" ":") &&
	for p in "$KIT"/bin/*; do
		LD_LIBRARY_PATH=$ll ldd "$p" | sed -n "s/^[[:space:]]*\([^ ]*\) => \([^ ]*\) .*/\1 \2/p" |
		while read -r name path; do
			case $(readlink -f "$path") in "$KIT"/* | "$TRASH"/unpacked/*) continue ;; esac
			echo "$name" | grep -Eq "$BASE" || { echo "${p##*/}: $name => $path"; exit 1; }
		done || exit 1
	done
'

test_expect_success 'the highest glibc symbol version the kit needs is at most GLIBC_2.34' '
	# 2.34: what anything built against glibc 2.34 or later needs (libc took
	# in libpthread), and RHEL 9'"'"'s; Ubuntu 22.04 has 2.35, 24.04 2.39
	v=$(sed -n "s/^KIT_GLIBC=//p" "$KIT/kit.info") && echo "$v" &&
	test "$(printf "%s\n%s\n" "${v#GLIBC_}" 2.34 | sort -V | tail -n 1)" = 2.34 &&
	test_grep "the kit needs $v at most" "$TRASH/build.out"
'

test_expect_success 'the rehearsal passes: the prebuilt path, then the fallback' '
	"$SRCDIR/scripts/gpu-kit.sh" --rehearse "$KIT" >"$TRASH/rehearse.out" 2>&1 &&
	sed -n "s/.*(results and logs in \(.*\))$/\1/p" "$TRASH/rehearse.out" >"$TRASH/rdir" &&
	test -s "$TRASH/rdir"
'
sed 's/^/# /' "$TRASH/rehearse.out"
R=$(cat "$TRASH/rdir" 2>/dev/null)

test_expect_success 'rehearsal, prebuilt: every program starts from the kit alone, the CPU steps pass' '
	j=$R/prebuilt/results.json &&
	grep -q "\"path\": \"prebuilt\"" "$j" &&
	J "$j" start | grep "^pass: [0-9]* programs start from the kit" &&
	J "$j" cpu-pipeline | grep "^pass: .*replay: gap 0" &&
	J "$j" libs | grep "^pass" &&
	! grep -q "\"status\": \"fail\"" "$j"
'

test_expect_success 'rehearsal, prebuilt: 2 ranks started by the kit'"'"'s own Open MPI, bitwise one process' '
	j=$R/prebuilt/results.json &&
	if grep -q "^KIT_MPI=.*openmpi-bin" "$KIT/kit.info"; then
		J "$j" ranks-cpu | grep "^pass: tp=2 and ep=2 (all-to-all) on 2 CPU ranks bitwise one process (orterun)" &&
		grep -q "ranks: .*/kitlibs/usr/bin/orterun" "$R/prebuilt-work/logs/ranks-cpu.log"
	else
		J "$j" ranks-cpu | grep "^skipped: this kit carries no MPI"
	fi
'

test_expect_success 'rehearsal, prebuilt: the GPU steps are reported skipped for want of a device' '
	j=$R/prebuilt/results.json &&
	for s in cuda-ops cuda-forward cuda-pipeline parity nccl peak bench-small bench-wide; do
		J "$j" $s | grep "^skipped: no CUDA device" || { echo "$s: $(J "$j" $s)"; exit 1; }
	done &&
	test -s "$R/prebuilt/table.txt" && test -s "$R/prebuilt/run.log" && test -s "$R/prebuilt/logs.tar.gz"
'

test_expect_success 'rehearsal, fallback: the tarball builds against the kit'"'"'s packages; its hi3 runs the pipeline' '
	j=$R/fallback/results.json &&
	grep -q "\"path\": \"fallback\"" "$j" &&
	J "$j" fallback | grep "^pass: built [0-9]* programs" &&
	J "$j" cpu-pipeline | grep "^pass: .*replay: gap 0" &&
	grep -q "^hi3: $R/fallback-work/fallback/bin/hi3" "$R/fallback-work/logs/cpu-pipeline.log" &&
	! grep -q "\"status\": \"fail\"" "$j"
'

test_expect_success 'results.json is JSON (where Python can say)' '
	if command -v python3 >/dev/null; then
		python3 -m json.tool "$R/prebuilt/results.json" >/dev/null &&
		python3 -m json.tool "$R/fallback/results.json" >/dev/null
	fi
'

# The rehearsal can fail: a kit without its jansson (the system's copy then
# not hidden either) does not start from the kit.
test_expect_success 'a kit that lacks one of its libraries fails the rehearsal'"'"'s start step' '
	cp -a "$KIT" kit2 && rm kit2/lib/libjansson.so.4 &&
	test_must_fail "$SRCDIR/scripts/gpu-kit.sh" --rehearse --prebuilt-only kit2 >out 2>&1 &&
	test_grep "start .*fail .*do not start from the kit" out &&
	test_grep "step start failed" out &&
	test_grep "| *libjansson.so.4 => .*: outside the kit and not on the base list" out
'

test_expect_success 'without dpkg-deb, run unpacks the kit'"'"'s OpenBLAS with Python (where there is one)' '
	if command -v python3 >/dev/null; then
		HI3_KIT_NO_DPKG=1 HI3_RUN_WORK=$TRASH/nodpkg "$KIT/run" --env >env.out &&
		test_grep "kitlibs/.*openblas" env.out &&
		test -s "$(find "$TRASH/nodpkg/kitlibs" -name "libopenblas*.so" -type f)" &&
		test_grep "^ok: hi3: every library found" "$TRASH/nodpkg/logs/start.log"
	fi
'

# A run out of time reports every step it could not start, and still writes its results.
test_expect_success 'a run with no time left skips every step, saying why, and writes its results' '
	OUT=$TRASH/late HI3_RUN_SECONDS=1 HI3_RUN_GPU=0 "$KIT/run" >late.out 2>&1 &&
	test_grep "no time left" late.out &&
	! grep "\"status\": \"\(pass\|fail\)\"" late/results.json &&
	test "$(grep -c "\"status\": \"skipped\", .*no time left" late/results.json)" -ge 6 &&
	test -s late/table.txt
'

test_done
