/*
 * batch.c -- conditions built from encoded rows (hi3_cond_build), merged
 * from files (hi3_cond_concat) or cut to some rows (hi3_cond_select).
 *
 * Dimension letters: B rows, L columns (right padded), S full-attention
 * blocks per row, NS stop tokens per row, K <timestep> indices per row,
 * R requests (B = R * cfg_factor).
 *
 * hi3-batching(7), rule 1: position_ids[b, t] = t on every column,
 * pads included; only the pad_zero ablation writes 0 at pad columns.
 */
#include <string.h>
#include "cond/cond-internal.h"

/* ----------------------------------------------------- building by rows */

/* One row to place: the real columns [0, n) and its lists. */
struct rowview {
	int64_t n;
	const int64_t *ids;          /* (n) */
	const int32_t *rope;         /* (n, 2) */
	const uint8_t *mask[3];      /* (n) gen_image, cond_vit, cond_vae; or NULL */
	int n_blocks;
	const int32_t *blocks;       /* (n_blocks, 2) */
	int n_stop;
	const int64_t *stops;        /* (n_stop) */
	int n_ts;
	const int64_t *ts;           /* (n_ts) */
	int n_forced, n_greedy;
	const int64_t *forced;       /* (n_forced) rule records */
	const int64_t *greedy;       /* (n_greedy) */
	int32_t gen_hw[2];           /* the generated image's grid, (0, 0) */
	int64_t seed;
	int n_img, P, D;             /* cond images with pixels */
	const int32_t *vit_grid;     /* (n_img, 2) */
	const uint8_t *vit_pixels;   /* (n_img, P, D) */
	const int32_t *vae_shape;    /* (n_img, 2) */
	const uint8_t *vae_pixels;   /* (nv) the images' VAE views, one after the other */
	int64_t nv;
	/* their encoder outputs, when stored (vit_emb NULL otherwise) */
	int E;
	const float *vit_emb;        /* (n_img, P, E) */
	const int32_t *lat_shape;    /* (n_img, 3) */
	const float *lat;            /* (nz) */
	int64_t nz;
};

static int used_prefix(const int64_t *v, int n)
{
	int k = 0;

	while (k < n && v[k] != -1)
		k++;
	return k;
}

static void view_of_cond(const hi3_cond *c, int b, struct rowview *v)
{
	const uint8_t *m[3] = {c->gen_image_mask, c->cond_vit_mask, c->cond_vae_mask};

	v->n = c->real_pos[b];
	v->ids = c->input_ids + (size_t)b * c->L;
	v->rope = c->rope_pos + (size_t)b * c->L * 2;
	for (int i = 0; i < 3; i++)
		v->mask[i] = m[i] ? m[i] + (size_t)b * c->L : NULL;
	v->blocks = c->image_blocks + (size_t)b * c->S * 2;
	v->n_blocks = 0;
	while (v->n_blocks < c->S && v->blocks[2 * v->n_blocks] != v->blocks[2 * v->n_blocks + 1])
		v->n_blocks++;
	v->stops = c->stop_tokens + (size_t)b * c->NS;
	v->n_stop = used_prefix(v->stops, c->NS);
	v->ts = c->timestep_index ? c->timestep_index + (size_t)b * c->K : NULL;
	v->n_ts = v->ts ? used_prefix(v->ts, c->K) : 0;
	v->forced = c->forced_after ? c->forced_after + (size_t)b * c->NF : NULL;
	v->n_forced = v->forced ? used_prefix(v->forced, c->NF) : 0;
	v->greedy = c->greedy_among ? c->greedy_among + (size_t)b * c->NG : NULL;
	v->n_greedy = v->greedy ? used_prefix(v->greedy, c->NG) : 0;
	v->gen_hw[0] = c->gen_image_hw ? c->gen_image_hw[2 * b] : 0;
	v->gen_hw[1] = c->gen_image_hw ? c->gen_image_hw[2 * b + 1] : 0;
	v->seed = c->seeds[b];
	v->n_img = 0;
	v->nv = 0;
	v->nz = 0;
	v->E = c->vit_embeds ? c->VE : 0;
	for (int64_t k = 0, off = 0, zo = 0; k < c->NI; k++) {
		const int64_t nz = c->vit_embeds ? (int64_t)c->latent_shape[3 * k] * c->latent_shape[3 * k + 1] *
		                                   c->latent_shape[3 * k + 2] : 0;
		if (c->image_row[k] == b) {
			if (!v->n_img++) {
				v->vit_grid = c->vit_grid + 2 * (size_t)k;
				v->vit_pixels = c->vit_pixels + (size_t)k * c->VP * c->VD;
				v->vae_shape = c->vae_shape + 2 * (size_t)k;
				v->vae_pixels = c->vae_pixels + off;
				v->vit_emb = c->vit_embeds ? c->vit_embeds + (size_t)k * c->VP * c->VE : NULL;
				v->lat_shape = c->vit_embeds ? c->latent_shape + 3 * (size_t)k : NULL;
				v->lat = c->vit_embeds ? c->vae_latents + zo : NULL;
			}
			v->nv += (int64_t)c->vae_shape[2 * k] * c->vae_shape[2 * k + 1] * 3;
			v->nz += nz;
		}
		off += (int64_t)c->vae_shape[2 * k] * c->vae_shape[2 * k + 1] * 3;
		zo += nz;
	}
	v->P = c->VP;
	v->D = c->VD;
}

