#!/usr/bin/env bash
# hi3 run: the stages of a pipeline in one process write byte for byte the
# files of separate commands; global options of run hold for every line;
# the model is opened once; the first failing command stops the run with its
# own exit status and a message naming its line.
. "$SRCDIR/tests/lib.sh"

# The four-stage pipeline, sampled, routing recorded: its commands without the
# program name, the form run reads. Row lengths differ, so pads are exercised.
# The files name the files they were made from (cond_file), so each pipeline
# runs in its own directory with the same names.
pipeline() {
	cat <<-\END
	tokenize-concat ../req.jsonl -o c.st
	prefill c.st -o k.st --max-new 12 --record-routing
	decode --temperature 0.8 --top-p 0.9 --stop 7,11 c.st k.st -o s.st
	replay c.st s.st -o r.st
	END
}
# Standard output without the timings, which differ from run to run.
untimed() { grep -v -e '"seconds"' -e '"tokens_per_s"' "$@"; }

test_expect_success 'setup: a MoE model, requests, the pipeline as separate commands' '
	make_model tiny-moe m &&
	requests 13 37 5 51 >req.jsonl &&
	mkdir sep &&
	(cd sep && pipeline | while read -r line; do eval "hi3 -q -m ../m $line" || exit 1; done) >sep.out &&
	ls sep >files && test "$(wc -l <files)" = 4 && test -s sep.out
'

test_expect_success 'run from a file writes the same bytes, prints the same output' '
	mkdir f && pipeline >script &&
	(cd f && hi3 -q -m ../m run ../script) >f.out &&
	for x in $(cat files); do cmp sep/$x f/$x || exit 1; done &&
	untimed sep.out >want && untimed f.out >got && test_cmp want got
'

test_expect_success 'run from standard input, -m given after run, likewise' '
	mkdir i && (cd i && pipeline | hi3 run -q -m ../m) >i.out &&
	for x in $(cat files); do cmp sep/$x i/$x || exit 1; done &&
	rm i/* && (cd i && pipeline | hi3 -q run -m ../m -) >i2.out &&
	for x in $(cat files); do cmp sep/$x i/$x || exit 1; done &&
	untimed i.out >got && untimed sep.out >want && test_cmp want got
'

test_expect_success 'the model is opened once for all the stages' '
	mkdir v && (cd v && pipeline | hi3 -v -m ../m run) >/dev/null 2>err &&
	test "$(grep -c "opened in" err)" = 1 &&
	test_grep "^hi3 run: line 2: prefill: ../m: opened in" err &&
	test_grep "^hi3 run: line 3: decode: " err
'

test_expect_success 'a line gives its own global options, for that line only' '
	printf "%s\n" "-v prefill f/c.st -o k2.st --max-new 12" "prefill f/c.st -o k3.st --max-new 12" |
		hi3 -q -m m run 2>err &&
	test_grep "^hi3 run: line 1: prefill: .* prompt tokens in" err &&
	test_grep "^hi3 run: line 1: prefill: m: opened in" err &&
	! grep "line 2" err && cmp k2.st k3.st
'

test_expect_success 'quotes, escapes, comments and blank lines' '
	mkdir "a dir" &&
	cat >script <<-\END &&
	# prefill into a directory with a blank in its name

	  prefill f/c.st   -o "a dir/k.st"   --max-new 12 --record-routing   # a trailing comment
	prefill f/c.st -o a\ dir/k2.st --max-new 12 '\''--record-routing'\''
	END
	hi3 -q -m m run script &&
	hi3 -q -m m prefill f/c.st -o k.st --max-new 12 --record-routing &&
	cmp k.st "a dir/k.st" && cmp k.st "a dir/k2.st"
'

test_expect_success 'the first failing command stops the run with its status and message' '
	mkdir x &&
	printf "%s\n" "tokenize-concat req.jsonl -o x/c.st" "" "decode x/c.st x/no-such.st -o x/s.st" \
		"prefill x/c.st -o x/k.st" >script &&
	rc_run=0 && { hi3 -q -m m run script 2>err || rc_run=$?; } &&
	test -f x/c.st && ! test -e x/k.st && ! test -e x/s.st &&
	rc=0 && { hi3 -q -m m decode x/c.st x/no-such.st -o x/s.st 2>err1 || rc=$?; } &&
	test "$rc" -gt 0 && test "$rc" -lt 128 && test "$rc_run" = "$rc" &&
	sed "s/^hi3 decode: /hi3 run: line 3: decode: /" err1 >want && test_cmp want err
'

test_expect_success 'a usage error in a line: status 2, the line named, later lines not run' '
	printf "%s\n" "prefill f/c.st -o y.st --no-such-option" "prefill f/c.st -o z.st" >script &&
	test_must_fail 2 hi3 -q -m m run script 2>err &&
	test_grep "^hi3 run: line 1: prefill: " err && test_grep "no-such-option" err &&
	! test -e y.st && ! test -e z.st
'

test_expect_success 'lines that are not commands: status 2, naming the line' '
	printf "inspect f/c.st\nno-such-command x\n" >s1 &&
	test_must_fail 2 hi3 run s1 >/dev/null 2>err && test_grep "^hi3 run: line 2: .no-such-command. is not a command" err &&
	printf "\n\nrun s1\n" >s2 &&
	test_must_fail 2 hi3 run s2 2>err && test_grep "^hi3 run: line 3: .run. does not run inside run" err &&
	printf "prefill \"f/c.st -o q.st\n" >s3 &&
	test_must_fail 2 hi3 -m m run s3 2>err && test_grep "^hi3 run: line 1: an unclosed \" quote" err &&
	printf "prefill f/c.st -o q.st\\\\\n" >s4 &&
	test_must_fail 2 hi3 -m m run s4 2>err && test_grep "^hi3 run: line 1: a backslash at the end" err &&
	! test -e q.st
'

test_expect_success 'a script that cannot be opened: status 3, naming it' '
	test_must_fail 3 hi3 run no-such-script 2>err && test_grep "no-such-script" err
'

test_expect_success 'an empty script does nothing and succeeds' '
	hi3 -m m run </dev/null >out 2>err && ! test -s out && ! test -s err
'

test_done
