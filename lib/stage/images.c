/*
 * images.c -- the cond images of a conditions file through their encoders
 * into a forward batch's input rows (images.h).
 *
 * Upstream (hunyuan.py at 1201fe8): the cond VAE tokens get
 * patch_embed(z, time_embed(0)) of each image's latent z
 * (instantiate_vae_image_tokens, _encode_cond_image), the cond ViT tokens
 * aligner(ViT(image)) (instantiate_continuous_tokens, P rows per image, pad
 * slots included), and each image's <timestep> timestep_emb(0); every
 * scatter puts the k-th source row at the k-th true column of the row's
 * mask, so the k-th image of a row feeds the row's k-th runs. The slots are
 * disjoint: the order of the scatters does not matter.
 *
 * Shape letters: n images, P ViT slots, D features per slot, H the model's
 * hidden size (= the aligner's width), Z latent channels, h x w an image's
 * latent grid, N = h w its VAE tokens, f the VAE's spatial factor.
 */
#include <string.h>
#include "cond/image-internal.h"
#include "format/conditions.h"
#include "model/heads.h"
#include "model/model.h"
#include "stage/diffusion.h"
#include "stage/images.h"

struct hi3i_image_enc {
	hi3_model *m;
	hi3_vit *vit;
	hi3_vae *vae;                 /* the encoder */
	struct hi3i_heads *hd;
	int H, Z, f, sample;
	float *temb0;                 /* (1, H) backend: time_embed(0) */
	float *ts0;                   /* (H) host: timestep_emb(0) */
};

void hi3i_image_embeds_release(struct hi3i_image_embeds *e)
{
	free(e->at);
	free(e->rows);
	memset(e, 0, sizeof(*e));
}

void hi3i_image_enc_close(struct hi3i_image_enc *enc)
{
	if (!enc)
		return;
	if (enc->temb0)
		enc->m->be->ops->free(enc->m->be, enc->temb0);
	free(enc->ts0);
	hi3i_heads_close(enc->hd);
	hi3_vae_close(enc->vae);
	hi3_vit_close(enc->vit);
	free(enc);
}

static int check_vit(const hi3_vit *v, hi3_model *m, const hi3_cond *c, const char *name, hi3_error *err)
{
	const hi3_vit_config *vc = hi3_vit_get_config(v);

	if (hi3_vit_get_aligner_config(v)->n_embed != hi3_model_config(m)->hidden_size)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s/config.json: vit_aligner.n_embed %d differs from hidden_size %d",
		                     hi3_model_dir(m), hi3_vit_get_aligner_config(v)->n_embed,
		                     hi3_model_config(m)->hidden_size);
	if (vc->num_channels * vc->patch_size * vc->patch_size != c->VD)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: cond images of %d features a patch, but the model's ViT takes "
		                     "%d x %d x %d", name, c->VD, vc->num_channels, vc->patch_size, vc->patch_size);
	return 0;
}

/* The sizes of the VAE views against the model's VAE: each a multiple of f. */
static int check_vae(const struct hi3i_image_enc *enc, const hi3_cond *c, const char *name, hi3_error *err)
{
	for (int k = 0; k < c->NI; k++)
		if (c->vae_shape[2 * k] % enc->f || c->vae_shape[2 * k + 1] % enc->f)
			return hi3_error_set(err, HI3_ERR_INPUT, "%s: cond image %d's VAE view is %d x %d, not a multiple of the "
			                     "model's VAE factor %d (%s/config.json): conditions made for another model",
			                     name, k, c->vae_shape[2 * k], c->vae_shape[2 * k + 1], enc->f,
			                     hi3_model_dir(enc->m));
	return 0;
}

/* Stored encoder outputs that fit the model: the aligner's width, each
 * latent's channels and grid. */
static int check_stored(const struct hi3i_image_enc *enc, const hi3_cond *c, const char *name, hi3_error *err)
{
	if (!c->vit_embeds)
		return 0;
	if (c->VE != enc->H)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor 'vit_embeds': %d wide, but the model's hidden size is "
		                     "%d (%s/config.json)", name, c->VE, enc->H, hi3_model_dir(enc->m));
	for (int k = 0; k < c->NI; k++) {
		const int32_t *z = c->latent_shape + 3 * k;
		if (z[0] != enc->Z || (int64_t)z[1] * enc->f != c->vae_shape[2 * k] ||
		    (int64_t)z[2] * enc->f != c->vae_shape[2 * k + 1])
			return hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor 'latent_shape': image %d's latent (%d, %d, %d) is "
			                     "not the model's (%d channels, factor %d) of a %d x %d view", name, k, z[0], z[1],
			                     z[2], enc->Z, enc->f, c->vae_shape[2 * k], c->vae_shape[2 * k + 1]);
	}
	return 0;
}

