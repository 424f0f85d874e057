/*
 * diffusion.c -- the diffusion stage (hi3-batching(7), DIFFUSION): the gen_image
 * rows of a conditions file denoised by flow matching, into a trajectory.
 *
 * The denoiser gives each row's velocity at latents x and timestep t:
 *   the input of the sequence is wte[ids] with, scattered in, the image
 *   rows patch_embed(x, time_embed(t)) (raster order) and the special rows
 *   timestep_emb(t) [guidance_emb(g)] [timestep_r_emb(r)];
 *   the decoder runs (no ln_f) and final_layer(hidden at the image tokens,
 *   time_embed_2(t)) is the velocity.
 * The first step runs the whole sequence into a static cache of exactly L
 * slots per row (K/V of column t at slot t, rule 1); a later step feeds
 * only the special tokens and the image tokens, at their own columns, with
 * the mask rows of those columns (a token admits slots up to itself, and
 * an image token its whole image block), against the cached prefix. Without
 * KV reuse every step runs the whole sequence.
 *
 * The capture: x_T (per request, from its seed through the counter-based
 * generator, or a --noise file), then per step the velocity, classifier-free
 * guidance (v = v_u + g (v_c - v_u) when g > 1 and the rows have CFG; the
 * cond rows alone otherwise), and an Euler or SDE step in fp32 (flow.c),
 * the result stored in the latent dtype and read back as the next input.
 *
 * Shapes: B requests, R rows (cond rows then uncond rows), L columns, Z
 * latent channels, h x w latent grid, N = h w image tokens, H hidden, ns
 * special tokens, T steps, K SDE steps.
 */
#include <math.h>
#include <string.h>
#include "format/conditions.h"
#include "format/provenance.h"
#include "format/trace.h"
#include "model/heads.h"
#include "model/model.h"
#include "stage/diffusion.h"
#include "stage/images.h"

struct hi3i_denoiser {
	hi3_model *m;
	const hi3_cond *c;
	const char *name;             /* the conditions, for messages */
	struct hi3i_heads *hd;
	struct hi3i_dn_opts o;
	int B, R, cfg, Z, h, w, N, H, L, ns, guidance, timestep_r;
	int64_t *ts, *img;            /* (R) the <timestep> column, the first <img> column */
	int64_t ts0;                  /* row 0's <timestep>: the flash-attention branch's bound */
	hi3_kvcache *kv;              /* (R, n_kv, L, d) when kv_reuse */
	/* the cond images' rows of every row (it2i), for the whole-sequence passes */
	struct hi3i_image_embeds cond;
	int *cond_upto;               /* (R + 1) cond.n of the rows before r */
	/* backend */
	float *x;                     /* (R, N, Z) latents channels-last */
	float *rows;                  /* (ns R + R N, H): special rows by kind (R each), then image rows */
	float *te;                    /* (R, H) a timestep embedder's output */
	float *hid;                   /* (R N, H) the image tokens' hidden states */
	float *vel;                   /* (R, N, Z) */
	/* host */
	float *hx;                    /* (R N Z) */
	float *tv;                    /* (R) */
	int64_t *ids;                 /* (R, L) */
	int32_t *rope, *hi, *at, *hat, *blocks;  /* (R L 2), (R L), (R (ns + N)), (R N), (R S 2) */
	int64_t *slot;                /* (R L) */
	uint8_t *zero;                /* (R L) rope-pad */
	/* tracing (hi3i_denoiser_trace): the calls record into trace */
	hi3_trace *trace;             /* NULL: none */
	int64_t *tpos;                /* (R L) each token's column in its row, -1 on pads */
};

#define DN_BAD(dn, ...) hi3_error_set(err, HI3_ERR_INPUT, __VA_ARGS__)

