/*
 * conditions.c -- the conditions file (format hi3.conditions, hi3-files(5)):
 * open and validate, write. Building, merging and selecting rows is
 * cond/batch.c's.
 *
 * Dimension letters: B rows, L columns (right padded), S full-attention
 * blocks per row, NS stop tokens per row, K <timestep> indices per row,
 * R requests (B = R * cfg_factor).
 *
 * hi3-batching(7), rule 1: position_ids[b, t] = t on every column,
 * pads included; only the pad_zero ablation writes 0 at pad columns.
 */
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include "format/conditions.h"

enum { B_, L_, S_, NS_, K_, NF_, NG_, NI_, VP_, VD_, NV_, VE_, NZ_, N_DIMS };

#define F(x) (int)offsetof(hi3_cond, x)
static const struct hi3i_ftensor tensors[] = {
	{"input_ids", "I64", "B,L", 0, F(input_ids), -1},
	{"position_ids", "I64", "B,L", 0, F(position_ids), -1},
	{"real_pos", "I64", "B", 0, F(real_pos), -1},
	{"rope_pos", "I32", "B,L,2", 0, F(rope_pos), -1},
	{"image_blocks", "I32", "B,S,2", 0, F(image_blocks), -1},
	{"seeds", "I64", "B", 0, F(seeds), -1},
	{"stop_tokens", "I64", "B,NS", 0, F(stop_tokens), -1},
	{"gen_image_mask", "U8", "B,L", 1, F(gen_image_mask), -1},
	{"cond_vit_mask", "U8", "B,L", 2, F(cond_vit_mask), -1},
	{"cond_vae_mask", "U8", "B,L", 3, F(cond_vae_mask), -1},
	{"timestep_index", "I64", "B,K", 4, F(timestep_index), -1},
	{"forced_after", "I64", "B,NF", 5, F(forced_after), -1},
	{"greedy_among", "I64", "B,NG", 6, F(greedy_among), -1},
	{"gen_image_hw", "I32", "B,2", 7, F(gen_image_hw), -1},
	/* the cond images' pixels */
	{"image_row", "I64", "NI", 8, F(image_row), -1},
	{"vit_grid", "I32", "NI,2", 8, F(vit_grid), -1},
	{"vit_pixels", "U8", "NI,VP,VD", 8, F(vit_pixels), -1},
	{"vae_shape", "I32", "NI,2", 8, F(vae_shape), -1},
	{"vae_pixels", "U8", "NV", 8, F(vae_pixels), -1},
	/* and their encoder outputs (tokenize-concat --encode) */
	{"vit_embeds", "F32", "NI,VP,VE", 9, F(vit_embeds), -1},
	{"latent_shape", "I32", "NI,3", 9, F(latent_shape), -1},
	{"vae_latents", "F32", "NZ", 9, F(vae_latents), -1},
	{0},
};
#undef F
/* In the order they are written; the values are checked by check_meta. */
static const struct hi3i_fmeta meta[] = {
	{"mode", "text", 1, -1}, {"bot_task", "text", 1, -1}, {"template", "text", 1, -1},
	{"tokenizer_hash", "text", 1, -1}, {"model_fingerprint", "text", 1, -1}, {"cfg_factor", "text", 1, -1},
	{"pad_id", "text", 1, -1}, {"pad_positions", "text", 1, -1}, {"requests", "text", 1, -1},
	{"vae_posterior", "mean|sample", 0, -1},
	/* the text stage of gen_image requests with image_size auto, and the
	 * image stage made from it (tokenize-concat --continue) */
	{"next_stage", "gen_image", 0, -1},
	{"text_conditions_hash", "text", 0, -1}, {"text_segment_hash", "text", 0, -1}, {"text_rows", "text", 0, -1},
	{0},
};
const struct hi3i_format hi3i_format_conditions = {
	HI3_FORMAT_CONDITIONS, "CONDITIONS",
	(const char *const[]){"B", "L", "S", "NS", "K", "NF", "NG", "NI", "VP", "VD", "NV", "VE", "NZ", NULL},
	tensors, meta, 1, 0,
};

static const char *const templates[] = {"pretrain", "instruct", "none", NULL};

const char *const hi3i_bot_task_names[] = {"auto", "image", "think", "recaption", "img_ratio", "think_recaption",
                                           NULL};
const char *const hi3i_mode_names[] = {"gen_text", "gen_image", NULL};

