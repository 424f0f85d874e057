#!/usr/bin/env bash
# gpu-run.sh -- every check and every figure hi3 takes on a GPU, in one run
# of at most 8 minutes. In a kit made by scripts/gpu-kit.sh this file is
# DIR/run, the one command of a GPU run (docs/PERFORMANCE.md); on a build
# tree it is what `make check-cuda` and scripts/gpu-check.sh run.
#
#   DIR/run [--only NAMES]                  in a kit: its programs, no compiler
#   DIR/run --env                           print the environment that runs the
#                                           kit's programs by hand (eval it)
#   scripts/gpu-run.sh --tree BUILDDIR [--src SRCDIR] [--only NAMES] [--require-gpu]
#   scripts/gpu-run.sh --list               the steps
#
# NAMES: step names or groups (setup, cpu, check, bench), comma-separated.
#
# Results go to $OUT (default: WORK/out; the first line printed names it):
#   results.json  the machine (GPU, driver, CUDA), the path taken (prebuilt
#                 or fallback) and why, the CUDA libraries used, each step
#                 with its status (pass, fail, skipped) and reason, each
#                 figure with its unit
#   table.txt     the same as a table, printed last
#   run.log       every step's output, written while it runs
#   logs.tar.gz   every step's own log, at the end
# results.json and table.txt are rewritten after every step, so a run that
# is killed keeps every step that ended. Exit status: 0 when no step failed.
#
# Each step runs under its own time limit (timeout, then SIGKILL), cut to
# what is left of the whole run's HI3_RUN_SECONDS (default 470); a step
# that cannot start in time is reported skipped, never silently dropped.
#
# In a kit the steps find programs in DIR/bin and the sources (test scripts,
# fixtures) in DIR/src/hi3-VERSION.tar.gz, unpacked under WORK. The kit's
# libraries are DIR/lib (the programs' rpath), and OpenBLAS, which travels
# only inside its Debian package in DIR/debs (35 MB unpacked), is unpacked
# under WORK by the `libs` step. If the prebuilt programs do not start
# there (`start`), `fallback` unpacks DIR/debs, builds the programs from the
# tarball against them, and the run goes on with those.
#
# Environment:
#   OUT              where the results go
#   HI3_RUN_WORK     scratch folder (default: a new one under TMPDIR)
#   HI3_RUN_SECONDS  the whole run's time (default 470; 0: no limit)
#   HI3_RUN_GPU      1: run the GPU steps without asking nvidia-smi; 0: skip them
#   HI3_RUN_QUICK    1: skip the wide model
#   HI3_KIT_PATH     auto (default), prebuilt (never build), fallback (build
#                    from the tarball even when the prebuilt programs start)
#   HI3_KIT_NO_DPKG  1: unpack the kit's packages with Python, as where there
#                    is no dpkg-deb
set -u

SELF=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")

# ---------------------------------------------------------------- the steps
#
# In order, one line each:   step NAME LIMIT NEEDS GROUP COMMAND...
#   LIMIT  seconds (cut to the time left)
#   NEEDS  any; gpu (a CUDA device); kit (a kit only: not listed on a
#          tree); ranks (hi3-mpi and an mpirun: a build tree's and the
#          system's, or the kit's with the Open MPI it carries); mpi (ranks
#          and a GPU)
#   GROUP  setup, cpu, check (make check-cuda runs these), bench
#   COMMAND  a function below, `tap PROGRAM` (a TAP test program of the kit
#          or tree: fails on a "not ok" or a "Bail out!") or `shtest NAME`
#          (tests/NAME.sh with the GPU's hi3 as HI3_CUDA_BIN)
# A new check is one line here, plus a function when one program is not
# enough; a new program also goes into GPU_RUN_TARGETS in Makefile.am.
steps() {
	step env             20 any setup s_env
	step libs            60 any setup s_libs
	step start           60 kit setup s_start
	step fallback       360 kit setup s_fallback
	step cpu-pipeline    90 any cpu   s_cpu_pipeline
	step cuda-nodev      30 any cpu   tap test-cuda-nodev
	step cuda-libs       60 gpu check s_cuda_libs
	step peak            90 gpu bench s_peak
	step cuda-ops        90 gpu check tap test-cuda-ops
	step cuda-forward   120 gpu check tap test-cuda-forward
	step cuda-sample     60 gpu check tap test-cuda-sample
	step vae-cuda        90 gpu check tap test-vae-cuda
	step vit-cuda        90 gpu check tap test-vit-cuda
	step cuda-pipeline  150 gpu check shtest t4000-cuda-pipeline
	step cuda-trace      90 gpu check shtest t4300-cuda-trace
	step cuda-diffusion  90 gpu check shtest t4310-cuda-diffusion
	step cuda-graphs     90 gpu check shtest t4400-cuda-graphs
	step cuda-quant      90 gpu check shtest t4500-cuda-quant
	step ranks-cpu       90 ranks cpu s_ranks_cpu
	step parity          90 gpu check s_parity
	step nccl            60 gpu check tap test-comm-nccl
	step nccl-mpi        90 mpi check s_nccl_mpi
	step bench-small    150 gpu bench s_bench_small
	step graphs-bench   150 gpu bench s_graphs_bench
	step bench-wide     240 gpu bench s_bench_wide
	step invariant-bench 120 gpu bench s_invariant_bench
	step layouts-cuda   180 mpi bench s_layouts_cuda
}

# ------------------------------------------------------ helpers for steps