static int check_rows(struct hi3i_denoiser *dn, hi3_error *err)
{
	const hi3_cond *c = dn->c;
	const char *name = dn->name;

	if (!c->gen_image_mask || !c->timestep_index || !c->gen_image_hw)
		return DN_BAD(dn, "%s: no %s: conditions of gen_image rows made by this hi3's tokenize-concat hold it",
		              name, !c->gen_image_mask ? "gen_image_mask" : !c->timestep_index ? "timestep_index"
		              : "gen_image_hw (the image's token grid)");
	for (int r = 0; r < c->B; r++) {
		const uint8_t *mk = c->gen_image_mask + (size_t)r * c->L;
		int32_t h = c->gen_image_hw[2 * r], w = c->gen_image_hw[2 * r + 1];
		int64_t first = -1, n = 0, ts = -1;
		int blk = 0;

		for (int t = 0; t < c->L; t++)
			if (mk[t]) {
				if (first < 0)
					first = t;
				else if (!mk[t - 1])
					return DN_BAD(dn, "%s: row %d has more than one generated image (hi3 generates one per "
					              "row)", name, r);
				n++;
			}
		if (n == 0 || h < 1 || w < 1)
			return DN_BAD(dn, "%s: row %d has no generated image tokens", name, r);
		if (r == 0) {
			dn->h = h;
			dn->w = w;
		} else if (h != dn->h || w != dn->w) {
			return DN_BAD(dn, "%s: row %d's image is %d x %d tokens, row 0's %d x %d: a trajectory holds one "
			              "size (make one conditions file per size)", name, r, h, w, dn->h, dn->w);
		}
		for (int k = 0; k < c->K; k++)
			if (c->timestep_index[(size_t)r * c->K + k] >= 0)
				ts = c->timestep_index[(size_t)r * c->K + k];
		if (ts < 0 || ts + dn->ns != first)
			return DN_BAD(dn, "%s: row %d: the image starts at column %lld, expected right after <timestep>%s "
			              "(column %lld of timestep_index)%s", name, r, (long long)first,
			              dn->ns == 3 ? " <guidance> <timestep_r>" : dn->ns == 2 ? " and one token" : "",
			              (long long)ts, dn->ns > 1 ? ": the conditions were made for another variant" : "");
		for (int s = 0; s < c->S; s++) {
			const int32_t *b = c->image_blocks + ((size_t)r * c->S + s) * 2;
			blk |= b[0] == first && b[1] == first + n;
		}
		if (!blk)
			return DN_BAD(dn, "%s: row %d: no full-attention block over its image tokens [%lld, %lld)", name, r,
			              (long long)first, (long long)(first + n));
		dn->ts[r] = ts;
		dn->img[r] = first;
	}
	dn->ts0 = dn->ts[0];
	return 0;
}

void hi3i_denoiser_close(struct hi3i_denoiser *dn)
{
	hi3_backend *be;
	float *bufs[5];

	if (!dn)
		return;
	be = dn->m->be;
	bufs[0] = dn->x, bufs[1] = dn->rows, bufs[2] = dn->te, bufs[3] = dn->hid, bufs[4] = dn->vel;
	for (int i = 0; i < 5; i++)
		if (bufs[i])
			be->ops->free(be, bufs[i]);
	if (dn->kv) {
		hi3_model_drop_cache(dn->m, dn->kv);
		hi3_kvcache_free(dn->kv);
	}
	hi3i_heads_close(dn->hd);
	free(dn->ts), free(dn->img), free(dn->hx), free(dn->tv), free(dn->ids), free(dn->rope), free(dn->hi);
	free(dn->at), free(dn->hat), free(dn->blocks), free(dn->slot), free(dn->zero), free(dn->tpos);
	hi3i_image_embeds_release(&dn->cond);
	free(dn->cond_upto);
	free(dn);
}

/* The rows of the conditions' cond images (it2i), once: the same at every
 * whole-sequence pass (the uncond rows keep the images, with the same
 * seeds, so their rows equal the cond rows'). */
static int cond_images(struct hi3i_denoiser *dn, hi3_error *err)
{
	struct hi3i_image_enc *enc = NULL;
	int *rows = NULL, rc = -1;

	if (!(rows = hi3i_malloc(sizeof(int) * (size_t)dn->R, err)) ||
	    !(dn->cond_upto = hi3i_calloc((size_t)dn->R + 1, sizeof(int), err)))
		goto out;
	for (int r = 0; r < dn->R; r++)
		rows[r] = r;
	if (hi3i_image_enc_open(&enc, dn->m, dn->c, dn->name, err) ||
	    hi3i_image_embeds(enc, dn->c, rows, dn->R, &dn->cond, err))
		goto out;
	for (int i = 0; i < dn->cond.n; i++)
		dn->cond_upto[dn->cond.at[2 * i] + 1] = i + 1;
	for (int r = 1; r <= dn->R; r++)
		dn->cond_upto[r] = HI3_MAX(dn->cond_upto[r], dn->cond_upto[r - 1]);
	rc = 0;
out:
	hi3i_image_enc_close(enc);
	free(rows);
	return rc;
}

