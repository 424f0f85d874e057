/*
 * request.c -- the JSONL requests of `hi3 tokenize-concat`: one JSON object
 * per line, checked field by field; every error names FILE:LINE.
 *
 *   {"prompt": "...", "system": "en_unified", "cot": "...", "bot_task": "auto",
 *    "mode": "gen_text", "image_size": "1024x768", "cond_images": [[H, W]],
 *    "seed": 7}
 *   {"prompt": "...", "images": ["a.png", "sub/b.jpg"]}
 *
 * "images" are files, relative to the JSONL file's directory (standard
 * input: the working directory); hi3_requests_load_images reads them and
 * gives each its size as "cond_images" would. "cond_images" gives only
 * sizes (the token layout without pixels, which no stage can run).
 *   {"tokens": [1, 2, 3], "stop_tokens": [2], "seed": 7}
 *   {"tokens": [65, 66], "images": ["a.png"]}       (the prompt's body)
 *   {"prompt": "...", "mode": "gen_image", "image_size": "auto"}
 *
 * "tokens" alone (mode gen_text) are the whole row; in mode gen_image, or
 * with "images", they are the prompt's body and the template adds the
 * rest. A gen_image request with image_size "auto" is first the text
 * stage that chooses the size (hi3i_request_text_stage).
 */
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cond/cond-internal.h"

static const char *const fields[] = {"prompt", "system", "cot",    "bot_task",   "mode",        "image_size",
                                     "cond_images", "images", "seed", "tokens", "stop_tokens", "strip_system",
                                     NULL};

#define MAX_IMAGE_SIDE 65536