now() { date +%s.%N | cut -c1-14; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# prog NAME: the path of a program of this kit or tree
prog() {
	local p
	if [ "$MODE" = kit ]; then
		p=$BIN/$1
	elif [ "$1" = hi3 ] || [ "$1" = hi3-mpi ]; then
		p=$BUILDDIR/bin/$1
	else
		p=$BUILDDIR/tests/$1
	fi
	[ -x "$p" ] || { echo "gpu-run: $1: not in this ${MODE} ($p)" >&2; return 1; }
	echo "$p"
}

# Inside a step: skip REASON (ends the step), detail TEXT, figure NAME VALUE
# UNIT [NOTE], info KEY VALUE (machine facts for the header and results.json).
skip() { printf '%s\n' "$*" >"$WORK/skip.$STEP"; echo "skipped: $*"; exit 77; }
detail() { printf '%s\n' "$*" >"$WORK/detail.$STEP"; }
figure() {
	printf '%s\t%s\t%s\t%s\t%s\n' "$STEP" "$1" "$2" "$3" "${4:-}" >>"$WORK/figures.tsv"
	printf 'figure: %s = %s %s %s\n' "$1" "$2" "$3" "${4:-}"
}
info() { printf '%s\t%s\n' "$1" "$2" >>"$WORK/info.tsv"; }
getinfo() { awk -F'\t' -v k="$1" '$1 == k { v = $2 } END { print v }' "$WORK/info.tsv" 2>/dev/null; }
getfig() { awk -F'\t' -v k="$1" '$2 == k { v = $3 } END { print v }' "$WORK/figures.tsv" 2>/dev/null; }
# what a later step must see of this one's environment (BIN, LD_LIBRARY_PATH)
setenv() { printf 'export %s=%q\n' "$1" "$2" >>"$WORK/env.$STEP"; }
# seconds this step has left
time_left() { awk -v s="$STEP_START" -v l="$STEP_LIMIT" -v n="$(now)" 'BEGIN { printf "%d", s + l - n }'; }

# tap PROGRAM [ARGS]: a TAP test program; its plan "1..0 # SKIP why" skips
tap() {
	local p rc
	p=$(prog "$1") || exit 1
	shift
	SRCDIR=$SRCDIR "$p" "$@" 2>&1 | tee "$WORK/tap.$STEP"
	rc=${PIPESTATUS[0]}
	tap_verdict "$rc"
}

# shtest NAME: tests/NAME.sh, the CPU's hi3 against the GPU's (the same program)
shtest() {
	local h rc
	h=$(prog hi3) || exit 1
	mkdir -p "$WORK/shtest" || exit 1
	HI3=$h HI3_CUDA_BIN=$h SRCDIR=$SRCDIR BUILDDIR=$TESTTREE TMPDIR=$WORK/shtest \
		bash "$SRCDIR/tests/$1.sh" 2>&1 | tee "$WORK/tap.$STEP"
	rc=${PIPESTATUS[0]}
	tap_verdict "$rc"
}

tap_verdict() {
	local t=$WORK/tap.$STEP n_ok n_bad plan
	plan=$(grep -m1 '^1\.\.0 # SKIP' "$t")
	if [ -n "$plan" ] && [ "$1" = 0 ]; then
		skip "${plan#1..0 # SKIP }"
	fi
	n_ok=$(grep -c '^ok ' "$t")
	n_bad=$(grep -c '^not ok ' "$t")
	if grep -q '^Bail out!' "$t"; then
		detail "$(grep -m1 '^Bail out!' "$t")"
		exit 1
	fi
	if [ "$n_bad" -gt 0 ] || [ "$1" != 0 ]; then
		detail "$n_bad of $((n_ok + n_bad)) checks failed (exit $1); first: $(grep -m1 '^not ok ' "$t")"
		exit 1
	fi
	[ "$n_ok" -gt 0 ] || { detail "no check ran"; exit 1; }
	detail "$n_ok checks"
}

# a small model, made once per run under WORK/models
model() { # model NAME PRESET [init-model args]
	local d=$WORK/models/$1
	shift
	if [ ! -f "$d/config.json" ]; then
		rm -rf "$d.tmp"
		"$HI3" -q init-model --preset "$@" --seed 1 -o "$d.tmp" >&2 && mv "$d.tmp" "$d" || return 1
	fi
	echo "$d"
}

# ------------------------------------------------------------------ steps

# The machine, the kit and what the run will use.
s_env() {
	local gpu v
	info date "$(date -u '+%Y-%m-%d %H:%M UTC')"
	info host_cpu "$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1)"
	info host_cpus "$(nproc 2>/dev/null)"
	info host_memory "$(awk '/^MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo 2>/dev/null)"
	v=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{ print $2 }')
	info glibc "${v:-unknown}"
	info kernel "$(uname -r)"
	if [ "$MODE" = kit ]; then
		info kit "hi3 $KIT_VERSION ($KIT_COMMIT, built $KIT_DATE with nvcc $KIT_NVCC)"
		info kit_glibc "$KIT_GLIBC"
		if [ -n "$v" ] && [ "$(printf '%s\n%s\n' "${KIT_GLIBC#GLIBC_}" "$v" | sort -V | tail -n 1)" != "$v" ]; then
			echo "the kit's programs need $KIT_GLIBC; this machine has glibc $v: expect the fallback"
		fi
	else
		info kit "build tree $BUILDDIR"
	fi
	if command -v nvidia-smi >/dev/null 2>&1; then
		nvidia-smi || true
		gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader 2>/dev/null |
			head -n 1)
		info gpu "$(echo "$gpu" | cut -d, -f1 | sed 's/^ *//')"
		info gpu_memory "$(echo "$gpu" | cut -d, -f2 | sed 's/^ *//')"
		info driver "$(echo "$gpu" | cut -d, -f3 | sed 's/^ *//')"
		info compute_capability "$(echo "$gpu" | cut -d, -f4 | sed 's/^ *//')"
		info cuda_driver "$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -n 1)"
		info gpus "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')"
	fi
	v=$(nvcc_path)
	if [ -n "$v" ]; then
		info nvcc "$("$v" --version | sed -n 's/.*release [0-9.]*, V\([0-9.]*\).*/\1/p')"
	fi
	if [ "$HAVE_GPU" = 1 ]; then
		detail "${gpu:-a GPU (HI3_RUN_GPU=1)}"
	else
		detail "no CUDA device: $GPU_WHY"
	fi
	cat "$WORK/info.tsv"
}

nvcc_path() {
	local d
	command -v nvcc 2>/dev/null && return
	for d in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda; do
		[ -n "$d" ] && [ -x "$d/bin/nvcc" ] && { echo "$d/bin/nvcc"; return; }
	done
}

# Folders that may hold the CUDA libraries, the toolkit's first (hi3 loads
# cuBLAS from the toolkit's lib64 first), then the Python wheels' (nvidia-*).
cuda_dirs() {
	local d py
	for d in ${KIT_CUDA_LIBDIR:-} "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda; do
		[ -n "$d" ] || continue
		case $d in */lib64 | */lib) echo "$d" ;; *) echo "$d/lib64" "$d/lib" "$d/targets/x86_64-linux/lib" ;; esac
	done | tr ' ' '\n'
	d=$(nvcc_path) && [ -n "$d" ] && echo "$(dirname "$(dirname "$d")")/lib64"
	echo "${LD_LIBRARY_PATH:-}" | tr ':' '\n'
	ldconfig -p 2>/dev/null | sed -n 's/.*\(libcu[a-zA-Z]*\|libnccl\)\.so[.0-9]* .*=> \(.*\)\/[^/]*$/\2/p'
	for py in python3 python; do
		command -v "$py" >/dev/null 2>&1 &&
			"$py" -c 'import site, sys; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' \
				2>/dev/null
	done | while read -r d; do ls -d "$d"/nvidia/*/lib 2>/dev/null; done
	ls -d /opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib /opt/*/lib/python3*/site-packages/nvidia/*/lib \
		/usr/local/lib/python3*/dist-packages/nvidia/*/lib /usr/lib/python3/dist-packages/nvidia/*/lib 2>/dev/null
}

# The kit's OpenBLAS (and any other library it carries packed) unpacked,
# the CUDA libraries found; their folders go on LD_LIBRARY_PATH.
s_libs() {
	local path="" d lib want dir where="" seen="" ll kind
	if [ "$MODE" = kit ]; then
		path=$BIN/../lib
		for pkg in $KIT_UNPACK; do
			deb=$(ls "$KIT"/debs/"${pkg}"_*.deb 2>/dev/null | head -n 1)
			[ -n "$deb" ] || { echo "the kit has no $pkg package in debs/"; exit 1; }
			unpack_deb "$deb" "$WORK/kitlibs" || exit 1
		done
		for d in $(find "$WORK/kitlibs" -name 'lib*.so*' -exec dirname {} \; 2>/dev/null | sort -u); do
			path=$path:$d
		done
		echo "unpacked from debs/: $(cd "$WORK/kitlibs" 2>/dev/null && find . -name 'lib*.so.*' | tr '\n' ' ')"
	fi
	want="libcudart.so.${KIT_CUDA_MAJOR} libcublas.so.${KIT_CUDA_MAJOR} libcublasLt.so.${KIT_CUDA_MAJOR} libnccl.so.2"
	: >"$WORK/cuda-libs.tsv"
	for lib in $want; do
		dir=
		for d in $(cuda_dirs); do
			[ -e "$d/$lib" ] && { dir=$d; break; }
		done
		# cuBLASLt must come from cuBLAS's folder: a mixed pair does not load
		if [ "$lib" = "libcublasLt.so.${KIT_CUDA_MAJOR}" ] && [ -n "$where" ] && [ -e "$where/$lib" ]; then
			dir=$where
		fi
		[ "$lib" = "libcublas.so.${KIT_CUDA_MAJOR}" ] && where=$dir
		if [ -n "$dir" ]; then
			dir=$(cd "$dir" && pwd -P)
			case $dir in */site-packages/* | */dist-packages/*) kind="python wheel" ;; *) kind=toolkit ;; esac
			printf '%s\t%s\t%s\n' "$lib" "$(readlink -f "$dir/$lib")" "$kind" >>"$WORK/cuda-libs.tsv"
			case ":$seen:" in *":$dir:"*) ;; *) seen=$seen:$dir ;; esac
		else
			printf '%s\t%s\t%s\n' "$lib" "not found" "-" >>"$WORK/cuda-libs.tsv"
		fi
	done
	ll=${path}${seen}
	[ -n "${LD_LIBRARY_PATH:-}" ] && ll=$ll:$LD_LIBRARY_PATH
	ll=${ll#:}
	setenv LD_LIBRARY_PATH "$ll"
	echo "LD_LIBRARY_PATH=$ll"
	sed 's/\t/  /g' "$WORK/cuda-libs.tsv"
	detail "$(awk -F'\t' '{ n[$3] = n[$3] (n[$3] == "" ? "" : " ") $1 }
		END { for (k in n) printf "%s%s: %s", (i++ ? "; " : ""), (k == "-" ? "not found" : "from the " k), n[k] }' \
		"$WORK/cuda-libs.tsv")"
	if [ "$HAVE_GPU" = 1 ] && grep -q 'not found' "$WORK/cuda-libs.tsv"; then
		echo "a CUDA library is missing on this machine (searched: $(cuda_dirs | sort -u | tr '\n' ' '))"
		exit 1
	fi
}

# unpack_deb DEB DIR: a Debian package's files, with dpkg-deb or, where
# there is none, Python (an ar archive holding data.tar.*)
unpack_deb() {
	mkdir -p "$2" || return 1
	if command -v dpkg-deb >/dev/null 2>&1 && [ "${HI3_KIT_NO_DPKG:-0}" != 1 ]; then
		dpkg-deb -x "$1" "$2"
		return
	fi
	local py
	for py in python3 python /opt/*/.venv/bin/python3; do
		command -v "$py" >/dev/null 2>&1 && break
		py=
	done
	[ -n "$py" ] || { echo "gpu-run: neither dpkg-deb nor Python to unpack $1" >&2; return 1; }
	"$py" - "$1" "$2" <<'EOF'
import io, sys, tarfile
with open(sys.argv[1], "rb") as f:
    if f.read(8) != b"!<arch>\n":
        sys.exit("%s: not a Debian package" % sys.argv[1])
    while True:
        h = f.read(60)
        if len(h) < 60:
            sys.exit("%s: no data.tar member" % sys.argv[1])
        name, size = h[:16].decode().strip().rstrip("/"), int(h[48:58])
        data = f.read(size)
        f.read(size % 2)
        if name.startswith("data.tar"):
            t = tarfile.open(fileobj=io.BytesIO(data))
            try:
                t.extractall(sys.argv[2], filter="tar")
            except TypeError:
                t.extractall(sys.argv[2])
            break
EOF
}