int hi3i_denoiser_open(struct hi3i_denoiser **out, hi3_model *m, const hi3_cond *c, const struct hi3i_dn_opts *o,
                       hi3_error *err)
{
	const hi3_config *cfg = hi3_model_config(m);
	struct hi3i_denoiser *dn;
	hi3_backend *be = m->be;
	const char *name = c->st ? hi3_st_path(c->st) : "the conditions";
	size_t RL;

	*out = NULL;
	if (strcmp(c->mode, "gen_image"))
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: conditions in mode '%s': diffusion runs gen_image rows "
		                     "(tokenize-concat requests with \"mode\": \"gen_image\")", name, c->mode);
	if (hi3_cond_check_model(c, m, err) || hi3i_cond_require_pixels(c, err))
		return -1;
	if (hi3_cond_cfg_factor(c) != (cfg->cfg_distilled ? 1 : 2))
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: cfg_factor %d, but the model %s %s", name,
		                     hi3_cond_cfg_factor(c), hi3_model_dir(m), cfg->cfg_distilled ?
		                     "is cfg-distilled (one row per request, a <guidance> token)" :
		                     "takes a cond and an uncond row per request");
	if (c->L > cfg->max_position_embeddings)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: L %d is more than the model's max_position_embeddings %d",
		                     name, c->L, cfg->max_position_embeddings);
	if (!(dn = hi3i_calloc(1, sizeof(*dn), err)))
		return -1;
	dn->m = m;
	dn->c = c;
	dn->name = name;
	dn->o = *o;
	dn->R = c->B;
	dn->cfg = hi3_cond_cfg_factor(c);
	dn->B = dn->R / dn->cfg;
	dn->L = c->L;
	dn->H = cfg->hidden_size;
	dn->Z = cfg->vae.latent_channels;
	dn->guidance = cfg->cfg_distilled;
	dn->timestep_r = cfg->use_meanflow;
	dn->ns = 1 + dn->guidance + dn->timestep_r;
	if (!(dn->ts = hi3i_calloc((size_t)dn->R, sizeof(int64_t), err)) ||
	    !(dn->img = hi3i_calloc((size_t)dn->R, sizeof(int64_t), err)) || check_rows(dn, err) ||
	    hi3i_heads_open(&dn->hd, be, m->ck, cfg, hi3_model_dir(m), err))
		goto fail;
	dn->N = dn->h * dn->w;
	RL = (size_t)dn->R * dn->L;
	if (!(dn->hx = hi3i_malloc(sizeof(float) * (size_t)dn->R * dn->N * dn->Z, err)) ||
	    !(dn->tv = hi3i_malloc(sizeof(float) * (size_t)dn->R, err)) ||
	    !(dn->ids = hi3i_malloc(sizeof(int64_t) * RL, err)) || !(dn->rope = hi3i_malloc(sizeof(int32_t) * 2 * RL, err)) ||
	    !(dn->hi = hi3i_malloc(sizeof(int32_t) * RL, err)) || !(dn->slot = hi3i_malloc(sizeof(int64_t) * RL, err)) ||
	    !(dn->zero = hi3i_calloc(RL, 1, err)) ||
	    !(dn->at = hi3i_malloc(sizeof(int32_t) * (size_t)dn->R * (dn->ns + dn->N), err)) ||
	    !(dn->hat = hi3i_malloc(sizeof(int32_t) * (size_t)dn->R * dn->N, err)) ||
	    !(dn->blocks = hi3i_malloc(sizeof(int32_t) * 2 * (size_t)dn->R * c->S, err)))
		goto fail;
	memcpy(dn->blocks, c->image_blocks, sizeof(int32_t) * 2 * (size_t)dn->R * c->S);
	if (!(dn->x = be->ops->alloc(be, sizeof(float) * (size_t)dn->R * dn->N * dn->Z)) ||
	    !(dn->rows = be->ops->alloc(be, sizeof(float) * (size_t)dn->R * (dn->ns + dn->N) * dn->H)) ||
	    !(dn->te = be->ops->alloc(be, sizeof(float) * (size_t)dn->R * dn->H)) ||
	    !(dn->hid = be->ops->alloc(be, sizeof(float) * (size_t)dn->R * dn->N * dn->H)) ||
	    !(dn->vel = be->ops->alloc(be, sizeof(float) * (size_t)dn->R * dn->N * dn->Z))) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "out of %s memory for %d rows of %d image tokens", be->name, dn->R,
		              dn->N);
		goto fail;
	}
	if (o->kv_reuse && !(dn->kv = hi3_kvcache_for_model(m, dn->R, dn->L, HI3_F32, err)))
		goto fail;
	if (c->NI && cond_images(dn, err))
		goto fail;
	*out = dn;
	return 0;
