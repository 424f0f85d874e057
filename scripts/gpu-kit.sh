#!/usr/bin/env bash
# gpu-kit.sh -- build on this CPU machine everything a GPU run needs, into
# one folder that travels to a bare GPU machine, and rehearse it here.
#
#   scripts/gpu-kit.sh [-j N] DIR        build the kit into DIR (made, or
#                                        emptied when it holds a kit)
#   scripts/gpu-kit.sh --rehearse [--prebuilt-only] DIR
#                                        run DIR/run here as the GPU machine
#                                        would, with the system's copies of
#                                        the kit's libraries hidden
#
# The kit (at most 48 MiB; docs/PERFORMANCE.md says how a GPU run is made):
#   DIR/run       the one command to run there (scripts/gpu-run.sh)
#   DIR/kit.info  what it was built from and with (read by DIR/run)
#   DIR/bin/      hi3 and every program `make check-cuda` and the GPU
#                 benchmarks run (GPU_RUN_TARGETS in Makefile.am), built
#                 from the tarball with nvcc for sm_90 machine code plus
#                 compute_90 PTX, libhi3 linked in, stripped, with an rpath
#                 of $ORIGIN/../lib
#   DIR/lib/      the shared libraries they need that a CUDA machine lacks:
#                 every one ldd finds outside glibc, libstdc++, libgcc_s,
#                 libm, libz and the CUDA libraries, copied from here; one
#                 larger than 8 MiB (OpenBLAS: 35 MB, every CPU's kernels)
#                 travels instead inside its Debian package in debs/, and
#                 DIR/run unpacks it; so does Open MPI (hi3-mpi's runtime:
#                 its libraries, plugins, mpirun and help files, with the
#                 packages they load), which DIR/run uses relocated
#                 (OPAL_PREFIX) to start several ranks
#   DIR/src/hi3-VERSION.tar.gz   `make dist` of this tree (its files as git
#                 lists them, committed or not): a generated configure
#   DIR/debs/     for the fallback build: the -dev packages of the build's
#                 libraries, their runtime packages and make (apt-get
#                 download, the versions installed here)
#
# The rehearsal runs DIR/run twice inside a mount namespace (unshare -m)
# where /dev/null is bound over every system copy of a library the kit
# carries, with the GPU steps skipped for want of a device: the prebuilt
# path (every program starts from the kit alone, the CPU steps pass), then
# the fallback (HI3_KIT_PATH=fallback) with the system's -dev headers and
# libraries, pkg-config, make and the autotools hidden as well: the tarball
# builds against the kit's unpacked packages and its hi3 runs the pipeline.
# Exit status 77 when unshare is refused here.
set -u
CALLER=$(pwd)
cd "$(dirname "$0")/.." || exit 1
TOP=$(pwd)
MAX_MIB=48
BIG_LIB=$((8 * 1048576))
# libraries a CUDA machine has (or brings: libcudart, cuBLAS, NCCL); the
# same list as DIR/run's start step
BASE_LIBS='^(linux-vdso|ld-linux-x86-64|libc|libm|libdl|libpthread|librt|libutil|libresolv|libstdc\+\+|libgcc_s|libz|libcuda|libcudart|libcublas|libcublasLt|libnccl|libnvidia-[a-z-]*)\.so'
# Open MPI's runtime, for hi3-mpi's ranks: packages unpacked by DIR/run,
# never copied to lib/ (its plugins are found by their place in the tree);
# the libraries its plugins load come along (a GPU machine may lack them)
MPI_PKGS='openmpi-bin openmpi-common libopenmpi3 libpmix2 libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7
libfabric1 libibverbs1 librdmacm1 libnl-3-200 libnl-route-3-200 libnuma1 libpsm2-2 libpsm-infinipath1 libucx0
libmunge2 libpciaccess0 libxnvctrl0'
# compiler runtimes: carried in lib/ for the prebuilt programs, never as
# packages (the fallback's compiler brings its own)
COMPILER_RUNTIME='^(libgomp1|libgcc-s1|libstdc\+\+6)$'

