#!/bin/bash
# t0300-write-blocks.sh -- hi3 writes a safetensors file in whole 2 MiB
# blocks at offsets that are multiples of 2 MiB (the last block may be
# short), so that the kernel caches it in huge folios and a map of it
# takes one entry a block, and a file hi3 updates in place (a KV file) a
# page a write (lib/format/safetensors.c): checked on the write and lseek
# calls that strace sees. test-st checks the bytes.
. "$SRCDIR/tests/lib.sh"

if ! strace -f -qq -o /dev/null true >/dev/null 2>&1; then
	echo "1..0 # SKIP strace cannot trace here (not installed, or ptrace refused)"
	rm -rf "$TRASH"
	exit 0
fi

# LeakSanitizer cannot run under ptrace (a sanitizer build): the other
# tests look for leaks
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"

# blocks LOG FILE [PAGES]: the calls LOG shows on the temporary file that
# became FILE (FILE.*.tmp.* or FILE.tmp.*); each write but the last, and each skip over a hole, a whole
# number of blocks in bytes (2 MiB; with PAGES, 4 KiB, and no write of
# more than one block); every byte of FILE accounted for.
blocks() {
	awk -v B=$([ -n "${3:-}" ] && echo 4096 || echo 2097152) -v one="${3:+1}" -v size="$(stat -c %s "$2")" \
	    -v f="/$(basename "$2")." '
		function ours() { return index($0, f) && index($0, ".tmp.") }
		ours() && /write\(/ { w[++n] = $NF; sum += $NF }
		ours() && /lseek\(.*SEEK_CUR/ { k = $0; sub(/.*>, /, "", k); sub(/,.*/, "", k)
			if (k % B && nb++ < 5) bad = bad " skip:" k; sum += k; skips++ }
		END {
			for (i = 1; i < n; i++) if ((w[i] % B || (one && w[i] > B)) && nb++ < 5) bad = bad " write" i ":" w[i]
			if (n < 2 || sum != size || nb) {
				printf "%d writes, %d of %d bytes; %d off the blocks:%s\n", n, sum, size, nb, bad; exit 1 }
			printf "%d writes and %d holes, %d bytes\n", n, skips, size }' "$1"
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

# A KV file is updated in place, a few bytes a step: written a page a
# write, its zeros (the slots decode fills) holes, so that the kernel
# caches it in pages and a step's commit writes back pages, not 2 MiB
# folios (lib/format/safetensors.c).
test_expect_success 'prefill writes its KV file a page a write, its zeros as holes' '
	requests 40 300 7 >req.jsonl && "$HI3" -q -m m tokenize-concat req.jsonl -o c.st &&
	strace -f -qq -y -s 0 -e trace=write,lseek -o log "$HI3" -q -m m prefill c.st -o kv.st --max-new 3000 &&
	blocks log kv.st pages >out || { cat out; false; } &&
	! grep " 0 holes" out
'

test_done
