#!/bin/sh
# t1200-tokenize-concat.sh -- hi3 tokenize-concat: requests to conditions, --batch
# against --per-row, the pad-position ablation, --concat, and bad input.
. "$SRCDIR/tests/lib.sh"

M=$TRASH/model
make_model tiny "$M"

# a file's bytes unchanged since 'keep FILE' (bad input must not touch it)
keep() { cp "$1" "$1.orig"; }
untouched() { cmp "$1" "$1.orig"; }
echo "an existing output" >"$TRASH/out.st" && keep "$TRASH/out.st"

cat >"$TRASH/pretok.jsonl" <<'EOF'
{"tokens": [256, 72, 105], "seed": 3}
{"tokens": [256, 1, 2, 3, 4, 5, 6]}
{"tokens": [256, 9], "stop_tokens": [257, 300]}
EOF

test_expect_success 'pre-tokenized requests need no tokenizer' '
	cp -r "$M" notok && rm notok/tokenizer.json notok/tokenizer_config.json &&
	hi3 tokenize-concat --pad-id 258 -o a.st pretok.jsonl &&
	hi3 tokenize-concat --pad-id 258 --batch -o b.st - <pretok.jsonl &&
	cmp a.st b.st &&
	hi3 -q tokenize-concat -m notok -o m.st pretok.jsonl &&
	hi3 -q tokenize-concat -m "$M" -o m2.st pretok.jsonl &&
	cmp m.st m2.st
'

test_expect_success '--per-row gives the same conditions as --batch' '
	hi3 -q tokenize-concat -m "$M" --batch -o batch.st pretok.jsonl &&
	hi3 -q tokenize-concat -m "$M" --per-row -o perrow.st pretok.jsonl &&
	cmp batch.st perrow.st
'

test_expect_success '--pad-positions=zero says so on stderr and changes the file' '
	hi3 -q tokenize-concat -m "$M" -o cont.st pretok.jsonl 2>err.cont &&
	hi3 -q tokenize-concat -m "$M" --pad-positions=zero -o zero.st pretok.jsonl 2>err.zero &&
	test_grep "upstream defect" err.zero &&
	! grep -q defect err.cont &&
	! cmp -s cont.st zero.st &&
	hi3 -q tokenize-concat -m "$M" --per-row --pad-positions=zero -o zero2.st pretok.jsonl 2>/dev/null &&
	cmp zero.st zero2.st
'

test_expect_success '--concat merges files of different B and L' '
	head -n 1 pretok.jsonl >one.jsonl &&
	tail -n 2 pretok.jsonl >two.jsonl &&
	hi3 -q tokenize-concat -m "$M" -o one.st one.jsonl &&
	hi3 -q tokenize-concat -m "$M" --seed 1 -o two.st two.jsonl &&
	hi3 -q tokenize-concat --concat -o merged.st one.st two.st &&
	hi3 -q tokenize-concat -m "$M" -o whole.st pretok.jsonl &&
	cmp merged.st whole.st
'

test_expect_success '--concat of one file gives the file back; -o - writes stdout' '
	hi3 -q tokenize-concat --concat -o - whole.st >again.st &&
	cmp whole.st again.st
'

test_expect_success 'a merge of files made with different models is refused' '
	make_model tiny other --set num_hidden_layers=3 &&
	hi3 -q tokenize-concat -m other -o other.st one.jsonl &&
	test_must_fail 3 hi3 tokenize-concat --concat -o out.st one.st other.st 2>err &&
	test_grep "one.st" err && test_grep "other.st" err && test_grep "model_fingerprint" err &&
	untouched out.st
'

test_expect_success 'a merge with a file that is not conditions is refused' '
	test_must_fail 3 hi3 tokenize-concat --concat -o out.st one.st "$M/model.safetensors" 2>err &&
	test_grep "model.safetensors" err && test_grep "hi3.conditions" err &&
	untouched out.st
'

# bad input: exit 3, FILE:LINE in the message, the output untouched
bad_input() { # bad_input NAME EXPECTED-MESSAGE [options...] <<JSONL
	name=$1 msg=$2; shift 2
	cat >"$TRASH/$name.jsonl"
	test_expect_success "bad input: $name" "
		test_must_fail 3 hi3 tokenize-concat -m \"\$M\" $* -o out.st $name.jsonl 2>err &&
		test_grep -F \"$msg\" err &&
		untouched out.st
	"
}

