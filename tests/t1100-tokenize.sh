#!/bin/bash
# t1100-tokenize.sh -- hi3 tokenize: lines to id arrays and back, against the
# ids the Hugging Face `tokenizers` library gives (tests/fixtures/tok).
. "$SRCDIR/tests/lib.sh"
FIX=$FIXTURES/tok

test_expect_success 'setup: a tiny model' '
	make_model tiny "$TRASH/m"
'

test_expect_success '--jsonl: every fixture string encodes to the library ids' '
	hi3 tokenize -m m --jsonl "$FIX/strings.jsonl" >ids &&
	test_cmp "$FIX/init.ids.jsonl" ids
'

test_expect_success '--decode writes back the very strings, as JSON' '
	hi3 tokenize -m m --decode "$FIX/init.ids.jsonl" >back &&
	test_cmp "$FIX/strings.jsonl" back
'

test_expect_success 'plain lines: one array per line, in order, bytes of a byte-level tokenizer' '
	printf "hi\n\nA b\n" >in.txt &&
	hi3 tokenize --tokenizer m/tokenizer.json in.txt >out &&
	printf "[104,105]\n[]\n[65,32,98]\n" >want &&
	test_cmp want out
'

test_expect_success 'a last line without a newline is a line; CR is kept' '
	printf "a\r\nb" | hi3 tokenize -m m >out &&
	printf "[97,13]\n[98]\n" >want &&
	test_cmp want out
'

test_expect_success 'several inputs and - for standard input, in order' '
	printf "a\n" >1.txt && printf "b\n" >2.txt &&
	printf "c\n" | hi3 tokenize -m m 1.txt - 2.txt >out &&
	printf "[97]\n[99]\n[98]\n" >want &&
	test_cmp want out
'

test_expect_success '--jsonl takes objects with a "text" field' '
	printf "{\"text\": \"ab\", \"id\": 3}\n\"c\"\n" | hi3 tokenize -m m --jsonl >out &&
	printf "[97,98]\n[99]\n" >want &&
	test_cmp want out
'

test_expect_success 'special tokens are recognised, or plain text with --no-special' '
	printf "x<pad>\n" | hi3 tokenize -m m >out &&
	printf "[120,258]\n" >want &&
	test_cmp want out &&
	printf "x<pad>\n" | hi3 tokenize -m m --no-special >out &&
	printf "[120,60,112,97,100,62]\n" >want &&
	test_cmp want out
'

test_expect_success '--add-special puts the bos and eos of tokenizer_config.json around each line' '
	printf "a\n\n" | hi3 tokenize -m m --add-special >out &&
	printf "[256,97,257]\n[256,257]\n" >want &&
	test_cmp want out
'

test_expect_success '--decode keeps special tokens, --no-special drops them' '
	printf "[256,104,105,257]\n" | hi3 tokenize -m m --decode >out &&
	printf "\"<|startoftext|>hi<|endoftext|>\"\n" >want &&
	test_cmp want out &&
	printf "[256,104,105,257]\n" | hi3 tokenize -m m --decode --no-special >out &&
	printf "\"hi\"\n" >want &&
	test_cmp want out
'

test_expect_success '--decode of a partial UTF-8 sequence gives U+FFFD, as the library does' '
	printf "[195]\n[195,169]\n" | hi3 tokenize -m m --decode >out &&
	printf "\"\\357\\277\\275\"\n\"\\303\\251\"\n" >want &&
	test_cmp want out
'

test_expect_success '--decode of 2000 lone continuation bytes, then 5000 a: 2000 U+FFFD, no heap overflow' '
	{ printf "[128"; for i in $(seq 1999); do printf ",128"; done
	  for i in $(seq 5000); do printf ",97"; done; printf "]\n"; } >many.ids &&
	hi3 tokenize -m m --decode many.ids >out &&
	{ printf "\""; for i in $(seq 2000); do printf "\357\277\275"; done
	  for i in $(seq 5000); do printf a; done; printf "\"\n"; } >want &&
	test_cmp want out
'