static void view_of_row(const hi3_cond_row *r, struct rowview *v)
{
	v->n = r->n;
	v->ids = r->ids;
	v->rope = r->rope;
	v->mask[0] = r->gen_image_mask;
	v->mask[1] = r->cond_vit_mask;
	v->mask[2] = r->cond_vae_mask;
	v->n_blocks = r->n_blocks;
	v->blocks = r->blocks;
	v->n_stop = r->n_stop;
	v->stops = r->stop_tokens;
	v->n_ts = r->n_ts;
	v->ts = r->timestep_index;
	v->n_forced = r->n_forced;
	v->forced = r->forced_after;
	v->n_greedy = r->n_greedy;
	v->greedy = r->greedy_among;
	v->gen_hw[0] = r->gen_h;
	v->gen_hw[1] = r->gen_w;
	v->seed = r->seed;
}

/* Allocate the tensors of B rows shaped by the views; has_mask[i] says
 * whether mask i is stored. */
static int cond_alloc(struct hi3i_cond *ci, const struct rowview *v, int B, int L, const int has_mask[3],
                      hi3_error *err)
{
	hi3_cond *c = &ci->c;
	int S = 1, NS = 1, K = 0, NF = 0, NG = 0, NI = 0, P = 0, D = 0, E = -1;
	int64_t NV = 0, NZ = 0;

	/* gen_image_hw when every row with generated image tokens knows its
	 * grid (conditions written before the tensor existed do not) */
	int has_hw = 0, lacks_hw = 0;

	for (int b = 0; b < B; b++) {
		int img = 0;
		for (int64_t t = 0; v[b].mask[0] && t < v[b].n && !img; t++)
			img = v[b].mask[0][t] != 0;
		has_hw |= v[b].gen_hw[0] > 0;
		lacks_hw |= img && v[b].gen_hw[0] == 0;
	}
	for (int b = 0; b < B; b++) {
		if (v[b].n_img && P && (v[b].P != P || v[b].D != D))
			return hi3_error_set(err, HI3_ERR_INPUT, "cond images of %d x %d and %d x %d ViT features in one "
			                     "conditions (made for different models?)", P, D, v[b].P, v[b].D);
		if (v[b].n_img && E >= 0 && v[b].E != E)
			return hi3_error_set(err, HI3_ERR_INPUT, "cond images %s in one conditions (merge files encoded "
			                     "alike: all with tokenize-concat --encode by one model, or none)",
			                     !E || !v[b].E ? "with and without their encoder outputs" :
			                     "encoded to different widths");
		if (v[b].n_img) {
			P = v[b].P;
			D = v[b].D;
			E = v[b].E;
			NI += v[b].n_img;
			NV += v[b].nv;
			NZ += v[b].nz;
		}
		L = (int)HI3_MAX(L, v[b].n);
		S = HI3_MAX(S, v[b].n_blocks);
		NS = HI3_MAX(NS, v[b].n_stop);
		K = HI3_MAX(K, v[b].n_ts);
		NF = HI3_MAX(NF, v[b].n_forced);
		NG = HI3_MAX(NG, v[b].n_greedy);
	}
	c->B = B;
	c->L = L;
	c->S = S;
	c->NS = NS;
	c->K = K;
	c->NF = NF;
	c->NG = NG;
	{
		size_t BL = (size_t)B * L;
		size_t sizes[T_COUNT] = {
			[T_IDS] = BL * 8, [T_POS] = BL * 8, [T_REAL] = (size_t)B * 8, [T_ROPE] = BL * 8,
			[T_BLOCKS] = (size_t)B * S * 8, [T_SEEDS] = (size_t)B * 8, [T_STOPS] = (size_t)B * NS * 8,
			[T_GMASK] = has_mask[0] ? BL : 0, [T_VIT] = has_mask[1] ? BL : 0, [T_VAE] = has_mask[2] ? BL : 0,
			[T_TS] = (size_t)B * K * 8, [T_FORCED] = (size_t)B * NF * 8, [T_GREEDY] = (size_t)B * NG * 8,
			[T_GEN_HW] = has_mask[0] && has_hw && !lacks_hw ? (size_t)B * 8 : 0,
			[T_IMG_ROW] = (size_t)NI * 8, [T_VIT_GRID] = (size_t)NI * 8, [T_VIT_PIX] = (size_t)NI * P * D,
			[T_VAE_SHAPE] = (size_t)NI * 8, [T_VAE_PIX] = (size_t)NV,
			[T_VIT_EMB] = E > 0 ? (size_t)NI * P * E * 4 : 0, [T_LAT_SHAPE] = E > 0 ? (size_t)NI * 12 : 0,
			[T_VAE_LAT] = E > 0 ? (size_t)NZ * 4 : 0,
		};
		for (int i = 0; i < T_COUNT; i++)
			if (sizes[i] && !(ci->buf[i] = hi3i_calloc(1, sizes[i], err)))
				return -1;
	}
	c->input_ids = ci->buf[T_IDS];
	c->position_ids = ci->buf[T_POS];
	c->real_pos = ci->buf[T_REAL];
	c->rope_pos = ci->buf[T_ROPE];
	c->image_blocks = ci->buf[T_BLOCKS];
	c->seeds = ci->buf[T_SEEDS];
	c->stop_tokens = ci->buf[T_STOPS];
	c->gen_image_mask = ci->buf[T_GMASK];
	c->cond_vit_mask = ci->buf[T_VIT];
	c->cond_vae_mask = ci->buf[T_VAE];
	c->timestep_index = ci->buf[T_TS];
	c->forced_after = ci->buf[T_FORCED];
	c->greedy_among = ci->buf[T_GREEDY];
	c->gen_image_hw = ci->buf[T_GEN_HW];
	c->NI = NI;
	c->VP = NI ? P : 0;
	c->VD = NI ? D : 0;
	c->image_row = ci->buf[T_IMG_ROW];
	c->vit_grid = ci->buf[T_VIT_GRID];
	c->vit_pixels = ci->buf[T_VIT_PIX];
	c->vae_shape = ci->buf[T_VAE_SHAPE];
	c->vae_pixels = ci->buf[T_VAE_PIX];
	c->NV = NV;
	c->VE = E > 0 ? E : 0;
	c->vit_embeds = ci->buf[T_VIT_EMB];
	c->latent_shape = ci->buf[T_LAT_SHAPE];
	c->vae_latents = ci->buf[T_VAE_LAT];
	c->NZ = E > 0 ? NZ : 0;
	return 0;
}