# What the dynamic loader makes of each program: every library inside the
# kit (or the unpacked ones) or on the base list a CUDA machine has.
BASE_LIBS='^(linux-vdso|ld-linux-x86-64|libc|libm|libdl|libpthread|librt|libutil|libresolv|libstdc\+\+|libgcc_s|libz|libcuda|libcudart|libcublas|libcublasLt|libnccl|libnvidia-[a-z-]*)\.so'

ldd_check() { # ldd_check PROGRAM: prints problems, status 1 when any
	local out bad=0 kit
	kit=$(cd "$BIN/.." && pwd -P)
	out=$(ldd -r "$1" 2>&1) || bad=1
	while read -r line; do
		case $line in
		*"not found"* | *"version"*"not found"* | *"undefined symbol"*)
			echo "  $line"
			bad=1
			;;
		*" => /"*)
			local name path
			name=${line%% =>*}
			path=${line#*=> }
			path=$(readlink -f "${path%% (*}")
			case $path in "$kit"/* | "$WORK"/*) continue ;; esac
			if ! echo "$name" | grep -Eq "$BASE_LIBS"; then
				echo "  $name => $path: outside the kit and not on the base list"
				bad=1
			fi
			;;
		esac
	done <<<"$out"
	return $bad
}

# Every kit program starts: the loader finds every library (ldd -r), inside
# the kit or on the base list; hi3 prints its version and help.
s_start() {
	local p n=0 bad=0 v
	for p in "$BIN"/*; do
		[ -x "$p" ] || continue
		n=$((n + 1))
		if ldd_check "$p"; then
			echo "ok: $(basename "$p"): every library found"
		else
			echo "FAILED: $(basename "$p")"
			bad=$((bad + 1))
		fi
	done
	v=$("$BIN/hi3" --version 2>&1) || { echo "hi3 --version: $v"; bad=$((bad + 1)); }
	"$BIN/hi3" --help >/dev/null 2>&1 || { echo "hi3 --help failed"; bad=$((bad + 1)); }
	echo "hi3 --version: $v"
	if [ "$bad" -gt 0 ]; then
		touch "$WORK/prebuilt-broken"
		detail "$bad of $n programs do not start from the kit (see the log)"
		exit 1
	fi
	detail "$n programs start from the kit ($v)"
}

# The fallback: unpack DIR/debs into a prefix, build the programs from the
# tarball against it (a generated configure: no autotools), go on with them.
s_fallback() {
	local P=$WORK/fallback R tarball src ML=x86_64-linux-gnu LIBDIR OBDIR cudalink rc
	case ${HI3_KIT_PATH:-auto} in
	prebuilt) skip "HI3_KIT_PATH=prebuilt" ;;
	fallback) echo "HI3_KIT_PATH=fallback: building from the tarball" ;;
	*) [ -f "$WORK/prebuilt-broken" ] || skip "the prebuilt programs start" ;;
	esac
	R=$P/root
	rm -rf "$P" && mkdir -p "$R" "$P/bin" || exit 1
	for deb in "$KIT"/debs/*.deb; do
		echo "unpack $(basename "$deb")"
		unpack_deb "$deb" "$R" || exit 1
	done
	LIBDIR=$R/usr/lib/$ML
	OBDIR=$LIBDIR/openblas-pthread
	if ! make --version >/dev/null 2>&1; then # make from debs/ (configure runs it too)
		mkdir -p "$P/tools" && ln -sf "$R/usr/bin/make" "$P/tools/make" || exit 1
		export PATH=$P/tools:$PATH
		echo "no make on this machine: the kit's ($("$P/tools/make" --version | head -n 1))"
	fi
	tarball=$(ls "$KIT"/src/hi3-*.tar.gz | head -n 1)
	tar -xzf "$tarball" -C "$P" || exit 1
	src=$(ls -d "$P"/hi3-*/ | head -n 1)
	# the CUDA libraries to link, where the toolkit has no libcublas.so or
	# libnccl.so (the Python wheels hold only libX.so.N)
	cudalink=$P/cudalink
	mkdir -p "$cudalink"
	while IFS=$'\t' read -r lib path kind; do
		[ -e "$path" ] || continue
		ln -sf "$path" "$cudalink/$lib"
		ln -sf "$path" "$cudalink/${lib%.so.*}.so"
	done <"$WORK/cuda-libs.tsv"
	local incs=""
	for d in $(cut -f2 "$WORK/cuda-libs.tsv"); do
		case $d in /*) [ -d "${d%/*}/../include" ] && incs="$incs -I$(cd "${d%/*}/../include" && pwd)" ;; esac
	done
	# each PKG_CHECK_MODULES's flags as pkg-config gave them on the kit's
	# machine, its /usr/ moved into the prefix: configure then needs no
	# pkg-config (an empty value would send it to pkg-config: the prefix's
	# include folder stands in)
	local v val
	for v in $KIT_PC_VARS; do
		eval "val=\${KIT_PC_$v-}"
		val=${val//\/usr\//$R\/usr\/}
		[ -n "$val" ] || val=-I$R/usr/include
		export "$v=$val"
		echo "$v=$val"
	done
	export PKG_CONFIG_PATH="$LIBDIR/pkgconfig:$OBDIR/pkgconfig:$R/usr/share/pkgconfig" PKG_CONFIG_SYSROOT_DIR=$R
	# the packages' libraries, not the kit's lib/: the programs built here use what they were built with
	export LD_LIBRARY_PATH="$LIBDIR:$OBDIR:$cudalink"
	mkdir -p "$P/build" && cd "$P/build" || exit 1
	echo "configure with the unpacked packages in $R"
	"$src/configure" -q --disable-shared --without-mpi \
		CPPFLAGS="-I$R/usr/include -I$R/usr/include/$ML$incs" \
		LDFLAGS="-L$LIBDIR -L$OBDIR -L$cudalink -Wl,-rpath-link,$LIBDIR:$OBDIR:$cudalink -Wl,-rpath,$LIBDIR:$OBDIR" ||
		{ tail -n 40 config.log; exit 1; }
	grep -q '^#define HI3_HAVE_CUDA 1' config.h || { echo "configure found no CUDA:"; grep -i -A3 'cublas\|nvcc' config.log | tail -n 30; exit 1; }
	echo "make -j$(nproc) gpu-run-programs"
	make -j"$(nproc)" gpu-run-programs >make.log 2>&1
	rc=$?
	[ "$rc" = 0 ] || { tail -n 40 make.log; exit 1; }
	for p in $(make -s print-gpu-run-programs); do
		cp "$p" "$P/bin/" || exit 1
	done
	"$P/bin/hi3" --version || exit 1
	setenv BIN "$P/bin"
	setenv LD_LIBRARY_PATH "$LD_LIBRARY_PATH"
	info path_taken fallback
	detail "built $(ls "$P/bin" | wc -l) programs from $(basename "$tarball") against the kit's $(ls "$KIT"/debs/*.deb | wc -l) packages"
}

# With the system's copies of the kit's libraries out of reach (rehearsal),
# the kit's hi3 on the CPU: init-model -> tokenize-concat -> prefill ->
# decode -> replay, the replay's gap 0; and a prefill through OpenBLAS
# (--batch-invariant=off) within 1e-5 of the batch-invariant one.
s_cpu_pipeline() {
	local d=$WORK/cpu-pipeline m
	mkdir -p "$d" && cd "$d" || exit 1
	echo "hi3: $HI3"
	m=$(model tm tiny-moe) || exit 1
	printf '%s\n' '{"prompt": "a red fox"}' '{"prompt": "two cats on a mat, one of them asleep", "seed": 3}' \
		'{"prompt": "x", "seed": 5}' >req.jsonl
	"$HI3" -q -m "$m" tokenize-concat req.jsonl -o cond.st &&
		"$HI3" -q -m "$m" prefill cond.st -o kv.st --max-new 12 &&
		cp kv.st kv0.st &&
		"$HI3" -q -m "$m" decode --temperature 0.8 --top-p 0.9 cond.st kv.st -o seg.st &&
		"$HI3" -q -m "$m" replay --threshold 0 cond.st seg.st -o rep.st >rep.json || exit 1
	cat rep.json
	# every row's and the overall largest |gap|: 0
	grep -q '"max_abs_dlogp"' rep.json && ! grep '"max_abs_dlogp"' rep.json | grep -v -q '"max_abs_dlogp": 0\.0,' ||
		{ echo "the replay's gap is not 0"; exit 1; }
	"$HI3" -q --batch-invariant=off -m "$m" prefill cond.st -o kv-blas.st --max-new 12 &&
		"$HI3" diff --valid-only kv0.st kv-blas.st || { echo "the OpenBLAS prefill differs"; exit 1; }
	detail "init-model, tokenize-concat, prefill, decode (3 ragged rows, sampled), replay: gap 0; OpenBLAS prefill within 1e-5"
}

# Which CUDA libraries hi3 loads (the loader's own account), and one prefill on the GPU.
s_cuda_libs() {
	local m d=$WORK/cuda-libs
	mkdir -p "$d" && cd "$d" || exit 1
	m=$(model tm tiny-moe) || exit 1
	printf '{"prompt": "a red fox"}\n' >req.jsonl
	"$HI3" -q -m "$m" tokenize-concat req.jsonl -o cond.st || exit 1
	LD_DEBUG=libs LD_DEBUG_OUTPUT=$d/ld "$HI3" -v --backend cuda --batch-invariant=off -m "$m" prefill cond.st \
		-o kv.st --max-new 2 || exit 1
	sed -n 's/.*calling init: \(.*\(libcudart\|libcublas\|libcublasLt\|libcuda\)\.so.*\)$/\1/p' "$d"/ld.* |
		sort -u >loaded
	if [ -x "$(prog test-comm-nccl 2>/dev/null)" ]; then
		ldd "$(prog test-comm-nccl)" | sed -n 's/.*libnccl[^ ]* => \([^ ]*\).*/\1/p' >>loaded
	fi
	cat loaded
	info cuda_libs_loaded "$(tr '\n' ' ' <loaded)"
	[ -s loaded ] || echo "(the loader named none of them)" >loaded
	detail "loaded: $(sed 's|.*/||' loaded | tr '\n' ' ')"
}

