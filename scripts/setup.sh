#!/usr/bin/env bash
# setup.sh -- install the Debian packages hi3 builds with, then build it.
#
#   scripts/setup.sh            install (as root, or through sudo), configure, make
#   scripts/setup.sh --no-apt   only configure and make
#   CONFIGURE_FLAGS="--enable-sanitizers" scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential autoconf automake libtool pkg-config
          libopenblas-dev libjansson-dev libpcre2-dev libpng-dev libutf8proc-dev
          libjpeg62-turbo-dev libwebp-dev zlib1g-dev
          groff-base libopenmpi-dev openmpi-bin time strace)

if [ "${1:-}" != "--no-apt" ]; then
	missing=()
	for p in "${packages[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
	done
	if [ "${#missing[@]}" -gt 0 ]; then
		echo "setup: installing ${missing[*]}" >&2
		if [ "$(id -u)" = 0 ]; then sudo=; else sudo=sudo; fi
		$sudo apt-get update -qq
		DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
	fi
fi

autoreconf -fi
./configure -q ${CONFIGURE_FLAGS:-}
make -j"$(nproc)"
echo "setup: built ./bin/hi3 ($(./bin/hi3 --version))" >&2