static int bad(hi3_error *err, const struct hi3_requests *rq, int line, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static int bad(hi3_error *err, const struct hi3_requests *rq, int line, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return hi3_error_set(err, HI3_ERR_INPUT, "%s:%d: %s", rq->name, line, msg);
}

static int get_string(const struct hi3_requests *rq, struct hi3i_request *r, const char *key, const char **out,
                      size_t *len, hi3_error *err)
{
	json_t *v = json_object_get(r->obj, key);

	*out = NULL;
	if (!v)
		return 0;
	if (!json_is_string(v))
		return bad(err, rq, r->line, "field '%s': expected a string", key);
	*out = json_string_value(v);
	if (len)
		*len = json_string_length(v);
	else if (strlen(*out) != json_string_length(v))
		return bad(err, rq, r->line, "field '%s': a NUL character (\\u0000) in the value", key);
	return 0;
}

/* A JSON array of integers in [lo, hi] into a fresh array (empty: an
 * error unless allow_empty, then *out is an allocation of no element). */
static int get_int_array(const struct hi3_requests *rq, struct hi3i_request *r, const char *key, int64_t lo,
                         int64_t hi, int allow_empty, int64_t **out, size_t *n, hi3_error *err)
{
	json_t *v = json_object_get(r->obj, key), *e;
	size_t i;

	*out = NULL;
	*n = 0;
	if (!v)
		return 0;
	if (!json_is_array(v))
		return bad(err, rq, r->line, "field '%s': expected an array of integers", key);
	if (json_array_size(v) == 0 && !allow_empty)
		return bad(err, rq, r->line, "field '%s': the array is empty", key);
	if (!(*out = hi3i_malloc(HI3_MAX(json_array_size(v), 1) * sizeof(int64_t), err)))
		return -1;
	json_array_foreach(v, i, e) {
		if (!json_is_integer(e))
			return bad(err, rq, r->line, "field '%s': element %zu is not an integer", key, i);
		if (json_integer_value(e) < lo || json_integer_value(e) > hi)
			return bad(err, rq, r->line, "field '%s': element %zu is %lld, expected [%lld, %lld]", key, i,
			           (long long)json_integer_value(e), (long long)lo, (long long)hi);
		(*out)[i] = json_integer_value(e);
	}
	*n = json_array_size(v);
	return 0;
}

/* Strict decimal integer of a whole string in [1, MAX_IMAGE_SIDE]. */
static int side(const char *s, size_t len, int64_t *out)
{
	char buf[16];

	if (len == 0 || len >= sizeof(buf))
		return -1;
	for (size_t i = 0; i < len; i++)
		if (s[i] < '0' || s[i] > '9')
			return -1;
	memcpy(buf, s, len);
	buf[len] = 0;
	return hi3i_parse_i64(buf, 1, MAX_IMAGE_SIDE, out);
}

static int parse_image_size(const struct hi3_requests *rq, struct hi3i_request *r, hi3_error *err)
{
	json_t *v = json_object_get(r->obj, "image_size");
	const char *s, *sep;
	int64_t idx;

	if (!v)
		return 0;
	if (json_is_integer(v)) {
		if (json_integer_value(v) < 0 || json_integer_value(v) > 1000)
			return bad(err, rq, r->line, "field 'image_size': ratio index %lld is out of range",
			           (long long)json_integer_value(v));
		r->size_kind = 2;
		r->ratio_index = (int)json_integer_value(v);
		return 0;
	}
	if (json_is_array(v)) {
		if (json_array_size(v) != 2 || !json_is_integer(json_array_get(v, 0)) ||
		    !json_is_integer(json_array_get(v, 1)))
			return bad(err, rq, r->line, "field 'image_size': expected [H, W], \"HxW\", \"H:W\", "
			           "\"<img_ratio_I>\" or \"auto\"");
		r->size_h = json_integer_value(json_array_get(v, 0));
		r->size_w = json_integer_value(json_array_get(v, 1));
		if (r->size_h < 1 || r->size_h > MAX_IMAGE_SIDE || r->size_w < 1 || r->size_w > MAX_IMAGE_SIDE)
			return bad(err, rq, r->line, "field 'image_size': [%lld, %lld]: sides must be in [1, %d]",
			           (long long)r->size_h, (long long)r->size_w, MAX_IMAGE_SIDE);
		r->size_kind = 1;
		return 0;
	}
	if (!json_is_string(v))
		return bad(err, rq, r->line, "field 'image_size': expected [H, W] or a string");
	s = json_string_value(v);
	if (!strcmp(s, "auto")) {
		r->size_auto = 1;
		return 0;
	}
	if (!strncmp(s, "<img_ratio_", 11) && s[strlen(s) - 1] == '>') {
		char num[16];
		size_t n = strlen(s) - 12;
		if (n == 0 || n >= sizeof(num) || strspn(s + 11, "0123456789") != n)
			return bad(err, rq, r->line, "field 'image_size': bad ratio token '%s'", s);
		memcpy(num, s + 11, n);
		num[n] = 0;
		if (hi3i_parse_i64(num, 0, 1000, &idx) != 0)
			return bad(err, rq, r->line, "field 'image_size': bad ratio token '%s'", s);
		r->size_kind = 2;
		r->ratio_index = (int)idx;
		return 0;
	}
	if (*s && strspn(s, "0123456789") == strlen(s)) {
		if (hi3i_parse_i64(s, 0, 1000, &idx) != 0)
			return bad(err, rq, r->line, "field 'image_size': ratio index '%s' is out of range", s);
		r->size_kind = 2;
		r->ratio_index = (int)idx;
		return 0;
	}
	sep = strpbrk(s, "x:");
	if (!sep || side(s, (size_t)(sep - s), &r->size_h) != 0 || side(sep + 1, strlen(sep + 1), &r->size_w) != 0)
		return bad(err, rq, r->line, "field 'image_size': expected \"HxW\", \"A:B\", \"<img_ratio_I>\", I, "
		           "\"auto\" or [H, W] with sides in [1, %d], found '%s'", MAX_IMAGE_SIDE, s);
	r->size_kind = 1;
	r->size_colon = *sep == ':';
	return 0;
}

static int parse_cond_images(const struct hi3_requests *rq, struct hi3i_request *r, hi3_error *err)
{
	json_t *v = json_object_get(r->obj, "cond_images"), *e;
	size_t i;

	if (!v)
		return 0;
	if (!json_is_array(v))
		return bad(err, rq, r->line, "field 'cond_images': expected an array of [H, W]");
	if (json_array_size(v) == 0)
		return 0;
	r->cond = hi3i_calloc(json_array_size(v), sizeof(*r->cond), err);
	if (!r->cond)
		return -1;
	json_array_foreach(v, i, e) {
		json_t *h = json_array_get(e, 0), *w = json_array_get(e, 1);
		if (!json_is_array(e) || json_array_size(e) != 2 || !json_is_integer(h) || !json_is_integer(w) ||
		    json_integer_value(h) < 1 || json_integer_value(h) > MAX_IMAGE_SIDE || json_integer_value(w) < 1 ||
		    json_integer_value(w) > MAX_IMAGE_SIDE)
			return bad(err, rq, r->line, "field 'cond_images': element %zu: expected [H, W] with sides "
			           "in [1, %d]", i, MAX_IMAGE_SIDE);
		r->cond[i][0] = json_integer_value(h);
		r->cond[i][1] = json_integer_value(w);
	}
	r->n_cond = (int)json_array_size(v);
	return 0;
}

static int parse_images(const struct hi3_requests *rq, struct hi3i_request *r, hi3_error *err)
{
	json_t *v = json_object_get(r->obj, "images"), *e;
	size_t i;

	if (!v)
		return 0;
	if (json_object_get(r->obj, "cond_images"))
		return bad(err, rq, r->line, "fields 'images' and 'cond_images' exclude each other (images give their "
		           "own sizes)");
	if (!json_is_array(v))
		return bad(err, rq, r->line, "field 'images': expected an array of file names");
	if (json_array_size(v) == 0)
		return 0;
	r->cond = hi3i_calloc(json_array_size(v), sizeof(*r->cond), err);
	r->image_paths = r->cond ? hi3i_calloc(json_array_size(v), sizeof(*r->image_paths), err) : NULL;
	r->images = r->image_paths ? hi3i_calloc(json_array_size(v), sizeof(*r->images), err) : NULL;
	if (!r->images)
		return -1;
	json_array_foreach(v, i, e) {
		if (!json_is_string(e) || !json_string_length(e) || strlen(json_string_value(e)) != json_string_length(e))
			return bad(err, rq, r->line, "field 'images': element %zu: expected a file name", i);
		r->image_paths[i] = json_string_value(e);
	}
	r->n_cond = (int)json_array_size(v);
	return 0;
}

static int parse_request(const struct hi3_requests *rq, struct hi3i_request *r, hi3_error *err)
{
	const char *key, *s;
	json_t *v;
	size_t n;

	json_object_foreach(r->obj, key, v) {
		if (hi3i_name_index(fields, key) < 0)
			return bad(err, rq, r->line, "unknown field '%s' (expected prompt, system, cot, bot_task, mode, "
			           "image_size, cond_images, images, seed, tokens, stop_tokens or strip_system)", key);
	}
	if (get_string(rq, r, "prompt", &r->prompt, &r->prompt_len, err) ||
	    get_string(rq, r, "system", &r->system, &r->system_len, err) ||
	    get_string(rq, r, "cot", &r->cot, &r->cot_len, err))
		return -1;
	if (get_string(rq, r, "bot_task", &s, NULL, err))
		return -1;
	r->bot_task = -1;
	if (s && (r->bot_task = hi3i_name_index(hi3i_bot_task_names, s)) < 0)
		return bad(err, rq, r->line, "field 'bot_task': unknown value '%s' (expected auto, image, think, "
		           "recaption, img_ratio or think_recaption)", s);
	if (get_string(rq, r, "mode", &s, NULL, err))
		return -1;
	if (s && (r->mode = hi3i_name_index(hi3i_mode_names, s)) < 0)
		return bad(err, rq, r->line, "field 'mode': unknown value '%s' (expected gen_text or gen_image)", s);
	if (parse_image_size(rq, r, err) || parse_cond_images(rq, r, err) || parse_images(rq, r, err))
		return -1;
	if ((v = json_object_get(r->obj, "seed"))) {
		if (!json_is_integer(v))
			return bad(err, rq, r->line, "field 'seed': expected an integer");
		r->has_seed = 1;
		r->seed = json_integer_value(v);
	}
	if (get_int_array(rq, r, "tokens", 0, INT64_MAX, 0, &r->tokens, &r->n_tokens, err) ||
	    get_int_array(rq, r, "stop_tokens", 0, INT64_MAX, 1, &r->stops, &n, err))
		return -1;
	r->has_stops = r->stops != NULL;
	r->n_stops = (int)n;
	r->strip_system = -1;
	if ((v = json_object_get(r->obj, "strip_system"))) {
		if (!json_is_boolean(v))
			return bad(err, rq, r->line, "field 'strip_system': expected true or false");
		r->strip_system = json_is_true(v);
	}
	if (hi3i_request_body(r)) {
		/* the pre-tokenized prompt body: the template adds the rest */
		if (r->prompt || json_object_get(r->obj, "cond_images"))
			return bad(err, rq, r->line, "field 'tokens' %s is the prompt's body: it excludes %s",
			           r->mode == HI3I_GEN_IMAGE ? "in mode gen_image" : "with images",
			           r->prompt ? "prompt" : "cond_images (give the pictures as images)");
	} else if (r->tokens) {
		if (r->prompt || r->system || r->cot || r->n_cond || r->strip_system >= 0)
			return bad(err, rq, r->line, "field 'tokens' is a complete row: it excludes %s (in mode gen_text "
			           "without images)", r->prompt ? "prompt" : r->system ? "system" : r->cot ? "cot" :
			           r->strip_system >= 0 ? "strip_system" : "cond_images");
	} else if (!r->prompt) {
		return bad(err, rq, r->line, "no 'prompt' (or 'tokens')");
	}
	if (r->mode == HI3I_GEN_IMAGE && r->size_kind == 0 && !r->size_auto)
		return bad(err, rq, r->line, "mode gen_image needs image_size (\"HxW\", \"A:B\", [H, W], "
		           "\"<img_ratio_I>\", I, or \"auto\": a text stage chooses it)");
	return 0;
}

int hi3i_request_body(const struct hi3i_request *r)
{
	return r->tokens && (r->mode == HI3I_GEN_IMAGE || r->image_paths);
}

int hi3i_request_text_stage(const struct hi3i_request *r)
{
	return r->mode == HI3I_GEN_IMAGE && r->size_kind == 0 && r->size_auto;
}

int hi3i_request_row_mode(const struct hi3i_request *r)
{
	return hi3i_request_text_stage(r) ? HI3I_GEN_TEXT : r->mode;
}

static int blank(const char *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != ' ' && p[i] != '\t')
			return 0;
	return 1;
}