# hi3 parity --backend cuda: batched rows equal rows alone (1e-5: not batch invariant)
s_parity() {
	local m
	m=$(model tm tiny-moe) || exit 1
	"$HI3" --backend cuda --batch-invariant=off parity -m "$m" "$SRCDIR/tests/cuda-parity.jsonl" --steps 3,5 |
		tee "$WORK/parity.out"
	[ "${PIPESTATUS[0]}" = 0 ] || exit 1
	grep -q '^\[PASS\]' "$WORK/parity.out" && ! grep -q '^\[FAIL\]' "$WORK/parity.out" || exit 1
	# asked for, the CUDA backend is batch invariant: tolerance 0
	"$HI3" --backend cuda --batch-invariant=on parity -m "$m" "$SRCDIR/tests/cuda-parity.jsonl" --steps 3,5 |
		tee "$WORK/parity-inv.out"
	[ "${PIPESTATUS[0]}" = 0 ] || exit 1
	grep -q '^\[PASS\]' "$WORK/parity-inv.out" && ! grep -q '^\[FAIL\]' "$WORK/parity-inv.out" || exit 1
	detail "$(grep -c '^\[PASS\]' "$WORK/parity.out") parity checks passed (1e-5), $(grep -c '^\[PASS\]' \
		"$WORK/parity-inv.out") bitwise with --batch-invariant=on"
}

# hi3-mpi and an mpirun for a step of several ranks ($MPI, $MPIRUN): a
# build tree's and the system's, or the kit's with the Open MPI the libs
# step unpacked, relocated (OPAL_PREFIX; PMIx's plugins by their path)
mpi_ready() {
	local root pmix
	MPI=$(prog hi3-mpi 2>/dev/null) || skip "no hi3-mpi in this build (configure found no MPI)"
	if [ "$MODE" = kit ]; then
		root=$WORK/kitlibs/usr
		[ -n "${KIT_MPI:-}" ] && [ -x "$root/bin/orterun" ] || skip "the kit carries no Open MPI"
		pmix=$(find "$root" -type d -path '*/pmix2/lib/pmix' 2>/dev/null | head -n 1)
		export OPAL_PREFIX=$root PATH=$root/bin:$PATH ${pmix:+PMIX_MCA_mca_base_component_path=$pmix}
		MPIRUN=$root/bin/orterun
	else
		MPIRUN=$(command -v mpirun) || skip "no mpirun"
	fi
	export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
	echo "ranks: $MPI under $MPIRUN"
}

# The NCCL communicator over MPI, one rank per GPU (NCCL refuses two ranks
# on one device): tests/test-comm-nccl-mpi.
s_nccl_mpi() {
	local n p
	mpi_ready
	p=$(prog test-comm-nccl-mpi 2>/dev/null) || skip "no tests/test-comm-nccl-mpi (configure found no NCCL)"
	n=$(getinfo gpus)
	[ "${n:-0}" -ge 2 ] || skip "one GPU: the one-rank NCCL check is the nccl step"
	"$MPIRUN" -np "$n" "$p" 2>&1 | tee "$WORK/tap.$STEP"
	tap_verdict "${PIPESTATUS[0]}"
}

