#!/bin/sh
# run.sh -- one harness under libFuzzer for a while (make fuzz-TARGET; docs/FUZZING.md).
#
#   FUZZ=tests/fuzz/hi3-fuzz SRCDIR=. tests/fuzz/run.sh TARGET SECONDS [libFuzzer flags...]
#
# New inputs go to tests/fuzz/run/TARGET/corpus (the committed seeds in
# $SRCDIR/tests/fuzz/corpus/TARGET and the crash inputs are read, never
# written), findings to tests/fuzz/run/TARGET/, the log to
# tests/fuzz/run/TARGET.log. Prints one line of figures; exits 1 on a finding.
#
# A finding is a crash, a leak, a timeout (30 s), an out-of-memory, or a
# unit slower than SLOW seconds (10) that is slow again when run once more
# on its own: on a shared machine one unit of a busy minute can take ten
# times its time, and a finding must be one the same input shows again.
# OpenMP runs one thread (OMP_NUM_THREADS, unless set): harnesses run two
# at a time on two cores, and a team per harness would oversubscribe them.
set -u
target=$1 seconds=$2
shift 2
: "${FUZZ:=tests/fuzz/hi3-fuzz}" "${SRCDIR:=.}" "${SLOW:=10}" "${OMP_NUM_THREADS:=1}"
export OMP_NUM_THREADS
fz=$SRCDIR/tests/fuzz
work=tests/fuzz/run/$target
log=tests/fuzz/run/$target.log
mkdir -p "$work/corpus"

# the dictionary: JSON tokens, the safetensors header for the file
# openers, then the target's own words
case $target in
conditions|kv|replay|safetensors|segment) dicts="json safetensors $target" ;;
template) dicts="json requests template" ;;
*) dicts="json $target" ;;
esac
: >"$work/dict"
for d in $dicts; do
	[ -f "$fz/dict/$d.dict" ] && cat "$fz/dict/$d.dict" >>"$work/dict"
done

seeds=
for d in "$fz/corpus/$target" "$fz/crashes/$target"; do
	[ -d "$d" ] && seeds="$seeds $d"
done
# A seed (-seed=N) mutates the same way again only where the run's heap
# addresses repeat: libFuzzer's comparison tracing records the operands
# of the harness's compares, some of them addresses, and offers them to
# its mutations. So address randomisation is off (setarch -R) where the
# kernel lets a process turn it off, and libFuzzer does not re-read its
# corpus directory every second (-reload=0: only this process writes it),
# which at moments set by the clock allocated and freed memory and so
# moved every later address (docs/FUZZING.md, "A run again").
norand=
setarch "$(uname -m)" -R true 2>/dev/null && norand="setarch $(uname -m) -R"
start=$(date +%s)
# shellcheck disable=SC2086 # $norand, $seeds: words without blanks
HI3_FUZZ_TARGET=$target ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1} \
	UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
	$norand "$FUZZ" -max_total_time="$seconds" -timeout=30 -rss_limit_mb=2560 -report_slow_units="$SLOW" \
	-print_final_stats=1 -reload=0 -dict="$work/dict" -artifact_prefix="$work/" "$@" "$work/corpus" $seeds >"$log" 2>&1
rc=$?
elapsed=$(( $(date +%s) - start ))

last=$(grep -E '^#[0-9]+' "$log" | tail -n 1)
execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
cov=$(echo "$last" | sed -n 's/.*cov: \([0-9]*\).*/\1/p')
ft=$(echo "$last" | sed -n 's/.*ft: \([0-9]*\).*/\1/p')
corp=$(echo "$last" | sed -n 's/.*corp: \([0-9]*\/[0-9a-zA-Z]*\).*/\1/p')
# a slow unit timed once more, alone: kept as a finding only when slow again
for p in "$work"/slow-unit-*; do
	[ -e "$p" ] || continue
	f=${p##*/}
	ms=$(HI3_FUZZ_TARGET=$target "$FUZZ" -timeout=30 "$p" 2>&1 | sed -n 's/^Executed .* in \([0-9]*\) ms$/\1/p')
	if [ -n "$ms" ] && [ "$ms" -lt $((SLOW * 1000)) ]; then
		echo "fuzz: $target: $f took over $SLOW s once, $ms ms again: not a finding (kept as $work/once-$f)" >&2
		mv "$p" "$work/once-$f"
	else
		echo "fuzz: $target: $f: slow again (${ms:-no time} ms)" >&2
	fi
done
found=$(for p in "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-* "$work"/slow-unit-*; do
	[ -e "$p" ] && echo "${p##*/}"
done | head -n 1)
echo "fuzz: $target: ${elapsed} s, ${execs:-?} executions, cov ${cov:-?}, ft ${ft:-?}, corpus ${corp:-?}" \
	"(log $log)"
if [ "$rc" -ne 0 ] || [ -n "$found" ]; then
	echo "fuzz: $target: FOUND ${found:-a failure (exit $rc)}; see $log" >&2
	[ -n "$found" ] && echo "fuzz: reproduce: HI3_FUZZ_TARGET=$target $FUZZ $work/$found;" \
		"keep it: cp $work/$found $fz/crashes/$target/ (make check replays it)" >&2
	exit 1
fi
exit 0