/* Row b of a freshly allocated conditions: the real columns as given, then
 * pads (pad id, position t or 0, RoPE (t, t), masks 0); its images from
 * image img0 on, their VAE views from byte vae0 on. */
static void put_row(struct hi3i_cond *ci, int b, const struct rowview *v, int64_t pad_id, int pad_zero, int img0,
                    int64_t vae0, int64_t z0)
{
	hi3_cond *c = &ci->c;
	size_t o = (size_t)b * c->L;
	int64_t *ids = ci->buf[T_IDS], *pos = ci->buf[T_POS], *stops = ci->buf[T_STOPS], *ts = ci->buf[T_TS];
	int64_t *forced = ci->buf[T_FORCED], *greedy = ci->buf[T_GREEDY];
	int32_t *rope = ci->buf[T_ROPE], *blocks = ci->buf[T_BLOCKS];
	uint8_t *mask[3] = {ci->buf[T_GMASK], ci->buf[T_VIT], ci->buf[T_VAE]};

	for (int64_t t = 0; t < c->L; t++) {
		int real = t < v->n;
		ids[o + t] = real ? v->ids[t] : pad_id;
		pos[o + t] = !real && pad_zero ? 0 : t;
		rope[2 * (o + t)] = real ? v->rope[2 * t] : (int32_t)t;
		rope[2 * (o + t) + 1] = real ? v->rope[2 * t + 1] : (int32_t)t;
		for (int i = 0; i < 3; i++)
			if (mask[i])
				mask[i][o + t] = real && v->mask[i] ? v->mask[i][t] : 0;
	}
	((int64_t *)ci->buf[T_REAL])[b] = v->n;
	if (ci->buf[T_GEN_HW])
		memcpy((int32_t *)ci->buf[T_GEN_HW] + 2 * b, v->gen_hw, sizeof(v->gen_hw));
	((int64_t *)ci->buf[T_SEEDS])[b] = v->seed;
	if (v->n_blocks)
		memcpy(blocks + (size_t)b * c->S * 2, v->blocks, (size_t)v->n_blocks * 2 * sizeof(int32_t));
	for (int k = 0; k < c->NS; k++)
		stops[(size_t)b * c->NS + k] = k < v->n_stop ? v->stops[k] : -1;
	for (int k = 0; k < c->K; k++)
		ts[(size_t)b * c->K + k] = k < v->n_ts ? v->ts[k] : -1;
	for (int k = 0; k < c->NF; k++)
		forced[(size_t)b * c->NF + k] = k < v->n_forced ? v->forced[k] : -1;
	for (int k = 0; k < c->NG; k++)
		greedy[(size_t)b * c->NG + k] = k < v->n_greedy ? v->greedy[k] : -1;
	for (int k = 0; k < v->n_img; k++)
		((int64_t *)ci->buf[T_IMG_ROW])[img0 + k] = b;
	if (v->n_img) {
		memcpy((int32_t *)ci->buf[T_VIT_GRID] + 2 * (size_t)img0, v->vit_grid, sizeof(int32_t) * 2 * v->n_img);
		memcpy((uint8_t *)ci->buf[T_VIT_PIX] + (size_t)img0 * c->VP * c->VD, v->vit_pixels,
		       (size_t)v->n_img * c->VP * c->VD);
		memcpy((int32_t *)ci->buf[T_VAE_SHAPE] + 2 * (size_t)img0, v->vae_shape, sizeof(int32_t) * 2 * v->n_img);
		memcpy((uint8_t *)ci->buf[T_VAE_PIX] + vae0, v->vae_pixels, (size_t)v->nv);
	}
	if (v->n_img && ci->buf[T_VIT_EMB]) {
		memcpy((float *)ci->buf[T_VIT_EMB] + (size_t)img0 * c->VP * c->VE, v->vit_emb,
		       sizeof(float) * (size_t)v->n_img * c->VP * c->VE);
		memcpy((int32_t *)ci->buf[T_LAT_SHAPE] + 3 * (size_t)img0, v->lat_shape, sizeof(int32_t) * 3 * v->n_img);
		memcpy((float *)ci->buf[T_VAE_LAT] + z0, v->lat, sizeof(float) * (size_t)v->nz);
	}
}