# Two ranks on the CPU, started as the GPU steps start theirs (in a kit:
# by the Open MPI it carries): tp=2 and ep=2 with the all-to-all dispatch,
# prefill and a sampled decode, bitwise one process.
s_ranks_cpu() {
	local m d=$WORK/ranks-cpu lay
	mpi_ready
	mkdir -p "$d" && cd "$d" || exit 1
	m=$(model tm tiny-moe) || exit 1
	printf '{"prompt": "a red fox", "seed": 1}\n{"prompt": "two cats on a mat", "seed": 3}\n' >req.jsonl
	"$HI3" -q -m "$m" tokenize-concat req.jsonl -o c.st &&
		"$HI3" -q -t 1 -m "$m" prefill c.st -o one.kv0 --max-new 8 && cp one.kv0 one.kv &&
		"$HI3" -q -t 1 -m "$m" decode --temperature 0.8 --top-k 20 c.st one.kv -o one.seg || exit 1
	for lay in tp=2 ep=2,dispatch=alltoall; do
		rm -f two.kv two.seg
		"$MPIRUN" -np 2 "$MPI" -q -t 1 -m "$m" --parallel $lay prefill c.st -o two.kv --max-new 8 &&
			cmp one.kv0 two.kv &&
			"$MPIRUN" -np 2 "$MPI" -q -t 1 -m "$m" --parallel $lay decode --temperature 0.8 --top-k 20 c.st two.kv \
				-o two.seg && cmp one.seg two.seg && cmp one.kv two.kv ||
			{ echo "$lay: differs from one process (or did not run)"; exit 1; }
		echo "$lay on 2 ranks: bitwise one process"
	done
	detail "tp=2 and ep=2 (all-to-all) on 2 CPU ranks bitwise one process ($(basename "$MPIRUN"))"
}

# The layouts on cuda as 2 ranks (one GPU: they share it, and NCCL refuses
# that, so the activations go through host buffers; two or more: NCCL):
# tp=2, ep=2 and ep=2 with the all-to-all, against one cuda process on
# `small` (bf16, 8 rows, 32 new tokens): bitwise or not (cuBLAS chooses
# by shape: a split product may sum in another order), and per decode step
# rank 0's time in collectives and MiB received.
s_layouts_cuda() {
	local m d=$WORK/layouts lay n steps line s mib path bad=0
	mpi_ready
	n=$(getinfo gpus)
	mkdir -p "$d" && cd "$d" || exit 1
	m=$(model small-bf16 small --dtype bf16) || exit 1
	for i in 1 2 3 4 5 6 7 8; do
		printf '{"prompt": "a photo of %d red foxes in the snow at dusk, wide angle", "seed": %d}\n' "$i" "$i"
	done >req.jsonl
	"$HI3" -q -m "$m" tokenize-concat req.jsonl -o c.st &&
		"$HI3" -q --backend cuda -m "$m" prefill c.st -o one.kv0 --max-new 32 && cp one.kv0 one.kv &&
		"$HI3" -q --backend cuda -m "$m" decode --greedy c.st one.kv -o one.seg || exit 1
	steps=$("$HI3" inspect --tensor gen_len one.kv | tail -n 1 | tr ' ' '\n' | sort -n | tail -n 1)
	for lay in tp=2 ep=2 ep=2,dispatch=alltoall; do
		rm -f two.kv two.seg
		if ! "$MPIRUN" -np 2 "$MPI" --backend cuda -m "$m" --parallel $lay prefill c.st -o two.kv --max-new 32 \
			2>prefill.err || ! cp two.kv two.kv0 || ! "$MPIRUN" -np 2 "$MPI" --backend cuda -m "$m" --parallel $lay \
			decode --greedy c.st two.kv -o two.seg 2>decode.err; then
			cat prefill.err decode.err
			echo "$lay: did not run"
			bad=$((bad + 1))
			# whether the decode steps from CUDA graphs are what fails
			if [ -f two.kv0 ] && cp two.kv0 two.kv && "$MPIRUN" -np 2 "$MPI" --backend cuda -m "$m" \
				--parallel $lay --cuda-graphs off decode --greedy c.st two.kv -o two.seg 2>decode-off.err; then
				if cmp -s one.seg two.seg; then
					echo "$lay: decodes with --cuda-graphs off, bitwise one process"
				else
					echo "$lay: decodes with --cuda-graphs off, not bitwise one process"
				fi
			else
				tail -n 5 decode-off.err 2>/dev/null
				echo "$lay: fails with --cuda-graphs off too"
			fi
			continue
		fi
		line=$(grep 'hi3 decode: rank 0 of 2: ' decode.err)
		echo "$line"
		s=$(echo "$line" | sed -n 's/.*: \([0-9.]*\) s in collectives.*/\1/p')
		mib=$(echo "$line" | sed -n 's/.* \([0-9.]*\) MiB received.*/\1/p')
		case $line in *"(nccl:"*) path="NCCL, device buffers" ;; *) path="MPI, host buffers" ;; esac
		figure "$lay on $n GPU(s), 2 ranks: decode collectives" \
			"$(awk -v s="$s" -v n="$steps" 'BEGIN { printf "%.3f", 1000 * s / n }')" "ms/step" "rank 0, $path"
		figure "$lay on $n GPU(s), 2 ranks: decode received" \
			"$(awk -v b="$mib" -v n="$steps" 'BEGIN { printf "%.4f", b / n }')" "MiB/step" "rank 0, $steps steps"
		if cmp -s one.kv0 two.kv0 && cmp -s one.seg two.seg && cmp -s one.kv two.kv; then
			echo "$lay: bitwise one process"
		elif "$HI3" diff one.seg two.seg >diff.txt && "$HI3" diff --valid-only one.kv two.kv >>diff.txt; then
			echo "$lay: within the pipeline's tolerance of one process, not bitwise"
		else
			cat diff.txt
			echo "$lay: differs from one process beyond the tolerance"
			bad=$((bad + 1))
		fi
	done
	[ "$bad" = 0 ] || exit 1
	detail "tp=2, ep=2 (both dispatches) on cuda, 2 ranks on $n GPU(s): figures per decode step"
}

# What this GPU reaches: device-to-device copy bandwidth, cuBLAS bf16 GEMM
# on the wide model's prefill shapes at 4096 tokens -- qkv and the shared
# gate_up (4096 x 6144 x 4096), o (4096 x 4096 x 4096), the shared down
# (4096 x 4096 x 3072), one expert's gate_up and down at the mean 512
# tokens an expert gets (4096 x 8 / 64) -- and fp32 GEMM.
s_peak() {
	local p
	p=$(prog bench-cuda-peak) || exit 1
	"$p" --shape 4096,6144,4096 --shape 4096,4096,4096 --shape 4096,4096,3072 --shape 512,6144,4096 \
		--shape 512,4096,3072 | tee "$WORK/peak.txt"
	[ "${PIPESTATUS[0]}" = 0 ] || exit 1
	grep -q '^PEAK' "$WORK/peak.txt" || exit 1
	awk '/^GEMM bf16/ { for (i = 3; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
		printf "%s x %s x %s\t%s\n", v["M"], v["N"], v["K"], v["tflops"] }' "$WORK/peak.txt" |
		while IFS=$'\t' read -r shape tf; do figure "cuBLAS bf16 GEMM $shape" "$tf" "TFLOP/s"; done
	set -- $(sed -n 's/^PEAK copy_gbs=\([^ ]*\) gemm_bf16_tflops=\([^ ]*\) gemm_f32_tflops=\([^ ]*\).*/\1 \2 \3/p' \
		"$WORK/peak.txt")
	figure "copy bandwidth (device to device)" "$1" "GB/s" "(read + written) / time"
	figure "cuBLAS bf16 GEMM peak" "$2" "TFLOP/s" "best over the shapes, fp32 accumulation"
	figure "cuBLAS fp32 GEMM" "$3" "TFLOP/s" "no TF32"
	detail "copy $1 GB/s, bf16 GEMM $2 TFLOP/s, fp32 GEMM $3 TFLOP/s"
}

