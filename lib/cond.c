/* cond.c -- conditions files (provisional reader; the full builder lands
 * with the template work). */
#include <string.h>
#include "internal.h"

static const void *get(const hi3_st *st, const char *name, hi3_dtype dt, int ndim, const int64_t *shape,
                       int optional, hi3_error *err)
{
	const hi3_tensor *t;

	if (optional && !hi3_st_find(st, name))
		return NULL;
	if (hi3_st_get(st, name, dt, ndim, shape, &t, err) != 0)
		return NULL;
	return t->data;
}

int hi3_cond_open(hi3_cond **out, const char *path, hi3_error *err)
{
	hi3_cond *c = hi3i_calloc(1, sizeof(*c), err);
	const hi3_tensor *ids, *bl, *st_t;

	*out = NULL;
	if (!c)
		return -1;
	if (hi3_st_open(&c->st, path, HI3_ST_READ, err) != 0 || hi3_st_expect_format(c->st, "hi3.conditions", err))
		goto fail;
	if (hi3_st_get(c->st, "input_ids", HI3_I64, 2, (int64_t[]){-1, -1}, &ids, err) != 0)
		goto fail;
	c->B = (int)ids->shape[0];
	c->L = (int)ids->shape[1];
	c->input_ids = ids->data;
	if (hi3_st_get(c->st, "image_blocks", HI3_I32, 3, (int64_t[]){c->B, -1, 2}, &bl, err) != 0 ||
	    hi3_st_get(c->st, "stop_tokens", HI3_I64, 2, (int64_t[]){c->B, -1}, &st_t, err) != 0)
		goto fail;
	c->S = (int)bl->shape[1];
	c->image_blocks = bl->data;
	c->NS = (int)st_t->shape[1];
	c->stop_tokens = st_t->data;
	if (!(c->position_ids = get(c->st, "position_ids", HI3_I64, 2, (int64_t[]){c->B, c->L}, 0, err)) ||
	    !(c->real_pos = get(c->st, "real_pos", HI3_I64, 1, (int64_t[]){c->B}, 0, err)) ||
	    !(c->rope_pos = get(c->st, "rope_pos", HI3_I32, 3, (int64_t[]){c->B, c->L, 2}, 0, err)) ||
	    !(c->seeds = get(c->st, "seeds", HI3_I64, 1, (int64_t[]){c->B}, 0, err)))
		goto fail;
	c->mode = hi3_st_meta(c->st, "mode");
	c->bot_task = hi3_st_meta(c->st, "bot_task");
	c->template_name = hi3_st_meta(c->st, "template");
	c->tokenizer_hash = hi3_st_meta(c->st, "tokenizer_hash");
	c->model_fingerprint = hi3_st_meta(c->st, "model_fingerprint");
	c->requests = hi3_st_meta(c->st, "requests");
	c->pad_id = -1;
	if (hi3_st_meta(c->st, "pad_id"))
		hi3i_parse_i64(hi3_st_meta(c->st, "pad_id"), -1, INT64_MAX, &c->pad_id);
	for (int i = 0; i < c->B; i++)
		if (c->real_pos[i] < 1 || c->real_pos[i] > c->L) {
			hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor 'real_pos': row %d is %lld, outside [1, %d]", path, i,
			              (long long)c->real_pos[i], c->L);
			goto fail;
		}
	*out = c;
	return 0;
fail:
	hi3_cond_close(c);
	return -1;
}

void hi3_cond_close(hi3_cond *c)
{
	if (!c)
		return;
	hi3_st_close(c->st);
	free(c);
}

int hi3_cond_check_model(const hi3_cond *c, const hi3_model *m, hi3_error *err)
{
	if (c->model_fingerprint && *c->model_fingerprint && strcmp(c->model_fingerprint, hi3_model_fingerprint(m)))
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: made for model fingerprint %s, but the model %s has %s",
		                     hi3_st_path(c->st), c->model_fingerprint, hi3_model_dir(m),
		                     hi3_model_fingerprint(m));
	return 0;
}
