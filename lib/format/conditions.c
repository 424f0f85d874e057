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
#include <string.h>
#include "format/conditions.h"

/* The metadata keys, in the order they are written. */
static const char *const meta_keys[] = {"format", "format_version", "mode", "bot_task", "template",
                                        "tokenizer_hash", "model_fingerprint", "cfg_factor", "pad_id",
                                        "pad_positions", "requests", NULL};
static const char *const templates[] = {"pretrain", "instruct", "none", NULL};

const char *const hi3i_bot_task_names[] = {"auto", "image", "think", "recaption", "img_ratio", "think_recaption",
                                           NULL};
const char *const hi3i_mode_names[] = {"gen_text", "gen_image", NULL};

int hi3i_name_index(const char *const *names, const char *s)
{
	for (int i = 0; names[i]; i++)
		if (!strcmp(names[i], s))
			return i;
	return -1;
}

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

	for (int i = 0; meta_keys[i]; i++)
		if (!hi3_cond_meta(c, meta_keys[i]))
			return vbad(ci, err, "__metadata__ '%s' is missing", meta_keys[i]);
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
	rq = json_loads(c->requests, 0, &je);
	n = json_is_array(rq) ? json_array_size(rq) : 0;
	json_decref(rq);
	if (!rq || n != (size_t)(c->B / ci->cfg_factor))
		return vbad(ci, err, "__metadata__ 'requests': expected a JSON array of %d requests (B / cfg_factor)",
		            c->B / ci->cfg_factor);
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

/* A tensor of the file with the given dtype and shape (-1: any), aligned
 * for its dtype; NULL data when optional and absent. */
static int get(struct hi3i_cond *ci, const char *name, hi3_dtype dt, int ndim, const int64_t *shape, int optional,
               const hi3_tensor **out, hi3_error *err)
{
	*out = NULL;
	if (optional && !hi3_st_find(ci->c.st, name))
		return 0;
	if (hi3_st_get(ci->c.st, name, (int)dt, ndim, shape, out, err) != 0)
		return -1;
	if ((uintptr_t)(*out)->data % hi3_dtype_size(dt))
		return vbad(ci, err, "tensor '%s': data is not aligned to %zu bytes", name, hi3_dtype_size(dt));
	return 0;
}