# bench LABEL MODEL ARGS...: one tests/bench-cuda run; its figures as
# ratios of the ceilings the peak step measured in this run
bench() {
	local label=$1 dir=$2 p r copy gemm kind
	shift 2
	p=$(prog bench-cuda) || return 1
	"$p" -m "$dir" --label "$label" "$@" | tee -a "$WORK/bench.txt" >"$WORK/bench.last"
	[ "${PIPESTATUS[0]}" = 0 ] || { cat "$WORK/bench.last"; return 1; }
	cat "$WORK/bench.last"
	r=$(grep '^RESULT' "$WORK/bench.last") || return 1
	val() { echo "$r" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
	copy=$(getfig "copy bandwidth (device to device)")
	case $label in *f32*) kind=fp32; gemm=$(getfig "cuBLAS fp32 GEMM") ;; *) kind=bf16; gemm=$(getfig "cuBLAS bf16 GEMM peak") ;; esac
	local tag
	# one name per run: the model, the prefill B x L, the rows D decoded from it
	tag="$label $(val B)x$(val L) D=$(val D)"
	figure "$tag: prefill" "$(val prefill_tok_s)" "tokens/s"
	figure "$tag: prefill GEMMs" "$(val prefill_tflops)" "TFLOP/s" "matrix FLOPs over the prefill's wall time"
	[ -n "$gemm" ] && figure "$tag: prefill GEMMs / $kind GEMM peak" \
		"$(awk -v a="$(val prefill_tflops)" -v b="$gemm" 'BEGIN { printf "%.2f", 100 * a / b }')" "%"
	figure "$tag: decode step" "$(val decode_ms)" "ms" "$(val decode_tok_s) tokens/s"
	figure "$tag: decode bytes read" "$(val decode_gbs)" "GB/s" "$(val decode_gb) GB a step"
	[ -n "$copy" ] && figure "$tag: decode / copy bandwidth" \
		"$(awk -v a="$(val decode_gbs)" -v b="$copy" 'BEGIN { printf "%.2f", 100 * a / b }')" "%"
	return 0
}

# result LABEL KEY: KEY's value in the last RESULT line of bench.txt whose
# label (a grep pattern, from the label on) matches
result() {
	grep "^RESULT label=$1" "$WORK/bench.txt" | tail -n 1 | sed -n "s/.* $2=\([0-9.]*\).*/\1/p"
}

