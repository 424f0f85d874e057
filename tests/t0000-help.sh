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

test_done
