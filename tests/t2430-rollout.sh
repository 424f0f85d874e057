#!/usr/bin/env bash
# The Instruct rollout end to end (hi3-tokenize-concat(1), "The Instruct
# rollout"; hi3-batching(7), IMAGES AND DIFFUSION): gen_image requests with image_size
# "auto" (different prompts, seeds, tasks and system prompts, with and
# without a cond image) go text stage -> tokenize-concat --continue ->
# diffusion-capture -> PNGs on tiny-instruct and tiny-distil. Each continued
# row is the row tokenize-concat builds from the explicit request it names;
# both parts replay with gap 0 and say which part they are; the batch equals
# each request alone through both stages; hi3 run writes the same files in
# one process; a row that did not end at a ratio token is refused (exit 3,
# the row named, nothing written). The cot, drop_think and the system
# prompt switch against upstream's generate_image: test-upstream
# (rollout-*.json).
. "$SRCDIR/tests/lib.sh"
J() { "$BUILDDIR/tests/test-tools" json "$@"; }
T() { "$BUILDDIR/tests/test-tools" "$@"; }

# think_recaption, img_ratio (with a cond image), recaption and think rows;
# their ratio tokens give two image sizes on these models
cat >"$TRASH/auto.jsonl" <<'EOF'
{"prompt": "a red fox in the snow", "mode": "gen_image", "image_size": "auto", "system": "None", "seed": 3}
{"prompt": "make it red", "images": ["rgb.png"], "mode": "gen_image", "image_size": "auto", "bot_task": "image", "system": "None", "seed": 4}
{"prompt": "a boat at dawn", "mode": "gen_image", "image_size": "auto", "bot_task": "recaption", "system": "You draw.", "seed": 12}
{"prompt": "a boat at dawn", "mode": "gen_image", "image_size": "auto", "bot_task": "think", "system": "You draw.", "seed": 14}
EOF
mkdir "$TRASH/pics" && cp "$FIXTURES/image/rgb.png" "$TRASH/auto.jsonl" "$TRASH/pics/"

# the chain for the requests file $1 into directory $2: the text stage (its
# image encoded once), the image stage of each size (the files named in
# $2/sizes), a trajectory of each, and PNGs when $3 is given
chain() {
	mkdir -p "$2" &&
	hi3 -q -m "$M" tokenize-concat --encode "$1" -o "$2/text.st" &&
	hi3 -q -m "$M" prefill -n 48 "$2/text.st" -o "$2/kv.st" &&
	hi3 -q -m "$M" decode "$2/text.st" "$2/kv.st" -o "$2/seg.st" &&
	hi3 -q -m "$M" tokenize-concat --continue --by-size "$2/text.st" "$2/seg.st" -o "$2/img" >"$2/sizes" &&
	while read -r f; do
		hi3 -q -m "$M" diffusion-capture --steps 2 --sampler sde "$f" -o "${f%.st}-traj.st" \
			${3:+--png "${f%.st}-png"} || return 1
	done <"$2/sizes"
}

# "--tensor NAME" for each tensor of the file $1
tensors_of() { hi3 inspect "$1" | sed -n "/^name /,\$p" | tail -n +2 | awk "{ print \"--tensor\", \$1 }"; }

for preset in tiny-instruct tiny-distil; do
	M=$TRASH/$preset W=w-$preset

	test_expect_success "$preset: a batch of auto requests: text stage, --continue, diffusion-capture, PNGs" '
		make_model $preset $preset --set "vae=$QUICK_VAE" &&
		chain pics/auto.jsonl $W/b png &&
		hi3 inspect $W/b/text.st >info &&
		test_grep "mode: gen_text" info && test_grep "next_stage: gen_image" info &&
		test "$(sed "s/.*img-//" $W/b/sizes | tr "\n" " ")" = "128x432.st 128x384.st " &&
		n=0 && while read -r f; do
			hi3 inspect "$f" >info &&
			test_grep "mode: gen_image" info && test_grep "text_conditions_hash: " info &&
			n=$((n + $(ls "${f%.st}-png" | wc -l))) || exit 1
		done <$W/b/sizes &&
		test $n = 4
	'

	test_expect_success "$preset: each continued row is the row of the explicit request it names" '
		while read -r f; do
			T requests "$f" >pics/explicit.jsonl &&
			hi3 -q -m $preset tokenize-concat pics/explicit.jsonl -o explicit.st &&
			hi3 diff --atol 0 $(tensors_of explicit.st) explicit.st "$f" >/dev/null || exit 1
		done <$W/b/sizes &&
		grep -q "\"cot\":\"<think>" pics/explicit.jsonl
	'

	test_expect_success "$preset: the continued image rows carry the text stage's encoder outputs, as --encode makes them" '
		f=$(head -n 1 $W/b/sizes) &&
		T requests "$f" >pics/explicit.jsonl && grep -q images pics/explicit.jsonl &&
		hi3 -q -m $preset tokenize-concat --encode pics/explicit.jsonl -o explicit.st &&
		hi3 diff --atol 0 explicit.st "$f" >/dev/null
	'

	test_expect_success "$preset: the text part and the image parts replay with gap 0, each named" '
		hi3 -q -m $preset replay $W/b/text.st $W/b/seg.st -o rt.st >rep.json &&
		test "$(J overall/max_abs_dlogp <rep.json)" = 0.0 &&
		test "$(J stage/part <rep.json)" = text &&
		test "$(J stage/next_stage <rep.json)" = gen_image &&
		seg_hash=$(J stage/segment_hash <rep.json) &&
		while read -r f; do
			hi3 -q -m $preset replay "$f" "${f%.st}-traj.st" -o ri.st >rep.json &&
			test "$(J overall/max_abs_dlogp <rep.json)" = 0.0 &&
			test "$(J overall/sde_steps <rep.json)" -gt 0 &&
			test "$(J stage/part <rep.json)" = image &&
			test "$(J stage/text_segment_hash <rep.json)" = "$seg_hash" || exit 1
		done <$W/b/sizes
	'