struct hi3i_cond *hi3i_cond_new(const char *name, hi3_error *err)
{
	struct hi3i_cond *ci = hi3i_calloc(1, sizeof(*ci), err);

	if (!ci)
		return NULL;
	ci->name = hi3i_strdup(name);
	ci->meta = json_object();
	if (!ci->name || !ci->meta) {
		hi3_cond_close(&ci->c);
		hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		return NULL;
	}
	return ci;
}

void hi3_cond_close(hi3_cond *c)
{
	struct hi3i_cond *ci = HI3I_COND(c);

	if (!c)
		return;
	hi3_st_close(c->st);
	for (int i = 0; i < T_COUNT; i++)
		free(ci->buf[i]);
	json_decref(ci->meta);
	free(ci->name);
	free(ci);
}

const char *hi3_cond_meta(const hi3_cond *c, const char *key)
{
	return json_string_value(json_object_get(HI3I_COND(c)->meta, key));
}

int hi3_cond_cfg_factor(const hi3_cond *c) { return HI3I_COND(c)->cfg_factor; }

/* Point the string fields of c at the metadata. */
void hi3i_cond_bind_meta(struct hi3i_cond *ci)
{
	hi3_cond *c = &ci->c;

	c->mode = hi3_cond_meta(c, "mode");
	c->bot_task = hi3_cond_meta(c, "bot_task");
	c->template_name = hi3_cond_meta(c, "template");
	c->tokenizer_hash = hi3_cond_meta(c, "tokenizer_hash");
	c->model_fingerprint = hi3_cond_meta(c, "model_fingerprint");
	c->requests = hi3_cond_meta(c, "requests");
}

int hi3i_cond_set_meta(struct hi3i_cond *ci, const char *key, const char *val, hi3_error *err)
{
	if (json_object_set_new(ci->meta, key, json_string(val)) != 0)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	return 0;
}

int hi3i_cond_set_meta_int(struct hi3i_cond *ci, const char *key, int64_t v, hi3_error *err)
{
	char buf[32];

	snprintf(buf, sizeof(buf), "%lld", (long long)v);
	return hi3i_cond_set_meta(ci, key, buf, err);
}

/* ------------------------------------------------------------ validation */