fail:
	hi3i_denoiser_close(dn);
	return -1;
}

int hi3i_denoiser_trace(struct hi3i_denoiser *dn, hi3_trace *t, hi3_error *err)
{
	if (t && !dn->tpos && !(dn->tpos = hi3i_malloc(sizeof(int64_t) * (size_t)dn->R * dn->L, err)))
		return -1;
	dn->trace = t;
	return 0;
}

void hi3i_denoiser_geometry(const struct hi3i_denoiser *dn, struct hi3i_dn_geometry *g)
{
	g->B = dn->B;
	g->R = dn->R;
	g->cfg = dn->cfg;
	g->Z = dn->Z;
	g->h = dn->h;
	g->w = dn->w;
	g->n_special = dn->ns;
	g->guidance = dn->guidance;
	g->timestep_r = dn->timestep_r;
}

/* Column t of row r as a token of this call: its id, RoPE, bound and slot. */
static void put_token(struct hi3i_denoiser *dn, size_t i, int r, int64_t t)
{
	const hi3_cond *c = dn->c;
	const size_t ct = (size_t)r * c->L + (size_t)t;
	const int in_image = t >= dn->img[r] && t < dn->img[r] + dn->N;

	dn->ids[i] = c->input_ids[ct];
	dn->rope[2 * i] = c->rope_pos[2 * ct];
	dn->rope[2 * i + 1] = c->rope_pos[2 * ct + 1];
	if ((dn->o.defects & HI3I_DN_ROPE_1D) && in_image)
		dn->rope[2 * i] = dn->rope[2 * i + 1] = (int32_t)t;
	/* rule 2: a token admits keys up to itself (an image token also its
	 * block); the flash-attention branch lets every token after row 0's
	 * <timestep> see all L keys */
	dn->hi[i] = (int32_t)t;
	if ((dn->o.defects & HI3I_DN_EOI) && t > dn->ts0)
		dn->hi[i] = dn->L - 1;
	/* rule 1: K/V of column t at slot position_ids[t] (t itself, pads
	 * included; 0 for pads under --pad-positions=zero) */
	dn->slot[i] = c->position_ids[ct];
	dn->zero[i] = (dn->o.defects & HI3I_DN_ROPE_ZERO) && t >= c->real_pos[r];
}

