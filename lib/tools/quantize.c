/*
 * quantize.c -- hi3 quantize: a checkpoint written again with its
 * transformer matrices quantized weight-only, in a layout the ecosystem's
 * loaders read (hi3-quant(7)):
 *
 *   fp8   compressed-tensors "naive-quantized" (what llm-compressor writes
 *         for weight-only FP8; vLLM and compressed-tensors read it):
 *         X.weight F8_E4M3 (N, K), X.weight_scale F32 (N, 1), scale =
 *         row absmax / 448, q = e4m3(w / scale) to nearest even
 *   int8  bitsandbytes LLM.int8 as transformers saves it: X.weight I8
 *         (N, K), X.SCB F32 (N) = the row absmax of the fp16 weight,
 *         X.weight_format U8 () = 0 (row); q = round(127 w / SCB)
 *
 * Streaming: shard by shard, in the source's order; a shard's quantized
 * tensors are the only memory held (unchanged tensors are written from
 * the mapping), each shard written atomically, then the index, the other
 * files and config.json (last, so a directory with a config.json is
 * whole). Every tensor's dtype is checked before anything is written.
 *
 * Default skips (kept as stored), and why: embeddings (model.wte: a row
 * gather, no matmul), norms (vectors), the MoE router (model.layers.*.mlp.
 * gate.wg: f32 upstream; its logits pick the experts, a flip changes the
 * routing), lm_head (the log-probs RL reads), and everything outside
 * model.layers (vision tower, VAE, image heads: small, and quantizing the
 * image path is not what these formats were published for).
 */
#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "backend/quant.h"
#include "tools/tools.h"

/* A quantizable matrix: a 2-D float .weight of a transformer layer, not
 * the router, not skipped by the user. */
static int wanted(const hi3_tensor *t, const hi3_quantize_opts *o)
{
	size_t n = strlen(t->name);
	char mod[512];

	if (t->ndim != 2 || n < 8 || strcmp(t->name + n - 7, ".weight") || strncmp(t->name, "model.layers.", 13) ||
	    strstr(t->name, ".mlp.gate.wg.") || n - 7 >= sizeof(mod))
		return 0;
	memcpy(mod, t->name, n - 7);
	mod[n - 7] = 0;
	for (int i = 0; i < o->n_skip; i++)
		if (!fnmatch(o->skip[i], mod, 0) || !fnmatch(o->skip[i], t->name, 0))
			return 0;
	return 1;
}

static float elem(const hi3_tensor *t, size_t i)
{
	float f;
	uint16_t h;

	if (t->dtype == HI3_F32) {
		memcpy(&f, (const float *)t->data + i, 4);
		return f;
	}
	memcpy(&h, (const uint16_t *)t->data + i, 2);
	return t->dtype == HI3_BF16 ? hi3_bf16_to_f32(h) : hi3_f16_to_f32(h);
}

/* The quantized tensors of one shard, owned until it is written. */
struct qbuf {
	void **p;
	char **names;
	int n, cap;
};

static void *qalloc(struct qbuf *b, size_t bytes, hi3_error *err)
{
	if (b->n == b->cap) {
		int cap = b->cap ? 2 * b->cap : 64;
		void **p = realloc(b->p, sizeof(*p) * (size_t)cap);
		if (!p)
			return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory"), NULL;
		b->p = p;
		b->cap = cap;
	}
	if (!(b->p[b->n] = calloc(bytes ? bytes : 1, 1)))
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory for %zu MiB of quantized weights", bytes >> 20),
		       NULL;
	return b->p[b->n++];
}

static void qbuf_free(struct qbuf *b)
{
	for (int i = 0; i < b->n; i++)
		free(b->p[i]);
	b->n = 0;
}

static char *side_name(struct qbuf *b, const char *name, const char *suffix, hi3_error *err)
{
	size_t n = strlen(name) - 7;        /* without ".weight" */
	char *s = qalloc(b, n + strlen(suffix) + 1, err);

	if (s) {
		memcpy(s, name, n);
		strcpy(s + n, suffix);
	}
	return s;
}

