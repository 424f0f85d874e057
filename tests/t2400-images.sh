#!/usr/bin/env bash
# Requests with "images" (image understanding, i2t): the files become joint
# image blocks whose ViT view the conditions carry; prefill scatters the
# ViT and aligner outputs into the prompt; a ragged batch (rows with 0, 1
# and 2 images of different sizes) equals each row alone, bit for bit;
# replay reproduces the rollout; and the bad inputs are refused with exit 3
# naming the file, leaving existing outputs alone.
. "$SRCDIR/tests/lib.sh"
IMG="$FIXTURES/image"

# PNG width and height from the IHDR chunk
png_size() { od -An -tu1 -j16 -N8 "$1" | awk '{ printf "%dx%d\n", $3 * 256 + $4, $7 * 256 + $8 }'; }

test_expect_success 'setup: a release-shaped model with vision weights, pictures, requests' '
	make_model tiny-release model --set "vae=$QUICK_VAE" &&
	mkdir pics && cp "$IMG/rgb.png" "$IMG/photo.jpg" "$IMG/gray.png" "$IMG/palette.gif" pics/ &&
	cat >pics/req.jsonl <<-\EOF &&
	{"prompt": "hello there", "seed": 3}
	{"prompt": "what is this", "images": ["rgb.png"], "seed": 4}
	{"prompt": "compare them", "images": ["photo.jpg", "gray.png"], "seed": 5}
	EOF
	hi3 -q -m model tokenize-concat pics/req.jsonl -o c.st
'

test_expect_success 'the conditions carry each image: its row, ViT grid and pixels, VAE view' '
	hi3 inspect --tensor image_row c.st | tail -n 1 >rows &&
	echo "1 2 2" >want && test_cmp want rows &&
	hi3 inspect c.st >info &&
	test_grep "vit_pixels *U8 *(3, 64, 768)" info &&
	test_grep "vae_shape *I32 *(3, 2)" info &&
	test_grep "vit_grid *I32 *(3, 2)" info
'

test_expect_success '--dump-images makes its directory, writes both views as PNGs at the sizes the conditions give' '
	hi3 -q -m model tokenize-concat --dump-images dump pics/req.jsonl -o c2.st &&
	cmp c.st c2.st &&
	ls dump >names &&
	printf "%s\n" row1-image0-vae.png row1-image0-vit.png row2-image0-vae.png row2-image0-vit.png \
		row2-image1-vae.png row2-image1-vit.png >want && test_cmp want names &&
	set -- $(hi3 inspect --tensor vit_grid c.st | grep "^\[1, :\]") &&
	test "$(png_size dump/row2-image0-vit.png)" = "$(($4 * 16))x$(($3 * 16))" &&
	set -- $(hi3 inspect --tensor vae_shape c.st | grep "^\[0, :\]") &&
	test "$(png_size dump/row1-image0-vae.png)" = "${4}x${3}"
'

test_expect_success 'a batch of rows with 0, 1 and 2 images equals each row alone, bit for bit' '
	hi3 -m model parity pics/req.jsonl >par.out 2>par.err &&
	test_grep "12 of 12 cases pass (tolerance 0)" par.err &&
	test_grep "unequal real_pos" par.out
'

test_expect_success 'prefill, decode; replay reproduces the i2t rollout exactly, per row and batched' '
	hi3 -q -m model prefill c.st -o k.st --max-new 8 &&
	hi3 -q -m model decode --temperature 0.8 --top-k 20 c.st k.st -o s.st &&
	hi3 -q -m model replay c.st s.st -o r.st >rep.json &&
	"$BUILDDIR/tests/test-tools" json overall/max_abs_dlogp <rep.json >d && echo 0.0 >want && test_cmp want d &&
	hi3 -q -m model replay --batched c.st s.st -o rb.st >/dev/null &&
	hi3 diff --atol 0 --tensor logprobs s.st rb.st >/dev/null
'

test_expect_success 'the images reach the model: another picture changes the logits, a copy does not' '
	cp pics/rgb.png pics/copy.png &&
	printf "%s\n" "{\"prompt\": \"what is this\", \"images\": [\"rgb.png\"]}" \
		"{\"prompt\": \"what is this\", \"images\": [\"copy.png\"]}" \
		"{\"prompt\": \"what is this\", \"images\": [\"palette.gif\"]}" >pics/same.jsonl &&
	hi3 -q -m model tokenize-concat --per-row pics/same.jsonl -o same.st &&
	hi3 -q -m model prefill same.st -o same-k.st --max-new 1 &&
	hi3 inspect --tensor next_logits --slice 0 same-k.st | tail -n 1 >l0 &&
	hi3 inspect --tensor next_logits --slice 1 same-k.st | tail -n 1 >l1 &&
	hi3 inspect --tensor next_logits --slice 2 same-k.st | tail -n 1 >l2 &&
	test_cmp l0 l1 && ! cmp -s l0 l2
'

