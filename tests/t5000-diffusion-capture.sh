#!/usr/bin/env bash
# hi3 diffusion-capture: gen_image requests to a trajectory and PNGs on the
# tiny models (hi3-batching(7), IMAGES AND DIFFUSION): the trajectory's
# tensors and metadata, KV reuse against the whole sequence every step,
# g = 1 and g > 1, --noise reproducing a trajectory, the sizes of
# tokenize-concat, --decode, and the bad inputs it refuses (exit 3, naming
# the file, no output touched).
. "$SRCDIR/tests/lib.sh"
T() { "$BUILDDIR/tests/test-tools" "$@"; }

gen_requests() { # gen_requests SIZE: two prompts of different lengths
	printf '{"prompt": "a red fox", "mode": "gen_image", "image_size": "%s", "seed": 7}\n' "$1"
	printf '{"prompt": "two cats asleep on a warm mat by the fire", "mode": "gen_image", "image_size": "%s", "seed": 9}\n' "$1"
}

test_expect_success 'requests to a trajectory and one PNG per request at the image size' '
	make_model tiny tiny &&
	gen_requests 32x48 >req.jsonl &&
	hi3 -q -m tiny tokenize-concat --exact-size req.jsonl -o c.st &&
	hi3 inspect --tensor gen_image_hw c.st >hw &&
	test_grep "^\[0, :\] 2 3$" hw &&
	hi3 -q -m tiny diffusion-capture --steps 4 c.st -o t.st --png out --json >sum.json &&
	test "$(T json steps <sum.json)" = 4 &&
	test "$(T json rows <sum.json)" = 4 &&
	test "$(T json image_tokens <sum.json)" = 6 &&
	hi3 inspect t.st >info &&
	test_grep "format: hi3.trajectory" info &&
	test_grep "latents *F32 *(2, 5, 16, 2, 3)" info &&
	test_grep "sigmas *F32 *(5,)" info &&
	test_grep "timesteps *F32 *(4,)" info &&
	test_grep "x_T *F32 *(2, 16, 2, 3)" info &&
	test_grep "sampler: euler" info && test_grep "kv_reuse: on" info &&
	test_grep "seeds: \[7, 9\]" info &&
	test "$(T pnginfo out/row-0.png)" = "48 32" &&
	test "$(T pnginfo out/row-1.png)" = "48 32" &&
	! test -e out/row-2.png &&
	T pngtext out/row-1.png >text &&
	test_grep "^prompt=two cats asleep on a warm mat by the fire$" text &&
	test_grep "^seed=9$" text && test_grep "^steps=4$" text &&
	test_grep "^parameters=.*Steps: 4, Sampler: euler, CFG scale: 5, Seed: 9, Size: 48x32" text
'

test_expect_success 'hi3 inspect --png draws a request of a trajectory step by step' '
	hi3 inspect --png steps.png --row 1 --scale 1 --json t.st >p.json &&
	test "$(T json kind <p.json)" = trajectory-steps &&
	test "$(T json rows <p.json)" = 2 &&
	test "$(T json cols <p.json)" = 19 &&
	test "$(T pnginfo steps.png)" = "19 2" &&
	test "$(T pngpix steps.png 3 0)" = "25 25 25" &&
	test_must_fail 2 hi3 inspect --png x.png --row 2 t.st 2>err &&
	test_grep "requests 0 to 1" err
'

test_expect_success 'a "tokens" gen_image request is the prompt body: the template adds the rest, <cfg> replaces it' '
	echo "{\"tokens\": [65, 66, 67], \"mode\": \"gen_image\", \"image_size\": \"32x32\", \"seed\": 3}" >tk.jsonl &&
	echo "{\"prompt\": \"ABC\", \"mode\": \"gen_image\", \"image_size\": \"32x32\", \"seed\": 3}" >tp.jsonl &&
	hi3 -q -m tiny tokenize-concat --exact-size tk.jsonl -o ck.st &&
	hi3 -q -m tiny tokenize-concat --exact-size tp.jsonl -o cp.st &&
	hi3 diff --atol 0 ck.st cp.st &&
	hi3 inspect --tensor input_ids ck.st >ids &&
	test_grep "^\[0, :\] 256 65 66 67 " ids &&
	cfg=$(sed -n "s/^\[1, :\] 256 \([0-9]*\) .*/\1/p" ids) &&
	test_grep "^\[1, :\] 256 $cfg $cfg $cfg " ids &&
	test "$cfg" != 65 &&
	hi3 -q -m tiny diffusion-capture --steps 2 ck.st -o tk.st &&
	echo "{\"tokens\": [65], \"prompt\": \"A\", \"mode\": \"gen_image\", \"image_size\": \"32x32\"}" >bad.jsonl &&
	test_must_fail 3 hi3 -m tiny tokenize-concat bad.jsonl -o x.st 2>err &&
	test_grep "bad.jsonl:1: field .tokens. in mode gen_image is the prompt.s body" err
'