/* Add t quantized to w; its new tensors into the index map m (if any). */
static int add_quantized(hi3_st_writer *w, const hi3_tensor *t, int int8, struct qbuf *b, json_t *m,
                         const char *shard, double *max_err, hi3_error *err)
{
	const int64_t N = t->shape[0], K = t->shape[1];
	uint8_t *q = qalloc(b, (size_t)(N * K), err);
	float *s = qalloc(b, sizeof(float) * (size_t)N, err);
	char *sn = side_name(b, t->name, int8 ? ".SCB" : ".weight_scale", err);
	char *fn = int8 ? side_name(b, t->name, ".weight_format", err) : NULL;
	uint8_t *fmt = int8 ? qalloc(b, 1, err) : NULL;
	int64_t shape[2] = {N, 1};

	if (!q || !s || !sn || (int8 && (!fn || !fmt)))
		return -1;
#pragma omp parallel for schedule(static)
	for (int64_t n = 0; n < N; n++) {
		const size_t r = (size_t)n * (size_t)K;
		float amax = 0, sc;
		double e = 0;

		for (int64_t k = 0; k < K; k++) {
			float v = elem(t, r + (size_t)k);
			if (int8)
				v = hi3_f16_to_f32(hi3_f32_to_f16(v));   /* SCB: the absmax of the fp16 weight */
			amax = fmaxf(amax, fabsf(v));
		}
		if (!isfinite(amax) || amax == 0)
			amax = 1.0f;
		sc = int8 ? amax : amax / 448.0f;
		s[n] = sc;
		for (int64_t k = 0; k < K; k++) {
			const float v = elem(t, r + (size_t)k);
			float d;
			if (int8) {
				float c = nearbyintf(v * (127.0f / sc));
				c = fmaxf(-127.0f, fminf(127.0f, c));
				((int8_t *)q)[r + (size_t)k] = (int8_t)c;
				d = (c * sc) * 7.874015718698502e-3f;
			} else {
				q[r + (size_t)k] = hi3i_f32_to_e4m3(v / sc);
				d = hi3i_e4m3_to_f32(q[r + (size_t)k]) * sc;
			}
			e = fmax(e, fabs((double)d - v));
		}
#pragma omp critical
		*max_err = fmax(*max_err, e);
	}
	if (hi3_stw_add(w, t->name, int8 ? HI3_I8 : HI3_F8_E4M3, 2, t->shape, q) ||
	    hi3_stw_add(w, sn, HI3_F32, int8 ? 1 : 2, shape, s) ||
	    (int8 && hi3_stw_add(w, fn, HI3_U8, 0, shape, fmt)))
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	if (m && (json_object_set_new(m, t->name, json_string(shard)) || json_object_set_new(m, sn, json_string(shard)) ||
	          (int8 && json_object_set_new(m, fn, json_string(shard)))))
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	return 0;
}

/* The shard files of dir in order, from its index (or model.safetensors). */
static json_t *shards_of(const char *dir, json_t **index, hi3_error *err)
{
	char *p = hi3i_asprintf("%s/model.safetensors.index.json", dir);
	json_t *list = json_array(), *map;
	json_error_t je;
	const char *k;
	json_t *v;

	*index = NULL;
	if (!p || !list)
		goto oom;
	if (access(p, F_OK) != 0) {
		json_array_append_new(list, json_string("model.safetensors"));
		free(p);
		return list;
	}
	if (!(*index = json_load_file(p, 0, &je)) || !json_is_object(map = json_object_get(*index, "weight_map"))) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s:%d: not an index with a weight_map (%s)", p, je.line, je.text);
		goto fail;
	}
	json_object_foreach(map, k, v) {
		size_t i;
		json_t *e;
		int seen = 0;
		if (!json_is_string(v) || strchr(json_string_value(v), '/')) {
			hi3_error_set(err, HI3_ERR_INPUT, "%s: weight_map entry '%s' is not a shard file name", p, k);
			goto fail;
		}
		json_array_foreach(list, i, e)
			seen |= json_equal(e, v);
		if (!seen)
			json_array_append(list, v);
	}
	free(p);
	return list;
oom:
	hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
fail:
	free(p);
	json_decref(list);
	json_decref(*index);
	*index = NULL;
	return NULL;
}

static int copy_file(const char *from, const char *to, hi3_error *err)
{
	char *buf = NULL;
	size_t len = 0;
	int rc;

	if (hi3i_read_file(from, &buf, &len, err) != 0)
		return -1;
	rc = hi3i_write_file(to, buf, len, err);
	free(buf);
	return rc;
}