bad_input malformed "malformed.jsonl:2: not valid JSON" <<'EOF'
{"tokens": [1, 2]}
{"tokens": [1, 2
EOF
bad_input bot_task "bot_task.jsonl:1: field 'bot_task': unknown value 'dream'" <<'EOF'
{"tokens": [1], "bot_task": "dream"}
EOF
bad_input mode "mode.jsonl:2: field 'mode': unknown value 'gen_video'" <<'EOF'
{"tokens": [1]}
{"prompt": "x", "mode": "gen_video"}
EOF
bad_input too_long "too_long.jsonl:3: the row has 5 tokens, more than --max-length 4" --max-length 4 <<'EOF'
{"tokens": [1, 2, 3, 4]}
{"tokens": [1]}
{"tokens": [1, 2, 3, 4, 5]}
EOF
bad_input empty "empty.jsonl: no requests" </dev/null
bad_input vocab "vocab.jsonl:2: token id 512 (column 3) is outside the vocabulary of 512 tokens" <<'EOF'
{"tokens": [1, 2]}
{"tokens": [1, 2, 3, 512]}
EOF
bad_input stop_vocab "stop_vocab.jsonl:1: stop token 9999 is outside the vocabulary" <<'EOF'
{"tokens": [1], "stop_tokens": [9999]}
EOF

test_expect_success 'bad input on stdin names <stdin> and the line' '
	printf "{\"tokens\": [1]}\n{\"tokens\": 5}\n" >stdin.jsonl &&
	test_must_fail 3 hi3 tokenize-concat -m "$M" -o out.st - <stdin.jsonl 2>err &&
	test_grep "<stdin>:2: field .tokens." err &&
	untouched out.st
'

test_expect_success 'a pre-tokenized batch without any pad id is a usage error' '
	test_must_fail 2 hi3 tokenize-concat -o out.st one.jsonl 2>err &&
	test_grep "no pad id" err && untouched out.st
'

test_expect_success 'usage errors: no -o, two inputs, --concat with build options' '
	test_must_fail 2 hi3 tokenize-concat one.jsonl &&
	test_must_fail 2 hi3 tokenize-concat -o x.st one.jsonl two.jsonl &&
	test_must_fail 2 hi3 tokenize-concat --concat --per-row -o x.st one.st &&
	test_must_fail 2 hi3 tokenize-concat --pad-positions=left -o x.st one.jsonl &&
	test_must_fail 2 hi3 tokenize-concat --max-length 0 -o x.st one.jsonl &&
	test_must_fail 2 hi3 tokenize-concat --template chat -o x.st one.jsonl &&
	! test -e x.st
'

test_expect_success '--help shows the usage; the man page synopsis names the same options' '
	hi3 tokenize-concat --help >help &&
	head -n 1 help | grep -q "^usage: hi3 tokenize-concat " &&
	for o in --tokenizer --template --batch --per-row --pad-positions --max-length --seed --pad-id \
		--drop-think --concat; do
		grep -q -- "$o" help &&
		sed -n "/^\.SH SYNOPSIS/,/^\.SH DESCRIPTION/p" "$SRCDIR/man/hi3-tokenize-concat.1" |
			sed "s/\\\\-/-/g" | grep -q -- "$o" || { echo "missing $o"; exit 1; }
	done
'

# ---- requests with prompts (the template and the tokenizer)

cat >"$TRASH/prompts.jsonl" <<'EOF2'
{"prompt": "A cat sitting on a red chair.", "seed": 1}
{"prompt": "Two dogs", "system": "You are a painter.", "bot_task": "think"}
{"prompt": "一只猫", "cot": "<think>red</think>ok", "bot_task": "recaption"}
{"prompt": "a boat", "bot_task": "img_ratio", "cond_images": [[64, 48]]}
{"tokens": [256, 72, 105], "bot_task": "image"}
EOF2
cat >"$TRASH/images.jsonl" <<'EOF2'
{"prompt": "a cat", "mode": "gen_image", "image_size": "256x256"}
{"prompt": "a very tall tower by the sea", "mode": "gen_image", "image_size": [512, 128], "seed": 4}
{"prompt": "the same cat", "mode": "gen_image", "image_size": "1:1", "cond_images": [[300, 200]]}
EOF2

# small images: base 256, 32x downsampling, 16 ViT patches
make_model tiny "$TRASH/small" --set image_base_size=256 --set vae_downsample_factor=[32,32] \
	--set 'vit_processor={"patch_size":16,"max_num_patches":16}'

test_expect_success 'prompts: --per-row equals --batch (both templates)' '
	for t in pretrain instruct; do
		hi3 -q tokenize-concat -m small --template $t -o pb.$t.st prompts.jsonl &&
		hi3 -q tokenize-concat -m small --template $t --per-row -o pr.$t.st prompts.jsonl &&
		cmp pb.$t.st pr.$t.st || exit 1
	done &&
	! cmp -s pb.pretrain.st pb.instruct.st
'

test_expect_success 'gen_image: --per-row equals --batch (cond rows, then uncond rows)' '
	hi3 -q tokenize-concat -m small -o ib.st images.jsonl &&
	hi3 -q tokenize-concat -m small --per-row -o ir.st images.jsonl &&
	cmp ib.st ir.st
'

test_expect_success 'gen_image: --concat of single requests equals the batch' '
	for i in 1 2 3; do
		sed -n "${i}p" images.jsonl >img$i.jsonl &&
		hi3 -q tokenize-concat -m small --seed $((i - 1)) -o img$i.st img$i.jsonl || exit 1
	done &&
	hi3 -q tokenize-concat --concat -o icat.st img1.st img2.st img3.st &&
	cmp ib.st icat.st
'

test_expect_success 'prompts: --pad-positions=zero with per row equals the batch' '
	hi3 -q tokenize-concat -m small --pad-positions=zero -o zb.st prompts.jsonl 2>/dev/null &&
	hi3 -q tokenize-concat -m small --pad-positions=zero --per-row -o zr.st prompts.jsonl 2>/dev/null &&
	cmp zb.st zr.st && ! cmp -s zb.st pb.pretrain.st
'

test_expect_success 'merging gen_text and gen_image files is refused, naming the field' '
	test_must_fail 3 hi3 tokenize-concat --concat -o out.st pb.pretrain.st ib.st 2>err &&
	test_grep "pb.pretrain.st" err && test_grep "ib.st" err && test_grep "mode" err &&
	untouched out.st
'

test_expect_success 'merging files of different tokenizers is refused' '
	sed "s/\"A cat/\"Another cat/" prompts.jsonl >p2.jsonl &&
	mkdir -p tok2 && sed "s/\"<cfg>\"/\"<cfg2>\"/" small/tokenizer.json >tok2/tokenizer.json &&
	cp small/tokenizer_config.json tok2/ &&
	hi3 -q tokenize-concat -m small --tokenizer tok2/tokenizer.json -o t2.st p2.jsonl &&
	test_must_fail 3 hi3 tokenize-concat --concat -o out.st pb.pretrain.st t2.st 2>err &&
	test_grep "tokenizer_hash" err && test_grep "t2.st" err &&
	untouched out.st
'

test_expect_success 'a prompt without a tokenizer is a usage error' '
	test_must_fail 2 hi3 tokenize-concat --pad-id 3 -o out.st prompts.jsonl 2>err &&
	test_grep "tokenizer" err && untouched out.st
'

bad_input long_prompt "long_prompt.jsonl:2: the row has" --max-length 8 <<'EOF2'
{"prompt": "hi"}
{"prompt": "a prompt that is longer than eight tokens for sure"}
EOF2

test_expect_success 'bad input: a special token missing from the tokenizer names it and the line' '
	mkdir -p noboi && cp small/config.json small/tokenizer_config.json noboi/ &&
	sed "s/\"<boi>\"/\"<bo1>\"/" small/tokenizer.json >noboi/tokenizer.json &&
	test_must_fail 3 hi3 tokenize-concat -m small --tokenizer noboi/tokenizer.json -o out.st images.jsonl 2>err &&
	test_grep "images.jsonl:1:" err && test_grep "<boi>" err &&
	untouched out.st
'

test_expect_success 'bad input: an unsupported tokenizer component is named' '
	sed "s/\"type\": \"BPE\"/\"type\": \"WordPiece\"/" small/tokenizer.json >wp.json &&
	test_must_fail 3 hi3 tokenize-concat -m small --tokenizer wp.json -o out.st prompts.jsonl 2>err &&
	test_grep "WordPiece" err && test_grep "wp.json" err &&
	untouched out.st
'

test_expect_success '--tokenizer alone: the tokenizer_config.json beside it names bos, eos and pad' '
	hi3 -q tokenize-concat --tokenizer small/tokenizer.json -o alone.st prompts.jsonl &&
	mkdir -p bare && cp small/tokenizer.json bare/ &&
	test_must_fail 3 hi3 tokenize-concat --tokenizer bare/tokenizer.json --pad-id 258 -o out.st prompts.jsonl 2>err &&
	test_grep "prompts.jsonl:1: no begin-of-sequence token" err &&
	untouched out.st
'

test_done
