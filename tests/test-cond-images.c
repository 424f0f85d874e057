/*
 * test-cond-images.c -- cond images from requests to the model's input rows:
 * what the conditions store of each image (the ViT view's patches and the
 * VAE view, bit for bit what hi3_image_vit_view and hi3_image_vae_view
 * make), that they survive writing, selecting and merging rows, that a
 * file whose images do not match its ViT columns is refused, and that the
 * rows prefill and replay put in place of token embeddings are the ViT and
 * aligner outputs of exactly those images, at exactly the cond_vit_mask
 * columns (hi3_forward's layer-0 input), the other columns untouched.
 *
 * The model is the tiny-release preset (a 2-layer SigLIP2 of width 32, at
 * most 64 patches, image base 256); the pictures are tests/fixtures/image's.
 * SRCDIR locates them.
 */
#include "config.h"
#include <math.h>
#include <string.h>
#include "core/internal.h"
#include "cond/image-internal.h"
#include "format/conditions.h"
#include "stage/images.h"
#include "tap.h"
#include "testdir.h"

static char *root, *model;
static const char *srcdir;

/* TAP's "Bail out!": the test cannot go on. */
#define BAIL_OUT(...) (printf("Bail out! "), printf(__VA_ARGS__), printf("\n"), exit(1))

static hi3_image *load(const char *name)
{
	char *path = hi3i_asprintf("%s/tests/fixtures/image/%s", srcdir, name);
	hi3_image *im = NULL;
	hi3_error err = {0};

	HI3_ASSERT(path);
	if (hi3_image_load(&im, path, NULL, &err))
		BAIL_OUT("%s", err.msg);
	free(path);
	return im;
}

/* The conditions of three requests: no image, rgb.png, photo.jpg and gray.png. */
static hi3_cond *build(hi3_template *t, int per_row)
{
	char *text = hi3i_asprintf("{\"prompt\": \"a\"}\n"
	                           "{\"prompt\": \"b\", \"images\": [\"%s/tests/fixtures/image/rgb.png\"]}\n"
	                           "{\"prompt\": \"c\", \"images\": [\"%s/tests/fixtures/image/photo.jpg\", "
	                           "\"%s/tests/fixtures/image/gray.png\"]}\n", srcdir, srcdir, srcdir);
	hi3_cond_build_opts bo = {.per_row = per_row};
	hi3_requests *rq = NULL;
	hi3_cond *c = NULL;
	hi3_error err = {0};

	HI3_ASSERT(text);
	if (hi3_requests_parse(&rq, text, strlen(text), "req.jsonl", &err) ||
	    hi3_cond_build(&c, t, rq, &bo, &err) == 0 || !strstr(err.msg, "was not read"))
		BAIL_OUT("images not read: expected a refusal, got '%s'", err.msg);
	memset(&err, 0, sizeof(err));
	if (hi3_requests_load_images(rq, NULL, &err) || hi3_cond_build(&c, t, rq, &bo, &err))
		BAIL_OUT("%s", err.msg);
	hi3_requests_free(rq);
	free(text);
	return c;
}

