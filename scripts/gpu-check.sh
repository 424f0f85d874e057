#!/bin/sh
# gpu-check.sh -- on a GPU machine that has the whole toolchain (autotools
# and the packages of scripts/setup.sh): build this tree, then run every GPU
# check and benchmark of scripts/gpu-run.sh on its programs. A bare GPU
# machine, the usual case, runs a kit instead (scripts/gpu-kit.sh on a CPU
# machine, then DIR/run there: docs/PERFORMANCE.md); both run the same steps.
#
#   scripts/gpu-check.sh [WORKDIR]   (scratch and models in WORKDIR, default
#                                     /tmp/hi3-gpu-check; results in $OUT,
#                                     default WORKDIR/out)
#
# Exit status: 0 when no step failed.
set -u
cd "$(dirname "$0")/.." || exit 1
WORK=${1:-/tmp/hi3-gpu-check}
JOBS=$(nproc 2>/dev/null || echo 4)
mkdir -p "$WORK" || exit 1
echo "gpu-check: build (log: $WORK/build.log)"
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
HI3_RUN_WORK=$WORK exec bash scripts/gpu-run.sh --tree . --src .
