#!/usr/bin/env bash
# The released checkpoints as published: the three release presets run the
# text pipeline (tokenize-concat, prefill, decode, replay) and keep batch
# parity; their variants, templates and generation defaults; the decoding
# rules of the Instruct text stage; ids above 128k; and the bad input each
# refuses with exit 3, naming the file and the field.
. "$SRCDIR/tests/lib.sh"
J() { "$BUILDDIR/tests/test-tools" json "$@"; }
REL="$FIXTURES/released"
M() { "$BUILDDIR/tests/test-tools" json "$1"; }   # a metadata or report field from JSON on stdin

# every top-level field of the released config.json is in DIR's
same_fields() {
	for key in $(sed -n 's/^    "\([a-z_A-Z]*\)":.*/\1/p' "$REL/config.json"); do
		grep -q "^  \"$key\":" "$1/config.json" || { echo "$1: missing field $key"; return 1; }
	done
}

for preset in tiny-release tiny-instruct tiny-distil; do
	test_expect_success "$preset: small, sharded, with the released field set" "
		make_model $preset $preset &&
		test -f $preset/model.safetensors.index.json &&
		ls $preset/model-0000?-of-00003.safetensors >shards && test \$(wc -l <shards) = 3 &&
		test \$(du -sk $preset | cut -f1) -lt 7000 &&
		grep -q 'routed_scaling_factor.: false' $preset/config.json &&
		grep -q 'moe_topk.: .\$' $preset/config.json &&
		same_fields $preset
	"
	test_expect_success "$preset: tokenize-concat, prefill, decode, replay (replay equals the rollout)" "
		cat >req.jsonl <<-\EOF &&
		{\"prompt\": \"A cat on a mat.\", \"system\": \"None\", \"bot_task\": \"auto\", \"seed\": 1}
		{\"prompt\": \"Two dogs by the sea, at dawn.\", \"system\": \"None\", \"bot_task\": \"think\", \"seed\": 2}
		{\"prompt\": \"一只猫\", \"system\": \"None\", \"bot_task\": \"recaption\", \"image_size\": \"1024x768\"}
		EOF
		hi3 -q -m $preset tokenize-concat req.jsonl -o c.st &&
		hi3 -q -m $preset prefill c.st -o k.st --max-new 24 &&
		hi3 -m $preset decode c.st k.st -o s.st 2>err &&
		test_grep 'sampling as generation_config.json asks: temperature 0.6, top_k 1024, top_p 0.95' err &&
		hi3 -q -m $preset replay --threshold 1e-5 c.st s.st -o r.st >rep.json &&
		test \"\$(J overall/tokens <rep.json)\" -gt 3 &&
		test \"\$(J overall/max_abs_dlogp <rep.json)\" = 0.0
	"
	test_expect_success "$preset: batch parity, greedy and sampled" "
		cat >preq.jsonl <<-\EOF &&
		{\"prompt\": \"A cat.\", \"system\": \"None\", \"bot_task\": \"auto\"}
		{\"prompt\": \"A much longer prompt about a lighthouse on a cliff over the sea.\", \"system\": \"None\"}
		{\"tokens\": [301, 65, 66, 67, 68, 69, 70], \"bot_task\": \"think_recaption\"}
		EOF
		hi3 -m $preset parity preq.jsonl --steps 3,6 --temperature 0.8 --top-k 20 >out 2>err &&
		test \$(grep -c '^\\[PASS\\]' out) = 12 && ! grep -q '^\\[FAIL\\]' out
	"
done

test_expect_success 'variants: inspect names each, with the fields that decided it' '
	hi3 inspect tiny-release >i1 && test_grep "^model: base (config.json: model_version .HunyuanImage-3.0.)" i1 &&
	hi3 inspect tiny-instruct >i2 && test_grep "^model: instruct (config.json: model_version .HunyuanImage-3.0-Instruct.)" i2 &&
	hi3 inspect tiny-distil >i3 && test_grep "^model: instruct-distil (config.json: cfg_distilled true, use_meanflow true)" i3 &&
	test_grep "config.json, 3 decide the variant: cfg_distilled model_version use_meanflow" i3 &&
	test_grep "diff_infer_steps 8, diff_guidance_scale 2.5, flow_shift 3" i3 &&
	test_grep "resolution buckets (image_base_size 256): 37," i2 &&
	test_grep "resolution buckets (image_base_size 256): 33," i1 &&
	hi3 inspect --json tiny-distil >i3.json &&
	test "$(J model/variant <i3.json)" = instruct-distil &&
	test "$(J model/generation/bot_task <i3.json)" = think_recaption
'

test_expect_success 'templates: pretrain for the base, instruct with the unified system prompt for Instruct' '
	echo "{\"prompt\": \"A cat.\"}" >one.jsonl &&
	hi3 -m tiny-release tokenize-concat one.jsonl -o b.st 2>err && test_grep "template pretrain, base model" err &&
	test "$(hi3 inspect --json b.st | M metadata/bot_task)" = image &&
	hi3 -m tiny-instruct tokenize-concat one.jsonl -o i.st 2>err && test_grep "template instruct, instruct model" err &&
	test "$(hi3 inspect --json i.st | M metadata/bot_task)" = think_recaption &&
	set -- $(hi3 inspect --tensor real_pos i.st | tail -n 1) && test "$1" -gt 4000 &&
	echo "{\"prompt\": \"A cat.\", \"system\": \"None\"}" >none.jsonl &&
	hi3 -q -m tiny-instruct tokenize-concat none.jsonl -o n.st &&
	set -- $(hi3 inspect --tensor real_pos n.st | tail -n 1) && test "$1" -lt 40
'

test_expect_success 'gen_image rows: 2 (CFG) for Instruct, 1 for the cfg-distilled model, with <guidance> <timestep_r>' '
	echo "{\"prompt\": \"A cat.\", \"system\": \"None\", \"mode\": \"gen_image\", \"image_size\": \"256x256\"}" >g.jsonl &&
	hi3 -q -m tiny-instruct tokenize-concat g.jsonl -o gi.st &&
	hi3 -q -m tiny-distil tokenize-concat g.jsonl -o gd.st &&
	test "$(hi3 inspect --json gi.st | M metadata/cfg_factor)" = 2 &&
	test "$(hi3 inspect --json gd.st | M metadata/cfg_factor)" = 1 &&
	set -- $(hi3 inspect --tensor timestep_index --slice 0 gd.st | tail -n 1) && ts=$1 &&
	test "$(hi3 inspect --tensor input_ids --slice 0,$((ts + 1)):$((ts + 3)) gd.st | tail -n 1)" = "346 347"
'

# the base code reads "16:9" as H:W (bucket 20 of 33, 320x192), the Instruct code as W:H (bucket 36, 720x1280)
test_expect_success 'image_size: HxW, the extra resolutions 33-36, W:H for the Instruct code, K and <img_ratio_K>' '
	for s in "\"1024x768\" 33" "\"1280x720\" 34" "\"768x1024\" 35" "\"720x1280\" 36" "\"16:9\" 36" "36 36" \
	         "\"<img_ratio_34>\" 34" "\"256x256\" 16"; do
		set -- $s &&
		echo "{\"prompt\": \"x\", \"system\": \"None\", \"mode\": \"gen_image\", \"image_size\": $1}" >s.jsonl &&
		hi3 -q -m tiny-instruct tokenize-concat s.jsonl -o s.st &&
		set -- $s $(hi3 inspect --tensor timestep_index --slice 0 s.st | tail -n 1) &&
		got=$(hi3 inspect --tensor input_ids --slice 0,$(($3 - 1)) s.st | tail -n 1) &&
		want=$(( $2 < 33 ? 387 + $2 : 500 + $2 - 33 )) &&
		{ test "$got" = "$want" || { echo "$1: ratio token $got, expected $want"; exit 1; }; }
	done &&
	echo "{\"prompt\": \"x\", \"mode\": \"gen_image\", \"image_size\": \"16:9\"}" >b.jsonl &&
	hi3 -q -m tiny-release tokenize-concat b.jsonl -o b.st &&
	set -- $(hi3 inspect --tensor timestep_index --slice 0 b.st | tail -n 1) &&
	test "$(hi3 inspect --tensor input_ids --slice 0,$(($1 - 1)) b.st | tail -n 1)" = $((387 + 20))
'

test_expect_success 'decode follows the rules: </recaption> forces <answer> <boi> <img_size_256>, then the greedy ratio' '
	echo "{\"tokens\": [301, 65, 66, 362], \"bot_task\": \"recaption\"}" >r.jsonl &&
	hi3 -q -m tiny-instruct tokenize-concat --tokenizer tiny-instruct/tokenizer.json r.jsonl -o r.st &&
	hi3 -q -m tiny-instruct prefill r.st -o rk.st --max-new 8 &&
	hi3 -q -m tiny-instruct decode --temperature 1.5 r.st rk.st -o rs.st &&
	set -- $(hi3 inspect --tensor tokens rs.st | tail -n 1) &&
	test "$1 $2 $3" = "368 343 377" && test $# = 4 &&
	{ test "$4" -ge 387 -a "$4" -le 419 || test "$4" -ge 500 -a "$4" -le 503; } &&
	test "$(hi3 inspect --tensor stop_reason rs.st | tail -n 1)" = 1 &&
	hi3 -q -m tiny-instruct replay --threshold 1e-5 r.st rs.st -o rr.st >rep.json &&
	test "$(J overall/max_abs_dlogp <rep.json)" = 0.0 &&
	echo "{\"tokens\": [301, 65, 66, 367], \"bot_task\": \"think_recaption\", \"image_size\": \"256x256\"}" >t.jsonl &&
	hi3 -q -m tiny-instruct tokenize-concat --tokenizer tiny-instruct/tokenizer.json t.jsonl -o t.st &&
	hi3 -q -m tiny-instruct prefill t.st -o tk.st --max-new 3 &&
	hi3 -q -m tiny-instruct decode t.st tk.st -o ts.st &&
	set -- $(hi3 inspect --tensor tokens ts.st | tail -n 1) && test "$1" = 361
'

test_expect_success 'ids above 128k: the release-id tokenizer on a model with the released vocabulary' '
	printf "%s\n" "<img_ratio_33><img_ratio_36><|startoftext|>" >sp.txt &&
	hi3 tokenize --tokenizer "$REL/tokenizer.json" sp.txt >sp.ids && test "$(cat sp.ids)" = "[130103,130106,127958]" &&
	echo "[130104, 128044, 72, 105]" | hi3 tokenize --tokenizer "$REL/tokenizer.json" --decode >sp.txt2 &&
	test_grep "<img_ratio_34><img_ratio_0>Hi" sp.txt2 &&
	make_model tiny-instruct big --set vocab_size=133120 --set hidden_size=16 --set num_attention_heads=2 \
		--set attention_head_dim=8 --set head_dim=8 &&
	echo "{\"prompt\": \"A cat on a mat.\", \"system\": \"None\"}" >big.jsonl &&
	hi3 -q -m big tokenize-concat --tokenizer "$REL/tokenizer.json" big.jsonl -o big.st &&
	hi3 inspect --tensor stop_tokens --slice 0 big.st | tail -n 1 >stops && test_grep "130103 130104 130105 130106$" stops &&
	hi3 inspect --tensor input_ids --slice 0 big.st | tail -n 1 >ids && test_grep "^127958 " ids &&
	hi3 -q -m big prefill big.st -o bigk.st --max-new 6 &&
	hi3 -q -m big decode --greedy big.st bigk.st -o bigs.st &&
	hi3 -q -m big replay --threshold 1e-5 big.st bigs.st -o bigr.st >rep.json &&
	test "$(J overall/max_abs_dlogp <rep.json)" = 0.0
'

test_expect_success 'max_position_embeddings bounds L + max_new before any work' '
	make_model tiny-release short --set max_position_embeddings=30 &&
	echo "{\"prompt\": \"A cat on a mat, a dog on a log.\", \"bot_task\": \"auto\"}" >p.jsonl &&
	hi3 -q -m short tokenize-concat p.jsonl -o p.st &&
	test_must_fail 3 hi3 -m short prefill p.st -o pk.st --max-new 20 2>err &&
	test_grep "max_position_embeddings 30 (short/config.json)" err && test ! -e pk.st
'

# bad_config NAME SED-EXPR EXPECTED: the preset's config.json edited, refused by
# every command that reads it (exit 3, naming the file and the field)
bad_config() {
	test_expect_success "bad config: $1" "
		rm -rf bad && cp -r tiny-release bad && sed -i '$2' bad/config.json &&
		! cmp -s bad/config.json tiny-release/config.json &&
		test_must_fail 3 hi3 -m bad prefill c0.st -o k0.st 2>err1 && test_grep 'bad/config.json: field .$3.' err1 &&
		test_must_fail 3 hi3 -m bad tokenize-concat one.jsonl -o t0.st 2>err2 &&
		test_grep 'bad/config.json: field .$3.' err2 && test ! -e t0.st
	"
}
test_expect_success 'conditions for the bad configs' 'requests 5 >r0.jsonl && hi3 -q -m tiny-release tokenize-concat r0.jsonl -o c0.st'
bad_config 'a string where an integer is' 's/"hidden_size": 64/"hidden_size": "64"/' hidden_size
bad_config 'a per-layer list of the wrong length' 's/"moe_topk": \[/"moe_topk": [2, /' moe_topk
bad_config 'use_cla true' 's/"use_cla": false/"use_cla": true/' use_cla
bad_config 'mlp_bias true' 's/"mlp_bias": false/"mlp_bias": true/' mlp_bias
bad_config 'moe_drop_tokens true' 's/"moe_drop_tokens": false/"moe_drop_tokens": true/' moe_drop_tokens
bad_config 'use_rotary_pos_emb false' 's/"use_rotary_pos_emb": true/"use_rotary_pos_emb": false/' use_rotary_pos_emb
bad_config 'a rope_scaling type other than custom' 's/"type": "custom"/"type": "dynamic"/' rope_scaling
bad_config 'a vae block field of the wrong type' 's/"latent_channels": 16/"latent_channels": "16"/' vae.latent_channels

test_expect_success 'routed_scaling_factor false where a layer uses it: a warning on stderr' '
	make_model tiny-release top1 --set moe_topk=1 &&
	hi3 -m top1 prefill c0.st -o k1.st 2>err || true &&
	test_grep "routed_scaling_factor\" is false (0, as Python reads it), and layer 0 uses it (moe_topk 1)" err
'

# bad_request MODEL LINE EXPECTED
bad_request() {
	test_expect_success "bad request on $1: $3" "
		echo '$2' >bad.jsonl &&
		test_must_fail 3 hi3 -m $1 tokenize-concat bad.jsonl -o bad.st 2>err &&
		test_grep \"bad.jsonl:1: $3\" err && test ! -e bad.st
	"
}
bad_request tiny-instruct '{"prompt": "x", "bot_task": "dream"}' "field 'bot_task': unknown value 'dream'"
bad_request tiny-instruct '{"prompt": "x", "system": "en_unifed"}' "field 'system': unknown system prompt name 'en_unifed'"
bad_request tiny-release '{"prompt": "x", "mode": "gen_image", "image_size": "<img_ratio_33>"}' \
	"field 'image_size': <img_ratio_33> maps to no bucket: the base model has 33"
bad_request tiny-instruct '{"prompt": "x", "mode": "gen_image", "image_size": 37}' \
	"field 'image_size': <img_ratio_37> maps to no bucket: the instruct model has 37"
bad_request tiny-release '{"prompt": "x", "bot_task": "think_recaption"}' "field 'bot_task': think_recaption is the Instruct code"

test_done