static int vbad(const struct hi3i_cond *ci, hi3_error *err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int vbad(const struct hi3i_cond *ci, hi3_error *err, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return hi3_error_set(err, HI3_ERR_INPUT, "%s: %s", ci->name, msg);
}

static int check_meta(struct hi3i_cond *ci, hi3_error *err)
{
	hi3_cond *c = &ci->c;
	const char *v;
	int64_t x;
	json_t *rq;
	json_error_t je;
	size_t n;

	for (const struct hi3i_fmeta *m = meta; m->key; m++)
		if (m->required && !hi3_cond_meta(c, m->key))
			return vbad(ci, err, "__metadata__ '%s' is missing", m->key);
	if (strcmp(c->mode, "gen_text") && strcmp(c->mode, "gen_image"))
		return vbad(ci, err, "__metadata__ 'mode': expected gen_text or gen_image, found '%s'", c->mode);
	if (hi3i_name_index(hi3i_bot_task_names, c->bot_task) < 0 && strcmp(c->bot_task, "mixed"))
		return vbad(ci, err, "__metadata__ 'bot_task': expected auto, image, think, recaption, img_ratio, "
		            "think_recaption or mixed, found '%s'", c->bot_task);
	if (hi3i_name_index(templates, c->template_name) < 0)
		return vbad(ci, err, "__metadata__ 'template': expected pretrain, instruct or none, found '%s'",
		            c->template_name);
	v = hi3_cond_meta(c, "cfg_factor");
	if (hi3i_parse_i64(v, 1, 64, &x) != 0 || c->B % x != 0)
		return vbad(ci, err, "__metadata__ 'cfg_factor': expected an integer in [1, 64] dividing B = %d, "
		            "found '%s'", c->B, v);
	ci->cfg_factor = (int)x;
	v = hi3_cond_meta(c, "pad_id");
	if (hi3i_parse_i64(v, 0, INT64_MAX, &c->pad_id) != 0)
		return vbad(ci, err, "__metadata__ 'pad_id': expected a non-negative integer, found '%s'", v);
	v = hi3_cond_meta(c, "pad_positions");
	if (strcmp(v, "continue") && strcmp(v, "zero"))
		return vbad(ci, err, "__metadata__ 'pad_positions': expected continue or zero, found '%s'", v);
	rq = json_loads(c->requests, JSON_ALLOW_NUL, &je);
	n = json_is_array(rq) ? json_array_size(rq) : 0;
	json_decref(rq);
	if (!rq || n != (size_t)(c->B / ci->cfg_factor))
		return vbad(ci, err, "__metadata__ 'requests': expected a JSON array of %d requests (B / cfg_factor)",
		            c->B / ci->cfg_factor);
	if (hi3_cond_meta(c, "next_stage") && strcmp(c->mode, "gen_text"))
		return vbad(ci, err, "__metadata__ 'next_stage': only a gen_text stage goes on to another, found mode '%s'",
		            c->mode);
	if ((v = hi3_cond_meta(c, "text_rows"))) {
		json_t *e;
		size_t i;
		int good;
		rq = json_loads(v, 0, &je);
		good = json_is_array(rq) && json_array_size(rq) == (size_t)(c->B / ci->cfg_factor);
		json_array_foreach(rq, i, e)
			good &= json_is_integer(e) && json_integer_value(e) >= 0;
		json_decref(rq);
		if (!good)
			return vbad(ci, err, "__metadata__ 'text_rows': expected a JSON array of %d row indices (B / "
			            "cfg_factor)", c->B / ci->cfg_factor);
	}
	return 0;
}

static int check_mask(const struct hi3i_cond *ci, const char *name, const uint8_t *m, hi3_error *err)
{
	const hi3_cond *c = &ci->c;

	if (!m)
		return 0;
	for (int b = 0; b < c->B; b++)
		for (int t = 0; t < c->L; t++) {
			uint8_t v = m[(size_t)b * c->L + t];
			if (v > 1 || (v && t >= c->real_pos[b]))
				return vbad(ci, err, "tensor '%s': row %d, column %d: expected %s, found %u", name, b, t,
				            t >= c->real_pos[b] ? "0 (a pad column)" : "0 or 1", v);
		}
	return 0;
}

/* Entries of a -1 padded list: values first, then only -1. */
static int check_list(const struct hi3i_cond *ci, const char *name, const int64_t *v, int n, int b, int64_t lo,
                      int64_t hi, int increasing, hi3_error *err)
{
	int end = 0;

	for (int k = 0; k < n; k++) {
		int64_t x = v[(size_t)b * n + k];
		if (x == -1) {
			end = 1;
			continue;
		}
		if (end)
			return vbad(ci, err, "tensor '%s': row %d: entry %d is %lld after a -1 (the -1 padding must "
			            "come last)", name, b, k, (long long)x);
		if (x < lo || x > hi)
			return vbad(ci, err, "tensor '%s': row %d: entry %d is %lld, expected -1 or [%lld, %lld]", name,
			            b, k, (long long)x, (long long)lo, (long long)hi);
		if (increasing && k > 0 && x <= v[(size_t)b * n + k - 1])
			return vbad(ci, err, "tensor '%s': row %d: entry %d (%lld) is not after entry %d", name, b, k,
			            (long long)x, k - 1);
	}
	return 0;
}

/* A -1 padded list of rule records (trigger, k, id_1 .. id_k). */
static int check_rules(const struct hi3i_cond *ci, const char *name, const int64_t *v, int n, int b, hi3_error *err)
{
	int k = 0;

	if (!v)
		return 0;
	v += (size_t)b * n;
	while (k < n && v[k] != -1) {
		if (v[k] < 0 || k + 1 >= n || v[k + 1] < 1 || v[k + 1] > n - k - 2)
			return vbad(ci, err, "tensor '%s': row %d: entry %d does not start a record (token, count >= 1, "
			            "that many ids)", name, b, k);
		for (int j = 0; j < v[k + 1]; j++)
			if (v[k + 2 + j] < 0)
				return vbad(ci, err, "tensor '%s': row %d: entry %lld is %lld, expected a token id", name, b,
				            (long long)(k + 2 + j), (long long)v[k + 2 + j]);
		k += 2 + (int)v[k + 1];
	}
	for (; k < n; k++)
		if (v[k] != -1)
			return vbad(ci, err, "tensor '%s': row %d: entry %d is %lld after the -1 padding", name, b, k,
			            (long long)v[k]);
	return 0;
}

static int check_row(const struct hi3i_cond *ci, int b, int pad_zero, hi3_error *err)
{
	const hi3_cond *c = &ci->c;
	int64_t n = c->real_pos[b], prev_stop = 0;
	int unused = 0;

	if (n < 1 || n > c->L)
		return vbad(ci, err, "tensor 'real_pos': row %d: expected a value in [1, %d], found %lld", b, c->L,
		            (long long)n);
	for (int t = 0; t < c->L; t++) {
		size_t i = (size_t)b * c->L + t;
		int64_t want_pos = t >= n && pad_zero ? 0 : t;
		if (c->position_ids[i] != want_pos)
			return vbad(ci, err, "tensor 'position_ids': row %d, column %d: expected %lld (%s), found %lld", b,
			            t, (long long)want_pos, t < n ? "its own index" : pad_zero ? "pad_positions zero"
			            : "a pad continues its row's indices", (long long)c->position_ids[i]);
		if (t < n && c->input_ids[i] < 0)
			return vbad(ci, err, "tensor 'input_ids': row %d, column %d: negative token id %lld", b, t,
			            (long long)c->input_ids[i]);
		if (t >= n && c->input_ids[i] != c->pad_id)
			return vbad(ci, err, "tensor 'input_ids': row %d, column %d: expected the pad id %lld at a pad "
			            "column, found %lld", b, t, (long long)c->pad_id, (long long)c->input_ids[i]);
		if (t < n ? c->rope_pos[2 * i] < 0 || c->rope_pos[2 * i + 1] < 0
		          : c->rope_pos[2 * i] != t || c->rope_pos[2 * i + 1] != t)
			return vbad(ci, err, "tensor 'rope_pos': row %d, column %d: expected %s, found (%d, %d)", b, t,
			            t < n ? "non-negative (y, x)" : "(t, t) at a pad column", c->rope_pos[2 * i],
			            c->rope_pos[2 * i + 1]);
	}
	for (int s = 0; s < c->S; s++) {
		int32_t lo = c->image_blocks[((size_t)b * c->S + s) * 2], hi = c->image_blocks[((size_t)b * c->S + s) * 2 + 1];
		if (lo == hi && lo >= 0 && lo <= c->L) {
			unused = 1;
			continue;
		}
		if (unused || lo < prev_stop || lo > hi || hi > n)
			return vbad(ci, err, "tensor 'image_blocks': row %d, block %d: [%d, %d) is not %s", b, s, lo, hi,
			            unused ? "unused (used blocks must come first)"
			                   : "an ordered, non-overlapping block inside the row's real columns");
		prev_stop = hi;
	}
	if (check_rules(ci, "forced_after", c->forced_after, c->NF, b, err) ||
	    check_rules(ci, "greedy_among", c->greedy_among, c->NG, b, err))
		return -1;
	if (check_list(ci, "stop_tokens", c->stop_tokens, c->NS, b, 0, INT64_MAX, 0, err) ||
	    (c->timestep_index && check_list(ci, "timestep_index", c->timestep_index, c->K, b, 0, n - 1, 1, err)))
		return -1;
	return 0;
}

/* The cond images: rows in order, grids that fit, and each row's images
 * one to one with its runs of cond_vit_mask columns, VP columns each. */
static int check_images(const struct hi3i_cond *ci, hi3_error *err)
{
	const hi3_cond *c = &ci->c;
	int k = 0;
	int64_t nv = 0;

	if (!c->NI)
		return 0;
	if (!c->cond_vit_mask)
		return vbad(ci, err, "tensor 'vit_pixels': %d images but no 'cond_vit_mask' to place them", c->NI);
	for (int i = 0; i < c->NI; i++) {
		const int32_t gh = c->vit_grid[2 * i], gw = c->vit_grid[2 * i + 1];
		if (c->image_row[i] < 0 || c->image_row[i] >= c->B || (i && c->image_row[i] < c->image_row[i - 1]))
			return vbad(ci, err, "tensor 'image_row': entry %d is %lld: expected rows in [0, %d) in order", i,
			            (long long)c->image_row[i], c->B);
		if (gh < 1 || gw < 1 || (int64_t)gh * gw > c->VP)
			return vbad(ci, err, "tensor 'vit_grid': image %d: a %d x %d patch grid in %d slots", i, gh, gw,
			            c->VP);
		if (c->vae_shape[2 * i] < 1 || c->vae_shape[2 * i + 1] < 1 || c->vae_shape[2 * i] > (1 << 16) ||
		    c->vae_shape[2 * i + 1] > (1 << 16))
			return vbad(ci, err, "tensor 'vae_shape': image %d: (%d, %d) is not an image size", i,
			            c->vae_shape[2 * i], c->vae_shape[2 * i + 1]);
		nv += (int64_t)c->vae_shape[2 * i] * c->vae_shape[2 * i + 1] * 3;
	}
	if (nv != c->NV)
		return vbad(ci, err, "tensor 'vae_pixels': %lld bytes, but the images of 'vae_shape' take %lld",
		            (long long)c->NV, (long long)nv);
	if (c->vit_embeds) {
		int64_t nz = 0;
		for (int i = 0; i < c->NI; i++) {
			const int32_t *z = c->latent_shape + 3 * i, *vs = c->vae_shape + 2 * i;
			/* (Z, h, w): the view's size h f x w f for one factor f */
			if (z[0] < 1 || z[0] > 4096 || z[1] < 1 || z[2] < 1 || vs[0] % z[1] || vs[1] % z[2] ||
			    vs[0] / z[1] != vs[1] / z[2])
				return vbad(ci, err, "tensor 'latent_shape': image %d: (%d, %d, %d) is not a latent of its %d x "
				            "%d VAE view", i, z[0], z[1], z[2], vs[0], vs[1]);
			nz += (int64_t)z[0] * z[1] * z[2];
		}
		if (nz != c->NZ)
			return vbad(ci, err, "tensor 'vae_latents': %lld values, but the latents of 'latent_shape' take %lld",
			            (long long)c->NZ, (long long)nz);
	}
	for (int b = 0; b < c->B; b++) {
		const uint8_t *m = c->cond_vit_mask + (size_t)b * c->L;
		int n = 0, have = 0;
		for (int t = 0; t < c->L; t++)
			n += m[t];
		while (k < c->NI && c->image_row[k] == b)
			k++, have++;
		if ((int64_t)have * c->VP != n)
			return vbad(ci, err, "row %d: %d cond_vit_mask columns, but %d images of %d ViT slots", b, n, have,
			            c->VP);
	}
	return 0;
}

static int validate(struct hi3i_cond *ci, hi3_error *err)
{
	const hi3_cond *c = &ci->c;
	int pad_zero;

	if (check_meta(ci, err) != 0)
		return -1;
	pad_zero = !strcmp(hi3_cond_meta(c, "pad_positions"), "zero");
	for (int b = 0; b < c->B; b++)
		if (check_row(ci, b, pad_zero, err) != 0)
			return -1;
	if (!strcmp(c->mode, "gen_image") && !c->gen_image_mask)
		return vbad(ci, err, "tensor 'gen_image_mask' is missing (mode gen_image)");
	for (int b = 0; c->gen_image_hw && b < c->B; b++) {
		int32_t h = c->gen_image_hw[2 * b], w = c->gen_image_hw[2 * b + 1];
		int64_t n = 0;
		for (int t = 0; c->gen_image_mask && t < c->L; t++)
			n += c->gen_image_mask[(size_t)b * c->L + t];
		if (h < 0 || w < 0 || (int64_t)h * w != n)
			return vbad(ci, err, "tensor 'gen_image_hw': row %d: (%d, %d) is not the grid of its %lld "
			            "generated image tokens", b, h, w, (long long)n);
	}
	if (check_mask(ci, "gen_image_mask", c->gen_image_mask, err) ||
	    check_mask(ci, "cond_vit_mask", c->cond_vit_mask, err) ||
	    check_mask(ci, "cond_vae_mask", c->cond_vae_mask, err) || check_images(ci, err))
		return -1;
	return 0;
}

/* ----------------------------------------------------------------- open */

int hi3_cond_open(hi3_cond **out, const char *path, hi3_error *err)
{
	struct hi3i_cond *ci = hi3i_cond_new(path, err);
	int64_t dims[N_DIMS];
	hi3_cond *c;

	*out = NULL;
	if (!ci)
		return -1;
	c = &ci->c;
	for (int i = 0; i < N_DIMS; i++)
		dims[i] = -1;
	if (hi3_st_open(&c->st, path, HI3_ST_READ, err) != 0 ||
	    hi3_st_expect_format(c->st, HI3_FORMAT_CONDITIONS, err) != 0)
		goto fail;
	for (int i = 0; i < hi3_st_meta_count(c->st); i++) {
		const char *k, *v;
		hi3_st_meta_at(c->st, i, &k, &v);
		if (hi3i_cond_set_meta(ci, k, v, err) != 0)
			goto fail;
	}
	hi3i_cond_bind_meta(ci);
	/* the images' tensors come with image_row, their encoder outputs all three or none */
	if (!hi3_st_find(c->st, "image_row") &&
	    (hi3_st_find(c->st, "vit_grid") || hi3_st_find(c->st, "vit_pixels") || hi3_st_find(c->st, "vae_shape") ||
	     hi3_st_find(c->st, "vae_pixels") || hi3_st_find(c->st, "vit_embeds") || hi3_st_find(c->st, "vae_latents"))) {
		vbad(ci, err, "tensor 'image_row' is missing (the file has cond image pixels)");
		goto fail;
	}
	if (hi3_st_find(c->st, "image_row") && (!hi3_st_find(c->st, "vit_embeds") != !hi3_st_find(c->st, "latent_shape") ||
	                                        !hi3_st_find(c->st, "vit_embeds") != !hi3_st_find(c->st, "vae_latents"))) {
		vbad(ci, err, "tensors 'vit_embeds', 'latent_shape' and 'vae_latents': give all three (the images' encoder "
		     "outputs) or none");
		goto fail;
	}
	if (hi3i_codec_read(&hi3i_format_conditions, c->st, c, dims, err) != 0)
		goto fail;
	if (dims[B_] < 1 || dims[L_] < 1 || dims[B_] > INT32_MAX || dims[L_] > INT32_MAX) {
		vbad(ci, err, "tensor 'input_ids': shape (%lld, %lld): B and L must be at least 1", (long long)dims[B_],
		     (long long)dims[L_]);
		goto fail;
	}
	c->B = (int)dims[B_];
	c->L = (int)dims[L_];
	c->S = (int)dims[S_];
	c->NS = (int)dims[NS_];
	c->K = c->timestep_index ? (int)dims[K_] : 0;
	c->NF = c->forced_after ? (int)dims[NF_] : 0;
	c->NG = c->greedy_among ? (int)dims[NG_] : 0;
	if (c->image_row) {
		if (dims[NI_] > INT32_MAX || dims[VP_] < 1 || dims[VP_] > (1 << 20) || dims[VD_] < 1 ||
		    dims[VD_] > (1 << 20)) {
			vbad(ci, err, "tensor 'vit_pixels': shape (%lld, %lld, %lld): expected (%lld images, P, D)",
			     (long long)dims[NI_], (long long)dims[VP_], (long long)dims[VD_], (long long)dims[NI_]);
			goto fail;
		}
		c->NI = (int)dims[NI_];
		c->VP = (int)dims[VP_];
		c->VD = (int)dims[VD_];
		c->NV = dims[NV_];
		if (c->vit_embeds && (dims[VE_] < 1 || dims[VE_] > (1 << 20))) {
			vbad(ci, err, "tensor 'vit_embeds': a width of %lld", (long long)dims[VE_]);
			goto fail;
		}
		if (c->vit_embeds) {
			c->VE = (int)dims[VE_];
			c->NZ = dims[NZ_];
		}
	}
	if (validate(ci, err) != 0)
		goto fail;
	*out = c;
	return 0;
fail:
	hi3_cond_close(c);
	return -1;
}

int hi3i_cond_check_facts(const hi3_cond *c, const struct hi3i_model_facts *m, hi3_error *err)
{
	const char *fp = m->fingerprint;
	int64_t V = m->vocab;
	const char *name = HI3I_COND(c)->name;

	if (c->model_fingerprint[0] && strcmp(c->model_fingerprint, fp))
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: made for model fingerprint %s, but the model %s has "
		                     "fingerprint %s", name, c->model_fingerprint, m->dir, fp);
	for (int b = 0; b < c->B; b++) {
		for (int t = 0; t < c->L; t++)
			if (c->input_ids[(size_t)b * c->L + t] >= V)
				return hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor 'input_ids': row %d, column %d: token "
				                     "id %lld is outside the model's vocabulary of %lld", name, b, t,
				                     (long long)c->input_ids[(size_t)b * c->L + t], (long long)V);
		for (int k = 0; k < c->NS; k++)
			if (c->stop_tokens[(size_t)b * c->NS + k] >= V)
				return hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor 'stop_tokens': row %d: token id %lld "
				                     "is outside the model's vocabulary of %lld", name, b,
				                     (long long)c->stop_tokens[(size_t)b * c->NS + k], (long long)V);
		for (int r = 0; r < 2; r++) {
			const int64_t *v = r ? c->greedy_among : c->forced_after;
			int n = r ? c->NG : c->NF;
			for (int k = 0; v && k < n; k++)
				if (v[(size_t)b * n + k] >= V)
					return hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor '%s': row %d: token id %lld is outside "
					                     "the model's vocabulary of %lld", name, r ? "greedy_among" : "forced_after",
					                     b, (long long)v[(size_t)b * n + k], (long long)V);
		}
	}
	return 0;
}