/* A conditions of the given rows (all columns), L at least min_L. */
static int cond_from_views(struct hi3i_cond *ci, const struct rowview *v, int B, int min_L, const int has_mask[3],
                           int64_t pad_id, int pad_zero, hi3_error *err)
{
	int img = 0;
	int64_t vae = 0, z = 0;

	if (cond_alloc(ci, v, B, min_L, has_mask, err) != 0)
		return -1;
	for (int b = 0; b < B; b++) {
		put_row(ci, b, &v[b], pad_id, pad_zero, img, vae, z);
		img += v[b].n_img;
		vae += v[b].nv;
		z += v[b].nz;
	}
	ci->c.pad_id = pad_id;
	return 0;
}

/* Fill ci with the rows of v, hand it out, free v; on failure free both. */
static int finish_views(struct hi3i_cond *ci, struct rowview *v, int B, int min_L, const int has_mask[3],
                        int64_t pad_id, int pad_zero, int cfg_factor, hi3_cond **out, hi3_error *err)
{
	int rc = cond_from_views(ci, v, B, min_L, has_mask, pad_id, pad_zero, err);

	free(v);
	if (rc != 0) {
		hi3_cond_close(&ci->c);
		return -1;
	}
	ci->cfg_factor = cfg_factor;
	hi3i_cond_bind_meta(ci);
	*out = &ci->c;
	return 0;
}

/* ----------------------------------------------------------------- merge */

/* Where merged row b comes from: input file and row. */
struct src {
	int file, row;
};

/* vae_posterior, "mean" when absent */
static const char *posterior_of(const hi3_cond *c)
{
	const char *v = hi3_cond_meta(c, "vae_posterior");

	return v ? v : "mean";
}

/* next_stage, "" when absent */
static const char *next_stage_of(const hi3_cond *c)
{
	const char *v = hi3_cond_meta(c, "next_stage");

	return v ? v : "";
}

static int concat_meta(struct hi3i_cond *ci, const hi3_cond *const *in, int n, int pad_zero, hi3_error *err)
{
	static const char *const same[] = {"mode", "template", "cfg_factor", "pad_id", NULL};
	static const char *const known[] = {"tokenizer_hash", "model_fingerprint", NULL};
	const char *bot = in[0]->bot_task;
	json_t *all = json_array();
	int rc = -1;

	if (!all)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	for (int i = 0; same[i]; i++)
		for (int k = 1; k < n; k++)
			if (strcmp(hi3_cond_meta(in[0], same[i]), hi3_cond_meta(in[k], same[i]))) {
				hi3_error_set(err, HI3_ERR_INPUT, "cannot merge %s and %s: they differ in '%s' ('%s' and '%s')",
				              HI3I_COND(in[0])->name, HI3I_COND(in[k])->name, same[i], hi3_cond_meta(in[0], same[i]),
				              hi3_cond_meta(in[k], same[i]));
				goto out;
			}
	for (int i = 0; known[i]; i++) {
		int first = -1;
		for (int k = 0; k < n; k++) {
			const char *v = hi3_cond_meta(in[k], known[i]);
			if (!v[0])
				continue;
			if (first >= 0 && strcmp(hi3_cond_meta(in[first], known[i]), v)) {
				hi3_error_set(err, HI3_ERR_INPUT, "cannot merge %s and %s: they differ in '%s' ('%s' and "
				              "'%s'): made with another %s", HI3I_COND(in[first])->name, HI3I_COND(in[k])->name,
				              known[i], hi3_cond_meta(in[first], known[i]), v,
				              i == 0 ? "tokenizer" : "model");
				goto out;
			}
			if (first < 0)
				first = k;
		}
		if (hi3i_cond_set_meta(ci, known[i], first >= 0 ? hi3_cond_meta(in[first], known[i]) : "", err) != 0)
			goto out;
	}
	/* how the images' latents are drawn: one way for every file with images */
	for (int k = 0, first = -1; k < n; k++) {
		if (!in[k]->NI)
			continue;
		if (first >= 0 && strcmp(posterior_of(in[first]), posterior_of(in[k]))) {
			hi3_error_set(err, HI3_ERR_INPUT, "cannot merge %s and %s: they differ in 'vae_posterior' ('%s' and "
			              "'%s')", HI3I_COND(in[first])->name, HI3I_COND(in[k])->name, posterior_of(in[first]),
			              posterior_of(in[k]));
			goto out;
		}
		if (first < 0 && hi3i_cond_set_meta(ci, "vae_posterior", posterior_of(in[first = k]), err))
			goto out;
	}
	/* a text stage that goes on to images: every file or none */
	for (int k = 1; k < n; k++)
		if (strcmp(next_stage_of(in[0]), next_stage_of(in[k]))) {
			hi3_error_set(err, HI3_ERR_INPUT, "cannot merge %s and %s: they differ in 'next_stage' ('%s' and '%s')",
			              HI3I_COND(in[0])->name, HI3I_COND(in[k])->name, next_stage_of(in[0]),
			              next_stage_of(in[k]));
			goto out;
		}
	if (*next_stage_of(in[0]) && hi3i_cond_set_meta(ci, "next_stage", next_stage_of(in[0]), err))
		goto out;
	for (int k = 0; k < n; k++) {
		json_t *rq = json_loads(in[k]->requests, JSON_ALLOW_NUL, NULL);
		if (strcmp(in[k]->bot_task, bot))
			bot = "mixed";
		if (!rq || json_array_extend(all, rq) != 0) {
			json_decref(rq);
			hi3_error_set(err, HI3_ERR_RUNTIME, "%s: cannot read the requests", HI3I_COND(in[k])->name);
			goto out;
		}
		json_decref(rq);
	}
	{
		char *text = json_dumps(all, JSON_COMPACT | JSON_ENSURE_ASCII);
		if (!text) {
			hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
			goto out;
		}
		rc = hi3i_cond_set_meta(ci, "requests", text, err);
		free(text);
		if (rc != 0)
			goto out;
	}
	rc = hi3i_cond_set_meta(ci, "format", HI3_FORMAT_CONDITIONS, err) ||
	     hi3i_cond_set_meta(ci, "format_version", HI3_FORMAT_VERSION, err) ||
	     hi3i_cond_set_meta(ci, "mode", in[0]->mode, err) || hi3i_cond_set_meta(ci, "bot_task", bot, err) ||
	     hi3i_cond_set_meta(ci, "template", in[0]->template_name, err) ||
	     hi3i_cond_set_meta(ci, "cfg_factor", hi3_cond_meta(in[0], "cfg_factor"), err) ||
	     hi3i_cond_set_meta(ci, "pad_id", hi3_cond_meta(in[0], "pad_id"), err) ||
	     hi3i_cond_set_meta(ci, "pad_positions", pad_zero ? "zero" : "continue", err)
	             ? -1 : 0;
out:
	json_decref(all);
	return rc;
}