test_expect_success 'a trained BPE: the library ids for every fixture string' '
	hi3 tokenize --tokenizer "$FIX/bpe.json" --jsonl "$FIX/strings.jsonl" >ids &&
	hi3 tokenize --tokenizer "$FIX/bpe.json" --decode ids >back &&
	test_cmp "$FIX/strings.jsonl" back &&
	test $(wc -l <ids) -ge 500
'

test_expect_success 'empty input gives empty output' '
	hi3 tokenize -m m </dev/null >out &&
	test ! -s out
'

test_expect_success 'malformed JSON line: exit 3 naming file and line, nothing written' '
	printf "\"ok\"\n{\"text\": \n" >bad.jsonl &&
	test_must_fail 3 hi3 tokenize -m m --jsonl bad.jsonl >out 2>err &&
	test_grep "bad.jsonl:2" err &&
	test ! -s out
'

test_expect_success '--jsonl line that is not a string or {"text"}: exit 3' '
	printf "[1, 2]\n" >bad.jsonl &&
	test_must_fail 3 hi3 tokenize -m m --jsonl bad.jsonl 2>err &&
	test_grep "bad.jsonl:1" err && test_grep "text" err
'

test_expect_success 'invalid UTF-8 line: exit 3 naming file and line' '
	printf "fine\nbad \377 byte\n" >bad.txt &&
	test_must_fail 3 hi3 tokenize -m m bad.txt >out 2>err &&
	test_grep "bad.txt:2" err && test_grep "UTF-8" err &&
	test ! -s out
'

test_expect_success '--decode: an id outside the vocabulary, exit 3 naming file, line and id' '
	printf "[1]\n[2]\n[3,99999]\n" >bad.ids &&
	test_must_fail 3 hi3 tokenize -m m --decode bad.ids >out 2>err &&
	test_grep "bad.ids:3" err && test_grep "99999" err &&
	test ! -s out
'

test_expect_success '--decode: not an array of integers, exit 3; standard input is named' '
	printf "[1, \"x\"]\n" | test_must_fail 3 hi3 tokenize -m m --decode 2>err &&
	test_grep "<stdin>:1" err
'

test_expect_success 'a tokenizer.json with an unsupported model: exit 3 naming it' '
	printf "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}\n" >wp.json &&
	echo a | test_must_fail 3 hi3 tokenize --tokenizer wp.json 2>err &&
	test_grep "WordPiece" err && test_grep "wp.json" err
'

test_expect_success '--add-special without tokenizer_config.json: exit 3 naming it' '
	mkdir -p lone && cp m/tokenizer.json lone/ &&
	echo a | test_must_fail 3 hi3 tokenize --tokenizer lone/tokenizer.json --add-special 2>err &&
	test_grep "lone/tokenizer_config.json" err
'

test_expect_success 'usage errors: exit 2' '
	echo a | test_must_fail 2 hi3 tokenize &&
	echo a | test_must_fail 2 hi3 tokenize -m m --tokenizer m/tokenizer.json &&
	echo a | test_must_fail 2 hi3 tokenize -m m --decode --add-special &&
	test_must_fail 2 hi3 tokenize -m m --bogus
'

test_expect_success 'a missing input file: exit 3 naming it' '
	test_must_fail 3 hi3 tokenize -m m nonesuch.txt 2>err &&
	test_grep "nonesuch.txt" err
'

test_expect_success '--help matches the man page synopsis' '
	hi3 tokenize --help >help &&
	head -n 1 help >usage &&
	test_grep "^usage: hi3 tokenize " usage &&
	sed -n "/^\.SH SYNOPSIS/,/^\.SH/p" "$SRCDIR/man/hi3-tokenize.1" |
		sed -e "1d;\$d" -e "s/\\\\f[BIR]//g" -e "s/\\\\-/-/g" -e "s/^\.[BI] //" | tr "\n" " " |
		sed -e "s/  */ /g" -e "s/ $//" >synopsis &&
	sed -e "s/^usage: //" usage >usage.bare &&
	echo >>synopsis && test_cmp usage.bare synopsis
'

test_done