done

M=$TRASH/tiny-instruct W=w-tiny-instruct

test_expect_success 'the batch equals each request alone through both stages, bit for bit' '
	for i in 1 2 3 4; do
		sed -n "${i}p" pics/auto.jsonl >pics/alone$i.jsonl &&
		chain pics/alone$i.jsonl $W/a$i &&
		hi3 diff --atol 0 --row $((i - 1)):0 $W/b/seg.st $W/a$i/seg.st >/dev/null &&
		a=$(cat $W/a$i/sizes) && found=0 &&
		for f in $(cat $W/b/sizes); do
			k=0 &&
			for r in $(hi3 inspect --json "$f" | J metadata/text_rows | tr -d "[]" | tr , " "); do
				if [ $r = $((i - 1)) ]; then
					hi3 diff --atol 0 --row $k:0 --tensor latents --tensor sde_logp \
						"${f%.st}-traj.st" "${a%.st}-traj.st" >/dev/null || exit 1
					found=1
				fi
				k=$((k + 1))
			done
		done &&
		test $found = 1 || exit 1
	done
'

test_expect_success 'hi3 run: the whole chain in one process writes the files of the separate commands' '
	cat >chain.run <<-\EOF &&
	tokenize-concat --encode pics/alone2.jsonl -o r/text.st
	prefill -n 48 r/text.st -o r/kv.st
	decode r/text.st r/kv.st -o r/seg.st
	tokenize-concat --continue r/text.st r/seg.st -o r/img.st
	diffusion-capture --steps 2 --sampler sde r/img.st -o r/traj.st
	replay r/img.st r/traj.st -o r/rep.st
	EOF
	mkdir r &&
	hi3 -q -m tiny-instruct run chain.run >run.out &&
	cmp r/text.st $W/a2/text.st && cmp r/seg.st $W/a2/seg.st &&
	cmp r/img.st "$(cat $W/a2/sizes)" &&
	hi3 diff --atol 0 r/traj.st "$(sed "s/\.st$/-traj.st/" $W/a2/sizes)" >/dev/null &&
	test "$(J stage/part <run.out)" = image
'

test_expect_success '--drop-think changes no cot without <recaption>; --rows picks and orders rows' '
	hi3 -q -m $M tokenize-concat --continue --drop-think $W/b/text.st $W/b/seg.st -o d.st &&
	hi3 -q -m $M tokenize-concat --continue $W/b/text.st $W/b/seg.st -o nd.st &&
	T requests nd.st >nd.jsonl && T requests d.st >d.jsonl &&
	! grep -q "<recaption>.*<think>\|<think>.*<recaption>" nd.jsonl && test_cmp nd.jsonl d.jsonl &&
	hi3 -q -m $M tokenize-concat --continue --rows 3,0 $W/b/text.st $W/b/seg.st -o r30.st &&
	T requests r30.st >r30.jsonl &&
	{ sed -n 4p nd.jsonl && sed -n 1p nd.jsonl; } >want && test_cmp want r30.jsonl &&
	hi3 inspect r30.st | grep "text_rows: \[3,0\]"
'

test_expect_success 'refused: a row that did not end at a ratio token (exit 3, the row named, nothing written)' '
	hi3 -q -m $M prefill -n 1 $W/b/text.st -o k1.st &&
	hi3 -q -m $M decode --stop 0 $W/b/text.st k1.st -o s1.st &&
	echo "an existing output" >keep.st && cp keep.st keep.orig &&
	test_must_fail 3 hi3 -m $M tokenize-concat --continue $W/b/text.st s1.st -o keep.st 2>err &&
	test_grep "text.st: row [0-9]: the text stage ended at token [0-9]*, not a ratio token (it reached its length)" err &&
	cmp keep.st keep.orig &&
	test_must_fail 3 hi3 -m $M tokenize-concat --continue --by-size $W/b/text.st s1.st -o part 2>err &&
	! ls part-* 2>/dev/null
'

test_expect_success 'refused: conditions that are no text stage, a segment of other conditions (exit 3)' '
	test_must_fail 3 hi3 -m $M tokenize-concat --continue $W/a1/text.st $W/b/seg.st -o x.st 2>err &&
	test_grep "b/seg.st: 4 rows" err &&
	echo "{\"prompt\": \"hi\", \"system\": \"None\"}" >plain.jsonl &&
	hi3 -q -m $M tokenize-concat plain.jsonl -o plain.st &&
	hi3 -q -m $M prefill -n 2 plain.st -o pk.st && hi3 -q -m $M decode plain.st pk.st -o ps.st &&
	test_must_fail 3 hi3 -m $M tokenize-concat --continue plain.st ps.st -o x.st 2>err &&
	test_grep "plain.st: not the text stage of gen_image requests" err &&
	! test -e x.st &&
	test_must_fail 2 hi3 -m $M tokenize-concat --by-size -o x plain.jsonl 2>err &&
	test_grep "by-size needs --continue" err
'

test_done