int hi3_cond_concat(hi3_cond **out, const hi3_cond *const *in, int n, int pad_zero, hi3_error *err)
{
	struct hi3i_cond *ci;
	struct rowview *v = NULL;
	int B = 0, L = 1, f, has_mask[3] = {0, 0, 0}, b = 0;

	*out = NULL;
	if (n < 1)
		return hi3_error_set(err, HI3_ERR_USAGE, "nothing to merge");
	if (!(ci = hi3i_cond_new(n == 1 ? HI3I_COND(in[0])->name : "(merged conditions)", err)))
		return -1;
	if (concat_meta(ci, in, n, pad_zero, err) != 0)
		goto fail;
	f = HI3I_COND(in[0])->cfg_factor;
	for (int k = 0; k < n; k++) {
		B += in[k]->B;
		L = HI3_MAX(L, in[k]->L);
		has_mask[0] |= in[k]->gen_image_mask != NULL;
		has_mask[1] |= in[k]->cond_vit_mask != NULL;
		has_mask[2] |= in[k]->cond_vae_mask != NULL;
	}
	if (!(v = hi3i_calloc((size_t)B, sizeof(*v), err)))
		goto fail;
	/* row groups in order: group g of every file, then group g + 1 */
	for (int g = 0; g < f; g++)
		for (int k = 0; k < n; k++) {
			int R = in[k]->B / f;
			for (int r = 0; r < R; r++)
				view_of_cond(in[k], g * R + r, &v[b++]);
		}
	return finish_views(ci, v, B, L, has_mask, in[0]->pad_id, pad_zero, f, out, err);
fail:
	free(v);
	hi3_cond_close(&ci->c);
	return -1;
}

int hi3_cond_select(hi3_cond **out, const hi3_cond *c, const int *rows, int n, int min_L, hi3_error *err)
{
	struct hi3i_cond *ci;
	struct rowview *v = NULL;
	int has_mask[3] = {c->gen_image_mask != NULL, c->cond_vit_mask != NULL, c->cond_vae_mask != NULL};
	int pad_zero = !strcmp(hi3_cond_meta(c, "pad_positions"), "zero");

	*out = NULL;
	if (n < 1)
		return hi3_error_set(err, HI3_ERR_USAGE, "no rows selected");
	for (int i = 0; i < n; i++)
		if (rows[i] < 0 || rows[i] >= c->B)
			return hi3_error_set(err, HI3_ERR_USAGE, "%s: row %d selected of %d", HI3I_COND(c)->name, rows[i], c->B);
	if (!(ci = hi3i_cond_new(HI3I_COND(c)->name, err)))
		return -1;
	if (concat_meta(ci, &c, 1, pad_zero, err) != 0 || !(v = hi3i_calloc((size_t)n, sizeof(*v), err)))
		goto fail;
	if (HI3I_COND(c)->cfg_factor > 1) {
		/* whole requests: rows [q_0 .. q_{k-1}] of each cfg group in the same order */
		const int f = HI3I_COND(c)->cfg_factor, R = c->B / f, k = n / f;
		int ok = n % f == 0;
		for (int g = 1; ok && g < f; g++)
			for (int i = 0; ok && i < k; i++)
				ok = rows[i] < R && rows[g * k + i] == rows[i] + g * R;
		if (!ok) {
			hi3_error_set(err, HI3_ERR_USAGE, "%s: cfg_factor %d: select whole requests (row i of each of the %d "
			              "groups of %d rows)", HI3I_COND(c)->name, f, f, R);
			goto fail;
		}
	}
	{
		/* the selected rows' requests */
		const int f = HI3I_COND(c)->cfg_factor;
		json_t *all = json_loads(c->requests, JSON_ALLOW_NUL, NULL), *sel = json_array();
		char *text;
		for (int i = 0; all && i < n / f; i++)
			json_array_append(sel, json_array_get(all, (size_t)rows[i]));
		text = json_dumps(sel, JSON_COMPACT | JSON_ENSURE_ASCII);
		json_decref(all);
		json_decref(sel);
		if (!text || hi3i_cond_set_meta(ci, "requests", text, err) != 0) {
			free(text);
			goto fail;
		}
		free(text);
	}
	for (int i = 0; i < n; i++)
		view_of_cond(c, rows[i], &v[i]);
	return finish_views(ci, v, n, HI3_MAX(min_L, 1), has_mask, c->pad_id, pad_zero, HI3I_COND(c)->cfg_factor, out,
	                    err);
fail:
	free(v);
	hi3_cond_close(&ci->c);
	return -1;
}