test_expect_success '--vit-resize float makes the float kernel view (and still runs)' '
	hi3 -q -m model tokenize-concat --vit-resize float pics/req.jsonl -o cf.st &&
	hi3 -q -m model prefill cf.st -o kf.st --max-new 1 &&
	test_must_fail 2 hi3 -q -m model tokenize-concat --vit-resize double pics/req.jsonl -o cf.st
'

test_expect_success '--encode stores the encoder outputs; prefill from them gives the same bits' '
	hi3 -q -m model tokenize-concat --encode pics/req.jsonl -o ce.st &&
	hi3 inspect ce.st >info &&
	test_grep "vit_embeds *F32 *(3, 64, 64)" info && test_grep "latent_shape *I32 *(3, 3)" info &&
	test_grep "vae_latents *F32" info &&
	hi3 -q -m model prefill c.st -o k-own.st --max-new 2 &&
	hi3 -q -m model prefill ce.st -o k-enc.st --max-new 2 &&
	hi3 diff --atol 0 k-own.st k-enc.st >/dev/null &&
	hi3 -q -m model tokenize-concat --encode --vae-sample pics/req.jsonl -o ces.st &&
	hi3 -q -m model tokenize-concat --vae-sample pics/req.jsonl -o cs.st &&
	hi3 -q -m model prefill ces.st -o ks-enc.st --max-new 2 &&
	hi3 -q -m model prefill cs.st -o ks-own.st --max-new 2 &&
	hi3 diff --atol 0 ks-own.st ks-enc.st >/dev/null &&
	! hi3 diff --atol 0 --tensor next_logits k-own.st ks-own.st >/dev/null
'

test_expect_success '--encode: merged rows keep their outputs; encoded and not are not merged; a part of them is refused' '
	hi3 -q tokenize-concat --concat ce.st ce.st -o cc.st &&
	hi3 inspect cc.st | grep -q "vit_embeds *F32 *(6, 64, 64)" &&
	test_must_fail 3 hi3 tokenize-concat --concat ce.st c.st -o mixed.st 2>err &&
	test_grep "with and without their encoder outputs" err && ! test -e mixed.st &&
	test_must_fail 2 hi3 tokenize-concat --encode pics/req.jsonl -o x.st 2>err &&
	test_grep "needs the model" err &&
	cp ce.st part.st && "$BUILDDIR/tests/test-tools" strip part.st vae_latents &&
	test_must_fail 3 hi3 -m model prefill part.st -o x.st 2>err &&
	test_grep "part.st.*give all three" err && ! test -e x.st
'

# bad input: exit 3 naming the file, and c.st as it was
bad_image() { # bad_image NAME EXPECTED-MESSAGE [tokenize-concat options]
	name=$1 msg=$2; shift 2
	printf "%s\n" "{\"prompt\": \"x\"}" "{\"prompt\": \"x\", \"images\": [\"$name\"]}" >pics/bad.jsonl &&
	cp c.st keep.st &&
	test_must_fail 3 hi3 -m model tokenize-concat "$@" pics/bad.jsonl -o c.st 2>err &&
	test_grep "bad.jsonl:2" err && test_grep "$msg" err &&
	cmp c.st keep.st
}

test_expect_success 'a missing image: exit 3 naming it' '
	bad_image nothere.png "nothere.png"
'

test_expect_success 'a truncated PNG and a file that is no image: exit 3 naming them' '
	head -c 300 pics/rgb.png >pics/cut.png && bad_image cut.png "cut.png" &&
	echo "not a picture" >pics/text.png && bad_image text.png "text.png.*not an image"
'

test_expect_success 'a directory, a FIFO, /dev/zero, an over-size file: exit 3 at once, the reason named' '
	mkdir pics/dir.png && bad_image dir.png "dir.png: not a regular file (a directory)" &&
	mkfifo pics/fifo.png && bad_image fifo.png "fifo.png: not a regular file (a FIFO)" &&
	bad_image /dev/zero "/dev/zero: not a regular file (a character device)" &&
	bad_image rgb.png "rgb.png: [0-9]* bytes, more than the limit of 100 (--max-image-bytes)" --max-image-bytes 100 &&
	printf "MM\0*\0\0\0\010" >pics/scan.tif && bad_image scan.tif "scan.tif: a TIFF file; hi3 reads JPEG, PNG, WebP"
'

test_expect_success 'a 1x100000 image: its VAE view would be a 128x12800000 resize (base 256), refused' '
	cp "$IMG/tall-1x100000.png" pics/ && bad_image tall-1x100000.png "tall-1x100000.png.*128x12800000"
'

test_expect_success '--max-image-pixels: an image above the limit is refused before decoding' '
	bad_image rgb.png "rgb.png" --max-image-pixels 100 &&
	hi3 -q -m model tokenize-concat --max-image-pixels 1000000 pics/req.jsonl -o ok.st &&
	test_must_fail 2 hi3 -m model tokenize-concat --max-image-pixels 0 pics/req.jsonl -o ok.st
'