/* Image k of c against its picture: both views bit for bit. */
static void test_views(const hi3_cond *c, int k, const char *name)
{
	hi3_image *im = load(name);
	hi3_image_vit *vit = NULL;
	hi3_image_vae *vae = NULL;
	hi3_image_vit_opts vo = {.patch = 16, .max_patches = c->VP};
	hi3_image_vae_opts ao = {.base_size = 256};
	hi3_error err = {0};
	int same = 1;
	size_t off = 0;

	if (hi3_image_vit_view(&vit, im, &vo, &err) || hi3_image_vae_view(&vae, im, &ao, &err))
		BAIL_OUT("%s: %s", name, err.msg);
	ok(c->vit_grid[2 * k] == vit->grid_h && c->vit_grid[2 * k + 1] == vit->grid_w, "%s: ViT grid %dx%d, the "
	   "view's %dx%d", name, c->vit_grid[2 * k], c->vit_grid[2 * k + 1], vit->grid_h, vit->grid_w);
	for (size_t i = 0; i < (size_t)c->VP * c->VD; i++) {
		const uint8_t u = c->vit_pixels[(size_t)k * c->VP * c->VD + i];
		float x = hi3i_vit_value(u);
		same &= vit->mask[i / c->VD] ? !memcmp(&x, &vit->pixel_values[i], sizeof(x))
		                             : u == 0 && vit->pixel_values[i] == 0.0f;
	}
	ok(same, "%s: the stored patches, normalised, are the ViT view's pixel_values bit for bit (pad rows 0)", name);
	for (int j = 0; j < k; j++)
		off += (size_t)c->vae_shape[2 * j] * c->vae_shape[2 * j + 1] * 3;
	ok(c->vae_shape[2 * k] == vae->height && c->vae_shape[2 * k + 1] == vae->width &&
	   !memcmp(c->vae_pixels + off, vae->rgb, (size_t)vae->height * vae->width * 3),
	   "%s: the stored VAE view is the %dx%d bucket's crop bit for bit", name, vae->width, vae->height);
	hi3_image_vit_free(vit);
	hi3_image_vae_free(vae);
	hi3_image_free(im);
}

static int same_images(const hi3_cond *a, const hi3_cond *b)
{
	return a->NI == b->NI && a->VP == b->VP && a->VD == b->VD && a->NV == b->NV &&
	       !memcmp(a->image_row, b->image_row, sizeof(int64_t) * a->NI) &&
	       !memcmp(a->vit_grid, b->vit_grid, sizeof(int32_t) * 2 * a->NI) &&
	       !memcmp(a->vit_pixels, b->vit_pixels, (size_t)a->NI * a->VP * a->VD) &&
	       !memcmp(a->vae_shape, b->vae_shape, sizeof(int32_t) * 2 * a->NI) &&
	       !memcmp(a->vae_pixels, b->vae_pixels, (size_t)a->NV);
}

static void test_files(const hi3_cond *c, hi3_template *t)
{
	char *path = hi3i_asprintf("%s/c.st", root), *bad = hi3i_asprintf("%s/bad.st", root);
	hi3_cond *back = NULL, *sel = NULL, *per = build(t, 1), *two = NULL;
	const int rows[2] = {2, 0};
	hi3_error err = {0};

	HI3_ASSERT(path && bad);
	ok(hi3_cond_write(c, path, &err) == 0 && hi3_cond_open(&back, path, &err) == 0 && same_images(c, back),
	   "written and read back, the images are the same %s", err.msg);
	ok(same_images(c, per), "--per-row conditions hold the same images as the batch's");
	ok(hi3_cond_select(&sel, back, rows, 2, 0, &err) == 0 && sel->NI == 2 && sel->image_row[0] == 0 &&
	   sel->image_row[1] == 0 && !memcmp(sel->vit_pixels, c->vit_pixels + (size_t)c->VP * c->VD,
	                                     (size_t)2 * c->VP * c->VD),
	   "rows 2 and 0 selected: row 2's two images, now row 0's %s", err.msg);
	{
		const hi3_cond *in[2] = {sel, back};
		ok(hi3_cond_concat(&two, in, 2, 0, &err) == 0 && two->NI == 5 && two->image_row[2] == 3 &&
		   two->image_row[4] == 4 && !memcmp(two->vit_grid + 4, c->vit_grid, sizeof(int32_t) * 2),
		   "merged with the whole batch: 5 images, rows 0 0 3 4 4 %s", err.msg);
	}
	/* a file whose images are off by one row */
	((int64_t *)HI3I_COND(c)->buf[T_IMG_ROW])[0] = 0;
	memset(&err, 0, sizeof(err));
	hi3_cond_close(back);
	back = NULL;
	ok(hi3_cond_write(c, bad, &err) == 0 && hi3_cond_open(&back, bad, &err) != 0 && err.status == HI3_ERR_INPUT &&
	   strstr(err.msg, "bad.st") && strstr(err.msg, "row 0: 0 cond_vit_mask columns, but 1 images"),
	   "an image put on a row without ViT columns: refused, naming the file: %s", err.msg);
	((int64_t *)HI3I_COND(c)->buf[T_IMG_ROW])[0] = 1;
	hi3_cond_close(back);
	hi3_cond_close(sel);
	hi3_cond_close(per);
	hi3_cond_close(two);
	free(path), free(bad);
}

