/*
 * denoiser.c -- the model as a denoiser of image latents (hi3-batching(7),
 * IMAGES AND DIFFUSION): the velocity of the gen_image rows of a
 * conditions file at latents x and timestep t, over the image heads
 * (heads.c) and the decoder (forward.c). The diffusion stage's capture and
 * replay, and parity through them, drive it (stage/diffusion.c).
 *
 * The input of the sequence is wte[ids] with, scattered in, the image
 * rows patch_embed(x, time_embed(t)) (raster order) and the special rows
 * timestep_emb(t) [guidance_emb(g)] [timestep_r_emb(r)], and the rows of
 * the cond images (it2i) the stage made with the model's encoders; the
 * decoder runs (no ln_f) and final_layer(hidden at the image tokens,
 * time_embed_2(t)) is the velocity.
 * The first step runs the whole sequence into a static cache of exactly L
 * slots per row (K/V of column t at slot t, rule 1); a later step feeds
 * only the special tokens and the image tokens, at their own columns, with
 * the mask rows of those columns (a token admits slots up to itself, and
 * an image token its whole image block), against the cached prefix. Without
 * KV reuse every step runs the whole sequence.
 *
 * Shapes: B requests, R rows (cond rows then uncond rows), L columns, Z
 * latent channels, h x w latent grid, N = h w image tokens, H hidden, ns
 * special tokens.
 */
#include <string.h>
#include "model/denoiser.h"
#include "model/heads.h"
#include "model/model.h"

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
	int n_cond;
	int32_t *cond_at;             /* (n_cond, 2) (row, column), grouped by row in order */
	float *cond_rows;             /* (n_cond, H) host */
	int *cond_upto;               /* (R + 1) cond rows of the rows before r */
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
	free(dn->cond_at), free(dn->cond_rows), free(dn->cond_upto);
	free(dn);
}

int hi3i_denoiser_cond_rows(struct hi3i_denoiser *dn, int n, int32_t *at, float *rows, hi3_error *err)
{
	dn->n_cond = n;
	dn->cond_at = at;
	dn->cond_rows = rows;
	if (!(dn->cond_upto = hi3i_calloc((size_t)dn->R + 1, sizeof(int), err)))
		return -1;
	for (int i = 0; i < n; i++)
		dn->cond_upto[at[2 * i] + 1] = i + 1;
	for (int r = 1; r <= dn->R; r++)
		dn->cond_upto[r] = HI3_MAX(dn->cond_upto[r], dn->cond_upto[r - 1]);
	return 0;
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
	 * included; 0 for pads under --pad-positions=zero or the pos-pad defect) */
	dn->slot[i] = (dn->o.defects & HI3I_DN_POS_ZERO) && t >= c->real_pos[r] ? 0 : c->position_ids[ct];
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
	if (full && dn->n_cond) {
		/* the cond images sit in the prefix: whole-sequence passes only */
		b.n_host_embed = dn->cond_upto[rows];
		b.host_embed_at = dn->cond_at;
		b.host_embed_rows = dn->cond_rows;
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