int hi3i_denoise(struct hi3i_denoiser *dn, const float *x, int rows, float t, float t_r, float gv, int full, float *v,
                 hi3_error *err)
{
	hi3_model *m = dn->m;
	hi3_backend *be = m->be;
	const int N = dn->N, Z = dn->Z, H = dn->H, ns = dn->ns, L = dn->L;
	const int T = full ? L : ns + N;
	const size_t nx = (size_t)rows * N * Z;
	float *img_rows = dn->rows + (size_t)ns * rows * H;
	hi3_batch b = {0};

	HI3_ASSERT(rows >= 1 && rows <= dn->R && (full || dn->kv));
	/* the image rows: patch_embed of each row's latent, channels-last */
	for (int r = 0; r < rows; r++) {
		const float *xr = x + (size_t)(r % dn->B) * Z * N;
		for (int p = 0; p < N; p++)
			for (int ch = 0; ch < Z; ch++)
				dn->hx[((size_t)r * N + p) * Z + ch] = xr[(size_t)ch * N + p];
	}
	if (be->ops->upload(be, dn->x, dn->hx, sizeof(float) * nx))
		goto be_failed;
	for (int r = 0; r < rows; r++)
		dn->tv[r] = t;
	if (hi3i_heads_temb(dn->hd, HI3I_TEMB_PATCH, dn->tv, rows, dn->te, err) ||
	    hi3i_heads_patch_embed(dn->hd, dn->x, rows, dn->h, dn->w, dn->te, img_rows, err) ||
	    hi3i_heads_temb(dn->hd, HI3I_TEMB_TIMESTEP, dn->tv, rows, dn->rows, err))
		return -1;
	if (dn->guidance) {
		for (int r = 0; r < rows; r++)
			dn->tv[r] = gv;
		if (hi3i_heads_temb(dn->hd, HI3I_TEMB_GUIDANCE, dn->tv, rows, dn->rows + (size_t)rows * H, err))
			return -1;
	}
	if (dn->timestep_r) {
		for (int r = 0; r < rows; r++)
			dn->tv[r] = t_r;
		if (hi3i_heads_temb(dn->hd, HI3I_TEMB_TIMESTEP_R, dn->tv, rows, dn->rows + (size_t)(ns - 1) * rows * H, err))
			return -1;
	}
	/* the tokens of this call: the whole row, or [special..., image...] */
	for (int r = 0; r < rows; r++) {
		for (int j = 0; j < T; j++) {
			int64_t col = full ? j : j < ns ? dn->ts[r] + j : dn->img[r] + (j - ns);
			put_token(dn, (size_t)r * T + j, r, col);
			if (dn->trace)
				dn->tpos[(size_t)r * T + j] = col < dn->c->real_pos[r] ? col : -1;
		}
		for (int k = 0; k < ns; k++)
			dn->at[(size_t)k * rows + r] = r * T + (int32_t)(full ? dn->ts[r] + k : k);
		for (int j = 0; j < N; j++) {
			int32_t at = r * T + (int32_t)(full ? dn->img[r] + j : ns + j);
			dn->at[(size_t)ns * rows + (size_t)r * N + j] = at;
			dn->hat[(size_t)r * N + j] = at;
		}
	}
	b.B = rows;
	b.T = T;
	b.mode = full ? HI3_ATTN_SELF : HI3_ATTN_CACHE;
	b.ids = dn->ids;
	b.rope = dn->rope;
	b.hi = dn->hi;
	b.blocks = dn->blocks;
	b.S = dn->c->S;
	b.slot = dn->kv ? dn->slot : NULL;
	b.n_embed = rows * (ns + N);
	b.embed_at = dn->at;
	b.embed_rows = dn->rows;
	b.n_hidden = rows * N;
	b.hidden_at = dn->hat;
	b.hidden = dn->hid;
	b.rope_zero = (dn->o.defects & HI3I_DN_ROPE_ZERO) ? dn->zero : NULL;
	if (full && dn->cond.n) {
		/* the cond images sit in the prefix: whole-sequence passes only */
		b.n_host_embed = dn->cond_upto[rows];
		b.host_embed_at = dn->cond.at;
		b.host_embed_rows = dn->cond.rows;
	}
	/* the stage's row r is batch row r (cond rows first); positions are columns */
	b.trace = dn->trace;
	b.trace_pos = dn->trace ? dn->tpos : NULL;
	if (hi3_forward(m, dn->kv, &b, err))
		return -1;
	/* final_layer, back to planar (rows, Z, h, w) */
	for (int r = 0; r < rows; r++)
		dn->tv[r] = t;
	if (hi3i_heads_temb(dn->hd, HI3I_TEMB_FINAL, dn->tv, rows, dn->te, err) ||
	    hi3i_heads_final(dn->hd, dn->hid, rows, dn->h, dn->w, dn->te, dn->vel, err))
		return -1;
	if (be->ops->download(be, dn->hx, dn->vel, sizeof(float) * nx))
		goto be_failed;
	for (int r = 0; r < rows; r++)
		for (int ch = 0; ch < Z; ch++)
			for (int p = 0; p < N; p++)
				v[((size_t)r * Z + ch) * N + p] = dn->hx[((size_t)r * N + p) * Z + ch];
	return 0;
be_failed:
	if (!hi3i_backend_failed(be, err))
		hi3_error_set(err, HI3_ERR_RUNTIME, "the %s backend could not copy the latents", be->name);
	return -1;
}

/* ---------------------------------------------------------------- capture */

/* The settings of a run: o's, else generation_config's. */
struct settings {
	int T;
	double g, shift;
	int *is_sde;                  /* (T) the SDE step's index into the K, or -1 */
	int64_t *sde;                 /* (K) */
	int K;
};