void hi3_requests_free(hi3_requests *rq)
{
	if (!rq)
		return;
	for (int i = 0; i < rq->n; i++) {
		json_decref(rq->r[i].obj);
		free(rq->r[i].cond);
		free(rq->r[i].cond_grid);
		for (int k = 0; rq->r[i].images && k < rq->r[i].n_cond; k++)
			hi3_image_free(rq->r[i].images[k]);
		free(rq->r[i].images);
		free(rq->r[i].image_paths);
		free(rq->r[i].tokens);
		free(rq->r[i].stops);
	}
	free(rq->r);
	free(rq->name);
	free(rq->dir);
	free(rq);
}

int hi3_requests_parse(hi3_requests **out, const char *text, size_t len, const char *name, hi3_error *err)
{
	hi3_requests *rq = calloc(1, sizeof(*rq));
	size_t pos = 0, cap = 0;
	int line = 0;

	*out = NULL;
	if (!rq || !(rq->name = hi3i_strdup(name)) || !(rq->dir = hi3i_strdup("."))) {
		if (rq)
			free(rq->name);
		free(rq);
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	}
	while (pos < len) {
		const char *p = text + pos, *nl = memchr(p, '\n', len - pos);
		size_t n = nl ? (size_t)(nl - p) : len - pos;
		struct hi3i_request *r;
		json_error_t je;

		pos += n + (nl ? 1 : 0);
		line++;
		if (n && p[n - 1] == '\r')
			n--;
		if (blank(p, n))
			continue;
		if (rq->n == (int)cap) {
			size_t nc = cap ? 2 * cap : 16;
			struct hi3i_request *nr = realloc(rq->r, nc * sizeof(*nr));
			if (!nr) {
				hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
				goto fail;
			}
			rq->r = nr;
			cap = nc;
		}
		r = &rq->r[rq->n];
		memset(r, 0, sizeof(*r));
		r->line = line;
		r->obj = json_loadb(p, n, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
		if (!r->obj) {
			bad(err, rq, line, "not valid JSON: %s (column %d)", je.text, je.column);
			goto fail;
		}
		rq->n++;
		if (!json_is_object(r->obj)) {
			bad(err, rq, line, "expected a JSON object");
			goto fail;
		}
		if (parse_request(rq, r, err) != 0)
			goto fail;
	}
	if (rq->n == 0) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: no requests (the input is empty)", name);
		goto fail;
	}
	*out = rq;
	return 0;
fail:
	hi3_requests_free(rq);
	return -1;
}