/* ----------------------------------------------------------------- build */

void hi3_cond_row_release(hi3_cond_row *r)
{
	if (!r)
		return;
	free(r->ids);
	free(r->rope);
	free(r->blocks);
	free(r->gen_image_mask);
	free(r->cond_vit_mask);
	free(r->cond_vae_mask);
	free(r->timestep_index);
	free(r->stop_tokens);
	free(r->forced_after);
	free(r->greedy_among);
	memset(r, 0, sizeof(*r));
}

/* The ViT and VAE views of one request's images. */
struct req_images {
	int n, P, D;
	int32_t *grid;               /* (n, 2) */
	uint8_t *pixels;             /* (n, P, D) */
	int32_t *vae_shape;          /* (n, 2) */
	uint8_t *vae;                /* (nv) */
	int64_t nv;
};

/* Metadata shared by every row of a build. */
struct build_meta {
	const hi3_template *t;
	const char *mode, *template_name, *tok_hash, *fingerprint;
	const char *next_stage;        /* "gen_image" for the text stage of image_size auto, or NULL */
	int cfg_factor;
	int64_t pad_id;
	int pad_zero;
	int vae_sample;
	const struct req_images *img;  /* (R) */
	const hi3_cond *views;         /* or the cond images of request i are row views_row[i]'s of this */
	const int *views_row;          /* (R) */
};

/* The ViT view of every image of request r (hi3_image_vit_view), as
 * uint8 patches: the levels the view normalised, re-read from its
 * resized image in patch order; and its VAE view (hi3_image_vae_view) in
 * the template's bucket, the cropped uint8 image. */
static int request_images(const hi3_template *t, const hi3_requests *rq, int i, int kernel, int64_t max_pixels,
                          struct req_images *ri, hi3_error *err)
{
	const struct hi3i_request *r = &rq->r[i];
	hi3_image_vit_opts vo = {.kernel = kernel};
	int tgh, tgw;

	memset(ri, 0, sizeof(*ri));
	if (!r->image_paths)
		return 0;
	hi3i_template_vit(t, &vo.patch, &vo.max_patches);
	ri->n = r->n_cond;
	ri->P = vo.max_patches;
	ri->D = 3 * vo.patch * vo.patch;
	ri->grid = hi3i_malloc(sizeof(int32_t) * 2 * (size_t)ri->n, err);
	ri->pixels = ri->grid ? hi3i_calloc((size_t)ri->n * ri->P, (size_t)ri->D, err) : NULL;
	ri->vae_shape = ri->pixels ? hi3i_malloc(sizeof(int32_t) * 2 * (size_t)ri->n, err) : NULL;
	if (!ri->vae_shape)
		return -1;
	for (int k = 0; k < ri->n; k++) {
		hi3i_template_cond_geometry(t, r, k, &ri->vae_shape[2 * k], &ri->vae_shape[2 * k + 1], &tgh, &tgw);
		ri->nv += (int64_t)ri->vae_shape[2 * k] * ri->vae_shape[2 * k + 1] * 3;
	}
	if (!(ri->vae = hi3i_malloc((size_t)ri->nv, err)))
		return -1;
	for (int k = 0; k < ri->n; k++) {
		hi3_image_vit *v = NULL;
		uint8_t *px = ri->pixels + (size_t)k * ri->P * ri->D;
		const int p = vo.patch;
		if (!r->images[k])
			return hi3_error_set(err, HI3_ERR_USAGE, "%s:%d: image %d ('%s') was not read "
			                     "(hi3_requests_load_images)", rq->name, r->line, k, r->image_paths[k]);
		if (hi3_image_vit_view(&v, r->images[k], &vo, err))
			return hi3_error_prefix(err, "%s:%d: image %d", rq->name, r->line, k);
		hi3i_template_cond_geometry(t, r, k, &tgh, &tgw, &tgh, &tgw);
		HI3_ASSERT(v->grid_h == tgh && v->grid_w == tgw && v->dim == ri->D && v->n_patches == ri->P);
		ri->grid[2 * k] = v->grid_h;
		ri->grid[2 * k + 1] = v->grid_w;
		/* patch (gy, gx), feature (py p + px) 3 + c */
		for (int gy = 0; gy < v->grid_h; gy++)
			for (int gx = 0; gx < v->grid_w; gx++)
				for (int py = 0; py < p; py++)
					memcpy(px + ((size_t)(gy * v->grid_w + gx) * ri->D + (size_t)py * p * 3),
					       v->rgb + ((size_t)(gy * p + py) * v->width + (size_t)gx * p) * 3, (size_t)p * 3);
		hi3_image_vit_free(v);
	}
	for (int k = 0, off = 0; k < ri->n; off += ri->vae_shape[2 * k] * ri->vae_shape[2 * k + 1] * 3, k++) {
		hi3_image_vae_opts ao = {.max_pixels = max_pixels, .target_h = ri->vae_shape[2 * k],
		                         .target_w = ri->vae_shape[2 * k + 1]};
		hi3_image_vae *v = NULL;
		if (hi3_image_vae_view(&v, r->images[k], &ao, err))
			return hi3_error_prefix(err, "%s:%d: image %d", rq->name, r->line, k);
		memcpy(ri->vae + off, v->rgb, (size_t)v->height * v->width * 3);
		hi3_image_vae_free(v);
	}
	return 0;
}