static int resolve(const hi3_model *m, const hi3_diffusion_opts *o, struct settings *s, hi3_error *err)
{
	const hi3_gen_defaults *gd = hi3_model_gen_defaults(m);

	memset(s, 0, sizeof(*s));
	s->T = o->steps > 0 ? o->steps : gd->diff_infer_steps;
	s->g = o->have_guidance ? o->guidance : gd->diff_guidance_scale;
	s->shift = o->have_flow_shift ? o->flow_shift : gd->flow_shift;
	if (s->T < 1 || s->T > 100000)
		return hi3_error_set(err, HI3_ERR_USAGE, "steps: %d (expected 1 to 100000)", s->T);
	if (!(s->shift > 0.0) || !isfinite(s->shift) || !isfinite(s->g))
		return hi3_error_set(err, HI3_ERR_USAGE, "flow shift %g and guidance %g must be finite, the shift "
		                     "positive", s->shift, s->g);
	if (o->sampler == HI3_SAMPLER_EULER && o->sde_steps)
		return hi3_error_set(err, HI3_ERR_USAGE, "SDE steps given with the euler sampler (use --sampler sde)");
	if (!(s->is_sde = hi3i_malloc(sizeof(int) * (size_t)s->T, err)) ||
	    !(s->sde = hi3i_malloc(sizeof(int64_t) * (size_t)s->T, err)))
		return -1;
	for (int i = 0; i < s->T; i++)
		s->is_sde[i] = -1;
	if (o->sampler != HI3_SAMPLER_SDE)
		return 0;
	for (int k = 0; k < (o->sde_steps ? o->n_sde_steps : s->T); k++) {
		int64_t i = o->sde_steps ? o->sde_steps[k] : k;
		if (i < 0 || i >= s->T || (s->K && i <= s->sde[s->K - 1]))
			return hi3_error_set(err, HI3_ERR_USAGE, "SDE step %lld: expected increasing steps in [0, %d)",
			                     (long long)i, s->T);
		s->is_sde[i] = s->K;
		s->sde[s->K++] = i;
	}
	return 0;
}

static unsigned defects_of(int ablate)
{
	switch (ablate) {
	case HI3_ABLATE_ROPE_1D: return HI3I_DN_ROPE_1D;
	case HI3_ABLATE_EOI: return HI3I_DN_EOI;
	case HI3_ABLATE_ROPE_PAD: return HI3I_DN_ROPE_ZERO;
	default: return 0;
	}
}

static const char *dtype_label(hi3_dtype dt)
{
	return dt == HI3_BF16 ? "bf16" : dt == HI3_F16 ? "f16" : "f32";
}