die() { echo "gpu-kit: $*" >&2; exit 1; }
say() { echo "gpu-kit: $*"; }

# fatbin_archs FILE: "cubin sm_NN" and "ptx compute_NN" for each entry of
# the CUDA fat binaries in FILE's .nv_fatbin section (blob header: magic
# 0xba55ed50, u16 version, u16 header size, u64 size; entry: u16 kind
# (1 PTX, 2 ELF), u32 header size at 4, u64 size at 8, u32 arch at 28)
fatbin_archs() {
	local t
	t=$(mktemp) || return 1
	objcopy -O binary --only-section=.nv_fatbin "$1" "$t" 2>/dev/null
	od -A n -v -t u1 "$t" | awk '
	{ for (i = 1; i <= NF; i++) b[n++] = $i }
	function u(o, k,   v, j) { v = 0; for (j = k - 1; j >= 0; j--) v = v * 256 + b[o + j]; return v }
	END {
		p = 0
		while (p + 16 <= n) {
			if (u(p, 4) != 3126193488) { p += 8; continue }   # 0xba55ed50; blobs are 8-aligned
			h = u(p + 6, 2); size = u(p + 8, 8); e = p + h
			while (e < p + h + size) {
				kind = u(e, 2); eh = u(e + 4, 4); es = u(e + 8, 8); arch = u(e + 28, 4)
				if (kind == 2) print "cubin sm_" arch; else if (kind == 1) print "ptx compute_" arch
				e += eh + es
			}
			p += h + size
		}
	}'
	rm -f "$t"
}

# the package that installed FILE (merged /usr: registered with or without /usr)
owner() {
	{ dpkg -S "$1" || dpkg -S "${1#/usr}" || dpkg -S "/usr$1"; } 2>/dev/null | head -n 1 | cut -d: -f1
}

glibc_max() { objdump -T "$@" 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n 1; }

# ------------------------------------------------------------------ build

