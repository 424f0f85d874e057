#!/usr/bin/env bash
# Every command answers -h/--help and `hi3 help CMD` with its usage, has a man
# page that renders, and the man page's SYNOPSIS is the usage line.
. "$SRCDIR/tests/lib.sh"

commands=$(hi3 --help | sed -n '/^commands:/,/^$/p' | awk 'NF && $1 != "commands:" {print $1}')

test_expect_success 'hi3 --help lists commands' '
	test -n "$commands"
'

render() { # render MANPAGE: plain text, no overstrike
	groff -man -Tascii -P-c -P-b -P-u "$1" 2>/dev/null
}

synopsis() { # synopsis MANPAGE: the SYNOPSIS section on one line
	render "$1" | awk '/^SYNOPSIS/ {on = 1; next} /^[A-Z]/ {on = 0} on' | tr -s " \n" "  " | sed "s/^ //; s/ $//"; echo
}

for cmd in $commands; do
	test_expect_success "$cmd: --help, -h and help agree and start with its usage" '
		hi3 "$cmd" --help >out &&
		hi3 "$cmd" -h >out2 &&
		hi3 help "$cmd" >out3 &&
		test_cmp out out2 && test_cmp out out3 &&
		head -n 1 out | grep -q "^usage: hi3 $cmd"
	'
	test_expect_success "$cmd: man page renders and its SYNOPSIS is the usage line" '
		page="$SRCDIR/man/hi3-$cmd.1" &&
		test -f "$page" &&
		render "$page" | grep -q "^NAME" &&
		hi3 "$cmd" --help | sed -n "/^usage: /,/^$/p" | sed "/^$/d; s/^usage: //; s/^ *or: //" |
			tr -s " \n" "  " | sed "s/ $//" >want && echo >>want &&
		synopsis "$page" >got &&
		test_cmp want got
	'
	test_expect_success "$cmd: every option of --help is in the man page" '
		hi3 "$cmd" --help | sed -n "s/^ *\(-[a-zA-Z], \)\{0,1\}--\([a-z][a-z-]*\).*/\2/p" >opts &&
		test -s opts &&
		sed "s/\\\\-/-/g" "$SRCDIR/man/hi3-$cmd.1" >page &&
		while read -r o; do grep -q -- "--$o" page || { echo "--$o is not in hi3-$cmd.1"; exit 1; }; done <opts
	'
done

test_expect_success 'hi3.1, hi3-files.5 and hi3-batching.7 render' '
	render "$SRCDIR/man/hi3.1" | grep -q "^SYNOPSIS" &&
	render "$SRCDIR/man/hi3-files.5" | grep -q "^NAME" &&
	render "$SRCDIR/man/hi3-batching.7" | grep -q "^BATCHING RULES"
'

test_expect_success 'unknown command and unknown option are usage errors (exit 2)' '
	test_must_fail 2 hi3 no-such-command 2>err &&
	grep -q "not a command" err &&
	test_must_fail 2 hi3 init-model --no-such-option 2>err &&
	grep -q "init-model --help" err
'

test_expect_success 'strict numbers: trailing garbage and out of range are refused' '
	test_must_fail 2 hi3 init-model --preset tiny --seed 12x -o m 2>err &&
	grep -q "expected an integer" err &&
	test_must_fail 2 hi3 -t -1 init-model --preset tiny -o m 2>err &&
	grep -q "out of range" err &&
	test ! -e m
'

test_expect_success 'hi3 -h, hi3 --help and hi3 help agree; help has a usage of its own' '
	hi3 -h >out && hi3 --help >out2 && hi3 help >out3 &&
	test_cmp out out2 && test_cmp out out3 &&
	hi3 help --help >out4 && head -n 1 out4 | grep -q "^usage: hi3 help" &&
	test_must_fail 2 hi3 help no-such-command 2>err && grep -q "unknown command" err
'

test_expect_success 'global options are accepted before and after the command name' '
	test_must_fail 2 hi3 --threads=x init-model 2>err && grep -q "hi3: --threads: expected an integer" err &&
	test_must_fail 2 hi3 init-model --threads=x 2>err && grep -q "hi3 init-model: --threads: expected an integer" err &&
	test_must_fail 2 hi3 init-model --backend tpu 2>err && grep -q "expected cpu or cuda" err
'

test_expect_success 'one range per shared option: decode and parity refuse the same values' '
	for cmd in "decode c k -o s" "parity r"; do
		test_must_fail 2 hi3 $cmd --temperature -1 2>err &&
		grep -q -- "--temperature: -1 is out of range \[0, 1e+06\]" err &&
		test_must_fail 2 hi3 $cmd --top-p 0 2>err && grep -q -- "--top-p: 0 is out of range (0, 1\]" err &&
		test_must_fail 2 hi3 $cmd --top-k -1 2>err && grep -q -- "--top-k: -1 is out of range" err || exit 1
	done
'

test_expect_success 'every --seed is in [0, INT64_MAX]' '
	for cmd in "decode c k -o s" "parity r" "tokenize-concat -o x r" "init-model --preset tiny -o m"; do
		test_must_fail 2 hi3 $cmd --seed -1 2>err &&
		grep -q -- "--seed: -1 is out of range \[0, 9223372036854775807\]" err &&
		test_must_fail 2 hi3 $cmd --seed 9223372036854775808 2>err || exit 1
	done &&
	test ! -e m && test ! -e x
'

test_expect_success 'tokenize-concat --seed N: N + the last index must fit' '
	printf "{\"tokens\": [1, 2]}\n{\"tokens\": [3]}\n" >two.jsonl &&
	test_must_fail 2 hi3 tokenize-concat --pad-id 0 --seed 9223372036854775807 -o x.st two.jsonl 2>err &&
	grep -q "beyond 9223372036854775807" err && test ! -e x.st &&
	hi3 -q tokenize-concat --pad-id 0 --seed 9223372036854775806 -o x.st two.jsonl &&
	hi3 inspect --tensor seeds x.st >seeds && grep -q 9223372036854775807 seeds
'

test_expect_success 'choosing an upstream defect warns; the default does not' '
	printf "{\"tokens\": [1, 2]}\n{\"tokens\": [3]}\n" >two.jsonl &&
	hi3 tokenize-concat --pad-id 0 --pad-positions zero -o z.st two.jsonl 2>err &&
	grep -q "warning: --pad-positions=zero" err &&
	hi3 tokenize-concat --pad-id 0 --pad-positions continue -o c.st two.jsonl 2>err &&
	! grep -q warning err &&
	test_must_fail 2 hi3 decode --decode-mask sideways c k -o s 2>err &&
	grep -q -- "--decode-mask: expected causal or none, found .sideways." err
'

test_expect_success 'missing values and values given to flags are usage errors' '
	test_must_fail 2 hi3 decode --stop 2>err && grep -q -- "--stop needs a value" err &&
	test_must_fail 2 hi3 decode --json=yes c k -o s 2>err && grep -q -- "--json takes no value" err &&
	test_must_fail 2 hi3 decode --stop 1,x c k -o s 2>err && grep -q "expected an integer, found .x." err
'

test_done