static int write_json(const char *path, json_t *j, hi3_error *err)
{
	char *s = json_dumps(j, JSON_INDENT(2));
	int rc;

	if (!s)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	rc = hi3i_write_file(path, s, strlen(s), err);
	free(s);
	return rc;
}

/* The quantization_config the output's loaders read. */
static json_t *qconfig(int int8, json_t *kept)
{
	if (int8)
		return json_pack("{s:s, s:b, s:b, s:b, s:b, s:f, s:O, s:b, s:b, s:s, s:b, s:s, s:s}", "quant_method",
		                 "bitsandbytes", "_load_in_8bit", 1, "_load_in_4bit", 0, "load_in_8bit", 1, "load_in_4bit",
		                 0, "llm_int8_threshold", 6.0, "llm_int8_skip_modules", kept,
		                 "llm_int8_enable_fp32_cpu_offload", 0, "llm_int8_has_fp16_weight", 0,
		                 "bnb_4bit_quant_type", "fp4", "bnb_4bit_use_double_quant", 0, "bnb_4bit_compute_dtype",
		                 "float32", "bnb_4bit_quant_storage", "uint8");
	return json_pack("{s:s, s:s, s:s, s:{s:{s:[s], s:{s:i, s:s, s:b, s:n, s:s, s:n, s:b, s:n, s:s, s:{}}, s:n, "
	                 "s:n, s:s}}, s:O, s:n, s:n, s:n}",
	                 "quant_method", "compressed-tensors", "format", "naive-quantized", "quantization_status",
	                 "compressed", "config_groups", "group_0", "targets", "Linear", "weights", "num_bits", 8, "type",
	                 "float", "symmetric", 1, "group_size", "strategy", "channel", "block_structure", "dynamic", 0,
	                 "actorder", "observer", "minmax", "observer_kwargs", "input_activations", "output_activations",
	                 "format", "naive-quantized", "ignore", kept, "kv_cache_scheme", "sparsity_config",
	                 "global_compression_ratio");
}