build() {
	local DIR=$1 J=$2 T tarball ver b progs p n deb pkg v f name path size unpack="" runtime="" mpi=""
	command -v git >/dev/null 2>&1 && git -C "$TOP" rev-parse --git-dir >/dev/null 2>&1 ||
		die "$TOP is not a git checkout: the kit is made from the files git lists"
	command -v apt-get >/dev/null 2>&1 && command -v dpkg-query >/dev/null 2>&1 ||
		die "the kit needs apt-get and dpkg (a Debian machine, scripts/setup.sh's packages installed)"
	if [ -e "$DIR" ] && [ -n "$(ls -A "$DIR" 2>/dev/null)" ] && [ ! -f "$DIR/kit.info" ]; then
		die "$DIR exists and is not a kit: give an empty or new folder"
	fi
	T=$(mktemp -d "${TMPDIR:-/tmp}/hi3-kit.XXXXXX") || exit 1
	say "building in $T (removed when the kit is made)"

	# 1. the tarball: make dist of a copy of the tree's files
	say "make dist"
	mkdir -p "$T/tree" &&
		git -C "$TOP" ls-files -z --cached --others --exclude-standard |
		(cd "$TOP" && xargs -0 sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh) |
		(cd "$TOP" && xargs -0 cp -a --parents -t "$T/tree/") || die "cannot copy the tree"
	(cd "$T/tree" && autoreconf -fi && ./configure -q --without-cuda --without-mpi && make dist) \
		>"$T/dist.log" 2>&1 || { tail -n 30 "$T/dist.log"; die "make dist failed (log: $T/dist.log)"; }
	tarball=$(ls "$T"/tree/hi3-*.tar.gz) || die "make dist made no tarball"
	ver=$(basename "$tarball" .tar.gz)
	ver=${ver#hi3-}

	# 2. the programs, from the tarball: static libhi3, CUDA for sm_90 + compute_90 PTX
	say "build the GPU run's programs from hi3-$ver.tar.gz (nvcc, sm_90 + compute_90)"
	mkdir -p "$T/build" && tar -xzf "$tarball" -C "$T" || die "cannot unpack $tarball"
	b=$T/build
	# --compress-mode=size: each program carries every kernel's fatbin; the
	# densest compression (read by the driver at load) keeps the kit under
	# its size limit (attention.o: 508 KB by default, 139 KB so)
	(cd "$b" && "$T/hi3-$ver/configure" -q --disable-shared --with-cuda \
		CUDA_ARCH="-gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90" \
		NVCCFLAGS="-O3 --compress-mode=size" \
		LDFLAGS='-Wl,--disable-new-dtags -Wl,-rpath,\$$ORIGIN/../lib' &&
		make -j"$J" gpu-run-programs) >"$T/build.log" 2>&1 ||
		{ tail -n 30 "$T/build.log"; die "the build failed (log: $T/build.log); the kit needs nvcc and cuBLAS"; }
	progs=$(make -s -C "$b" print-gpu-run-programs) || die "no program list"
	# hi3-mpi when configure found MPI here: then Open MPI travels as packages
	if echo "$progs" | grep -q 'hi3-mpi'; then
		for pkg in $MPI_PKGS; do
			dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" && mpi="$mpi $pkg"
		done
		mpi=${mpi# }
	fi

	# 3. the kit
	rm -rf "$DIR" && mkdir -p "$DIR/bin" "$DIR/lib" "$DIR/src" "$DIR/debs" || die "cannot make $DIR"
	DIR=$(cd "$DIR" && pwd)
	for p in $progs; do
		strip -o "$DIR/bin/$(basename "$p")" "$b/$p" || die "strip $p"
	done
	cp "$tarball" "$DIR/src/" || die "cannot copy the tarball"
	cp "$TOP/scripts/gpu-run.sh" "$DIR/run" && chmod +x "$DIR/run" || die "cannot write $DIR/run"

	# lib/: what ldd resolves outside the base list; the big ones as packages
	for p in "$DIR"/bin/*; do ldd "$p"; done | sed -n 's/^[[:space:]]*\([^ ]*\) => \(\/[^ ]*\) .*/\1 \2/p' | sort -u |
		while read -r name path; do
			echo "$name" | grep -Eq "$BASE_LIBS" && continue
			size=$(stat -L -c %s "$path")
			pkg=$(owner "$(readlink -f "$path")")
			if [ -n "$pkg" ] && echo " $mpi " | grep -q " $pkg "; then
				echo "mpi $name $pkg"
			elif [ "$size" -gt "$BIG_LIB" ]; then
				[ -n "$pkg" ] || die "$name ($size bytes) is too big to carry and belongs to no package"
				echo "packed $name $pkg"
			else
				cp -L "$path" "$DIR/lib/$name" || die "cannot copy $path"
				echo "lib $name $pkg"
			fi
		done >"$T/libs.txt" || exit 1
	unpack=$(awk '$1 == "packed" { print $3 }' "$T/libs.txt" | sort -u | tr '\n' ' ')
	unpack="$unpack$mpi"
	runtime=$(awk '$1 != "" && $1 != "mpi" && $3 != "" { print $3 }' "$T/libs.txt" | grep -Ev "$COMPILER_RUNTIME" |
		sort -u | tr '\n' ' ')

	# debs/: the -dev packages configure.ac names for the libraries it
	# requires (HI3_MISSING; not MPI's: the fallback builds without MPI),
	# OpenBLAS's in the variant installed here, the runtime packages of the
	# libraries found above, Open MPI's runtime (hi3-mpi's) and make
	local dev var
	dev=$(sed -n 's/.*HI3_MISSING(\[[^]]*\], \[\([a-z0-9.+-]*-dev\)\]).*/\1/p' "$T/hi3-$ver/configure.ac" |
		grep -v '^libopenmpi' | sort -u | tr '\n' ' ')
	for var in pthread openmp serial; do
		dpkg-query -W -f='${Status}' "libopenblas-$var-dev" 2>/dev/null | grep -q "ok installed" &&
			{ dev="$dev libopenblas-$var-dev"; break; }
	done
	say "debs: $(echo $dev $runtime make)"
	(
		cd "$DIR/debs" || exit 1
		for pkg in $dev $runtime $mpi make; do
			v=$(dpkg-query -W -f='${Version}' "$pkg" 2>/dev/null) || die "$pkg is not installed here (scripts/setup.sh)"
			f=$(ls /var/cache/apt/archives/"${pkg}_${v/:/%3a}"_*.deb 2>/dev/null | head -n 1)
			if [ -n "$f" ]; then
				cp "$f" . || exit 1
			elif ! apt-get download -q "$pkg=$v" >/dev/null 2>&1 && ! apt-get download -q "$pkg" >/dev/null 2>&1; then
				die "apt-get download $pkg=$v failed (apt-get update?)"
			fi
		done
	) || exit 1

	# kit.info
	v=$("$(sed -n 's/^NVCC = //p' "$b/Makefile")" --version | sed -n 's/.*release [0-9.]*, V\([0-9.]*\).*/\1/p')
	{
		echo "# made by scripts/gpu-kit.sh; read by DIR/run"
		echo "KIT_VERSION=$ver"
		echo "KIT_COMMIT=$(git -C "$TOP" describe --always --dirty 2>/dev/null || echo unknown)"
		echo "KIT_DATE='$(date -u '+%Y-%m-%d %H:%M UTC')'"
		echo "KIT_NVCC=$v"
		echo "KIT_CUDA_MAJOR=${v%%.*}"
		echo "KIT_GLIBC=$(glibc_max "$DIR"/bin/* "$DIR"/lib/*)"
		echo "KIT_CUDA_LIBDIR=$(sed -n 's/^#define HI3_CUDA_LIBDIR "\(.*\)"/\1/p' "$b/config.h")"
		echo "KIT_UNPACK='${unpack% }'"
		echo "KIT_MPI='$mpi'"
		echo "KIT_PROGRAMS='$(ls "$DIR/bin" | tr '\n' ' ' | sed 's/ $//')'"
		# what configure's PKG_CHECK_MODULES found here, for the fallback,
		# which has no pkg-config perhaps: the same flags with /usr/ moved
		# into the unpacked packages
		local vars="" m s val
		for m in $(sed -n 's/.*PKG_CHECK_MODULES(\[\([A-Z0-9_]*\)\].*/\1/p' "$T/hi3-$ver/configure.ac"); do
			[ "$m" = MPI ] && continue
			for s in CFLAGS LIBS; do
				val=$(sed -n "s/^${m}_$s = //p" "$b/Makefile")
				printf 'KIT_PC_%s_%s=%q\n' "$m" "$s" "$val"
				vars="$vars ${m}_$s"
			done
		done
		echo "KIT_PC_VARS='${vars# }'"
	} >"$DIR/kit.info"

	verify "$DIR" || { say "the kit in $DIR does not pass its checks (the build is kept in $T)"; exit 1; }
	rm -rf "$T"
}

# --------------------------------------------------------------- verify

verify() {
	local DIR=$1 bad=0 p g a bytes out
	say "checks of $DIR"
	bytes=$(du -sb "$DIR" | cut -f1)
	printf '  size: %s bytes (%.1f MiB; at most %d MiB)\n' "$bytes" "$(awk -v b="$bytes" 'BEGIN { print b / 1048576 }')" \
		"$MAX_MIB"
	[ "$bytes" -le $((MAX_MIB * 1048576)) ] || { echo "  FAILED: the kit is over $MAX_MIB MiB"; bad=1; }
	echo "  highest glibc symbol version each file needs (objdump -T):"
	for p in "$DIR"/bin/* "$DIR"/lib/*; do
		printf '    %-24s %s\n' "$(basename "$p")" "$(glibc_max "$p")"
	done
	g=$(glibc_max "$DIR"/bin/* "$DIR"/lib/*)
	echo "  the kit needs $g at most"
	echo "  CUDA code in each program (its .nv_fatbin):"
	for p in "$DIR"/bin/*; do
		a=$(fatbin_archs "$p" | sort | uniq -c | awk '{ printf "%s%s %s", (NR > 1 ? ", " : ""), $1, $2 " " $3 }')
		[ -n "$a" ] || continue
		printf '    %-24s %s\n' "$(basename "$p")" "$a"
		case $a in
		*"cubin sm_90"*"ptx compute_90"*) ;;
		*) echo "    FAILED: $(basename "$p") must hold sm_90 machine code and compute_90 PTX"; bad=1 ;;
		esac
		if echo "$a" | tr ',' '\n' | grep -v -q -e 'cubin sm_90$' -e 'ptx compute_90$'; then
			echo "    FAILED: $(basename "$p") holds code for another architecture"
			bad=1
		fi
	done
	for p in "$DIR"/bin/*; do
		if objdump -T "$p" 2>/dev/null | grep -q 'cudaMallocManaged'; then
			echo "  FAILED: $(basename "$p") calls cudaMallocManaged (managed memory can hang the GPU)"
			bad=1
		fi
	done
	echo "  no program calls cudaMallocManaged"
	p=$(command -v cuobjdump || ls "${CUDA_HOME:-/usr/local/cuda}"/bin/cuobjdump 2>/dev/null)
	p=${CUOBJDUMP:-$p}
	if [ -n "$p" ] && [ -x "$p" ]; then
		echo "  $p --list-elf $DIR/bin/hi3:"
		"$p" --list-elf "$DIR/bin/hi3" | sed 's/^/    /' | head -n 4
		"$p" --list-elf "$DIR/bin/hi3" | grep -q 'sm_90' || { echo "  FAILED: cuobjdump lists no sm_90 code"; bad=1; }
	else
		echo "  (no cuobjdump here, CUOBJDUMP= names one: the fatbin headers above are read directly)"
	fi
	# every program starts and every library resolves inside the kit or
	# to the base list: DIR/run's own start step (here, nothing hidden)
	out=$(mktemp -d "${TMPDIR:-/tmp}/hi3-kit-check.XXXXXX")
	if HI3_RUN_GPU=0 HI3_KIT_PATH=prebuilt OUT=$out/out HI3_RUN_WORK=$out/work "$DIR/run" --only start >"$out/log" 2>&1
	then
		echo "  DIR/run --only start: every program starts, every library inside the kit or on the base list"
	else
		sed 's/^/    /' "$out/work/logs/start.log" 2>/dev/null || cat "$out/log"
		echo "  FAILED: DIR/run --only start"
		bad=1
	fi
	rm -rf "$out"
	echo "  contents: bin/ $(ls "$DIR/bin" | wc -l) programs ($(du -sh "$DIR/bin" | cut -f1)), lib/ $(ls "$DIR/lib" |
		tr '\n' ' ')($(du -sh "$DIR/lib" | cut -f1)), debs/ $(ls "$DIR/debs" | wc -l) packages ($(du -sh "$DIR/debs" |
		cut -f1)), src/ $(ls "$DIR/src") ($(du -sh "$DIR/src" | cut -f1))"
	return $bad
}

# ------------------------------------------------------------- rehearse

# the files (real paths) holding the system's copies of a library or of a
# package's files
real_files() { for f; do [ -e "$f" ] && readlink -f "$f"; done | sort -u; }

rehearse() {
	local DIR prebuilt_only=$2 R hide1 hide2 pkg rc=0 f t0
	DIR=$(cd "$1" 2>/dev/null && pwd) || die "no kit in $1"
	[ -x "$DIR/run" ] && [ -f "$DIR/kit.info" ] || die "$DIR is not a kit (scripts/gpu-kit.sh $1 first)"
	if ! unshare -m true 2>/dev/null; then
		echo "gpu-kit: rehearse: skipped: unshare -m is refused here ($(unshare -m true 2>&1 | head -n 1))"
		exit 77
	fi
	. "$DIR/kit.info"
	R=$(mktemp -d "${TMPDIR:-/tmp}/hi3-rehearse.XXXXXX") || exit 1
	# phase 1: every system copy of a library in lib/ or in a package the kit unpacks
	{
		for f in "$DIR"/lib/*; do
			name=$(basename "$f")
			real_files $(ldconfig -p | sed -n "s/^[[:space:]]*$name (.*=> \(.*\)$/\1/p") \
				/lib/x86_64-linux-gnu/"$name" /usr/lib/x86_64-linux-gnu/"$name" /usr/local/lib/"$name"
		done
		for pkg in $KIT_UNPACK; do
			real_files $(dpkg -L "$pkg" 2>/dev/null | grep '\.so')
		done
		# Open MPI's programs, help files and settings: the kit's are used
		for pkg in ${KIT_MPI:-}; do
			real_files $(dpkg -L "$pkg" 2>/dev/null | grep -E '^/usr/bin/|/share/openmpi/|/share/pmix/|^/etc/openmpi/')
		done
	} | sort -u | while read -r f; do [ -f "$f" ] && echo "$f"; done >"$R/hide1"
	# phase 2, the fallback: also every installed file of the kit's packages
	# (headers, .so links, .a, .pc), pkg-config, make and the autotools; but
	# not the compiler's runtimes (libgomp, ...), which the GPU machine's gcc
	# brings and the fallback build uses
	real_files $(dpkg -L $(dpkg-query -W -f='${Package}\n' | grep -E "$COMPILER_RUNTIME") 2>/dev/null) >"$R/compiler"
	{
		grep -vxF -f "$R/compiler" "$R/hide1"
		for deb in "$DIR"/debs/*.deb; do
			pkg=$(dpkg-deb -f "$deb" Package)
			real_files $(dpkg -L "$pkg" 2>/dev/null)
		done
		real_files $(for t in pkg-config pkgconf x86_64-linux-gnu-pkg-config make gmake autoconf autoreconf automake \
			aclocal autoheader libtoolize libtool m4; do command -v "$t"; done)
	} | sort -u | while read -r f; do
		# a -dev package's link (libz.so) leads to its library: never hide one on the base list
		[ -f "$f" ] && ! basename "$f" | grep -Eq "$BASE_LIBS" && echo "$f"
	done >"$R/hide2"
	# The system's own tools (grep links libpcre2-8) get the hidden
	# libraries they need from copies in R/toollibs, on LD_LIBRARY_PATH
	# behind whatever DIR/run puts first: a kit program that found one of
	# them there would be outside the kit, which the start step fails.
	mkdir -p "$R/toollibs"
	for t in bash grep sed awk tar gzip find sort timeout tee cut od objcopy dpkg-deb mount date uname readlink; do
		t=$(command -v "$t") && ldd "$t" 2>/dev/null
	done | sed -n 's/^[[:space:]]*\([^ ]*\) => \(\/[^ ]*\) .*/\1 \2/p' | sort -u | while read -r name path; do
		grep -qxF "$(readlink -f "$path")" "$R/hide2" && cp -L "$path" "$R/toollibs/$name"
	done
	say "rehearse $DIR in a mount namespace: $(wc -l <"$R/hide1") files hidden for the prebuilt path," \
		"$(wc -l <"$R/hide2") for the fallback"
	sed 's/^/  hidden: /' "$R/hide1"

	# phase NAME HIDE ENV...: DIR/run in a namespace with the HIDE files
	# bound to /dev/null; the namespace first shows that they are empty
	phase() {
		local name=$1 hide=$2
		shift 2
		unshare -m --propagation private env "$@" OUT="$R/$name" HI3_RUN_WORK="$R/$name-work" \
			LD_LIBRARY_PATH="$R/toollibs" \
			bash -c '
			while read -r f; do mount --bind /dev/null "$f" || exit 3; done <"$1"
			f=$(head -n 1 "$1")
			[ ! -s "$f" ] || { echo "rehearse: $f is not hidden"; exit 3; }
			echo "rehearse: $(wc -l <"$1") files hidden (e.g. $f: $(wc -c <"$f") bytes)"
			"$2/run" ${3:+--only "$3"}' sh "$hide" "$DIR" "${ONLY:-}"
	}
	t0=$(date +%s)
	say "phase 1: the prebuilt programs (HI3_KIT_PATH=prebuilt)"
	ONLY="" phase prebuilt "$R/hide1" HI3_KIT_PATH=prebuilt || rc=1
	judge "$R" prebuilt || rc=1
	say "phase 1 took $(($(date +%s) - t0)) s"
	if [ "$prebuilt_only" != 1 ]; then
		t0=$(date +%s)
		say "phase 2: the fallback: the tarball built against the kit's packages (HI3_KIT_PATH=fallback)"
		ONLY=cpu phase fallback "$R/hide2" HI3_KIT_PATH=fallback || rc=1
		judge "$R" fallback || rc=1
		say "phase 2 took $(($(date +%s) - t0)) s"
	fi
	if [ "$rc" = 0 ]; then
		say "rehearsal passed (results and logs in $R)"
	else
		say "rehearsal FAILED (results and logs in $R)"
	fi
	return $rc
}

# judge R PATH: the run in R/PATH took PATH; no step failed (the log of
# each that did is shown); env, libs, start and cpu-pipeline passed.
judge() {
	local j=$1/$2/results.json want=$2 bad=0 s
	[ -f "$j" ] || { echo "rehearse: no $j"; return 1; }
	grep -q "\"path\": \"$want\"" "$j" || { echo "rehearse: the run did not take the $want path"; bad=1; }
	for s in $(sed -n 's/.*"name": "\([^"]*\)", "group": "[a-z]*", "status": "fail".*/\1/p' "$j"); do
		echo "rehearse: step $s failed; its log ends:"
		tail -n 25 "$1/$want-work/logs/$s.log" | sed 's/^/  | /'
		bad=1
	done
	for s in env libs start cpu-pipeline; do
		grep -q "\"name\": \"$s\", \"group\": \"[a-z]*\", \"status\": \"pass\"" "$j" ||
			{ echo "rehearse: step $s did not pass"; bad=1; }
	done
	if [ "$want" = fallback ]; then
		grep -q '"name": "fallback", "group": "setup", "status": "pass"' "$j" ||
			{ echo "rehearse: the fallback build did not pass"; bad=1; }
	fi
	return $bad
}

# ------------------------------------------------------------------- main

J=$(nproc 2>/dev/null || echo 2)
REHEARSE=0 PREBUILT_ONLY=0 DIR=""
while [ $# -gt 0 ]; do
	case $1 in
	-j) J=$2; shift ;;
	-j*) J=${1#-j} ;;
	--rehearse) REHEARSE=1 ;;
	--prebuilt-only) PREBUILT_ONLY=1 ;;
	-h | --help) sed -n '2,/^set -u/p' "$0" | sed -e '/^set -u/d' -e 's/^# \{0,1\}//'; exit 0 ;;
	-*) die "unknown option $1 (--help)" ;;
	*) [ -z "$DIR" ] || die "one DIR only"; DIR=$1 ;;
	esac
	shift
done
[ -n "$DIR" ] || die "give the kit's folder (--help)"
case $DIR in /*) ;; *) DIR=$CALLER/$DIR ;; esac

if [ "$REHEARSE" = 1 ]; then
	rehearse "$DIR" "$PREBUILT_ONLY"
	exit $?
fi
build "$DIR" "$J"
say "kit ready: $DIR ($(du -sh "$DIR" | cut -f1)); rehearse with scripts/gpu-kit.sh --rehearse $DIR"