# `small` in bf16 and f32: prefill 8 x 512 tokens, decode 64 steps at B = 1
# and 8; and the weights' upload rate through hi3 -v.
s_bench_small() {
	local b f d=$WORK/bench-small n=0
	mkdir -p "$d" && cd "$d" || exit 1
	b=$(model small-bf16 small --dtype bf16) && f=$(model small-f32 small --dtype f32) || exit 1
	bench small-bf16 "$b" -B 8 -L 512 -D 1 -n 64 || n=$((n + 1))
	bench small-bf16 "$b" -B 8 -L 512 -D 8 -n 64 || n=$((n + 1))
	bench small-f32 "$f" -B 8 -L 512 -D 1 -n 64 --kv-dtype f32 || n=$((n + 1))
	printf '{"prompt": "a red fox"}\n' >req.jsonl
	"$HI3" -q -m "$b" tokenize-concat req.jsonl -o cond.st &&
		"$HI3" -v --backend cuda --batch-invariant=off -m "$b" prefill cond.st -o kv.st --max-new 1 2>err.txt
	cat err.txt
	set -- $(sed -n 's/.*cuda: weights uploaded: \([0-9.]*\) MB in \([0-9.]*\) s, \([0-9.]*\) GB\/s.*/\1 \2 \3/p' err.txt)
	[ $# = 3 ] && figure "weights upload, small bf16 ($1 MB)" "$3" "GB/s" "from the mapping through 2 pinned buffers"
	[ "$n" = 0 ] || exit 1
	detail "3 benchmarks"
}

# Decode steps from CUDA graphs against launched one by one (--cuda-graphs
# on and off): `small` bf16 at B = 1 and 8, the step time each way.
s_graphs_bench() {
	local b d=$WORK/graphs-bench D g on off n=0
	mkdir -p "$d" && cd "$d" || exit 1
	b=$(model small-bf16 small --dtype bf16) || exit 1
	for D in 1 8; do
		for g in on off; do
			bench "small-bf16-graphs-$g" "$b" -B 8 -L 256 -D $D -n 64 --reps 1 --cuda-graphs $g || n=$((n + 1))
		done
		on=$(result "small-bf16-graphs-on .* D=$D " decode_ms)
		off=$(result "small-bf16-graphs-off .* D=$D " decode_ms)
		[ -n "$on" ] && [ -n "$off" ] && figure "small bf16 decode step at B = $D: eager / graphs" \
			"$(awk -v a="$off" -v b="$on" 'BEGIN { printf "%.2f", a / b }')" "x" "$off ms eager, $on ms from graphs"
	done
	[ "$n" = 0 ] || exit 1
	detail "decode steps at B = 1 and 8 with and without CUDA graphs"
}

# The real layer shape (hidden 4096, 32 query / 8 kv heads of 128, 64
# experts top-8 of width 3072, a shared MLP), 2 layers, bf16: prefill 8 x
# 512, decode at B = 1; then, with time left, one row of 4096 and 16 rows.
wide_model() {
	model wide small --dtype bf16 --set hidden_size=4096 --set num_hidden_layers=2 --set num_experts=64 \
		--set moe_topk=8 --set moe_intermediate_size=3072 --set num_attention_heads=32 \
		--set num_key_value_heads=8 --set attention_head_dim=128
}

s_bench_wide() {
	local w n=0
	[ "${HI3_RUN_QUICK:-0}" = 1 ] && skip "HI3_RUN_QUICK=1"
	w=$(wide_model) || exit 1
	echo "the wide model: $(du -sh "$w" | cut -f1), made in the step's first $((STEP_LIMIT - $(time_left))) s"
	bench wide-bf16 "$w" -B 8 -L 512 -D 1 -n 32 --reps 2 || n=$((n + 1))
	if [ "$(time_left)" -gt 90 ]; then
		bench wide-bf16 "$w" -B 1 -L 4096 -D 1 -n 16 --reps 2 || n=$((n + 1))
		bench wide-bf16 "$w" -B 16 -L 256 -D 16 -n 16 --reps 2 || n=$((n + 1))
	else
		echo "no time for the long-context and B = 16 runs"
	fi
	[ "$n" = 0 ] || exit 1
	detail "$(grep -c '^RESULT label=wide' "$WORK/bench.txt") benchmarks"
}

# What --batch-invariant=on costs on cuda (every product the fixed-order
# gemv kernel in passes of 8 rows, never cuBLAS; attention over the cache
# unsplit): the same runs with it off and on, side by side, on `small` bf16
# (prefill 8 x 512, decode 8 rows) and, with time left, the wide model
# (prefill 8 x 512, decode 1 row).
s_invariant_bench() {
	local b w n=0 tag m off on
	b=$(model small-bf16 small --dtype bf16) || exit 1
	for m in off on; do
		bench "small-bf16-invariant-$m" "$b" -B 8 -L 512 -D 8 -n 32 --reps 2 --batch-invariant $m || n=$((n + 1))
	done
	if [ "${HI3_RUN_QUICK:-0}" != 1 ] && [ "$(time_left)" -gt 60 ] && w=$(wide_model); then
		for m in off on; do
			bench "wide-bf16-invariant-$m" "$w" -B 8 -L 512 -D 1 -n 16 --reps 2 --batch-invariant $m || n=$((n + 1))
		done
	else
		echo "no time for the wide model"
	fi
	for tag in small-bf16 wide-bf16; do
		for m in prefill_tok_s decode_ms; do
			off=$(result "$tag-invariant-off " $m)
			on=$(result "$tag-invariant-on " $m)
			[ -n "$off" ] && [ -n "$on" ] || continue
			if [ $m = prefill_tok_s ]; then
				figure "$tag prefill 8 x 512: invariant off / on" \
					"$(awk -v a="$off" -v b="$on" 'BEGIN { printf "%.2f", a / b }')" "x" "$off and $on tokens/s"
			else
				figure "$tag decode step: invariant on / off" \
					"$(awk -v a="$on" -v b="$off" 'BEGIN { printf "%.2f", a / b }')" "x" "$on and $off ms"
			fi
		done
	done
	[ "$n" = 0 ] || exit 1
	detail "prefill and decode with --batch-invariant off and on"
}

# ------------------------------------------------------------- the runner

json_s() {
	local s=$1
	s=${s//\\/\\\\}
	s=${s//\"/\\\"}
	s=${s//$'\t'/ }
	s=${s//$'\r'/ }
	s=${s//$'\n'/ }
	printf '"%s"' "$s"
}
json_n() { # a number, or null
	if [[ $1 =~ ^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$ ]]; then printf '%s' "$1"; else printf 'null'; fi
}

write_results() {
	local j=$OUT/results.json.tmp first k v w name group status secs limit det st value unit note
	{
		printf '{\n  "hi3_gpu_run": 1,\n  "mode": %s,\n  "path": %s,\n  "path_reason": %s,\n' \
			"$(json_s "$MODE")" "$(json_s "$(path_taken)")" "$(json_s "$(path_reason)")"
		printf '  "seconds": %s,\n  "machine": {' "$(elapsed "$T0")"
		first=1
		while IFS=$'\t' read -r k v; do
			[ "$first" = 1 ] || printf ','
			first=0
			printf '\n    %s: %s' "$(json_s "$k")" "$(json_s "$v")"
		done < <(awk -F'\t' '$1 == "path_taken" || $1 == "cuda_libs_loaded" { next }
			{ v[$1] = $2; if (!($1 in o)) { o[$1] = n++; k[n - 1] = $1 } }
			END { for (i = 0; i < n; i++) printf "%s\t%s\n", k[i], v[k[i]] }' "$WORK/info.tsv" 2>/dev/null)
		printf '\n  },\n  "cuda_libraries": ['
		first=1
		while IFS=$'\t' read -r k v w; do
			[ "$first" = 1 ] || printf ','
			first=0
			printf '\n    {"name": %s, "path": %s, "from": %s}' "$(json_s "$k")" "$(json_s "$v")" "$(json_s "$w")"
		done <"$WORK/cuda-libs.tsv"
		printf '\n  ],\n  "cuda_libraries_loaded": ['
		first=1
		for k in $(getinfo cuda_libs_loaded); do
			[ "$first" = 1 ] || printf ', '
			first=0
			printf '%s' "$(json_s "$k")"
		done
		printf '],\n  "checks": ['
		first=1
		while IFS=$'\t' read -r name group status secs limit det; do
			[ "$first" = 1 ] || printf ','
			first=0
			printf '\n    {"name": %s, "group": %s, "status": %s, "seconds": %s, "limit": %s, "detail": %s}' \
				"$(json_s "$name")" "$(json_s "$group")" "$(json_s "$status")" "$(json_n "$secs")" \
				"$(json_n "$limit")" "$(json_s "$det")"
		done <"$WORK/steps.tsv"
		printf '\n  ],\n  "figures": ['
		first=1
		while IFS=$'\t' read -r st name value unit note; do
			[ "$first" = 1 ] || printf ','
			first=0
			printf '\n    {"step": %s, "name": %s, "value": %s, "unit": %s, "note": %s}' "$(json_s "$st")" \
				"$(json_s "$name")" "$(json_n "$value")" "$(json_s "$unit")" "$(json_s "$note")"
		done <"$WORK/figures.tsv"
		printf '\n  ],\n  "summary": {"passed": %d, "failed": %d, "skipped": %d}\n}\n' \
			"$(count pass)" "$(count fail)" "$(count skipped)"
	} >"$j" && mv "$j" "$OUT/results.json"
	write_table >"$OUT/table.txt.tmp" && mv "$OUT/table.txt.tmp" "$OUT/table.txt"
}

count() { awk -F'\t' -v s="$1" '$3 == s { n++ } END { print n + 0 }' "$WORK/steps.tsv"; }
path_taken() {
	local p
	p=$(getinfo path_taken)
	[ -n "$p" ] && { echo "$p"; return; }
	[ "$MODE" = kit ] && echo prebuilt || echo "build tree"
}
path_reason() {
	case $(path_taken) in
	fallback) [ -f "$WORK/prebuilt-broken" ] && echo "the prebuilt programs did not start (step start)" ||
		echo "HI3_KIT_PATH=fallback" ;;
	prebuilt) echo "the kit's programs, built on the CPU machine" ;;
	*) echo "the programs of $BUILDDIR" ;;
	esac
}

write_table() {
	local g
	printf 'hi3 GPU run, %s, %s s, path: %s (%s)\n' "$(getinfo date)" "$(elapsed "$T0")" "$(path_taken)" "$(path_reason)"
	g=$(getinfo gpu)
	if [ -n "$g" ]; then
		printf 'GPU:  %s, %s, compute capability %s, driver %s, CUDA %s (driver); nvcc %s\n' "$g" \
			"$(getinfo gpu_memory)" "$(getinfo compute_capability)" "$(getinfo driver)" "$(getinfo cuda_driver)" \
			"$(getinfo nvcc)"
	else
		printf 'GPU:  none (%s); nvcc %s\n' "$GPU_WHY" "$(getinfo nvcc)"
	fi
	printf 'host: %s, %s CPUs, %s, glibc %s, Linux %s\n' "$(getinfo host_cpu)" "$(getinfo host_cpus)" \
		"$(getinfo host_memory)" "$(getinfo glibc)" "$(getinfo kernel)"
	printf 'kit:  %s%s\n' "$(getinfo kit)" "$([ -n "$(getinfo kit_glibc)" ] && echo ", needs $(getinfo kit_glibc)")"
	if [ -s "$WORK/cuda-libs.tsv" ]; then
		echo "CUDA libraries:"
		awk -F'\t' '{ printf "  %-18s %s%s\n", $1, $2, ($3 == "-" ? "" : " (" $3 ")") }' "$WORK/cuda-libs.tsv"
	fi
	[ -n "$(getinfo cuda_libs_loaded)" ] && printf 'loaded by hi3 --backend cuda: %s\n' "$(getinfo cuda_libs_loaded)"
	printf '\n%-15s %-7s %7s  %s\n' step status seconds detail
	awk -F'\t' '{ printf "%-15s %-7s %7s  %s\n", $1, $3, $4, $6 }' "$WORK/steps.tsv"
	if [ -s "$WORK/figures.tsv" ]; then
		printf '\n%-52s %12s  %s\n' figure value unit
		awk -F'\t' '{ printf "%-52s %12s  %s%s\n", $2, $3, $4, ($5 != "" ? "  (" $5 ")" : "") }' "$WORK/figures.tsv"
	fi
	printf '\n%d passed, %d failed, %d skipped\n' "$(count pass)" "$(count fail)" "$(count skipped)"
}

record() { # record NAME GROUP STATUS SECONDS LIMIT DETAIL
	local d=${6//$'\t'/ }
	d=${d//$'\n'/ }
	printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" "$d" >>"$WORK/steps.tsv"
	printf '[%5ss] %-15s %-7s %s\n' "$(elapsed "$T0" | cut -d. -f1)" "$1" "$3" "$d"
	write_results
}

selected() { # selected NAME GROUP
	[ -z "$ONLY" ] && return 0
	[ "$2" = setup ] && return 0 # what every run needs: the machine, the libraries, programs that start
	case ",$ONLY," in *",$1,"* | *",$2,"*) return 0 ;; esac
	return 1
}

step() {
	local name=$1 limit=$2 needs=$3 group=$4 left lim t0 rc why det
	shift 4
	if [ "$LISTING" = 1 ]; then
		printf '%-15s %4s s  %-4s %-6s %s\n' "$name" "$limit" "$needs" "$group" "$*"
		return
	fi
	selected "$name" "$group" || return 0
	case $needs in
	kit) [ "$MODE" = kit ] || return 0 ;;
	mpi | ranks) [ "$MODE" = kit ] && [ -z "${KIT_MPI:-}" ] && { record "$name" "$group" skipped 0 "$limit" \
		"this kit carries no MPI: several ranks need hi3-mpi and Open MPI (docs/PERFORMANCE.md)"; return; } ;;
	esac
	if [ "$needs" = gpu ] || [ "$needs" = mpi ]; then
		[ "$HAVE_GPU" = 1 ] || { record "$name" "$group" skipped 0 "$limit" "no CUDA device ($GPU_WHY)"; return; }
	fi
	lim=$limit
	if [ "$DEADLINE" -gt 0 ]; then
		left=$(awk -v d="$DEADLINE" -v n="$(now)" 'BEGIN { printf "%d", d - n - 10 }')
		if [ "$left" -lt 10 ]; then
			record "$name" "$group" skipped 0 "$limit" "no time left in the run's $RUN_SECONDS s"
			return
		fi
		[ "$left" -lt "$lim" ] && lim=$left
	fi
	t0=$(now)
	rm -f "$WORK/skip.$name" "$WORK/detail.$name" "$WORK/env.$name"
	printf '\n===== %s (%s, limit %s s) at %s s: %s\n' "$name" "$group" "$lim" "$(elapsed "$T0")" "$*" >>"$OUT/run.log"
	if [ "$group" = check ]; then export HI3_CUDA_SYNC=1; else unset HI3_CUDA_SYNC; fi
	STEP=$name STEP_START=$t0 STEP_LIMIT=$lim timeout -k 10 "$lim" bash "$SELF" --step "$@" </dev/null 2>&1 |
		tee "$WORK/logs/$name.log" >>"$OUT/run.log"
	rc=${PIPESTATUS[0]}
	det=$(cat "$WORK/detail.$name" 2>/dev/null)
	case $rc in
	0) record "$name" "$group" pass "$(elapsed "$t0")" "$lim" "$det" ;;
	77) record "$name" "$group" skipped "$(elapsed "$t0")" "$lim" "$(cat "$WORK/skip.$name" 2>/dev/null)" ;;
	124 | 137)
		why="timed out after $lim s"
		[ "$lim" -lt "$limit" ] && why="$why (its $limit s cut to the time left)"
		record "$name" "$group" fail "$(elapsed "$t0")" "$lim" "$why${det:+; $det}"
		;;
	*)
		[ -n "$det" ] || det=$(grep -v '^$' "$WORK/logs/$name.log" | tail -n 1 | cut -c1-200)
		record "$name" "$group" fail "$(elapsed "$t0")" "$lim" "exit $rc: $det"
		;;
	esac
	if [ -f "$WORK/env.$name" ]; then
		. "$WORK/env.$name"
		HI3=$(prog hi3 2>/dev/null)
		export HI3
	fi
}