int hi3i_image_enc_open(struct hi3i_image_enc **out, hi3_model *m, const hi3_cond *c, const char *cond_path,
                        hi3_error *err)
{
	const char *name = cond_path ? cond_path : "the conditions";
	const char *post = hi3_cond_meta(c, "vae_posterior");
	hi3_backend *be = m->be;
	struct hi3i_image_enc *enc;
	float zero = 0.0f;

	*out = NULL;
	if (!c->NI)
		return 0;
	if (post && strcmp(post, "mean") && strcmp(post, "sample"))
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: metadata vae_posterior '%s': expected 'mean' or 'sample'", name,
		                     post);
	if (!(enc = hi3i_calloc(1, sizeof(*enc), err)))
		return -1;
	enc->m = m;
	enc->H = hi3_model_config(m)->hidden_size;
	enc->sample = post && !strcmp(post, "sample");
	/* the encoders whose outputs the conditions do not hold */
	if (!c->vit_embeds && (hi3_vit_open(&enc->vit, m, err) || check_vit(enc->vit, m, c, name, err)))
		goto fail;
	if (!c->vit_embeds && hi3_vae_open(&enc->vae, m, HI3_VAE_ENCODER, err))
		goto fail;
	if (hi3i_heads_open(&enc->hd, be, m->ck, hi3_model_config(m), hi3_model_dir(m), err))
		goto fail;
	enc->Z = hi3_model_config(m)->vae.latent_channels;
	enc->f = hi3_model_config(m)->vae.ffactor_spatial;
	if (check_vae(enc, c, name, err) || check_stored(enc, c, name, err))
		goto fail;
	if (!(enc->ts0 = hi3i_malloc(sizeof(float) * (size_t)enc->H, err)))
		goto fail;
	if (!(enc->temb0 = be->ops->alloc(be, sizeof(float) * (size_t)enc->H))) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "out of %s memory", be->name);
		goto fail;
	}
	/* timestep_emb(0) through the device buffer, then time_embed(0) kept */
	if (hi3i_heads_temb(enc->hd, HI3I_TEMB_TIMESTEP, &zero, 1, enc->temb0, err))
		goto fail;
	if (be->ops->download(be, enc->ts0, enc->temb0, sizeof(float) * (size_t)enc->H)) {
		if (!hi3i_backend_failed(be, err))
			hi3_error_set(err, HI3_ERR_RUNTIME, "the %s backend could not copy an embedding", be->name);
		goto fail;
	}
	if (hi3i_heads_temb(enc->hd, HI3I_TEMB_PATCH, &zero, 1, enc->temb0, err))
		goto fail;
	*out = enc;
	return 0;
fail:
	hi3_error_prefix(err, "%s has %d cond images", name, c->NI);
	hi3i_image_enc_close(enc);
	return -1;
}

/* Where cond image k's parts lie in the conditions, and what it makes. */
struct image_at {
	int row, place;               /* its row, and its index among the row's images */
	int h, w;                     /* its latent grid: the VAE view over the factor */
	int64_t vae_off;              /* its view's first byte in vae_pixels */
	int64_t lat_off;              /* its latent's first value among all the latents (Z h w each) */
};

/* (NI) the images' places, in one pass; NULL when out of memory. */
static struct image_at *image_layout(const struct hi3i_image_enc *enc, const hi3_cond *c, hi3_error *err)
{
	struct image_at *a = hi3i_malloc(sizeof(*a) * (size_t)c->NI, err);

	for (int k = 0; a && k < c->NI; k++) {
		a[k].row = (int)c->image_row[k];
		a[k].place = k && c->image_row[k - 1] == c->image_row[k] ? a[k - 1].place + 1 : 0;
		a[k].h = c->vae_shape[2 * k] / enc->f;
		a[k].w = c->vae_shape[2 * k + 1] / enc->f;
		a[k].vae_off = k ? a[k - 1].vae_off + (int64_t)c->vae_shape[2 * k - 2] * c->vae_shape[2 * k - 1] * 3 : 0;
		a[k].lat_off = k ? a[k - 1].lat_off + (int64_t)enc->Z * a[k - 1].h * a[k - 1].w : 0;
	}
	return a;
}

