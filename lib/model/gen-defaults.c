/*
 * gen-defaults.c -- generation_config.json: the sampling, template and
 * diffusion defaults of a checkpoint, with transformers' GenerationConfig
 * defaults where the file has no value.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <string.h>
#include "model/config-internal.h"

static int bad(hi3_error *err, const char *path, const char *key, const char *want, const json_t *v)
{
	return hi3_error_set(err, HI3_ERR_INPUT, "%s: field \"%s\": expected %s, found %s", path, key, want,
	                     json_is_string(v) ? "a string" : json_is_array(v) ? "a list" : json_is_object(v) ? "an object"
	                     : json_is_real(v) ? "a real number" : json_is_integer(v) ? "an integer" : "a boolean");
}

static int num(json_t *o, const char *path, const char *key, double *out, hi3_error *err)
{
	json_t *v = json_object_get(o, key);

	if (!v || json_is_null(v))
		return 0;
	if (json_is_boolean(v))
		*out = json_is_true(v);
	else if (json_is_number(v) && isfinite(json_number_value(v)))
		*out = json_number_value(v);
	else
		return bad(err, path, key, "a number", v);
	return 0;
}

static int integer(json_t *o, const char *path, const char *key, int64_t lo, int64_t *out, hi3_error *err)
{
	json_t *v = json_object_get(o, key);

	if (!v || json_is_null(v))
		return 0;
	if (!json_is_integer(v) || json_integer_value(v) < lo)
		return bad(err, path, key, lo > 0 ? "a positive integer" : "an integer >= 0", v);
	*out = json_integer_value(v);
	return 0;
}

static int flag(json_t *o, const char *path, const char *key, int *out, hi3_error *err)
{
	json_t *v = json_object_get(o, key);

	if (!v || json_is_null(v))
		return 0;
	if (!json_is_boolean(v))
		return bad(err, path, key, "true or false", v);
	*out = json_is_true(v);
	return 0;
}

static int str(json_t *o, const char *path, const char *key, char *out, size_t n, hi3_error *err)
{
	json_t *v = json_object_get(o, key);

	if (!v || json_is_null(v))
		return 0;
	if (!json_is_string(v) || strlen(json_string_value(v)) >= n)
		return bad(err, path, key, "a (short) string", v);
	snprintf(out, n, "%s", json_string_value(v));
	return 0;
}

/* eos_token_id: an id or a list of ids. */
static int eos(json_t *o, const char *path, hi3_gen_defaults *g, hi3_error *err)
{
	json_t *v = json_object_get(o, "eos_token_id"), *e;
	size_t i;

	if (!v || json_is_null(v))
		return 0;
	if (json_is_integer(v) && json_integer_value(v) >= 0) {
		g->eos_token_id[g->n_eos++] = json_integer_value(v);
		return 0;
	}
	if (!json_is_array(v) || json_array_size(v) > HI3_MAX_EOS)
		return bad(err, path, "eos_token_id", "a token id or a list of at most 8", v);
	json_array_foreach(v, i, e) {
		if (!json_is_integer(e) || json_integer_value(e) < 0)
			return bad(err, path, "eos_token_id", "a list of token ids", v);
		g->eos_token_id[g->n_eos++] = json_integer_value(e);
	}
	return 0;
}

int hi3_gen_defaults_load(hi3_gen_defaults *g, const char *dir, hi3_error *err)
{
	char *path = dir ? hi3i_asprintf("%s/generation_config.json", dir) : NULL;
	int64_t top_k = 50, steps = 50;
	json_error_t je;
	json_t *o = NULL;
	FILE *f;
	int rc = -1;

	memset(g, 0, sizeof(*g));
	snprintf(g->bot_task, sizeof(g->bot_task), "auto");
	snprintf(g->use_system_prompt, sizeof(g->use_system_prompt), "None");
	g->temperature = 1.0;
	g->top_k = 50;
	g->top_p = 1.0;
	g->max_length = -1;
	g->max_new_tokens = -1;
	g->pad_token_id = -1;
	g->diff_infer_steps = 50;
	g->diff_guidance_scale = 5.0;
	g->flow_shift = 3.0;
	if (!dir)
		return 0;
	if (!path)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	if (!(f = fopen(path, "r"))) {
		rc = errno == ENOENT ? 0 : hi3_error_set(err, HI3_ERR_INPUT, "%s: %s", path, strerror(errno));
		goto out;
	}
	fclose(f);
	if (!(o = json_load_file(path, JSON_REJECT_DUPLICATES, &je))) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s:%d:%d: not valid JSON: %s", path, je.line, je.column, je.text);
		goto out;
	}
	if (!json_is_object(o)) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: expected a JSON object", path);
		goto out;
	}
	g->present = 1;
	if (str(o, path, "sequence_template", g->sequence_template, sizeof(g->sequence_template), err) ||
	    str(o, path, "bot_task", g->bot_task, sizeof(g->bot_task), err) ||
	    str(o, path, "use_system_prompt", g->use_system_prompt, sizeof(g->use_system_prompt), err) ||
	    str(o, path, "moe_impl", g->moe_impl, sizeof(g->moe_impl), err) ||
	    flag(o, path, "drop_think", &g->drop_think, err) || flag(o, path, "do_sample", &g->do_sample, err) ||
	    num(o, path, "temperature", &g->temperature, err) || integer(o, path, "top_k", 0, &top_k, err) ||
	    num(o, path, "top_p", &g->top_p, err) || integer(o, path, "max_length", 1, &g->max_length, err) ||
	    integer(o, path, "max_new_tokens", 1, &g->max_new_tokens, err) ||
	    integer(o, path, "pad_token_id", 0, &g->pad_token_id, err) || eos(o, path, g, err) ||
	    integer(o, path, "diff_infer_steps", 1, &steps, err) ||
	    num(o, path, "diff_guidance_scale", &g->diff_guidance_scale, err) ||
	    num(o, path, "flow_shift", &g->flow_shift, err))
		goto out;
	if (top_k > INT32_MAX || steps > 1 << 20 || g->temperature < 0 || !(g->top_p > 0 && g->top_p <= 1)) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: temperature must be >= 0, top_p in (0, 1], top_k and "
		              "diff_infer_steps in range", path);
		goto out;
	}
	g->top_k = (int)top_k;
	g->diff_infer_steps = (int)steps;
	rc = 0;
out:
	json_decref(o);
	free(path);
	return rc;
}
