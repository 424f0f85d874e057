#!/usr/bin/env bash
# t4200-cuda-nodev.sh -- `hi3 --backend cuda` on a machine without a GPU or
# driver: exit 1, a message naming the cause, no output file touched.
# Skipped where a GPU is present.
. "$SRCDIR/tests/lib.sh"
if "$BUILDDIR/tests/test-cuda-nodev" | grep -q "^1\.\.0 # SKIP"; then
	echo "1..0 # SKIP a CUDA device is present"
	exit 0
fi

test_expect_success 'prefill --backend cuda: exit 1, names cudaGetDeviceCount and its error, writes nothing' '
	make_model tiny tt &&
	printf "{\"tokens\": [1, 2, 3]}\n" >req.jsonl &&
	hi3 -q -m tt tokenize-concat req.jsonl -o cond.st &&
	test_must_fail 1 hi3 --backend cuda -m tt prefill cond.st -o kv.st 2>err &&
	test_grep "no CUDA device available: cudaGetDeviceCount: .* (cuda" err &&
	test ! -e kv.st
'

test_expect_success 'an existing output stays as it was' '
	echo keep >kv2.st &&
	test_must_fail 1 hi3 --backend cuda -m tt prefill cond.st -o kv2.st 2>err &&
	test "$(cat kv2.st)" = keep
'

test_done