test_expect_success 'a size is snapped to its bucket by default; --strict-size refuses it (exit 3)' '
	gen_requests 32x48 >req.jsonl &&
	hi3 -q -m tiny tokenize-concat req.jsonl -o cb.st &&
	hi3 inspect --tensor gen_image_hw cb.st >hw &&
	test_grep "^\[0, :\] 13 19$" hw &&
	test_must_fail 3 hi3 -m tiny tokenize-concat --strict-size req.jsonl -o cs.st 2>err &&
	test_grep "req.jsonl:1: field .image_size.: 32x48 is not a bucket" err &&
	! test -e cs.st &&
	gen_requests 208x304 >bucket.jsonl &&
	hi3 -q -m tiny tokenize-concat --strict-size bucket.jsonl -o cs.st &&
	gen_requests 40x48 >odd.jsonl &&
	test_must_fail 3 hi3 -m tiny tokenize-concat --exact-size odd.jsonl -o co.st 2>err &&
	test_grep "40x48 is not a multiple of the latent factor 16x16" err
'

test_expect_success '--decode writes the PNG of an existing trajectory, at its bucket size' '
	gen_requests 208x304 | head -n 1 >bucket1.jsonl &&
	hi3 -q -m tiny tokenize-concat bucket1.jsonl -o cb.st &&
	hi3 -q -m tiny diffusion-capture --steps 1 --guidance 1 cb.st -o tb.st &&
	hi3 -q -m tiny diffusion-capture --decode tb.st --png dec &&
	test "$(T pnginfo dec/row-0.png)" = "304 208" &&
	! test -e dec/row-1.png
'

for sampler in "euler" "sde --sde-steps 1,2" "sde --eta 0.7"; do
	test_expect_success "KV reuse equals the whole sequence every step ($sampler, 4 steps, <= 1e-5 relative)" "
		hi3 -q -m tiny diffusion-capture --steps 4 --sampler $sampler c.st -o a.st &&
		hi3 -q -m tiny diffusion-capture --steps 4 --sampler $sampler --no-kv-reuse c.st -o b.st &&
		hi3 inspect b.st | grep -q 'kv_reuse: off' &&
		hi3 diff --atol 0 --rtol 1e-5 a.st b.st
	"
done

test_expect_success 'g = 1 runs the cond rows alone, g > 1 guides: both run, and they differ' '
	hi3 -q -m tiny diffusion-capture --steps 3 --guidance 1 c.st -o g1.st &&
	hi3 -q -m tiny diffusion-capture --steps 3 --guidance 0.5 c.st -o g05.st &&
	hi3 -q -m tiny diffusion-capture --steps 3 --guidance 4 c.st -o g4.st &&
	hi3 diff --atol 0 --tensor latents g1.st g05.st &&
	test_must_fail 1 hi3 diff --tensor latents g1.st g4.st >d &&
	test_grep "latents .*step 1" d &&
	hi3 diff --atol 0 --tensor x_T g1.st g4.st
'

test_expect_success 'SDE steps: a log-prob per request and step, the noise saved; --noise reproduces it bitwise' '
	hi3 -q -m tiny diffusion-capture --steps 5 --sampler sde --sde-steps 0,2,3 c.st -o s.st &&
	hi3 inspect s.st >info &&
	test_grep "sde_logp *F32 *(2, 3)" info &&
	test_grep "sde_noise *F32 *(2, 3, 16, 2, 3)" info &&
	test_grep "sde_steps *I64 *(3,)" info &&
	hi3 inspect --tensor sde_steps s.st | tail -n 1 >steps &&
	test_grep "0 2 3" steps &&
	hi3 -q -m tiny diffusion-capture --steps 5 --sampler sde --sde-steps 0,2,3 --noise s.st c.st -o n.st &&
	hi3 inspect n.st | grep -q "noise: s.st" &&
	hi3 diff --atol 0 s.st n.st &&
	hi3 -q -m tiny diffusion-capture --steps 5 --sampler sde --sde-steps 0,2,3 --latent-dtype bf16 c.st -o sb.st &&
	hi3 inspect sb.st | grep -q "latents *BF16" &&
	test_must_fail 1 hi3 diff --tensor sde_logp s.st sb.st >/dev/null
'

test_expect_success 'each request draws its own noise from its seed: the same in any batch' '
	head -n 1 req.jsonl >r0.jsonl && tail -n 1 req.jsonl >r1.jsonl &&
	hi3 -q -m tiny tokenize-concat --exact-size r1.jsonl -o c1.st &&
	hi3 -q -m tiny diffusion-capture --steps 3 --sampler sde c1.st -o t1.st &&
	hi3 -q -m tiny diffusion-capture --steps 3 --sampler sde c.st -o t2.st &&
	hi3 diff --atol 0 --row 1:0 t2.st t1.st
'

