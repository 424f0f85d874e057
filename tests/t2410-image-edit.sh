#!/usr/bin/env bash
# Image editing (it2i): gen_image requests with "images". The images become
# joint blocks of the cond row and, unchanged, of its unconditional twin;
# every whole-sequence pass of diffusion-capture puts the VAE encoder's
# latents through patch_embed at the VAE tokens, timestep_emb(0) at their
# <timestep> and the ViT outputs at the ViT tokens. A ragged batch (0, 1 and
# 2 images of different sizes) equals each request alone, bit for bit; the
# posterior sample is drawn from the request's seed; a request gives a PNG.
. "$SRCDIR/tests/lib.sh"
IMG="$FIXTURES/image"

test_expect_success 'setup: a release-shaped model, pictures, editing requests' '
	make_model tiny-release model --set "vae=$QUICK_VAE" &&
	mkdir pics && cp "$IMG/rgb.png" "$IMG/photo.jpg" "$IMG/gray.png" "$IMG/palette.gif" pics/ &&
	cp pics/rgb.png pics/copy.png &&
	cat >pics/edit.jsonl <<-\EOF &&
	{"prompt": "a red cat", "mode": "gen_image", "image_size": "64x64", "seed": 3}
	{"prompt": "make it red", "images": ["rgb.png"], "mode": "gen_image", "image_size": "64x64", "seed": 4}
	{"prompt": "mix them", "images": ["photo.jpg", "gray.png"], "mode": "gen_image", "image_size": "64x64", "seed": 5}
	EOF
	hi3 -q -m model tokenize-concat pics/edit.jsonl -o c.st
'

test_expect_success 'the unconditional twins keep the images: the same image columns and pixels' '
	hi3 inspect --tensor image_row c.st | tail -n 1 >rows &&
	echo "1 2 2 4 5 5" >want && test_cmp want rows &&
	hi3 inspect --tensor cond_vae_mask --slice 2 c.st | tail -n 1 >m2 &&
	hi3 inspect --tensor cond_vae_mask --slice 5 c.st | tail -n 1 >m5 &&
	test_cmp m2 m5 && grep -q 1 m2 &&
	hi3 inspect c.st >info && test_grep "vae_posterior: mean" info
'

test_expect_success 'an editing request gives a trajectory and a PNG at its bucket size' '
	hi3 -m model diffusion-capture --steps 2 c.st -o t.st --png out --json >sum.json 2>log &&
	test "$("$BUILDDIR/tests/test-tools" json cond_images <sum.json)" = 3 &&
	test_grep "^hi3 diffusion-capture: 3 cond images encoded" log &&
	test -s out/row-1.png &&
	od -An -tu1 -j16 -N8 out/row-1.png | awk "{ print \$3 * 256 + \$4, \$7 * 256 + \$8 }" >size &&
	echo "256 256" >want && test_cmp want size
'

test_expect_success 'the images reach the denoiser: a copy gives the same latents, another picture others' '
	printf "%s\n" "{\"prompt\": \"make it red\", \"images\": [\"rgb.png\"], \"mode\": \"gen_image\", \"image_size\": \"64x64\", \"seed\": 4}" \
		"{\"prompt\": \"make it red\", \"images\": [\"copy.png\"], \"mode\": \"gen_image\", \"image_size\": \"64x64\", \"seed\": 4}" \
		"{\"prompt\": \"make it red\", \"images\": [\"palette.gif\"], \"mode\": \"gen_image\", \"image_size\": \"64x64\", \"seed\": 4}" \
		>pics/same.jsonl &&
	hi3 -q -m model tokenize-concat --per-row pics/same.jsonl -o same.st &&
	hi3 -q -m model diffusion-capture --steps 1 same.st -o same-t.st &&
	hi3 inspect --tensor latents --slice 0,1 same-t.st | tail -n +2 | sed "s/^[^]]*]//" >l0 &&
	hi3 inspect --tensor latents --slice 1,1 same-t.st | tail -n +2 | sed "s/^[^]]*]//" >l1 &&
	hi3 inspect --tensor latents --slice 2,1 same-t.st | tail -n +2 | sed "s/^[^]]*]//" >l2 &&
	test_cmp l0 l1 && ! cmp -s l0 l2
'

test_expect_success 'a batch of requests with 0, 1 and 2 images equals each request alone, bit for bit' '
	hi3 -m model parity --steps 2 pics/edit.jsonl >par.out 2>par.err &&
	test_grep "6 of 6 cases pass (tolerance 0)" par.err &&
	test_grep "unequal real_pos" par.out
'

test_expect_success 'KV reuse equals the whole sequence every step with cond images (<= 1e-5 relative)' '
	hi3 -q -m model diffusion-capture --steps 3 --no-kv-reuse c.st -o full.st &&
	hi3 -q -m model diffusion-capture --steps 3 c.st -o reuse.st &&
	hi3 diff --rtol 1e-5 --atol 1e-6 --tensor latents full.st reuse.st >/dev/null
'

test_expect_success '--vae-sample: latents drawn from the seed: other latents, the same in any batch, replayed' '
	hi3 -q -m model tokenize-concat --vae-sample pics/edit.jsonl -o cs.st &&
	hi3 inspect cs.st >info && test_grep "vae_posterior: sample" info &&
	hi3 -q -m model diffusion-capture --steps 2 --sampler sde cs.st -o ts.st &&
	hi3 -q -m model diffusion-capture --steps 2 --sampler sde c.st -o tm.st &&
	! hi3 diff --atol 0 --tensor latents ts.st tm.st >/dev/null 2>&1 &&
	hi3 -q -m model replay cs.st ts.st -o rs.st >rep.json &&
	"$BUILDDIR/tests/test-tools" json overall/max_abs_dlogp <rep.json >d && echo 0.0 >want && test_cmp want d &&
	hi3 -m model parity --vae-sample --steps 2 pics/edit.jsonl >/dev/null 2>par.err &&
	test_grep "6 of 6 cases pass (tolerance 0)" par.err
'

test_expect_success 'conditions that differ in vae_posterior are not merged (exit 3)' '
	test_must_fail 3 hi3 tokenize-concat --concat c.st cs.st -o m.st 2>err &&
	test_grep "vae_posterior" err && ! test -e m.st
'

test_expect_success 'a model without VAE encoder weights given editing conditions: exit 3 naming both' '
	cp -r model noenc &&
	"$BUILDDIR/tests/test-tools" strip noenc/model-00003-of-00003.safetensors vae.encoder. &&
	awk "/vae\.encoder\./ { next } /^  }/ { sub(/,\$/, \"\", prev) } NR > 1 { print prev } { prev = \$0 }
		END { print prev }" model/model.safetensors.index.json >noenc/model.safetensors.index.json &&
	hi3 -q -m noenc tokenize-concat pics/edit.jsonl -o cn.st &&
	test_must_fail 3 hi3 -m noenc diffusion-capture --steps 1 cn.st -o tn.st 2>err &&
	test_grep "cn.st has 6 cond images" err && test_grep "vae.encoder" err &&
	! test -e tn.st
'

test_done
