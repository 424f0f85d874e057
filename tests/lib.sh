# lib.sh -- shell test helpers in the style of git's t/test-lib.sh, TAP output.
#
#   . "$SRCDIR/tests/lib.sh"
#   test_expect_success 'what it checks' '
#       commands that must all succeed
#   '
#   test_done
#
# Each test runs in a fresh subshell inside $TRASH (a scratch directory
# removed at the end unless HI3_KEEP=1). HI3 names the binary under test.

set -u
: "${HI3:?HI3 must name the hi3 binary}"
: "${SRCDIR:?SRCDIR must name the source tree}"
TEST_NAME=$(basename "$0" .sh)
TRASH=$(mktemp -d "${TMPDIR:-/tmp}/hi3-$TEST_NAME.XXXXXX")
FIXTURES="$SRCDIR/tests/fixtures"
test_count=0
test_failures=0
export LC_ALL=C

hi3() { "$HI3" "$@"; }

test_expect_success() {
	test_count=$((test_count + 1))
	if (cd "$TRASH" && set -e && eval "$2") >"$TRASH/.out" 2>&1; then
		echo "ok $test_count - $1"
	else
		echo "not ok $test_count - $1"
		sed 's/^/# /' "$TRASH/.out" | tail -n 40
		test_failures=$((test_failures + 1))
	fi
}

# test_must_fail [STATUS] CMD...: CMD fails (with exit STATUS when given),
# and is not killed by a signal (a crash is never an acceptable failure).
test_must_fail() {
	want=
	case "$1" in [0-9]*) want=$1; shift ;; esac
	"$@" && { echo "expected failure: $*" >&2; return 1; }
	rc=$?
	if [ "$rc" -gt 128 ]; then echo "killed by signal $((rc - 128)): $*" >&2; return 1; fi
	if [ -n "$want" ] && [ "$rc" -ne "$want" ]; then
		echo "expected exit $want, got $rc: $*" >&2
		return 1
	fi
	return 0
}

# test_cmp EXPECTED ACTUAL
test_cmp() { diff -u "$1" "$2"; }

# test_grep PATTERN FILE: like grep, but shows the file when it fails.
test_grep() {
	grep "$@" || { echo "no match for '$1' in:" >&2; cat "${@: -1}" >&2; return 1; }
}

# The release presets' VAE block with one ResNet block a level: the encoder
# runs on every cond image, four frames at full size, so image tests that
# run many cases use it to stay quick (make_model ... --set "vae=$QUICK_VAE").
QUICK_VAE=$(cat "$FIXTURES/quick-vae.json")

# A tiny model, made once per test file.
make_model() { # make_model PRESET DIR [extra init-model args]
	preset=$1 dir=$2; shift 2
	[ -f "$dir/config.json" ] || hi3 -q init-model --preset "$preset" --seed 1 -o "$dir" "$@"
}

# Pre-tokenized requests (JSONL) with rows of the given lengths: token ids
# below 256 from a fixed LCG started at REQ_SEED (default 12345), and row r
# (from 1) carrying "seed": 100 + r.
requests() { # requests LEN...
	awk -v lens="$*" -v s="${REQ_SEED:-12345}" 'BEGIN { n = split(lens, L, " ")
		for (r = 1; r <= n; r++) { printf "{\"tokens\": ["
			for (i = 0; i < L[r]; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? ", " : "", s % 256 }
			printf "], \"seed\": %d}\n", 100 + r } }'
}

test_done() {
	echo "1..$test_count"
	if [ "${HI3_KEEP:-0}" = 1 ]; then echo "# kept $TRASH"; else rm -rf "$TRASH"; fi
	[ "$test_failures" -eq 0 ]
}