test_expect_success 'Instruct-Distil: one row per request, <guidance> embedded; its 8 default steps, a replay, PNGs' '
	make_model tiny-distil distil &&
	hi3 -q -m distil tokenize-concat --exact-size req.jsonl -o cd.st &&
	hi3 inspect cd.st >info && test_grep "cfg_factor: 1" info &&
	hi3 -q -m distil diffusion-capture --sampler sde --sde-steps 6 cd.st -o td.st --png pd &&
	hi3 inspect td.st >info &&
	test_grep "latents *F32 *(2, 9, 16, 2, 3)" info &&
	test_grep "variant: instruct-distil" info && test_grep "rows: 2$" info &&
	test "$(T pnginfo pd/row-1.png)" = "48 32" &&
	hi3 -q -m distil replay --threshold 1e-5 cd.st td.st -o rd.st >/dev/null &&
	hi3 -q -m distil diffusion-capture --steps 2 --guidance 2 cd.st -o g2.st &&
	hi3 -q -m distil diffusion-capture --steps 2 --guidance 6 cd.st -o g6.st &&
	test_must_fail 1 hi3 diff --tensor latents g2.st g6.st >/dev/null
'

test_expect_success 'hi3 run: capture, replay and decode in one process give the files of the separate commands' '
	hi3 -q -m tiny diffusion-capture --steps 3 --sampler sde c.st -o sep.st --png sep &&
	hi3 -q -m tiny replay c.st sep.st -o sep-r.st >/dev/null &&
	printf "%s\n" "diffusion-capture --steps 3 --sampler sde c.st -o one.st --png one" \
		"replay c.st one.st -o one-r.st" "diffusion-capture --decode one.st --png one2" >script &&
	hi3 -q -m tiny run <script >/dev/null &&
	hi3 diff --atol 0 sep.st one.st && hi3 diff --atol 0 sep-r.st one-r.st &&
	cmp sep/row-1.png one/row-1.png && cmp sep/row-1.png one2/row-1.png
'

test_expect_success 'bad input: gen_text conditions (exit 3, the file named)' '
	requests 5 9 >txt.jsonl &&
	hi3 -q -m tiny tokenize-concat txt.jsonl -o ct.st &&
	echo keep >old.st &&
	test_must_fail 3 hi3 -m tiny diffusion-capture --steps 2 ct.st -o old.st 2>err &&
	test_grep "ct.st: conditions in mode .gen_text." err &&
	test "$(cat old.st)" = keep
'

test_expect_success 'bad input: a noise file of the wrong shape (exit 3, file and tensor named)' '
	hi3 -q -m tiny tokenize-concat --exact-size r0.jsonl -o c0.st &&
	hi3 -q -m tiny diffusion-capture --steps 2 c0.st -o one.st &&
	echo keep >old.st &&
	test_must_fail 3 hi3 -m tiny diffusion-capture --steps 2 --noise one.st c.st -o old.st 2>err &&
	test_grep "one.st: tensor .x_T.: expected shape (2, 16, 2, 3), found (1, 16, 2, 3)" err &&
	test_must_fail 3 hi3 -m tiny diffusion-capture --steps 5 --sampler sde --noise a.st c.st -o old.st 2>err &&
	test_grep "a.st: tensor .sde_noise." err &&
	test "$(cat old.st)" = keep
'

test_expect_success 'bad input: conditions or a trajectory of another model (exit 3)' '
	make_model tiny-moe moe &&
	test_must_fail 3 hi3 -m moe diffusion-capture --steps 2 c.st -o x.st 2>err &&
	test_grep "c.st: made for model fingerprint" err &&
	! test -e x.st &&
	test_must_fail 3 hi3 -m moe diffusion-capture --decode t.st --png x 2>err &&
	test_grep "t.st: made by model fingerprint" err &&
	! test -e x
'

test_expect_success 'bad input: --png without VAE weights still writes the trajectory, and says why (exit 3)' '
	cp -r tiny nv && T strip nv/model.safetensors vae. &&
	hi3 -q -m nv tokenize-concat --exact-size req.jsonl -o cn.st &&
	test_must_fail 3 hi3 -m nv diffusion-capture --steps 2 cn.st -o tn.st --png pn 2>err &&
	test_grep "no PNG (the trajectory tn.st is written)" err &&
	test_grep "tensor .vae.decoder.conv_in.weight. is missing" err &&
	hi3 inspect tn.st | grep -q "format: hi3.trajectory" &&
	! test -e pn/row-0.png
'

test_expect_success 'usage errors (exit 2)' '
	test_must_fail 2 hi3 -m tiny diffusion-capture c.st 2>err && test_grep "TRAJ" err &&
	test_must_fail 2 hi3 -m tiny diffusion-capture --eta 0.5 c.st -o x.st &&
	test_must_fail 2 hi3 -m tiny diffusion-capture --sde-steps 1 c.st -o x.st &&
	test_must_fail 2 hi3 -m tiny diffusion-capture --sampler sde --sde-steps 2,1 --steps 4 c.st -o x.st &&
	test_must_fail 2 hi3 -m tiny diffusion-capture --sampler sde --sde-steps 4 --steps 4 c.st -o x.st &&
	test_must_fail 2 hi3 -m tiny diffusion-capture --flow-shift 0 c.st -o x.st &&
	test_must_fail 2 hi3 -m tiny diffusion-capture --decode t.st &&
	! test -e x.st
'

test_done