static void request_images_release(struct req_images *ri)
{
	free(ri->grid);
	free(ri->pixels);
	free(ri->vae_shape);
	free(ri->vae);
}

/* A conditions of requests [r0, r0 + R) of rq from rows laid out as
 * rows[g * n_req + i] (group g, request i). */
static int build_part(hi3_cond **out, const hi3_requests *rq, const hi3_cond_row *rows, int n_req, int r0, int R,
                      const struct build_meta *bm, hi3_error *err)
{
	struct hi3i_cond *ci;
	struct rowview *v;
	int f = bm->cfg_factor, B = R * f, has_mask[3] = {0, 0, 0};
	const char *bot = hi3i_bot_task_names[hi3i_template_bot_task(bm->t, &rq->r[r0])];
	json_t *reqs = json_array();
	char *text = NULL, name[64];

	snprintf(name, sizeof(name), "%s:%d", rq->name, rq->r[r0].line);
	*out = NULL;
	if (!(ci = hi3i_cond_new(R == 1 ? name : rq->name, err))) {
		json_decref(reqs);
		return -1;
	}
	if (!(v = hi3i_calloc((size_t)B, sizeof(*v), err)))
		goto fail;
	for (int g = 0; g < f; g++)
		for (int i = 0; i < R; i++) {
			const hi3_cond_row *row = &rows[g * n_req + r0 + i];
			const struct req_images *ri = &bm->img[r0 + i];
			struct rowview *w = &v[g * R + i];
			view_of_row(row, w);
			if (bm->views) {
				/* the images as the text stage had them, with their encoder outputs */
				struct rowview iv;
				view_of_cond(bm->views, bm->views_row[r0 + i], &iv);
				w->n_img = iv.n_img, w->P = iv.P, w->D = iv.D, w->nv = iv.nv, w->E = iv.E, w->nz = iv.nz;
				w->vit_grid = iv.vit_grid, w->vit_pixels = iv.vit_pixels, w->vae_shape = iv.vae_shape;
				w->vae_pixels = iv.vae_pixels, w->vit_emb = iv.vit_emb, w->lat_shape = iv.lat_shape;
				w->lat = iv.lat;
			} else {
				w->n_img = ri->n, w->P = ri->P, w->D = ri->D, w->nv = ri->nv;
				w->vit_grid = ri->grid, w->vit_pixels = ri->pixels, w->vae_shape = ri->vae_shape;
				w->vae_pixels = ri->vae;
			}
			has_mask[0] |= row->gen_image_mask != NULL;
			has_mask[1] |= row->cond_vit_mask != NULL;
			has_mask[2] |= row->cond_vae_mask != NULL;
		}
	for (int i = 0; i < R; i++) {
		if (strcmp(hi3i_bot_task_names[hi3i_template_bot_task(bm->t, &rq->r[r0 + i])], bot))
			bot = "mixed";
		json_array_append(reqs, rq->r[r0 + i].obj);
	}
	if (cond_from_views(ci, v, B, 1, has_mask, bm->pad_id, bm->pad_zero, err) != 0)
		goto fail;
	text = json_dumps(reqs, JSON_COMPACT | JSON_ENSURE_ASCII);
	if (!text || json_array_size(reqs) != (size_t)R) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		goto fail;
	}
	if (hi3i_cond_set_meta(ci, "format", HI3_FORMAT_CONDITIONS, err) ||
	    hi3i_cond_set_meta(ci, "format_version", HI3_FORMAT_VERSION, err) ||
	    hi3i_cond_set_meta(ci, "mode", bm->mode, err) || hi3i_cond_set_meta(ci, "bot_task", bot, err) ||
	    hi3i_cond_set_meta(ci, "template", bm->template_name, err) ||
	    hi3i_cond_set_meta(ci, "tokenizer_hash", bm->tok_hash, err) ||
	    hi3i_cond_set_meta(ci, "model_fingerprint", bm->fingerprint, err) ||
	    hi3i_cond_set_meta_int(ci, "cfg_factor", f, err) || hi3i_cond_set_meta_int(ci, "pad_id", bm->pad_id, err) ||
	    hi3i_cond_set_meta(ci, "pad_positions", bm->pad_zero ? "zero" : "continue", err) ||
	    hi3i_cond_set_meta(ci, "requests", text, err) ||
	    (ci->c.NI && hi3i_cond_set_meta(ci, "vae_posterior", bm->vae_sample ? "sample" : "mean", err)) ||
	    (bm->next_stage && hi3i_cond_set_meta(ci, "next_stage", bm->next_stage, err)))
		goto fail;
	ci->cfg_factor = f;
	hi3i_cond_bind_meta(ci);
	free(text);
	free(v);
	json_decref(reqs);
	*out = &ci->c;
	return 0;
fail:
	free(text);
	free(v);
	json_decref(reqs);
	hi3_cond_close(&ci->c);
	return -1;
}

/* Check a row against the length bound (--max-length, else the model's
 * generation_config.json max_length, as upstream's preprocess_inputs) and
 * the vocabulary. */