test_expect_success '--safe-paths: images outside the requests directory are refused, a path or a link' '
	cp "$IMG/rgb.png" outside.png &&
	bad_image ../outside.png "outside.png.*outside.*--safe-paths" --safe-paths &&
	ln -s ../outside.png pics/link.png &&
	bad_image link.png "link.png.*--safe-paths" --safe-paths &&
	printf "%s\n" "{\"prompt\": \"x\", \"images\": [\"../outside.png\", \"link.png\"]}" >pics/out.jsonl &&
	hi3 -q -m model tokenize-concat pics/out.jsonl -o out.st &&
	mkdir pics/sub && cp "$IMG/gray.png" pics/sub/ &&
	printf "%s\n" "{\"prompt\": \"x\", \"images\": [\"sub/gray.png\"]}" >pics/in.jsonl &&
	hi3 -q -m model tokenize-concat --safe-paths pics/in.jsonl -o in.st
'

test_expect_success 'images exclude cond_images; standard input reads paths from the working directory' '
	echo "{\"prompt\": \"x\", \"images\": [\"a.png\"], \"cond_images\": [[8, 8]]}" >pics/both.jsonl &&
	test_must_fail 3 hi3 -m model tokenize-concat pics/both.jsonl -o x.st 2>err &&
	test_grep "exclude each other" err &&
	echo "{\"tokens\": [1, 2], \"images\": [\"gray.png\"], \"prompt\": \"x\"}" >pics/tok.jsonl &&
	test_must_fail 3 hi3 -m model tokenize-concat pics/tok.jsonl -o x.st 2>err &&
	test_grep "pics/tok.jsonl:1: field .tokens. with images is the prompt.s body: it excludes prompt" err &&
	(cd pics && echo "{\"prompt\": \"x\", \"images\": [\"gray.png\"]}" |
		hi3 -q -m ../model tokenize-concat - -o ../stdin.st)
'

test_expect_success '"tokens" with "images" is the prompt body: the row of the same text as a prompt (both modes)' '
	ids=$(echo "what is this" | hi3 tokenize -m model) &&
	for extra in "" ", \"mode\": \"gen_image\", \"image_size\": \"64x64\""; do
		echo "{\"tokens\": $ids, \"images\": [\"rgb.png\"], \"seed\": 4$extra}" >pics/body.jsonl &&
		echo "{\"prompt\": \"what is this\", \"images\": [\"rgb.png\"], \"seed\": 4$extra}" >pics/text.jsonl &&
		hi3 -q -m model tokenize-concat pics/body.jsonl -o body.st &&
		hi3 -q -m model tokenize-concat pics/text.jsonl -o text.st &&
		hi3 diff --atol 0 body.st text.st >/dev/null || exit 1
	done &&
	hi3 inspect body.st | grep -q "mode: gen_image"
'

test_expect_success '"stop_tokens": [] is no stop token: the row runs to its length (both modes)' '
	echo "{\"prompt\": \"what is this\", \"images\": [\"rgb.png\"], \"bot_task\": \"auto\", \"stop_tokens\": []}" >pics/nostop.jsonl &&
	hi3 -q -m model tokenize-concat pics/nostop.jsonl -o nostop.st &&
	test "$(hi3 inspect --tensor stop_tokens nostop.st | tail -n 1)" = "[0, :] -1" &&
	hi3 -q -m model prefill -n 6 nostop.st -o nostop-kv.st &&
	hi3 -q -m model decode nostop.st nostop-kv.st -o nostop-seg.st &&
	hi3 inspect --tensor cu_seqlens nostop-seg.st | tail -n 1 >cu &&
	echo "0 6" >want && test_cmp want cu &&
	echo "{\"prompt\": \"a cat\", \"mode\": \"gen_image\", \"image_size\": \"64x64\", \"stop_tokens\": []}" >pics/nostop-i.jsonl &&
	hi3 -q -m model tokenize-concat pics/nostop-i.jsonl -o nostop-i.st &&
	hi3 inspect --tensor stop_tokens nostop-i.st | tail -n 2 | sed "s/^.*] //" | sort -u >stops &&
	echo -1 >want && test_cmp want stops
'

test_expect_success 'a model without vision weights given image conditions: exit 3 naming both' '
	make_model tiny text &&
	hi3 -q -m text tokenize-concat --template pretrain pics/req.jsonl -o t.st 2>err ||
		{ cat err; false; } &&
	test_must_fail 3 hi3 -m text prefill t.st -o tk.st 2>err &&
	test_grep "t.st" err && test_grep "vit" err && ! test -e tk.st
'

test_expect_success 'conditions with image sizes but no pixels (cond_images) are still refused by prefill' '
	echo "{\"prompt\": \"x\", \"cond_images\": [[64, 64]]}" >sizes.jsonl &&
	hi3 -q -m model tokenize-concat sizes.jsonl -o sz.st &&
	test_must_fail 3 hi3 -m model prefill sz.st -o szk.st 2>err &&
	test_grep "no pixels" err
'

test_done
