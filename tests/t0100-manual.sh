#!/usr/bin/env bash
# t0100-manual.sh -- the manual holds together: every page renders without
# warnings and is installed, every page it names exists, every citation of
# a rule of hi3-batching(7) names a rule the page has, the documents' links
# lead to files of the tree, and nothing cites a design document the tree
# does not hold.
. "$SRCDIR/tests/lib.sh"
cd "$SRCDIR" || exit 1

pages=$(ls man/*.[1-9])
# where documentation and citations live (fixtures are data, not prose)
sources() { grep -rlI "$1" lib bin man tests docs scripts kernels README.md Makefile.am 2>/dev/null |
	grep -v '^tests/fixtures/'; }

test_expect_success 'every page renders with no groff warning' '
	for p in $pages; do
		groff -ww -man -Tascii "$SRCDIR/$p" >/dev/null 2>"$TRASH/warn" || return 1
		test ! -s "$TRASH/warn" || { echo "$p:"; cat "$TRASH/warn"; return 1; }
	done
'

test_expect_success 'every page is installed (man_MANS)' '
	for p in $pages; do
		grep -q "[ =]$p\( \|$\)" "$SRCDIR/Makefile.am" || { echo "$p is not in man_MANS"; return 1; }
	done
'

test_expect_success 'every page the manual names exists' '
	cd "$SRCDIR" &&
	sed "s/\\\\f[BIRP]//g; s/\\\\-/-/g; s/\\\\//g" $pages README.md docs/DESIGN.md |
		grep -o "hi3\(-[a-z][a-z-]*\)\? \?([1-9])" | tr -d " " | sort -u >"$TRASH/named" &&
	test -s "$TRASH/named" &&
	while read -r ref; do
		name=${ref%%(*} sec=${ref#*(} && sec=${sec%)} &&
		test -f "man/$name.$sec" || { echo "no page for $ref"; return 1; }
	done <"$TRASH/named"
'

test_expect_success 'every cited rule of hi3-batching(7) exists' '
	cd "$SRCDIR" &&
	n=$(groff -man -Tascii -P-c -P-b -P-u man/hi3-batching.7 |
		sed -n "/^BATCHING RULES/,/^SAMPLING/p" | grep -c "^       [1-9]\. ") &&
	test "$n" -ge 9 &&
	sources "batching.*(7), rules\? [0-9]" >"$TRASH/files" &&
	test -s "$TRASH/files" &&
	for f in $(cat "$TRASH/files"); do
		sed "s/\\\\f[BIRP]//g; s/\\\\-/-/g" "$f" |
			grep -o "batching(7), rules\? [0-9][0-9, and]*" | grep -o "[0-9][0-9]*"
	done | sort -un >"$TRASH/cited" &&
	while read -r r; do
		test "$r" -ge 1 && test "$r" -le "$n" || { echo "rule $r is cited; the page has $n"; return 1; }
	done <"$TRASH/cited"
'

test_expect_success 'README, DESIGN and tests/README link to files that exist' '
	cd "$SRCDIR" &&
	for doc in README.md docs/DESIGN.md; do
		grep -o "\]([^)#]*)" "$doc" | sed "s/^](//; s/)$//" | grep -v "^[a-z]*://" |
		while read -r link; do
			test -e "$(dirname "$doc")/$link" || { echo "$doc: no $link"; exit 1; }
		done || return 1
	done &&
	test -f docs/DESIGN.md && test -f tests/README
'

spec="SPEC"
test_expect_success 'no citation of a design document outside the tree' '
	cd "$SRCDIR" &&
	! sources "$spec \(§\|[0-9]\|section\)"
'

test_done