/* The [start, stop) of run k of mask m (L columns); -1 when it has fewer. */
static int64_t run_of(const uint8_t *m, int L, int k, int64_t *stop)
{
	for (int t = 0, run = 0; t < L; t++)
		if (m[t] && (t == 0 || !m[t - 1])) {
			if (run++ == k) {
				int u = t;
				while (u < L && m[u])
					u++;
				*stop = u;
				return t;
			}
		}
	return -1;
}

/* lat (Z, h, w) = the latent of cond image k at a: the VAE encoder's
 * posterior mean, or a sample from its row's seed, shifted and scaled. */
static int image_latent(struct hi3i_image_enc *enc, const hi3_cond *c, int k, const struct image_at *a, float *lat,
                        hi3_error *err)
{
	const int Hp = c->vae_shape[2 * k], Wp = c->vae_shape[2 * k + 1], Z = enc->Z;
	const size_t HW = (size_t)Hp * Wp, N = (size_t)a->h * a->w;
	const uint8_t *u = c->vae_pixels + a->vae_off;   /* (Hp, Wp, 3) */
	float *x = NULL, *mean = NULL, *lv = NULL, *noise = NULL;
	int rc = -1;

	if (!(x = hi3i_malloc(sizeof(float) * 3 * HW, err)) || !(mean = hi3i_malloc(sizeof(float) * Z * N, err)) ||
	    !(lv = hi3i_malloc(sizeof(float) * Z * N, err)) ||
	    (enc->sample && !(noise = hi3i_malloc(sizeof(float) * Z * N, err))))
		goto out;
	/* (3, Hp, Wp) planar in [-1, 1] as ToTensor then Normalize(0.5, 0.5) */
	for (size_t p = 0; p < HW; p++)
		for (int ch = 0; ch < 3; ch++)
			x[(size_t)ch * HW + p] = hi3i_vae_value(u[p * 3 + ch]);
	if (hi3_vae_encode(enc->vae, x, 1, Hp, Wp, mean, lv, err))
		goto out;
	if (noise)
		hi3i_normals((uint64_t)c->seeds[a->row], HI3I_STREAM_VAE(a->place), (size_t)Z * N, noise);
	hi3_vae_latent(enc->vae, mean, lv, noise, (size_t)Z * N, lat);
	rc = 0;
out:
	free(x);
	free(mean);
	free(lv);
	free(noise);
	return rc;
}

/* rows (N, H) host = patch_embed(lat, time_embed(0)), lat (Z, h, w). */
static int vae_rows(struct hi3i_image_enc *enc, const float *lat, int h, int w, float *rows, hi3_error *err)
{
	hi3_backend *be = enc->m->be;
	const int Z = enc->Z;
	const size_t N = (size_t)h * w;
	float *x = NULL, *d_x = NULL, *d_out = NULL;
	int rc = -1;

	if (!(x = hi3i_malloc(sizeof(float) * N * Z, err)))
		return -1;
	/* channels-last (h, w, Z) */
	for (size_t p = 0; p < N; p++)
		for (int ch = 0; ch < Z; ch++)
			x[p * Z + ch] = lat[(size_t)ch * N + p];
	if (!(d_x = be->ops->alloc(be, sizeof(float) * N * Z)) ||
	    !(d_out = be->ops->alloc(be, sizeof(float) * N * (size_t)enc->H))) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "out of %s memory for a %d x %d latent", be->name, h, w);
		goto out;
	}
	if (be->ops->upload(be, d_x, x, sizeof(float) * N * Z))
		goto be_failed;
	if (hi3i_heads_patch_embed(enc->hd, d_x, 1, h, w, enc->temb0, d_out, err))
		goto out;
	if (be->ops->download(be, rows, d_out, sizeof(float) * N * (size_t)enc->H))
		goto be_failed;
	rc = 0;
	goto out;
be_failed:
	if (!hi3i_backend_failed(be, err))
		hi3_error_set(err, HI3_ERR_RUNTIME, "the %s backend could not copy a latent", be->name);
out:
	if (d_x)
		be->ops->free(be, d_x);
	if (d_out)
		be->ops->free(be, d_out);
	free(x);
	return rc;
}

