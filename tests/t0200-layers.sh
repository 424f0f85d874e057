#!/usr/bin/env bash
# t0200-layers.sh -- the layers of lib/ hold (docs/DESIGN.md, "The layers of
# lib/"): no file includes or calls what a layer above it defines, no loop
# of files spans two folders, and public headers include only public
# headers, read by scripts/check-layers from the built tree; each public
# header stands alone; and the check finds each kind of breach in a small
# tree made to have them.
. "$SRCDIR/tests/lib.sh"

test_expect_success 'the tree: no upward arrow, no loop across folders, public headers public' '
	"$SRCDIR/scripts/check-layers" "$BUILDDIR" >out 2>err || { cat out err; false; } &&
	test_grep "^0 upward arrows, 0 loops across folders, 0 private includes" out
'

test_expect_success 'each public header compiles alone, as C and as C++ (what make install puts in hi3/)' '
	for h in $(cd "$SRCDIR" && ls lib/hi3.h lib/*/hi3-*.h); do
		echo "#include \"$h\"" >one.c &&
		${CC:-cc} -std=c11 -Wall -Werror -fsyntax-only -I "$SRCDIR" one.c &&
		if command -v c++ >/dev/null; then c++ -Wall -Werror -fsyntax-only -x c++ -I "$SRCDIR" one.c; fi ||
			{ echo "$h"; return 1; }
	done
'

# A tree with one breach of each kind: core/a.c includes format/f.h and
# calls f_val (format/f.c); tok/t.c and backend/b.c call each other; the
# public core/hi3-core.h includes core/internal.h.
test_expect_success 'a tree with an upward include and call, a loop and a private include fails, each named' '
	mkdir -p t/lib/core t/lib/format t/lib/tok t/lib/backend t/scripts &&
	cp "$SRCDIR/scripts/check-layers" t/scripts/ &&
	printf "int c_val(void);\n" >t/lib/core/internal.h &&
	printf "#include \"core/internal.h\"\n" >t/lib/core/hi3-core.h &&
	printf "#include \"format/f.h\"\nint c_val(void) { return f_val(); }\n" >t/lib/core/a.c &&
	printf "int f_val(void);\n" >t/lib/format/f.h &&
	printf "#include \"core/internal.h\"\nint f_val(void) { return 1; }\n" >t/lib/format/f.c &&
	printf "int b_val(void);\nint t_val(void) { return b_val(); }\n" >t/lib/tok/t.c &&
	printf "int t_val(void);\nint b_val(void) { return t_val() + 1; }\n" >t/lib/backend/b.c &&
	(cd t && for f in lib/core/a.c lib/format/f.c lib/tok/t.c lib/backend/b.c; do
		${CC:-cc} -c -I lib -o "${f%.c}.o" "$f" || exit 1; done) &&
	test_must_fail 1 t/scripts/check-layers t >out &&
	test_grep "^upward: lib/core/a.c -> lib/format/f.h (include format/f.h)" out &&
	test_grep "^upward: lib/core/a.c -> lib/format/f.c (call f_val)" out &&
	test_grep "^loop across 2 folders: lib/backend/b lib/tok/t$" out &&
	test_grep "^private: lib/core/hi3-core.h includes lib/core/internal.h" out &&
	test_grep "^2 upward arrows, 1 loops across folders, 1 private includes" out
'

test_done