/* The rows in place of the token embeddings: for each image, its VAE
 * tokens, its <timestep>, then aligner(ViT(image)) at the row's
 * cond_vit_mask columns in order; the forward pass takes them there and
 * nowhere else. */
static void test_embeds(const hi3_cond *c)
{
	hi3_model *m = NULL;
	hi3_vit *v = NULL;
	struct hi3i_image_enc *enc = NULL;
	hi3_error err = {0};
	const int rows[2] = {2, 1};
	struct hi3i_image_embeds e = {0}, one = {0};
	int H, ok_rows = 1, ok_at = 1, n_vae = 0, n_ts = 0, n_vit = 0, ok_ts = 1, ok_alone = 1;
	uint8_t *seen;

	if (hi3_model_open(&m, model, NULL, &err) || hi3i_image_enc_open(&enc, m, c, "c.st", &err) ||
	    hi3_vit_open(&v, m, &err))
		BAIL_OUT("%s", err.msg);
	H = hi3_model_config(m)->hidden_size;
	ok(hi3i_image_embeds(enc, c, rows, 2, &e, &err) == 0, "rows 2 and 1: their images' rows %s", err.msg);
	/* each row's entry kinds, by column */
	seen = calloc((size_t)2 * c->L, 1);
	HI3_ASSERT(seen);
	for (int i = 0; i < e.n; i++) {
		const int j = e.at[2 * i], t = e.at[2 * i + 1];
		const size_t ct = (size_t)rows[j] * c->L + t;
		ok_at &= !seen[(size_t)j * c->L + t]++ && (i == 0 || e.at[2 * i - 2] <= j);
		if (c->cond_vae_mask[ct]) {
			n_vae++;
		} else if (c->cond_vit_mask[ct]) {
			n_vit++;
		} else {
			/* a <timestep>: right before a VAE run, timestep_emb(0) each */
			n_ts++;
			ok_at &= t + 1 < c->L && c->cond_vae_mask[ct + 1];
		}
	}
	{
		/* every image column of the two rows has a row */
		size_t want_vae = 0, want_vit = 0;
		for (int j = 0; j < 2; j++)
			for (int t = 0; t < c->L; t++) {
				want_vae += c->cond_vae_mask[(size_t)rows[j] * c->L + t];
				want_vit += c->cond_vit_mask[(size_t)rows[j] * c->L + t];
			}
		ok(ok_at && (size_t)n_vae == want_vae && (size_t)n_vit == want_vit && n_ts == 3 && n_vit == 3 * c->VP,
		   "they go to the rows' cond_vae_mask and cond_vit_mask columns and the 3 images' <timestep>s, once "
		   "each, row by row (%d VAE, %d ViT, %d timestep rows)", n_vae, n_vit, n_ts);
	}
	/* the <timestep> rows: all the same, timestep_emb(0) */
	{
		const float *first = NULL;
		for (int i = 0; i < e.n; i++) {
			const size_t ct = (size_t)rows[e.at[2 * i]] * c->L + e.at[2 * i + 1];
			if (c->cond_vae_mask[ct] || c->cond_vit_mask[ct])
				continue;
			if (!first)
				first = e.rows + (size_t)i * H;
			ok_ts &= !memcmp(first, e.rows + (size_t)i * H, sizeof(float) * H);
		}
		ok(ok_ts && first, "the <timestep> rows are one embedding (timestep_emb(0))");
	}
	/* row 1 alone: the same rows, bit for bit (each image runs alone) */
	ok(hi3i_image_embeds(enc, c, (const int[]){1}, 1, &one, &err) == 0, "row 1 alone %s", err.msg);
	{
		int k = 0;
		for (int i = 0; i < e.n; i++)
			if (e.at[2 * i] == 1) {
				ok_alone &= k < one.n && one.at[2 * k] == 0 && one.at[2 * k + 1] == e.at[2 * i + 1] &&
				            !memcmp(one.rows + (size_t)k * H, e.rows + (size_t)i * H, sizeof(float) * H);
				k++;
			}
		ok(ok_alone && k == one.n && k > 0, "row 1's %d rows are the same alone as in the batch", k);
	}
	hi3i_image_embeds_release(&one);
	/* each image alone through the ViT: the same bits as its ViT rows */
	for (int img = 0; img < 3; img++) {
		const int k = (int[]){1, 2, 0}[img];    /* batch order: row 2's images, then row 1's */
		float *pv = malloc(sizeof(float) * (size_t)c->VP * c->VD), *out = malloc(sizeof(float) * (size_t)c->VP * H);
		int32_t *mask = calloc((size_t)c->VP, sizeof(int32_t));
		int s = 0;
		HI3_ASSERT(pv && out && mask);
		/* the ViT view itself, as hi3_image_vit_view gives it (pad rows 0) */
		hi3_image *im = load((const char *[]){"rgb.png", "photo.jpg", "gray.png"}[k]);
		hi3_image_vit *view = NULL;
		hi3_image_vit_opts vo = {.patch = 16, .max_patches = c->VP};
		if (hi3_image_vit_view(&view, im, &vo, &err))
			BAIL_OUT("%s", err.msg);
		memcpy(pv, view->pixel_values, sizeof(float) * (size_t)c->VP * c->VD);
		memcpy(mask, view->mask, sizeof(int32_t) * (size_t)c->VP);
		hi3_image_vit_free(view);
		hi3_image_free(im);
		if (hi3_vit_encode(v, pv, mask, c->vit_grid + 2 * k, 1, c->VP, NULL, out, &err))
			BAIL_OUT("%s", err.msg);
		/* the img-th image's ViT rows: entries img P .. of the ViT kind */
		for (int i = 0, nv = 0; i < e.n; i++) {
			const size_t ct = (size_t)rows[e.at[2 * i]] * c->L + e.at[2 * i + 1];
			if (!c->cond_vit_mask[ct])
				continue;
			if (nv >= img * c->VP && nv < (img + 1) * c->VP)
				ok_rows &= !memcmp(out + (size_t)s++ * H, e.rows + (size_t)i * H, sizeof(float) * H);
			nv++;
		}
		ok_rows &= s == c->VP;
		free(pv), free(out), free(mask);
	}
	ok(ok_rows, "each image's ViT rows are its aligner(ViT) output alone, bit for bit, pad slots included");
	free(seen);
	/* the forward pass: layer 0's input is the row there, the token embedding elsewhere */
	{
		const int B = 2, T = c->L, L = hi3_model_config(m)->num_hidden_layers;
		int64_t *ids = malloc(sizeof(int64_t) * (size_t)B * T);
		int32_t *rope = malloc(sizeof(int32_t) * 2 * (size_t)B * T), *hi = malloc(sizeof(int32_t) * (size_t)B * T);
		int32_t *blocks = malloc(sizeof(int32_t) * 2 * (size_t)B * c->S);
		float *h0 = malloc(sizeof(float) * (size_t)(L + 1) * B * T * H);
		float *h1 = malloc(sizeof(float) * (size_t)(L + 1) * B * T * H);
		int at[2] = {0, 0}, placed = 1, kept = 1;
		float logit[2 * 512];
		HI3_ASSERT(ids && rope && hi && blocks && h0 && h1 && hi3_model_config(m)->vocab_size <= 512);
		for (int j = 0; j < B; j++) {
			memcpy(ids + (size_t)j * T, c->input_ids + (size_t)rows[j] * T, sizeof(int64_t) * T);
			memcpy(rope + (size_t)j * T * 2, c->rope_pos + (size_t)rows[j] * T * 2, sizeof(int32_t) * 2 * T);
			memcpy(blocks + (size_t)j * c->S * 2, c->image_blocks + (size_t)rows[j] * c->S * 2,
			       sizeof(int32_t) * 2 * c->S);
			for (int t = 0; t < T; t++)
				hi[(size_t)j * T + t] = t;
		}
		{
			hi3_batch b = {.B = B, .T = T, .mode = HI3_ATTN_SELF, .ids = ids, .rope = rope, .hi = hi,
			               .blocks = blocks, .S = c->S, .n_logits = 1, .logit_at = at, .logits = logit,
			               .hidden_out = h0};
			if (hi3_forward(m, NULL, &b, &err))
				BAIL_OUT("%s", err.msg);
			b.hidden_out = h1;
			b.n_host_embed = e.n;
			b.host_embed_at = e.at;
			b.host_embed_rows = e.rows;
			if (hi3_forward(m, NULL, &b, &err))
				BAIL_OUT("%s", err.msg);
		}
		for (int i = 0; i < e.n; i++)
			placed &= !memcmp(h1 + ((size_t)e.at[2 * i] * T + e.at[2 * i + 1]) * H, e.rows + (size_t)i * H,
			                  sizeof(float) * H);
		for (int j = 0; j < B; j++)
			for (int t = 0; t < T; t++)
				if (!c->cond_vit_mask[(size_t)rows[j] * T + t] && !c->cond_vae_mask[(size_t)rows[j] * T + t] &&
				    !(t + 1 < T && c->cond_vae_mask[(size_t)rows[j] * T + t + 1]))
					kept &= !memcmp(h1 + ((size_t)j * T + t) * H, h0 + ((size_t)j * T + t) * H, sizeof(float) * H);
		ok(placed && kept, "hi3_forward: layer 0's input is those rows at those columns, the token embedding "
		   "at every other column");
		free(ids), free(rope), free(hi), free(blocks), free(h0), free(h1);
	}
	/* a bad place is a usage error, not a write out of bounds */
	{
		int32_t bad_at[2] = {0, c->L};
		int64_t id = 1;
		int32_t r2[2] = {0, 0}, h = 0, lat[2] = {0, 0};
		float lg[512];
		hi3_batch b = {.B = 1, .T = 1, .mode = HI3_ATTN_SELF, .ids = &id, .rope = r2, .hi = &h, .n_logits = 1,
		               .logit_at = lat, .logits = lg, .n_host_embed = 1, .host_embed_at = bad_at, .host_embed_rows = e.rows};
		memset(&err, 0, sizeof(err));
		ok(hi3_forward(m, NULL, &b, &err) && err.status == HI3_ERR_USAGE && strstr(err.msg, "embedding row 0"),
		   "an embedding row outside the batch: refused: %s", err.msg);
	}
	hi3i_image_embeds_release(&e);
	hi3_vit_close(v);
	hi3i_image_enc_close(enc);
	hi3_model_close(m);
}

int main(void)
{
	hi3_init_opts io = {.preset = "tiny-release", .seed = 5};
	hi3_template_opts to = {.load_tokenizer = 1};
	hi3_template *t = NULL;
	hi3_error err = {0};
	hi3_cond *c;

	srcdir = getenv("SRCDIR") ? getenv("SRCDIR") : ".";
	if (!(root = testdir_new("test-cond-images")) || !(model = hi3i_asprintf("%s/model", root)))
		return 1;
	if (hi3_init_model(model, &io, &err) || (to.model_dir = model, hi3_template_open(&t, &to, &err)))
		BAIL_OUT("%s", err.msg);
	c = build(t, 0);
	ok(c->NI == 3 && c->image_row[0] == 1 && c->image_row[1] == 2 && c->image_row[2] == 2 && c->VP == 64 &&
	   c->VD == 768, "3 images: row 1's, then row 2's two; 64 slots of 768 features");
	test_views(c, 0, "rgb.png");
	test_views(c, 1, "photo.jpg");
	test_views(c, 2, "gray.png");
	test_files(c, t);
	test_embeds(c);
	hi3_cond_close(c);
	hi3_template_free(t);
	free(model);
	testdir_done(root);
	return done_testing();
}