/* aligner(ViT(image k)) (P, H) host into rows. */
static int vit_rows(struct hi3i_image_enc *enc, const hi3_cond *c, int k, float *rows, hi3_error *err)
{
	const int P = c->VP, D = c->VD, real = c->vit_grid[2 * k] * c->vit_grid[2 * k + 1];
	const uint8_t *u = c->vit_pixels + (size_t)k * P * D;
	float *pv;
	int32_t *mask;
	int rc = -1;

	pv = hi3i_malloc(sizeof(float) * (size_t)P * D, err);
	mask = hi3i_calloc((size_t)P, sizeof(int32_t), err);
	if (pv && mask) {
		/* real patches normalised; pad rows 0, as the processor pads */
		for (size_t i = 0; i < (size_t)P * D; i++)
			pv[i] = i < (size_t)real * D ? hi3i_vit_value(u[i]) : 0.0f;
		for (int s = 0; s < real; s++)
			mask[s] = 1;
		rc = hi3_vit_encode(enc->vit, pv, mask, c->vit_grid + 2 * k, 1, P, NULL, rows, err);
	}
	free(pv);
	free(mask);
	return rc;
}

/* ------------------------------------------------------------ the memo */

/* An image's rows and what they depend on: the model keeps the latest
 * (m->image_memo) up to HI3I_IMAGE_MEMO_BYTES, so that the cases of a
 * parity run, or a replay after its prefill in one process, encode an
 * image once; an uncond row's images are its cond row's. */
#define HI3I_IMAGE_MEMO_BYTES ((size_t)1 << 30)

struct memo {
	struct memo *next;
	unsigned char *key;           /* (key_len) */
	size_t key_len;
	float *rows;                  /* (n, H) */
	size_t n;
};

struct hi3i_image_memo {
	struct memo *head;            /* newest first */
	size_t bytes;
};

static void memo_free(void *p)
{
	struct hi3i_image_memo *im = p;

	while (im && im->head) {
		struct memo *e = im->head;
		im->head = e->next;
		free(e->key);
		free(e->rows);
		free(e);
	}
	free(im);
}

/* The key of image k at a: (shapes, the sampling, place and seed when
 * sampled, whether the conditions hold the encoder outputs, then the ViT
 * and VAE pixels); malloc'd. Stored outputs come with the pixels they were
 * made of (the conditions' model fingerprint). */
static unsigned char *memo_key(const struct hi3i_image_enc *enc, const hi3_cond *c, int k, const struct image_at *a,
                               size_t *len)
{
	const size_t pd = (size_t)c->VP * c->VD, nv = (size_t)c->vae_shape[2 * k] * c->vae_shape[2 * k + 1] * 3;
	const int64_t head[9] = {c->vae_shape[2 * k], c->vae_shape[2 * k + 1], c->vit_grid[2 * k], c->vit_grid[2 * k + 1],
	                         c->VP, enc->sample, enc->sample ? a->place : 0, enc->sample ? c->seeds[a->row] : 0,
	                         c->vit_embeds != NULL};
	unsigned char *key;

	*len = sizeof(head) + pd + nv;
	if (!(key = malloc(*len)))
		return NULL;
	memcpy(key, head, sizeof(head));
	memcpy(key + sizeof(head), c->vit_pixels + (size_t)k * pd, pd);
	memcpy(key + sizeof(head) + pd, c->vae_pixels + a->vae_off, nv);
	return key;
}

/* Keep rows (n, H) under key (taken); a failure only loses the memo. */
static void memo_put(struct hi3i_image_enc *enc, unsigned char *key, size_t len, const float *rows, size_t n)
{
	hi3_model *m = enc->m;
	struct hi3i_image_memo *im = m->image_memo;
	struct memo *e = NULL;
	const size_t bytes = len + sizeof(float) * n * (size_t)enc->H;

	if (bytes > HI3I_IMAGE_MEMO_BYTES || (!im && !(im = calloc(1, sizeof(*im)))) ||
	    !(e = calloc(1, sizeof(*e))) || !(e->rows = malloc(sizeof(float) * n * (size_t)enc->H))) {
		if (e)
			free(e);
		free(key);
		if (im && !m->image_memo)
			free(im);
		return;
	}
	m->image_memo = im;
	m->image_memo_free = memo_free;
	memcpy(e->rows, rows, sizeof(float) * n * (size_t)enc->H);
	e->key = key;
	e->key_len = len;
	e->n = n;
	e->next = im->head;
	im->head = e;
	im->bytes += bytes;
	/* the oldest go first */
	while (im->bytes > HI3I_IMAGE_MEMO_BYTES) {
		struct memo **pp = &im->head, *last;
		while ((*pp)->next)
			pp = &(*pp)->next;
		last = *pp;
		*pp = NULL;
		im->bytes -= last->key_len + sizeof(float) * last->n * (size_t)enc->H;
		free(last->key);
		free(last->rows);
		free(last);
	}
}