int hi3_cond_vit_image(const hi3_cond *c, int k, uint8_t **rgb, int *w, int *h, hi3_error *err)
{
	int p = 1;

	*rgb = NULL;
	if (k < 0 || k >= c->NI)
		return hi3_error_set(err, HI3_ERR_USAGE, "%s: image %d of %d", HI3I_COND(c)->name, k, c->NI);
	while (3 * (p + 1) * (p + 1) <= c->VD)
		p++;
	if (3 * p * p != c->VD)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor 'vit_pixels': %d features are not 3 channels of a "
		                     "square patch", HI3I_COND(c)->name, c->VD);
	*h = c->vit_grid[2 * k] * p;
	*w = c->vit_grid[2 * k + 1] * p;
	if (!(*rgb = hi3i_malloc((size_t)*h * *w * 3, err)))
		return -1;
	for (int gy = 0; gy < c->vit_grid[2 * k]; gy++)
		for (int gx = 0; gx < c->vit_grid[2 * k + 1]; gx++)
			for (int py = 0; py < p; py++)
				memcpy(*rgb + ((size_t)(gy * p + py) * *w + (size_t)gx * p) * 3,
				       c->vit_pixels + ((size_t)k * c->VP + (size_t)gy * c->vit_grid[2 * k + 1] + gx) * c->VD +
				           (size_t)py * p * 3, (size_t)p * 3);
	return 0;
}