int hi3_requests_read(hi3_requests **out, const char *path, hi3_error *err)
{
	char *text;
	size_t len;
	int rc;

	*out = NULL;
	if (hi3i_read_file(path, &text, &len, err) != 0)
		return -1;
	rc = hi3_requests_parse(out, text, len, strcmp(path, "-") ? path : "<stdin>", err);
	free(text);
	if (!rc && strcmp(path, "-")) {
		const char *slash = strrchr(path, '/');
		char *dir = slash ? hi3i_asprintf("%.*s", (int)(slash == path ? 1 : slash - path), path) : NULL;
		if (slash && !dir) {
			hi3_requests_free(*out);
			*out = NULL;
			return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		}
		if (dir) {
			free((*out)->dir);
			(*out)->dir = dir;
		}
	}
	return rc;
}

/* Whether the real path of file lies inside the real directory root. */
static int inside(const char *root, const char *file)
{
	char rr[PATH_MAX], rf[PATH_MAX];
	size_t n;

	if (!realpath(root, rr) || !realpath(file, rf))
		return 0;
	n = strlen(rr);
	if (n == 1 && rr[0] == '/')
		return 1;
	return !strncmp(rr, rf, n) && rf[n] == '/';
}

int hi3_requests_load_images(hi3_requests *rq, const hi3_request_image_opts *o, hi3_error *err)
{
	const hi3_image_opts io = {.max_pixels = o ? o->max_pixels : 0, .max_bytes = o ? o->max_bytes : 0};

	for (int i = 0; i < rq->n; i++) {
		struct hi3i_request *r = &rq->r[i];
		for (int k = 0; r->image_paths && k < r->n_cond; k++) {
			const char *p = r->image_paths[k];
			char *path = p[0] == '/' ? hi3i_strdup(p) : hi3i_asprintf("%s/%s", rq->dir, p);
			int rc;

			if (r->images[k])
				continue;
			if (!path)
				return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
			if (o && o->safe_paths && access(path, F_OK) == 0 && !inside(rq->dir, path)) {
				rc = bad(err, rq, r->line, "image '%s': %s is outside %s (--safe-paths)", p, path, rq->dir);
			} else {
				rc = hi3_image_load(&r->images[k], path, &io, err);
				if (rc)
					hi3_error_prefix(err, "%s:%d: image %d", rq->name, r->line, k);
			}
			free(path);
			if (rc)
				return -1;
			r->cond[k][0] = r->images[k]->height;
			r->cond[k][1] = r->images[k]->width;
		}
	}
	return 0;
}

int hi3_requests_have_images(const hi3_requests *rq)
{
	for (int i = 0; i < rq->n; i++)
		if (rq->r[i].image_paths)
			return 1;
	return 0;
}

int hi3_requests_count(const hi3_requests *rq) { return rq->n; }

int hi3_requests_need_tokenizer(const hi3_requests *rq)
{
	for (int i = 0; i < rq->n; i++)
		if (!rq->r[i].tokens || hi3i_request_body(&rq->r[i]))
			return 1;
	return 0;
}