int hi3_quantize(const char *dir, const char *out, const hi3_quantize_opts *o, hi3_quantize_result *r,
                 hi3_error *err)
{
	const int int8 = o->int8;
	json_t *index = NULL, *shards = NULL, *cfg = NULL, *map = NULL, *kept = json_array(), *v;
	struct qbuf b = {0};
	hi3_st *st = NULL;
	char *p = NULL;
	size_t i;
	int rc = -1;
	DIR *d = NULL;
	struct dirent *de;

	memset(r, 0, sizeof(*r));
	if (!kept)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	p = hi3i_asprintf("%s/config.json", dir);
	{
		json_error_t je;
		if (!p || !(cfg = json_load_file(p, 0, &je)) || !json_is_object(cfg)) {
			hi3_error_set(err, HI3_ERR_INPUT, "%s:%d: cannot read a config object (%s)", p ? p : dir, je.line,
			              je.text);
			goto out;
		}
	}
	if (json_object_get(cfg, "quantization_config")) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: already quantized (quantization_config); hi3 quantize reads a "
		              "checkpoint of F32, BF16 or F16 weights", p);
		goto out;
	}
	free(p);
	if (!(p = hi3i_asprintf("%s/hf_quant_config.json", dir)))
		goto oom;
	if (access(p, F_OK) == 0) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: already quantized (ModelOpt)", p);
		goto out;
	}
	if (!(shards = shards_of(dir, &index, err)))
		goto out;
	if (index && !(map = json_object()))
		goto oom;
	/* every tensor checked before anything is written */
	json_array_foreach(shards, i, v) {
		free(p);
		if (!(p = hi3i_asprintf("%s/%s", dir, json_string_value(v))))
			goto oom;
		if (hi3_st_open(&st, p, HI3_ST_READ, err) != 0)
			goto out;
		for (int j = 0; j < hi3_st_count(st); j++) {
			const hi3_tensor *t = hi3_st_at(st, j);
			if (!wanted(t, o))
				continue;
			if (t->dtype != HI3_F32 && t->dtype != HI3_BF16 && t->dtype != HI3_F16) {
				hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor '%s': dtype %s; hi3 quantize reads F32, BF16 or "
				              "F16 matrices", p, t->name, hi3_dtype_name(t->dtype));
				goto out;
			}
			if (t->shape[0] < 1 || t->shape[1] < 1 || t->shape[0] > INT32_MAX || t->shape[1] > INT32_MAX) {
				hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor '%s': an empty or too large matrix", p, t->name);
				goto out;
			}
		}
		hi3_st_close(st);
		st = NULL;
	}
	if (mkdir(out, 0777) != 0 && errno != EEXIST) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "%s: cannot create: %s", out, strerror(errno));
		goto out;
	}
	json_array_foreach(shards, i, v) {
		const char *shard = json_string_value(v);
		hi3_st_writer *w = hi3_stw_new();
		int wrc = 0;

		free(p);
		if (!w || !(p = hi3i_asprintf("%s/%s", dir, shard)))
			goto oom;
		if (hi3_st_open(&st, p, HI3_ST_READ, err) != 0) {
			hi3_stw_free(w);
			goto out;
		}
		for (int j = 0; j < hi3_st_count(st) && !wrc; j++) {
			const hi3_tensor *t = hi3_st_at(st, j);
			if (index && !json_equal(json_object_get(json_object_get(index, "weight_map"), t->name), v))
				continue;        /* not this shard's by the index */
			if (wanted(t, o)) {
				wrc = add_quantized(w, t, int8, &b, map, shard, &r->max_abs_error, err);
				r->quantized++;
				r->bytes_in += t->nbytes;
				r->bytes_out += (size_t)(t->shape[0] * t->shape[1]) + 4 * (size_t)t->shape[0];
				continue;
			}
			if (t->ndim == 2 && strlen(t->name) > 7 && !strcmp(t->name + strlen(t->name) - 7, ".weight")) {
				char *mod = hi3i_strdup(t->name);
				if (!mod)
					goto oom;
				mod[strlen(mod) - 7] = 0;
				json_array_append_new(kept, json_string(mod));
				free(mod);
			}
			r->kept++;
			if (hi3_stw_add(w, t->name, t->dtype, t->ndim, t->shape, t->data) ||
			    (map && json_object_set_new(map, t->name, json_string(shard))))
				wrc = hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		}
		free(p);
		p = hi3i_asprintf("%s/%s", out, shard);
		if (!wrc && p)
			wrc = hi3_stw_write(w, p, err);
		hi3_stw_free(w);
		hi3_st_close(st);
		st = NULL;
		qbuf_free(&b);
		if (wrc || !p)
			goto out;
		r->shards++;
	}
	if (index) {
		json_t *idx = json_pack("{s:{}, s:O}", "metadata", "weight_map", map);
		free(p);
		if (!idx || !(p = hi3i_asprintf("%s/model.safetensors.index.json", out)) || write_json(p, idx, err)) {
			json_decref(idx);
			goto out;
		}
		json_decref(idx);
	}
	/* the other files: tokenizer, generation config, code, ... */
	if (!(d = opendir(dir))) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "%s: cannot list: %s", dir, strerror(errno));
		goto out;
	}
	while ((de = readdir(d))) {
		const char *n = de->d_name;
		size_t l = strlen(n);
		struct stat sb;
		char *from, *to;
		int crc;
		if (n[0] == '.' || !strcmp(n, "config.json") || !strcmp(n, "model.safetensors.index.json") ||
		    (l > 12 && !strcmp(n + l - 12, ".safetensors")))
			continue;
		from = hi3i_asprintf("%s/%s", dir, n);
		to = hi3i_asprintf("%s/%s", out, n);
		crc = !from || !to || stat(from, &sb) != 0 || !S_ISREG(sb.st_mode) ? 0 : copy_file(from, to, err);
		free(from);
		free(to);
		if (crc)
			goto out;
	}
	{
		json_t *qc = qconfig(int8, kept);
		if (!qc || json_object_set_new(cfg, "quantization_config", qc))
			goto oom;
	}
	free(p);
	if (!(p = hi3i_asprintf("%s/config.json", out)) || write_json(p, cfg, err))
		goto out;
	rc = 0;
	goto out;
oom:
	hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
out:
	if (d)
		closedir(d);
	hi3_st_close(st);
	qbuf_free(&b);
	free(b.p);
	free(p);
	json_decref(index);
	json_decref(shards);
	json_decref(cfg);
	json_decref(map);
	json_decref(kept);
	return rc;
}