static const struct memo *memo_get(const struct hi3i_image_enc *enc, const unsigned char *key, size_t len)
{
	const struct hi3i_image_memo *im = enc->m->image_memo;

	for (const struct memo *e = im ? im->head : NULL; e; e = e->next)
		if (e->key_len == len && !memcmp(e->key, key, len))
			return e;
	return NULL;
}

/* rows (N + 1 + P, H) host, N = h w: image k's VAE rows, timestep_emb(0),
 * its ViT rows; from the memo when the model has them. */
static int image_rows(struct hi3i_image_enc *enc, const hi3_cond *c, int k, const struct image_at *a, float *rows,
                      hi3_error *err)
{
	const size_t N = (size_t)a->h * a->w, n = N + 1 + (size_t)c->VP, H = (size_t)enc->H;
	size_t len = 0;
	unsigned char *key = memo_key(enc, c, k, a, &len);
	const struct memo *e = key ? memo_get(enc, key, len) : NULL;

	if (e && e->n == n) {
		memcpy(rows, e->rows, sizeof(float) * n * H);
		free(key);
		return 0;
	}
	if (c->vit_embeds) {
		/* the outputs tokenize-concat --encode stored (check_stored: the
		 * latents are the model's, Z x h x w each) */
		if (vae_rows(enc, c->vae_latents + a->lat_off, a->h, a->w, rows, err)) {
			free(key);
			return -1;
		}
		memcpy(rows + (N + 1) * H, c->vit_embeds + (size_t)k * c->VP * c->VE, sizeof(float) * (size_t)c->VP * H);
	} else {
		float *lat = hi3i_malloc(sizeof(float) * (size_t)enc->Z * N, err);
		if (!lat || image_latent(enc, c, k, a, lat, err) || vae_rows(enc, lat, a->h, a->w, rows, err) ||
		    vit_rows(enc, c, k, rows + (N + 1) * H, err)) {
			free(lat);
			free(key);
			return -1;
		}
		free(lat);
	}
	memcpy(rows + N * H, enc->ts0, sizeof(float) * H);
	if (key)
		memo_put(enc, key, len, rows, n);
	return 0;
}

static int timestep_at(const hi3_cond *c, int row, int64_t col)
{
	for (int i = 0; c->timestep_index && i < c->K; i++)
		if (c->timestep_index[(size_t)row * c->K + i] == col)
			return 1;
	return 0;
}

int hi3i_image_embeds(struct hi3i_image_enc *enc, const hi3_cond *c, const int *rows, int nb,
                      struct hi3i_image_embeds *e, hi3_error *err)
{
	const char *name = c->st ? hi3_st_path(c->st) : "the conditions";
	const int P = c->VP, H = enc ? enc->H : 0;
	struct image_at *at = NULL;
	size_t n = 0;
	int rc = -1;

