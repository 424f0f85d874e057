#!/bin/bash
# t0300-write-blocks.sh -- hi3 writes a safetensors file in whole 2 MiB
# blocks at offsets that are multiples of 2 MiB (the last block may be
# short), so that the kernel caches it in huge folios and a map of it
# takes one entry a block (lib/format/safetensors.c): checked on the
# write and lseek calls that strace sees. test-st checks the bytes.
. "$SRCDIR/tests/lib.sh"

if ! strace -f -qq -o /dev/null true >/dev/null 2>&1; then
	echo "1..0 # SKIP strace cannot trace here (not installed, or ptrace refused)"
	rm -rf "$TRASH"
	exit 0
fi

# LeakSanitizer cannot run under ptrace (a sanitizer build): the other
# tests look for leaks
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"

# blocks LOG FILE: the calls LOG shows on the temporary file that became
# FILE; each write but the last, and each skip over a hole, a whole number
# of blocks in bytes; every byte of FILE accounted for.
blocks() {
	awk -v B=2097152 -v size="$(stat -c %s "$2")" -v f="$(basename "$2").tmp." '
		index($0, f) && /write\(/ { w[++n] = $NF; sum += $NF }
		index($0, f) && /lseek\(.*SEEK_CUR/ { sub(/,.*/, "", $2); if ($2 % B && nb++ < 5) bad = bad " skip:" $2; sum += $2 }
		END {
			for (i = 1; i < n; i++) if (w[i] % B && nb++ < 5) bad = bad " write" i ":" w[i]
			if (n < 2 || sum != size || nb) {
				printf "%d writes, %d of %d bytes; %d off the blocks:%s\n", n, sum, size, nb, bad; exit 1 }
			printf "%d writes of %d bytes\n", n, size }' "$1"
}

test_expect_success 'init-model writes its checkpoint in 2 MiB blocks' '
	strace -f -qq -y -s 0 -e trace=write,lseek -o log "$HI3" -q init-model --preset tiny-moe --seed 1 -o m &&
	blocks log m/model.safetensors
'

test_expect_success 'in bf16 too (another size, the last block short)' '
	strace -f -qq -y -s 0 -e trace=write,lseek -o log "$HI3" -q init-model --preset tiny --seed 1 --dtype bf16 -o b &&
	blocks log b/model.safetensors &&
	test $(($(stat -c %s b/model.safetensors) % 2097152)) -ne 0
'

test_done