# ------------------------------------------------------------------- main

if [ "${1:-}" = --step ]; then # one step, in its own process (under timeout)
	shift
	"$@"
	exit $?
fi

usage() { # usage STATUS
	sed -n '2,/^set -u/p' "$SELF" | sed -e '/^set -u/d' -e 's/^# \{0,1\}//'
	exit "$1"
}

MODE=kit ONLY="" LISTING=0 REQUIRE_GPU=0 PRINT_ENV=0 BUILDDIR="" SRCDIR=""
while [ $# -gt 0 ]; do
	case $1 in
	--tree) MODE=tree BUILDDIR=$(cd "$2" && pwd) || exit 2; shift ;;
	--src) SRCDIR=$(cd "$2" && pwd) || exit 2; shift ;;
	--only) ONLY=$2; shift ;;
	--list) LISTING=1 ;;
	--env) PRINT_ENV=1 ;;
	--require-gpu) REQUIRE_GPU=1 ;;
	-h | --help) usage 0 ;;
	*) echo "gpu-run: unknown argument '$1' (--help)" >&2; exit 2 ;;
	esac
	shift
done
if [ "$LISTING" = 1 ]; then
	printf '%-15s %6s  %-4s %-6s %s\n' step limit need group command
	steps
	exit 0
fi

KIT_CUDA_MAJOR=13 KIT_CUDA_LIBDIR="" KIT_UNPACK="" KIT_MPI=""
if [ "$MODE" = kit ]; then
	KIT=$(dirname "$SELF")
	if [ ! -f "$KIT/kit.info" ] || [ ! -d "$KIT/bin" ]; then
		echo "gpu-run: $KIT is not a kit (no kit.info and bin/): run it as DIR/run of scripts/gpu-kit.sh DIR," \
			"or give --tree BUILDDIR" >&2
		exit 2
	fi
	set -a
	. "$KIT/kit.info"
	set +a
	BIN=$KIT/bin
	# a copy that lost the programs' mode bits (run as `bash DIR/run`)
	for p in "$BIN"/*; do [ -x "$p" ] || chmod +x "$p" 2>/dev/null; done
else
	: "${SRCDIR:=$(cd "$(dirname "$SELF")/.." && pwd)}"
	v=$(sed -n 's/.*release \([0-9]*\)\..*/\1/p' <<<"$("$(nvcc_path || echo false)" --version 2>/dev/null)")
	[ -n "$v" ] && KIT_CUDA_MAJOR=$v
	BIN="" KIT=""
fi

WORK=${HI3_RUN_WORK:-}
if [ -z "$WORK" ]; then
	WORK=$(mktemp -d "${TMPDIR:-/tmp}/hi3-gpu-run.XXXXXX") || exit 1
fi
mkdir -p "$WORK/logs" "$WORK/models" || exit 1
WORK=$(cd "$WORK" && pwd)
OUT=${OUT:-$WORK/out}
mkdir -p "$OUT" || exit 1
OUT=$(cd "$OUT" && pwd)
: >"$WORK/steps.tsv"
: >"$WORK/figures.tsv"
: >"$WORK/info.tsv"
: >"$WORK/cuda-libs.tsv"
: >"$OUT/run.log"
rm -f "$WORK/prebuilt-broken" "$WORK"/env.* "$WORK"/skip.* "$WORK"/detail.*

HAVE_GPU=0 GPU_WHY=""
case ${HI3_RUN_GPU:-auto} in
0) GPU_WHY="HI3_RUN_GPU=0" ;;
1) HAVE_GPU=1 ;;
*)
	if command -v nvidia-smi >/dev/null 2>&1; then
		if nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then HAVE_GPU=1; else
			GPU_WHY="nvidia-smi: $(nvidia-smi -L 2>&1 | head -n 1)"
		fi
	elif [ -e /dev/nvidia0 ]; then
		HAVE_GPU=1
	else
		GPU_WHY="no nvidia-smi and no /dev/nvidia0"
	fi
	;;
esac
if [ "$REQUIRE_GPU" = 1 ] && [ "$HAVE_GPU" != 1 ]; then
	echo "gpu-run: no CUDA device ($GPU_WHY): nothing to check (HI3_RUN_GPU=1 to try anyway)" >&2
	exit 1
fi

# the tree the shell tests see as BUILDDIR (tests/test-tools, ...)
if [ "$MODE" = kit ]; then
	TESTTREE=$WORK/tree
	mkdir -p "$TESTTREE/tests" "$WORK/src" || exit 1
	tar -xzf "$(ls "$KIT"/src/hi3-*.tar.gz | head -n 1)" -C "$WORK/src" || exit 1
	SRCDIR=$(ls -d "$WORK"/src/hi3-*/ | head -n 1)
	SRCDIR=${SRCDIR%/}
	for p in "$BIN"/*; do ln -sf "$p" "$TESTTREE/tests/"; done
else
	TESTTREE=$BUILDDIR
fi
RUN_SECONDS=${HI3_RUN_SECONDS:-470}
T0=$(now)
DEADLINE=0
[ "$RUN_SECONDS" -gt 0 ] && DEADLINE=$(awk -v t="$T0" -v s="$RUN_SECONDS" 'BEGIN { printf "%d", t + s }')
HI3=$(prog hi3) || exit 1
export MODE KIT BIN BUILDDIR SRCDIR TESTTREE WORK OUT HAVE_GPU GPU_WHY HI3 KIT_CUDA_MAJOR KIT_CUDA_LIBDIR KIT_UNPACK KIT_MPI
export HI3_KIT_PATH=${HI3_KIT_PATH:-auto}

if [ "$PRINT_ENV" = 1 ]; then
	ONLY=libs
	steps >/dev/null
	. "$WORK/env.libs" 2>/dev/null
	echo "export LD_LIBRARY_PATH='$LD_LIBRARY_PATH'"
	echo "# programs: ${BIN:-$BUILDDIR/bin and $BUILDDIR/tests}; scratch: $WORK"
	exit 0
fi

echo "hi3 GPU run: results in $OUT (scratch $WORK), ${RUN_SECONDS} s at most"
steps
if [ "$(getinfo path_taken)" = "" ] && [ "$MODE" = kit ]; then info path_taken prebuilt; fi
write_results
tar -czf "$OUT/logs.tar.gz" -C "$WORK" logs 2>/dev/null
echo
cat "$OUT/table.txt"
[ "$(count fail)" = 0 ]