int hi3_diffusion_capture(hi3_model *m, const hi3_cond *c, const hi3_diffusion_opts *o, const char *traj_path,
                          hi3_diffusion_stats *st, hi3_error *err)
{
	struct hi3i_dn_opts dno = {.kv_reuse = !o->no_kv_reuse, .defects = defects_of(o->ablate)};
	struct hi3i_denoiser *dn = NULL;
	struct hi3i_dn_geometry g;
	struct settings s;
	hi3_trajectory tr = {0};
	float *sig = NULL, *tst = NULL, *x_T = NULL, *noise = NULL, *lp = NULL, *vel = NULL, *v = NULL, *vg = NULL;
	float *x = NULL, *xn = NULL, *mu = NULL;
	void *lat = NULL;
	char hash[17], *seeds = NULL;
	double t0 = hi3i_now(), t_step0 = 0.0, t_rest = 0.0;
	size_t n, es;
	int rows, rc = -1;

	memset(st, 0, sizeof(*st));
	if (o->latent_dtype != HI3_F32 && o->latent_dtype != HI3_BF16 && o->latent_dtype != HI3_F16)
		return hi3_error_set(err, HI3_ERR_USAGE, "latent dtype: expected f32, bf16 or f16");
	if (o->cfg_dtype != HI3_F32 && o->cfg_dtype != HI3_BF16 && o->cfg_dtype != HI3_F16)
		return hi3_error_set(err, HI3_ERR_USAGE, "guidance dtype: expected f32, bf16 or f16");
	if (!(o->eta >= 0.0) || !isfinite(o->eta))
		return hi3_error_set(err, HI3_ERR_USAGE, "eta %g: expected a finite number >= 0", o->eta);
	if (resolve(m, o, &s, err))
		goto out;
	{
		double te = hi3i_now();
		if (hi3i_denoiser_open(&dn, m, c, &dno, err))
			goto out;
		st->cond_images = c->NI;
		st->encode_seconds = c->NI ? hi3i_now() - te : 0.0;
	}
	hi3i_denoiser_geometry(dn, &g);
	n = (size_t)g.Z * g.h * g.w;
	es = hi3_dtype_size(o->latent_dtype);
	rows = g.cfg == 2 && s.g > 1.0 ? g.R : g.B;
	if (o->trace) {
		char v0[32], v1[32], v2[32];
		if (o->trace_step < 0 || o->trace_step >= s.T) {
			hi3_error_set(err, HI3_ERR_USAGE, "--trace-step %d: expected a step in [0, %d)", o->trace_step, s.T);
			goto out;
		}
		snprintf(v0, sizeof(v0), "%d", o->trace_step);
		snprintf(v1, sizeof(v1), "%d", s.T);
		snprintf(v2, sizeof(v2), "%d", rows);
		if (hi3i_trace_stage_meta(o->trace, "diffusion-capture", c, err) ||
		    hi3_trace_set_meta(o->trace, "trace_step", v0, err) || hi3_trace_set_meta(o->trace, "steps", v1, err) ||
		    hi3_trace_set_meta(o->trace, "denoised_rows", v2, err) ||
		    hi3_trace_set_meta(o->trace, "kv_reuse", o->no_kv_reuse ? "off" : "on", err))
			goto out;
	}
	if (!(sig = hi3i_malloc(sizeof(float) * (size_t)(s.T + 1), err)) ||
	    !(tst = hi3i_malloc(sizeof(float) * (size_t)s.T, err)) || !(x_T = hi3i_malloc(sizeof(float) * g.B * n, err)) ||
	    !(noise = hi3i_calloc((size_t)g.B * HI3_MAX(s.K, 1) * n, sizeof(float), err)) ||
	    !(lp = hi3i_calloc((size_t)g.B * HI3_MAX(s.K, 1), sizeof(float), err)) ||
	    !(lat = hi3i_malloc(es * g.B * (size_t)(s.T + 1) * n, err)) ||
	    !(v = hi3i_malloc(sizeof(float) * (size_t)g.R * n, err)) || !(vg = hi3i_malloc(sizeof(float) * g.B * n, err)) ||
	    !(x = hi3i_malloc(sizeof(float) * g.B * n, err)) || !(xn = hi3i_malloc(sizeof(float) * n, err)) ||
	    !(mu = hi3i_malloc(sizeof(float) * n, err)) ||
	    (o->capture_velocity && !(vel = hi3i_calloc((size_t)s.T * g.R * n, sizeof(float), err))))
		goto out;
	hi3i_flow_sigmas(s.T, s.shift, sig);
	for (int i = 0; i < s.T; i++)
		tst[i] = sig[i] * 1000.0f;
	/* the noise: per request from its seed, or from the file */
	if (o->noise) {
		if (hi3i_noise_read(o->noise, g.B, g.Z, g.h, g.w, s.K, x_T, noise, err))
			goto out;
	} else {
		for (int b = 0; b < g.B; b++) {
			uint64_t seed = (uint64_t)c->seeds[b];
			hi3i_normals(seed, HI3I_STREAM_XT, n, x_T + (size_t)b * n);
			for (int k = 0; k < s.K; k++)
				hi3i_normals(seed, HI3I_STREAM_STEP(s.sde[k]), n, noise + ((size_t)b * s.K + k) * n);
		}
	}
	/* latents[:, 0] = x_T as stored */
	for (int b = 0; b < g.B; b++)
		for (size_t i = 0; i < n; i++) {
			float q = hi3i_round_to(x_T[(size_t)b * n + i], o->latent_dtype);
			x[(size_t)b * n + i] = q;
		}
	{
		const float gv = hi3_bf16_to_f32(hi3_f32_to_bf16((float)(1000.0 * s.g)));   /* upstream: a bf16 tensor */
		for (int i = 0; i < s.T; i++) {
			double ts = hi3i_now();
			int full = i == 0 || o->no_kv_reuse;

			for (int b = 0; b < g.B; b++)
				for (size_t k = 0; k < n; k++) {
					size_t at = ((size_t)b * (s.T + 1) + i) * n + k;
					if (o->latent_dtype == HI3_F32)
						((float *)lat)[at] = x[(size_t)b * n + k];
					else
						((uint16_t *)lat)[at] = o->latent_dtype == HI3_BF16 ? hi3_f32_to_bf16(x[(size_t)b * n + k])
						                                                    : hi3_f32_to_f16(x[(size_t)b * n + k]);
				}
			if (o->trace && i == o->trace_step && hi3i_denoiser_trace(dn, o->trace, err))
				goto out;
			if (hi3i_denoise(dn, x, rows, tst[i], sig[i + 1] * 1000.0f, gv, full, v, err)) {
				hi3_error_prefix(err, "step %d", i);
				goto out;
			}
			if (o->trace && i == o->trace_step)
				hi3i_denoiser_trace(dn, NULL, err);
			if (vel)
				memcpy(vel + (size_t)i * g.R * n, v, sizeof(float) * (size_t)rows * n);
			for (int b = 0; b < g.B; b++) {
				const float *vb = v + (size_t)b * n;
				float *xb = x + (size_t)b * n;
				if (rows == g.R && g.cfg == 2) {
					hi3i_cfg_combine(vb, v + (size_t)(g.B + b) * n, n, s.g, o->cfg_dtype, vg + (size_t)b * n);
					vb = vg + (size_t)b * n;
				}
				if (s.is_sde[i] >= 0) {
					struct hi3i_sde sd;
					int k = s.is_sde[i];
					hi3i_sde_coeffs(sig[i], sig[i + 1], sig[1], (float)o->eta, &sd);
					hi3i_sde_mean(xb, vb, n, &sd, mu);
					hi3i_sde_sample(mu, noise + ((size_t)b * s.K + k) * n, n, &sd, xn);
					for (size_t e = 0; e < n; e++)
						xn[e] = hi3i_round_to(xn[e], o->latent_dtype);
					lp[(size_t)b * s.K + k] = hi3i_sde_logp(xn, mu, n, &sd);
				} else {
					hi3i_euler(xb, vb, n, sig[i], sig[i + 1], xn);
					for (size_t e = 0; e < n; e++)
						xn[e] = hi3i_round_to(xn[e], o->latent_dtype);
				}
				memcpy(xb, xn, sizeof(float) * n);
			}
			if (i == 0)
				t_step0 = hi3i_now() - ts;
			else
				t_rest += hi3i_now() - ts;
			if (o->progress)
				o->progress(o->progress_ctx, i + 1, s.T);
		}
	}
	for (int b = 0; b < g.B; b++)
		for (size_t k = 0; k < n; k++) {
			size_t at = ((size_t)b * (s.T + 1) + s.T) * n + k;
			if (o->latent_dtype == HI3_F32)
				((float *)lat)[at] = x[(size_t)b * n + k];
			else
				((uint16_t *)lat)[at] = o->latent_dtype == HI3_BF16 ? hi3_f32_to_bf16(x[(size_t)b * n + k])
				                                                    : hi3_f32_to_f16(x[(size_t)b * n + k]);
		}
	hi3i_cond_hash(c, hash);
	{
		size_t off = 0, cap = (size_t)g.B * 24 + 4;
		if (!(seeds = hi3i_malloc(cap, err)))
			goto out;
		for (int b = 0; b < g.B; b++)
			off += (size_t)snprintf(seeds + off, cap - off, "%s%lld", b ? ", " : "[", (long long)c->seeds[b]);
		snprintf(seeds + off, cap - off, "]");
	}
	tr = (hi3_trajectory){
		.B = g.B, .R = g.R, .T = s.T, .K = s.K, .C = g.Z, .h = g.h, .w = g.w, .latent_dtype = o->latent_dtype,
		.latents = lat, .sigmas = sig, .timesteps = tst, .sde_steps = s.sde, .sde_logp = lp, .x_T = x_T,
		.sde_noise = noise, .velocity = vel, .sampler = o->sampler == HI3_SAMPLER_SDE ? "sde" : "euler",
		.eta = o->sampler == HI3_SAMPLER_SDE ? o->eta : 0.0, .guidance = s.g, .flow_shift = s.shift,
		.kv_reuse = !o->no_kv_reuse, .cfg_dtype = dtype_label(o->cfg_dtype),
		.variant = hi3_variant_name(hi3_variant_of(hi3_model_config(m), hi3_model_gen_defaults(m), NULL, 0)),
		.noise = o->noise ? o->noise : "philox", .model_fingerprint = hi3_model_fingerprint(m),
		.conditions_hash = hash, .requests = c->requests, .seeds = seeds,
	};
	if (hi3_trajectory_write(&tr, traj_path, err))
		goto out;
	st->B = g.B;
	st->R = g.R;
	st->T = s.T;
	st->K = s.K;
	st->h = g.h;
	st->w = g.w;
	st->L = c->L;
	st->image_tokens = (int64_t)g.h * g.w;
	st->seconds = hi3i_now() - t0;
	st->step0_seconds = t_step0;
	st->step_seconds = s.T > 1 ? t_rest / (s.T - 1) : t_step0;
	rc = 0;
out:
	hi3i_denoiser_close(dn);
	free(s.is_sde), free(s.sde), free(sig), free(tst), free(x_T), free(noise), free(lp), free(lat), free(v);
	free(vg), free(x), free(xn), free(mu), free(vel), free(seeds);
	return rc;
}