static int check_encoded(const hi3_requests *rq, int i, const hi3_cond_row *row, int64_t max_length,
                         const char *bound, int64_t V, hi3_error *err)
{
	const struct hi3i_request *r = &rq->r[i];

	if (max_length > 0 && row->n > max_length)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s:%d: the row has %lld tokens, more than %s %lld", rq->name,
		                     r->line, (long long)row->n, bound, (long long)max_length);
	if (V <= 0)
		return 0;
	for (int64_t t = 0; t < row->n; t++)
		if (row->ids[t] >= V)
			return hi3_error_set(err, HI3_ERR_INPUT, "%s:%d: token id %lld (column %lld) is outside the "
			                     "vocabulary of %lld tokens", rq->name, r->line, (long long)row->ids[t],
			                     (long long)t, (long long)V);
	for (int k = 0; k < row->n_stop; k++)
		if (row->stop_tokens[k] >= V)
			return hi3_error_set(err, HI3_ERR_INPUT, "%s:%d: stop token %lld is outside the vocabulary of "
			                     "%lld tokens", rq->name, r->line, (long long)row->stop_tokens[k], (long long)V);
	return 0;
}

int hi3_cond_build(hi3_cond **out, const hi3_template *t, const hi3_requests *rq, const hi3_cond_build_opts *o,
                   hi3_error *err)
{
	return hi3i_cond_build(out, t, rq, o, NULL, NULL, err);
}

/* What a request's row is, for the one-kind-a-file check: its mode, and
 * for gen_text whether it is the text stage of a gen_image request. */
static const char *row_kind(const struct hi3i_request *r)
{
	return hi3i_request_text_stage(r) ? "the text stage of a gen_image request with image_size auto"
	                                  : r->mode == HI3I_GEN_IMAGE ? "mode gen_image" : "mode gen_text";
}

int hi3i_cond_build(hi3_cond **out, const hi3_template *t, const hi3_requests *rq, const hi3_cond_build_opts *o,
                    const hi3_cond *views, const int *views_row, hi3_error *err)
{
	int R = rq->n, f, B;
	hi3_cond_row *rows = NULL;
	hi3_cond **parts = NULL;
	struct req_images *img = NULL;
	struct build_meta bm = {0};
	const hi3_tok *tok = hi3_template_tok(t);
	const hi3_gen_defaults *gen = hi3_template_gen_defaults(t);
	int64_t max_length = o->max_length > 0 ? o->max_length : gen->max_length;
	const char *bound = o->max_length > 0 ? "--max-length" : "generation_config.json's max_length";
	int rc = -1;

	*out = NULL;
	for (int i = 1; i < R; i++)
		if (strcmp(row_kind(&rq->r[i]), row_kind(&rq->r[0])))
			return hi3_error_set(err, HI3_ERR_INPUT, "%s:%d: %s, line %d %s (a conditions file has one mode; a "
			                     "text stage that goes on to images is one of its own)", rq->name, rq->r[i].line,
			                     row_kind(&rq->r[i]), rq->r[0].line, row_kind(&rq->r[0]));
	bm.t = t;
	bm.mode = hi3i_mode_names[hi3i_request_row_mode(&rq->r[0])];
	bm.next_stage = hi3i_request_text_stage(&rq->r[0]) ? hi3i_mode_names[HI3I_GEN_IMAGE] : NULL;
	bm.views = views;
	bm.views_row = views_row;
	bm.cfg_factor = f = hi3i_template_cfg_factor(t, hi3i_request_row_mode(&rq->r[0]));
	bm.template_name = hi3_requests_need_tokenizer(rq) ? hi3_template_name(t) : "none";
	bm.tok_hash = tok ? hi3_tok_hash(tok) : "";
	bm.fingerprint = hi3_template_fingerprint(t);
	bm.pad_id = hi3_template_pad_id(t);
	bm.pad_zero = o->pad_zero;
	bm.vae_sample = o->vae_sample;
	if (bm.pad_id < 0)
		return hi3_error_set(err, HI3_ERR_USAGE, "no pad id: give --pad-id, or a model whose config.json has "
		                     "pad_token_id (or whose tokenizer_config.json names pad_token)");
	B = R * f;
	if (!(rows = hi3i_calloc((size_t)B, sizeof(*rows), err)))
		return -1;
	if (!(img = hi3i_calloc((size_t)R, sizeof(*img), err)))
		goto out;
	bm.img = img;
	for (int i = 0; !views && i < R; i++)
		if (request_images(t, rq, i, o->vit_kernel, o->max_image_pixels, &img[i], err))
			goto out;
	for (int g = 0; g < f; g++)
		for (int i = 0; i < R; i++) {
			hi3_cond_row *row = &rows[g * R + i];
			if (hi3_template_encode(t, rq, i, g > 0, row, err) != 0 ||
			    check_encoded(rq, i, row, max_length, bound, hi3i_template_vocab(t), err) != 0)
				goto out;
			row->seed = rq->r[i].has_seed ? rq->r[i].seed : o->seed_base + i;
		}
	if (!o->per_row) {
		rc = build_part(out, rq, rows, R, 0, R, &bm, err);
		goto out;
	}
	if (!(parts = hi3i_calloc((size_t)R, sizeof(*parts), err)))
		goto out;
	for (int i = 0; i < R; i++)
		if (build_part(&parts[i], rq, rows, R, i, 1, &bm, err) != 0)
			goto out;
	rc = hi3_cond_concat(out, (const hi3_cond *const *)parts, R, o->pad_zero, err);
out:
	for (int i = 0; parts && i < R; i++)
		hi3_cond_close(parts[i]);
	free(parts);
	for (int i = 0; i < B; i++)
		hi3_cond_row_release(&rows[i]);
	for (int i = 0; img && i < R; i++)
		request_images_release(&img[i]);
	free(img);
	free(rows);
	return rc;
}