/* ----------------------------------------------------------------- write */

int hi3_cond_write(const hi3_cond *c, const char *path, hi3_error *err)
{
	const struct hi3i_cond *ci = HI3I_COND(c);
	const int64_t dims[N_DIMS] = {c->B, c->L, c->S, c->NS, c->K, c->NF, c->NG, c->NI, c->VP, c->VD, c->NV, c->VE,
	                              c->NZ};
	const char *(*m)[2] = NULL, *k;
	size_t n = 0;
	json_t *jv;
	int rc;

	/* the table's keys in its order, then any other the conditions carry */
	if (!(m = hi3i_calloc(json_object_size(ci->meta) + HI3_ARRAY_SIZE(meta), sizeof(*m), err)))
		return -1;
	for (const struct hi3i_fmeta *e = meta; e->key; e++)
		if (hi3_cond_meta(c, e->key)) {
			m[n][0] = e->key;
			m[n++][1] = hi3_cond_meta(c, e->key);
		}
	json_object_foreach(ci->meta, k, jv) {
		if (strcmp(k, "format") && strcmp(k, "format_version") && !hi3i_codec_meta(&hi3i_format_conditions, k)) {
			m[n][0] = k;
			m[n++][1] = json_string_value(jv);
		}
	}
	rc = hi3i_codec_write(&hi3i_format_conditions, c, dims, (const char *const (*)[2])m, n, path, err);
	free(m);
	return rc;
}

int hi3i_cond_require_pixels(const hi3_cond *c, hi3_error *err)
{
	int tokens = 0;

	for (size_t i = 0; !c->NI && i < (size_t)c->B * c->L; i++)
		tokens |= (c->cond_vit_mask && c->cond_vit_mask[i]) || (c->cond_vae_mask && c->cond_vae_mask[i]);
	if (tokens)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: conditions hold cond image tokens but no pixels (requests "
		                     "with 'cond_images' sizes; give 'images' files instead): running them as text "
		                     "would be wrong", HI3I_COND(c)->name);
	return 0;
}

int hi3i_cond_require_text(const hi3_cond *c, const char *what, hi3_error *err)
{
	if (c->mode && strcmp(c->mode, "gen_text"))
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: conditions in mode '%s': only gen_text rows can be "
		                     "%s (image generation is diffusion-capture's)", HI3I_COND(c)->name, c->mode, what);
	return hi3i_cond_require_pixels(c, err);
}