	memset(e, 0, sizeof(*e));
	if (!c->NI || !enc)
		return 0;
	/* each image's place, and the rows it takes */
	if (!(at = image_layout(enc, c, err)))
		goto out;
	for (int k = 0, j = 0; k < c->NI; k++) {
		for (j = 0; j < nb && rows[j] != at[k].row; j++)
			;
		if (j < nb)
			n += (size_t)at[k].h * at[k].w + 1 + (size_t)P;
	}
	if (!n) {
		rc = 0;
		goto out;
	}
	if (!(e->at = hi3i_malloc(sizeof(int32_t) * 2 * n, err)) || !(e->rows = hi3i_malloc(sizeof(float) * n * H, err)))
		goto out;
	for (int j = 0; j < nb; j++) {
		const int r = rows[j];
		const uint8_t *vae_m = c->cond_vae_mask ? c->cond_vae_mask + (size_t)r * c->L : NULL;
		const uint8_t *vit_m = c->cond_vit_mask ? c->cond_vit_mask + (size_t)r * c->L : NULL;
		for (int k = 0; k < c->NI; k++) {
			const int kr = at[k].place;
			int64_t v0, v1 = 0, t0, t1 = 0;
			size_t N;
			if (at[k].row != r)
				continue;
			N = (size_t)at[k].h * at[k].w;
			v0 = vae_m ? run_of(vae_m, c->L, kr, &v1) : -1;
			t0 = vit_m ? run_of(vit_m, c->L, kr, &t1) : -1;
			if (v0 < 0 || (size_t)(v1 - v0) != N || t0 < 0 || t1 - t0 != P) {
				hi3_error_set(err, HI3_ERR_INPUT, "%s: row %d, image %d: %s run %s (%lld columns, the image takes "
				              "%zu)", name, r, kr, v0 < 0 || (size_t)(v1 - v0) != N ? "cond_vae_mask" : "cond_vit_mask",
				              (v0 < 0 || t0 < 0) ? "missing" : "of the wrong length",
				              (long long)((size_t)(v1 - v0) != N ? v1 - v0 : t1 - t0),
				              (size_t)(v1 - v0) != N ? N : (size_t)P);
				goto out;
			}
			if (!timestep_at(c, r, v0 - 1)) {
				hi3_error_set(err, HI3_ERR_INPUT, "%s: row %d, image %d: column %lld before its VAE tokens is not "
				              "in timestep_index", name, r, kr, (long long)(v0 - 1));
				goto out;
			}
			/* the VAE rows, then the <timestep>'s, then the ViT rows */
			if (image_rows(enc, c, k, &at[k], e->rows + (size_t)e->n * H, err))
				goto out;
			for (size_t i = 0; i < N; i++, e->n++) {
				e->at[2 * e->n] = j;
				e->at[2 * e->n + 1] = (int32_t)(v0 + (int64_t)i);
			}
			e->at[2 * e->n] = j;
			e->at[2 * e->n + 1] = (int32_t)(v0 - 1);
			e->n++;
			for (int s = 0; s < P; s++, e->n++) {
				e->at[2 * e->n] = j;
				e->at[2 * e->n + 1] = (int32_t)(t0 + s);
			}
		}
	}
	HI3_ASSERT((size_t)e->n == n);
	rc = 0;
out:
	if (rc)
		hi3i_image_embeds_release(e);
	free(at);
	return rc;
}

int hi3_cond_encode(hi3_cond **out, const hi3_cond *c, hi3_model *m, hi3_error *err)
{
	const char *name = HI3I_COND(c)->name;
	struct hi3i_image_enc *enc = NULL;
	hi3_cond *cp = NULL;
	struct hi3i_cond *ci;
	int *rows = NULL, rc = -1;
	struct image_at *at = NULL;
	float *emb = NULL, *lat = NULL;
	int32_t *ls = NULL;
	int64_t NZ = 0;

	*out = NULL;
	if (!(rows = hi3i_malloc(sizeof(int) * (size_t)c->B, err)))
		return -1;
	for (int r = 0; r < c->B; r++)
		rows[r] = r;
	if (hi3_cond_select(&cp, c, rows, c->B, c->L, err))
		goto out;
	if (!c->NI || c->vit_embeds) {
		rc = 0;
		goto out;
	}
	if (hi3_cond_check_model(c, m, err) || hi3i_image_enc_open(&enc, m, c, name, err) ||
	    !(at = image_layout(enc, c, err)))
		goto out;
	NZ = at[c->NI - 1].lat_off + (int64_t)enc->Z * at[c->NI - 1].h * at[c->NI - 1].w;
	if (!(emb = hi3i_malloc(sizeof(float) * (size_t)c->NI * c->VP * enc->H, err)) ||
	    !(lat = hi3i_malloc(sizeof(float) * (size_t)NZ, err)) ||
	    !(ls = hi3i_malloc(sizeof(int32_t) * 3 * (size_t)c->NI, err)))
		goto out;
	for (int k = 0; k < c->NI; k++) {
		ls[3 * k] = enc->Z;
		ls[3 * k + 1] = at[k].h;
		ls[3 * k + 2] = at[k].w;
		if (vit_rows(enc, c, k, emb + (size_t)k * c->VP * enc->H, err) ||
		    image_latent(enc, c, k, &at[k], lat + at[k].lat_off, err))
			goto out;
	}
	ci = HI3I_COND(cp);
	ci->buf[T_VIT_EMB] = emb;
	ci->buf[T_LAT_SHAPE] = ls;
	ci->buf[T_VAE_LAT] = lat;
	cp->VE = enc->H;
	cp->vit_embeds = emb;
	cp->latent_shape = ls;
	cp->vae_latents = lat;
	cp->NZ = NZ;
	emb = lat = NULL;
	ls = NULL;
	rc = 0;
out:
	if (rc) {
		hi3_cond_close(cp);
		cp = NULL;
	}
	*out = cp;
	hi3i_image_enc_close(enc);
	free(rows);
	free(at);
	free(emb);
	free(lat);
	free(ls);
	return rc;
}