int hi3_cond_open(hi3_cond **out, const char *path, hi3_error *err)
{
	struct hi3i_cond *ci = hi3i_cond_new(path, err);
	hi3_cond *c;
	const hi3_tensor *t;
	int64_t any2[2] = {-1, -1};

	*out = NULL;
	if (!ci)
		return -1;
	c = &ci->c;
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
	if (get(ci, "input_ids", HI3_I64, 2, any2, 0, &t, err) != 0)
		goto fail;
	if (t->shape[0] < 1 || t->shape[1] < 1 || t->shape[0] > INT32_MAX || t->shape[1] > INT32_MAX) {
		vbad(ci, err, "tensor 'input_ids': shape (%lld, %lld): B and L must be at least 1",
		     (long long)t->shape[0], (long long)t->shape[1]);
		goto fail;
	}
	c->B = (int)t->shape[0];
	c->L = (int)t->shape[1];
	c->input_ids = t->data;
	{
		const int64_t B = c->B, L = c->L;
		const int64_t s_bl[2] = {B, L}, s_b[1] = {B}, s_bl2[3] = {B, L, 2}, s_bs2[3] = {B, -1, 2},
		              s_bn[2] = {B, -1};
		const int64_t s_b2[2] = {B, 2};
		const hi3_tensor *pos, *real, *rope, *blk, *seeds, *stops, *gm, *vit, *vae, *ts, *fa, *ga, *hw;

		if (get(ci, "position_ids", HI3_I64, 2, s_bl, 0, &pos, err) ||
		    get(ci, "real_pos", HI3_I64, 1, s_b, 0, &real, err) ||
		    get(ci, "rope_pos", HI3_I32, 3, s_bl2, 0, &rope, err) ||
		    get(ci, "image_blocks", HI3_I32, 3, s_bs2, 0, &blk, err) ||
		    get(ci, "seeds", HI3_I64, 1, s_b, 0, &seeds, err) ||
		    get(ci, "stop_tokens", HI3_I64, 2, s_bn, 0, &stops, err) ||
		    get(ci, "gen_image_mask", HI3_U8, 2, s_bl, 1, &gm, err) ||
		    get(ci, "cond_vit_mask", HI3_U8, 2, s_bl, 1, &vit, err) ||
		    get(ci, "cond_vae_mask", HI3_U8, 2, s_bl, 1, &vae, err) ||
		    get(ci, "timestep_index", HI3_I64, 2, s_bn, 1, &ts, err) ||
		    get(ci, "forced_after", HI3_I64, 2, s_bn, 1, &fa, err) ||
		    get(ci, "greedy_among", HI3_I64, 2, s_bn, 1, &ga, err) ||
		    get(ci, "gen_image_hw", HI3_I32, 2, s_b2, 1, &hw, err))
			goto fail;
		c->position_ids = pos->data;
		c->real_pos = real->data;
		c->rope_pos = rope->data;
		c->image_blocks = blk->data;
		c->S = (int)blk->shape[1];
		c->seeds = seeds->data;
		c->stop_tokens = stops->data;
		c->NS = (int)stops->shape[1];
		c->gen_image_mask = gm ? gm->data : NULL;
		c->cond_vit_mask = vit ? vit->data : NULL;
		c->cond_vae_mask = vae ? vae->data : NULL;
		c->timestep_index = ts ? ts->data : NULL;
		c->K = ts ? (int)ts->shape[1] : 0;
		c->forced_after = fa ? fa->data : NULL;
		c->NF = fa ? (int)fa->shape[1] : 0;
		c->greedy_among = ga ? ga->data : NULL;
		c->NG = ga ? (int)ga->shape[1] : 0;
		c->gen_image_hw = hw ? hw->data : NULL;
	}
	{
		const int64_t any1[1] = {-1}, any3[3] = {-1, -1, -1};
		const hi3_tensor *row, *grid, *pix, *vs, *vp;
		if (get(ci, "image_row", HI3_I64, 1, any1, 1, &row, err))
			goto fail;
		if (row) {
			const int64_t s_n2[2] = {row->shape[0], 2};
			if (get(ci, "vit_grid", HI3_I32, 2, s_n2, 0, &grid, err) ||
			    get(ci, "vit_pixels", HI3_U8, 3, any3, 0, &pix, err) ||
			    get(ci, "vae_shape", HI3_I32, 2, s_n2, 0, &vs, err) ||
			    get(ci, "vae_pixels", HI3_U8, 1, any1, 0, &vp, err))
				goto fail;
			if (pix->shape[0] != row->shape[0] || row->shape[0] > INT32_MAX || pix->shape[1] < 1 ||
			    pix->shape[1] > (1 << 20) || pix->shape[2] < 1 || pix->shape[2] > (1 << 20)) {
				vbad(ci, err, "tensor 'vit_pixels': shape (%lld, %lld, %lld): expected (%lld images, P, D)",
				     (long long)pix->shape[0], (long long)pix->shape[1], (long long)pix->shape[2],
				     (long long)row->shape[0]);
				goto fail;
			}
			c->NI = (int)row->shape[0];
			c->VP = (int)pix->shape[1];
			c->VD = (int)pix->shape[2];
			c->image_row = row->data;
			c->vit_grid = grid->data;
			c->vit_pixels = pix->data;
			c->vae_shape = vs->data;
			c->vae_pixels = vp->data;
			c->NV = vp->shape[0];
			/* the encoder outputs (tokenize-concat --encode): all three or none */
			{
				const int64_t s_n3[2] = {row->shape[0], 3}, s_emb[3] = {row->shape[0], pix->shape[1], -1};
				const hi3_tensor *emb, *ls, *lat;
				if (get(ci, "vit_embeds", HI3_F32, 3, s_emb, 1, &emb, err) ||
				    get(ci, "latent_shape", HI3_I32, 2, s_n3, 1, &ls, err) ||
				    get(ci, "vae_latents", HI3_F32, 1, any1, 1, &lat, err))
					goto fail;
				if ((emb != NULL) != (ls != NULL) || (emb != NULL) != (lat != NULL)) {
					vbad(ci, err, "tensors 'vit_embeds', 'latent_shape' and 'vae_latents': give all three "
					     "(the images' encoder outputs) or none");
					goto fail;
				}
				if (emb && (emb->shape[2] < 1 || emb->shape[2] > (1 << 20))) {
					vbad(ci, err, "tensor 'vit_embeds': a width of %lld", (long long)emb->shape[2]);
					goto fail;
				}
				if (emb) {
					c->VE = (int)emb->shape[2];
					c->vit_embeds = emb->data;
					c->latent_shape = ls->data;
					c->vae_latents = lat->data;
					c->NZ = lat->shape[0];
				}
			}
		} else if (hi3_st_find(c->st, "vit_grid") || hi3_st_find(c->st, "vit_pixels") ||
		           hi3_st_find(c->st, "vae_shape") || hi3_st_find(c->st, "vae_pixels") ||
		           hi3_st_find(c->st, "vit_embeds") || hi3_st_find(c->st, "vae_latents")) {
			vbad(ci, err, "tensor 'image_row' is missing (the file has cond image pixels)");
			goto fail;
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
	hi3_st_writer *w = hi3_stw_new();
	int64_t B = c->B, L = c->L;
	const int64_t s_bl[2] = {B, L}, s_b[1] = {B}, s_bl2[3] = {B, L, 2}, s_bs2[3] = {B, c->S, 2},
	              s_bns[2] = {B, c->NS}, s_bk[2] = {B, c->K}, s_bf[2] = {B, c->NF}, s_bg[2] = {B, c->NG};
	const char *k, *v;
	json_t *jv;
	int rc = -1, bad = 0;

	if (!w)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	bad |= hi3_stw_add(w, "input_ids", HI3_I64, 2, s_bl, c->input_ids);
	bad |= hi3_stw_add(w, "position_ids", HI3_I64, 2, s_bl, c->position_ids);
	bad |= hi3_stw_add(w, "real_pos", HI3_I64, 1, s_b, c->real_pos);
	bad |= hi3_stw_add(w, "rope_pos", HI3_I32, 3, s_bl2, c->rope_pos);
	bad |= hi3_stw_add(w, "image_blocks", HI3_I32, 3, s_bs2, c->image_blocks);
	bad |= hi3_stw_add(w, "seeds", HI3_I64, 1, s_b, c->seeds);
	bad |= hi3_stw_add(w, "stop_tokens", HI3_I64, 2, s_bns, c->stop_tokens);
	if (c->gen_image_mask)
		bad |= hi3_stw_add(w, "gen_image_mask", HI3_U8, 2, s_bl, c->gen_image_mask);
	if (c->cond_vit_mask)
		bad |= hi3_stw_add(w, "cond_vit_mask", HI3_U8, 2, s_bl, c->cond_vit_mask);
	if (c->cond_vae_mask)
		bad |= hi3_stw_add(w, "cond_vae_mask", HI3_U8, 2, s_bl, c->cond_vae_mask);
	if (c->timestep_index)
		bad |= hi3_stw_add(w, "timestep_index", HI3_I64, 2, s_bk, c->timestep_index);
	if (c->forced_after)
		bad |= hi3_stw_add(w, "forced_after", HI3_I64, 2, s_bf, c->forced_after);
	if (c->greedy_among)
		bad |= hi3_stw_add(w, "greedy_among", HI3_I64, 2, s_bg, c->greedy_among);
	if (c->gen_image_hw)
		bad |= hi3_stw_add(w, "gen_image_hw", HI3_I32, 2, (const int64_t[]){B, 2}, c->gen_image_hw);
	if (c->NI) {
		const int64_t s_n[1] = {c->NI}, s_n2[2] = {c->NI, 2}, s_npd[3] = {c->NI, c->VP, c->VD};
		bad |= hi3_stw_add(w, "image_row", HI3_I64, 1, s_n, c->image_row);
		bad |= hi3_stw_add(w, "vit_grid", HI3_I32, 2, s_n2, c->vit_grid);
		bad |= hi3_stw_add(w, "vit_pixels", HI3_U8, 3, s_npd, c->vit_pixels);
		bad |= hi3_stw_add(w, "vae_shape", HI3_I32, 2, s_n2, c->vae_shape);
		bad |= hi3_stw_add(w, "vae_pixels", HI3_U8, 1, &c->NV, c->vae_pixels);
		if (c->vit_embeds) {
			const int64_t s_emb[3] = {c->NI, c->VP, c->VE}, s_n3[2] = {c->NI, 3};
			bad |= hi3_stw_add(w, "vit_embeds", HI3_F32, 3, s_emb, c->vit_embeds);
			bad |= hi3_stw_add(w, "latent_shape", HI3_I32, 2, s_n3, c->latent_shape);
			bad |= hi3_stw_add(w, "vae_latents", HI3_F32, 1, &c->NZ, c->vae_latents);
		}
	}
	for (int i = 0; meta_keys[i]; i++)
		if ((v = hi3_cond_meta(c, meta_keys[i])))
			bad |= hi3_stw_meta(w, meta_keys[i], v);
	json_object_foreach(ci->meta, k, jv) {
		if (hi3i_name_index(meta_keys, k) < 0)
			bad |= hi3_stw_meta(w, k, json_string_value(jv));
	}
	if (bad)
		hi3_error_set(err, HI3_ERR_RUNTIME, "%s: cannot add the tensors (out of memory)", path);
	else
		rc = hi3_stw_write(w, path, err);
	hi3_stw_free(w);
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
