/*
 * quant.c -- a checkpoint's quantization (quant.h): the published config
 * fields of bitsandbytes, compressed-tensors and NVIDIA ModelOpt, read
 * strictly (a method or field hi3 does not know is refused by name, never
 * run as plain weights), and each matrix's codes and scales found beside
 * it and checked against each other before a byte of them is multiplied.
 *
 * hi3 computes weight-only: the activations stay f32 whatever scheme the
 * checkpoint asks for (FP8 W8A8, NVFP4 W4A4); inspect says which.
 */
#include <ctype.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "model/quant.h"

struct hi3_quant {
	int method;               /* enum hi3_qmethod */
	char file[PATH_MAX];      /* where the fields were read */
	int bnb_8bit;             /* bitsandbytes: LLM.int8 (else 4-bit) */
	int ct_channel, ct_tensor;/* compressed-tensors: weight strategies declared */
	char algo[32];            /* modelopt: quant_algo, upper case */
	json_t *layers;           /* modelopt MIXED_PRECISION: quantized_layers */
	char desc[160];
	char acts[320];
};

/* -------------------------------------------------------------- fields */

static int unknown_key(json_t *obj, const char *const *known, const char *file, const char *where, hi3_error *err)
{
	const char *k;
	json_t *v;

	json_object_foreach(obj, k, v) {
		int ok = 0;
		for (int i = 0; known[i]; i++)
			ok |= !strcmp(k, known[i]);
		if (!ok)
			return hi3_error_set(err, HI3_ERR_INPUT, "%s: %s: unknown field '%s' (hi3-quant(7) lists the fields "
			                     "hi3 reads; it does not guess at others)", file, where, k);
	}
	return 0;
}

static const char *str_of(json_t *obj, const char *key)
{
	json_t *v = json_object_get(obj, key);

	return json_is_string(v) ? json_string_value(v) : NULL;
}

static int is_true(json_t *obj, const char *key)
{
	return json_is_true(json_object_get(obj, key));
}

static int bad_value(const char *file, const char *where, const char *key, json_t *v, const char *want, hi3_error *err)
{
	char *s = v ? json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;

	hi3_error_set(err, HI3_ERR_INPUT, "%s: %s: field '%s' is %s; hi3 reads %s", file, where, key, s ? s : "missing",
	              want);
	free(s);
	return -1;
}

static int open_bnb(hi3_quant *q, json_t *c, hi3_error *err)
{
	static const char *const known[] = {"quant_method", "load_in_8bit", "load_in_4bit", "_load_in_8bit",
	                                    "_load_in_4bit", "llm_int8_threshold", "llm_int8_skip_modules",
	                                    "llm_int8_enable_fp32_cpu_offload", "llm_int8_has_fp16_weight",
	                                    "bnb_4bit_quant_type", "bnb_4bit_use_double_quant", "bnb_4bit_compute_dtype",
	                                    "bnb_4bit_quant_storage", NULL};
	const char *w = "quantization_config", *qt = str_of(c, "bnb_4bit_quant_type");
	const char *st = str_of(c, "bnb_4bit_quant_storage");
	int b8 = is_true(c, "load_in_8bit") || is_true(c, "_load_in_8bit");
	int b4 = is_true(c, "load_in_4bit") || is_true(c, "_load_in_4bit");

	if (unknown_key(c, known, q->file, w, err))
		return -1;
	if (b8 == b4)
		return bad_value(q->file, w, "load_in_8bit", json_object_get(c, "load_in_8bit"),
		                 "exactly one of load_in_8bit and load_in_4bit true", err);
	if (b4 && qt && strcmp(qt, "nf4"))
		return bad_value(q->file, w, "bnb_4bit_quant_type", json_object_get(c, "bnb_4bit_quant_type"),
		                 "\"nf4\" (bitsandbytes fp4 is not read)", err);
	if (b4 && st && strcmp(st, "uint8"))
		return bad_value(q->file, w, "bnb_4bit_quant_storage", json_object_get(c, "bnb_4bit_quant_storage"),
		                 "\"uint8\"", err);
	q->method = HI3_QM_BNB;
	q->bnb_8bit = b8;
	snprintf(q->desc, sizeof(q->desc), "bitsandbytes %s", b8 ? "int8 (LLM.int8 row scales, SCB)" :
	         is_true(c, "bnb_4bit_use_double_quant") ? "nf4 (double quantization)" : "nf4");
	if (b8)
		snprintf(q->acts, sizeof(q->acts), "LLM.int8 int8 activations with fp16 outlier columns (threshold %g)",
		         json_is_number(json_object_get(c, "llm_int8_threshold")) ?
		         json_number_value(json_object_get(c, "llm_int8_threshold")) : 6.0);
	return 0;
}

static int ct_args(hi3_quant *q, json_t *a, const char *where, int weights, hi3_error *err)
{
	static const char *const known[] = {"num_bits", "type", "symmetric", "group_size", "strategy",
	                                    "block_structure", "dynamic", "actorder", "observer", "observer_kwargs",
	                                    "scale_dtype", "zp_dtype", NULL};
	const char *type = str_of(a, "type"), *strat = str_of(a, "strategy");

	if (unknown_key(a, known, q->file, where, err))
		return -1;
	if (!json_is_integer(json_object_get(a, "num_bits")) || json_integer_value(json_object_get(a, "num_bits")) != 8)
		return bad_value(q->file, where, "num_bits", json_object_get(a, "num_bits"), "8", err);
	if (!type || strcmp(type, "float"))
		return bad_value(q->file, where, "type", json_object_get(a, "type"), "\"float\" (e4m3)", err);
	if (!weights) {
		snprintf(q->acts, sizeof(q->acts), "FP8 e4m3 %s per-%s input activations (W8A8)",
		         is_true(a, "dynamic") ? "dynamic" : "static", strat ? strat : "tensor");
		return 0;
	}
	if (json_object_get(a, "symmetric") && !is_true(a, "symmetric"))
		return bad_value(q->file, where, "symmetric", json_object_get(a, "symmetric"), "true", err);
	if (is_true(a, "dynamic"))
		return bad_value(q->file, where, "dynamic", json_object_get(a, "dynamic"), "false for weights", err);
	if (!strat || (strcmp(strat, "channel") && strcmp(strat, "tensor")))
		return bad_value(q->file, where, "strategy", json_object_get(a, "strategy"),
		                 "\"channel\" or \"tensor\" (group and block FP8 are not read)", err);
	q->ct_channel |= !strcmp(strat, "channel");
	q->ct_tensor |= !strcmp(strat, "tensor");
	return 0;
}

static int ct_format(hi3_quant *q, json_t *obj, const char *where, hi3_error *err)
{
	const char *f = str_of(obj, "format");

	if (!json_object_get(obj, "format") || json_is_null(json_object_get(obj, "format")))
		return 0;
	if (!f || (strcmp(f, "float-quantized") && strcmp(f, "naive-quantized")))
		return bad_value(q->file, where, "format", json_object_get(obj, "format"),
		                 "\"float-quantized\" or \"naive-quantized\"", err);
	return 0;
}

static int open_ct(hi3_quant *q, json_t *c, hi3_error *err)
{
	static const char *const known[] = {"quant_method", "format", "quantization_status", "config_groups", "ignore",
	                                    "kv_cache_scheme", "global_compression_ratio", "version", "sparsity_config",
	                                    "transform_config", "provider", NULL};
	static const char *const gknown[] = {"targets", "weights", "input_activations", "output_activations",
	                                     "format", NULL};
	const char *w = "quantization_config", *status = str_of(c, "quantization_status"), *gk;
	json_t *groups = json_object_get(c, "config_groups"), *g;
	char where[256];

	if (unknown_key(c, known, q->file, w, err) || ct_format(q, c, w, err))
		return -1;
	if (status && strcmp(status, "compressed"))
		return bad_value(q->file, w, "quantization_status", json_object_get(c, "quantization_status"),
		                 "\"compressed\"", err);
	if (json_object_get(c, "sparsity_config") && !json_is_null(json_object_get(c, "sparsity_config")))
		return bad_value(q->file, w, "sparsity_config", json_object_get(c, "sparsity_config"), "null", err);
	if (json_object_get(c, "transform_config") && !json_is_null(json_object_get(c, "transform_config")))
		return bad_value(q->file, w, "transform_config", json_object_get(c, "transform_config"), "null", err);
	if (!json_is_object(groups) || !json_object_size(groups))
		return bad_value(q->file, w, "config_groups", groups, "an object of quantization groups", err);
	json_object_foreach(groups, gk, g) {
		json_t *wa = json_object_get(g, "weights"), *ia = json_object_get(g, "input_activations");
		json_t *oa = json_object_get(g, "output_activations");
		snprintf(where, sizeof(where), "quantization_config.config_groups.%s", gk);
		if (!json_is_object(g) || unknown_key(g, gknown, q->file, where, err) || ct_format(q, g, where, err))
			return json_is_object(g) ? -1 : bad_value(q->file, w, gk, g, "an object", err);
		if (!json_is_object(wa))
			return bad_value(q->file, where, "weights", wa, "the weights' arguments", err);
		snprintf(where, sizeof(where), "quantization_config.config_groups.%s.weights", gk);
		if (ct_args(q, wa, where, 1, err))
			return -1;
		if (oa && !json_is_null(oa))
			return bad_value(q->file, where, "output_activations", oa, "null", err);
		snprintf(where, sizeof(where), "quantization_config.config_groups.%s.input_activations", gk);
		if (ia && !json_is_null(ia) && (!json_is_object(ia) || ct_args(q, ia, where, 0, err)))
			return json_is_object(ia) ? -1 : bad_value(q->file, where, "input_activations", ia, "an object", err);
	}
	q->method = HI3_QM_CT;
	snprintf(q->desc, sizeof(q->desc), "compressed-tensors fp8 e4m3 (%s%s%s weight scales, %s)",
	         q->ct_channel ? "per-channel" : "", q->ct_channel && q->ct_tensor ? " and " : "",
	         q->ct_tensor ? "per-tensor" : "", str_of(c, "format") ? str_of(c, "format") : "float-quantized");
	if (json_object_get(c, "kv_cache_scheme") && !json_is_null(json_object_get(c, "kv_cache_scheme")))
		snprintf(q->acts + strlen(q->acts), sizeof(q->acts) - strlen(q->acts), "%sa quantized KV cache "
		         "(kv_cache_scheme)", q->acts[0] ? "; " : "");
	return 0;
}

static int mo_algo(const char *a)
{
	static const char *const ok[] = {"FP8", "FP8_PER_CHANNEL_PER_TOKEN", "NVFP4", "W4A16_NVFP4", NULL};

	for (int i = 0; ok[i]; i++)
		if (!strcmp(a, ok[i]))
			return 1;
	return 0;
}

static void upper(char *d, size_t n, const char *s)
{
	size_t i = 0;

	for (; s[i] && i + 1 < n; i++)
		d[i] = (char)toupper((unsigned char)s[i]);
	d[i] = 0;
}

/* c: hf_quant_config.json's "quantization", or config.json's quantization_config (modelopt). */
static int open_modelopt(hi3_quant *q, json_t *c, int legacy, hi3_error *err)
{
	static const char *const known_legacy[] = {"quant_algo", "kv_cache_quant_algo", "exclude_modules",
	                                           "quantized_layers", "group_size", NULL};
	static const char *const known_cfg[] = {"quant_method", "quant_algo", "kv_cache_scheme", "ignore",
	                                        "quantized_layers", "group_size", "producer", "kv_cache_quant_algo",
	                                        NULL};
	static const char *const lknown[] = {"quant_algo", "group_size", NULL};
	const char *w = legacy ? "quantization" : "quantization_config", *a = str_of(c, "quant_algo"), *lk;
	json_t *gs = json_object_get(c, "group_size"), *l;
	char where[320];

	if (unknown_key(c, legacy ? known_legacy : known_cfg, q->file, w, err))
		return -1;
	if (!a)
		return bad_value(q->file, w, "quant_algo", json_object_get(c, "quant_algo"), "a string", err);
	upper(q->algo, sizeof(q->algo), a);
	if (gs && !json_is_null(gs) && (!json_is_integer(gs) || json_integer_value(gs) != 16))
		return bad_value(q->file, w, "group_size", gs, "16", err);
	if (!strcmp(q->algo, "MIXED_PRECISION")) {
		q->layers = json_object_get(c, "quantized_layers");
		if (!json_is_object(q->layers) || !json_object_size(q->layers))
			return bad_value(q->file, w, "quantized_layers", q->layers, "a non-empty object", err);
		json_incref(q->layers);
		json_object_foreach(q->layers, lk, l) {
			char u[32];
			snprintf(where, sizeof(where), "%s.quantized_layers.%s", w, lk);
			if (!json_is_object(l) || unknown_key(l, lknown, q->file, where, err))
				return json_is_object(l) ? -1 : bad_value(q->file, w, lk, l, "an object", err);
			if (!str_of(l, "quant_algo"))
				return bad_value(q->file, where, "quant_algo", json_object_get(l, "quant_algo"), "a string", err);
			upper(u, sizeof(u), str_of(l, "quant_algo"));
			if (!mo_algo(u))
				return bad_value(q->file, where, "quant_algo", json_object_get(l, "quant_algo"),
				                 "FP8, FP8_PER_CHANNEL_PER_TOKEN, NVFP4 or W4A16_NVFP4", err);
			gs = json_object_get(l, "group_size");
			if (gs && !json_is_null(gs) && (!json_is_integer(gs) || json_integer_value(gs) != 16))
				return bad_value(q->file, where, "group_size", gs, "16", err);
		}
	} else if (!mo_algo(q->algo)) {
		return bad_value(q->file, w, "quant_algo", json_object_get(c, "quant_algo"),
		                 "FP8, FP8_PER_CHANNEL_PER_TOKEN, NVFP4, W4A16_NVFP4 or MIXED_PRECISION", err);
	}
	q->method = HI3_QM_MODELOPT;
	snprintf(q->desc, sizeof(q->desc), "modelopt %s", q->algo);
	if (strcmp(q->algo, "W4A16_NVFP4"))
		snprintf(q->acts, sizeof(q->acts), "%s", !strcmp(q->algo, "FP8") ? "FP8 e4m3 static per-tensor input "
		         "activations (input_scale)" : !strcmp(q->algo, "NVFP4") ? "NVFP4 input activations (W4A4)" :
		         !strcmp(q->algo, "FP8_PER_CHANNEL_PER_TOKEN") ? "FP8 e4m3 dynamic per-token input activations" :
		         "per layer: FP8 static per-tensor / NVFP4 input activations");
	return 0;
}

static json_t *load_json(const char *path, hi3_error *err)
{
	json_error_t je;
	json_t *j = json_load_file(path, 0, &je);

	if (!j)
		hi3_error_set(err, HI3_ERR_INPUT, "%s:%d: %s", path, je.line, je.text);
	else if (!json_is_object(j)) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: not a JSON object", path);
		json_decref(j);
		j = NULL;
	}
	return j;
}

int hi3i_quant_open(hi3_quant **out, const char *dir, const char *config_json, hi3_error *err)
{
	json_t *root = json_loads(config_json, 0, NULL), *c = json_object_get(root, "quantization_config");
	json_t *hf = NULL;
	hi3_quant *q = NULL;
	const char *m;
	int rc = -1;

	*out = NULL;
	if (!(q = hi3i_calloc(1, sizeof(*q), err)))
		goto out;
	snprintf(q->file, sizeof(q->file), "%s/config.json", dir);
	if (!c || json_is_null(c)) {
		char hp[PATH_MAX];
		snprintf(hp, sizeof(hp), "%s/hf_quant_config.json", dir);
		if (access(hp, F_OK) != 0) {
			rc = 0;              /* not quantized */
			goto out;
		}
		if (!(hf = load_json(hp, err)))
			goto out;
		snprintf(q->file, sizeof(q->file), "%s", hp);
		{
			static const char *const known[] = {"producer", "quantization", NULL};
			if (unknown_key(hf, known, q->file, "top level", err))
				goto out;
		}
		c = json_object_get(hf, "quantization");
		if (!json_is_object(c)) {
			bad_value(q->file, "top level", "quantization", c, "an object", err);
			goto out;
		}
		if (open_modelopt(q, c, 1, err))
			goto out;
		*out = q;
		q = NULL;
		rc = 0;
		goto out;
	}
	if (!json_is_object(c) || !(m = str_of(c, "quant_method"))) {
		bad_value(q->file, "quantization_config", "quant_method", json_object_get(c, "quant_method"),
		          "bitsandbytes, compressed-tensors or modelopt", err);
		goto out;
	}
	if (!strcmp(m, "bitsandbytes"))
		rc = open_bnb(q, c, err);
	else if (!strcmp(m, "compressed-tensors"))
		rc = open_ct(q, c, err);
	else if (!strncmp(m, "modelopt", 8))
		rc = open_modelopt(q, c, 0, err);
	else
		rc = hi3_error_set(err, HI3_ERR_INPUT, "%s: quantization_config: quant_method '%s' is not read by hi3 "
		                   "(it reads bitsandbytes, compressed-tensors and modelopt; hi3-quant(7))", q->file, m);
	if (rc == 0) {
		*out = q;
		q = NULL;
	}
out:
	hi3i_quant_close(q);
	json_decref(hf);
	json_decref(root);
	return rc;
}

void hi3i_quant_close(hi3_quant *q)
{
	if (!q)
		return;
	json_decref(q->layers);
	free(q);
}

int hi3i_quant_method(const hi3_quant *q)
{
	return q ? q->method : HI3_QM_NONE;
}

const char *hi3i_quant_describe(const hi3_quant *q)
{
	return q ? q->desc : "none";
}

const char *hi3i_quant_activations(const hi3_quant *q)
{
	return q ? q->acts : "";
}

/* ------------------------------------------------------------- tensors */

struct qt {                       /* what a weight's checks need to name things */
	const hi3_ckpt *ck;
	const char *name;             /* X.weight */
	char base[256];               /* X */
	hi3_error *err;
};

static const char *file_of(const struct qt *t, const char *name)
{
	const char *f = hi3_ckpt_file_of(t->ck, name);

	return f ? f : "checkpoint";
}

static int qfail(const struct qt *t, const char *tensor, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int qfail(const struct qt *t, const char *tensor, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return hi3_error_set(t->err, HI3_ERR_INPUT, "%s: tensor '%s': %s", file_of(t, tensor), tensor, msg);
}

/* The tensor X<suffix> (or name<suffix>); with dt >= 0 it must have that dtype
 * and n >= 0 elements. */
static const hi3_tensor *side(const struct qt *t, int of_name, const char *suffix, int dt, int64_t n, int need)
{
	char nm[384];
	const hi3_tensor *s;

	snprintf(nm, sizeof(nm), "%s%s", of_name ? t->name : t->base, suffix);
	s = hi3_ckpt_find(t->ck, nm);
	if (!s) {
		if (need)
			hi3_error_set(t->err, HI3_ERR_INPUT, "%s: tensor '%s' is quantized (%s) but '%s' is missing",
			              file_of(t, t->name), t->name, hi3_dtype_name(hi3_ckpt_find(t->ck, t->name)->dtype), nm);
		return NULL;
	}
	if (dt >= 0 && s->dtype != (hi3_dtype)dt) {
		qfail(t, s->name, "dtype %s, expected %s", hi3_dtype_name(s->dtype), hi3_dtype_name((hi3_dtype)dt));
		return NULL;
	}
	if (n >= 0 && hi3_tensor_numel(s) != n) {
		char b[96];
		qfail(t, s->name, "shape %s has %lld elements, expected %lld", hi3_shape_str(b, sizeof(b), s->ndim, s->shape),
		      (long long)hi3_tensor_numel(s), (long long)n);
		return NULL;
	}
	return s;
}

static int fits_int(int64_t v)
{
	return v > 0 && v <= INT_MAX;
}

static int dtype_of_torch(const char *s, hi3_dtype *dt)
{
	if (!strcmp(s, "bfloat16"))
		*dt = HI3_BF16;
	else if (!strcmp(s, "float16"))
		*dt = HI3_F16;
	else if (!strcmp(s, "float32"))
		*dt = HI3_F32;
	else
		return -1;
	return 0;
}

/* bitsandbytes' 4-bit quant state: the JSON bytes of
 * X.weight.quant_state.bitsandbytes__nf4. */
struct nf4_state {
	int64_t N, K;
	int block, nested_block, nested;
	hi3_dtype dtype;
	float offset;
};

static int nf4_state(const struct qt *t, const hi3_tensor *s, struct nf4_state *st)
{
	static const char *const known[] = {"quant_type", "blocksize", "dtype", "shape", "nested_blocksize",
	                                    "nested_dtype", "nested_offset", NULL};
	json_error_t je;
	json_t *j = s->dtype == HI3_U8 ? json_loadb(s->data, s->nbytes, 0, &je) : NULL, *sh, *v;
	const char *qt, *dt, *ndt;
	char where[400];
	int rc = -1;

	memset(st, 0, sizeof(*st));
	if (!json_is_object(j)) {
		qfail(t, s->name, "not the JSON bytes of a bitsandbytes quant state (%s)", s->dtype == HI3_U8 ? je.text :
		      "dtype is not U8");
		goto out;
	}
	snprintf(where, sizeof(where), "tensor '%s'", s->name);
	if (unknown_key(j, known, file_of(t, s->name), where, t->err))
		goto out;
	qt = str_of(j, "quant_type");
	if (!qt || strcmp(qt, "nf4")) {
		qfail(t, s->name, "quant_type %s; hi3 reads nf4", qt ? qt : "missing");
		goto out;
	}
	sh = json_object_get(j, "shape");
	if (!json_is_array(sh) || json_array_size(sh) != 2 || !json_is_integer(json_array_get(sh, 0)) ||
	    !json_is_integer(json_array_get(sh, 1))) {
		qfail(t, s->name, "shape is not [out_features, in_features]");
		goto out;
	}
	st->N = json_integer_value(json_array_get(sh, 0));
	st->K = json_integer_value(json_array_get(sh, 1));
	v = json_object_get(j, "blocksize");
	if (!fits_int(st->N) || !fits_int(st->K) || st->N * st->K > INT64_MAX / 2 || !json_is_integer(v) ||
	    json_integer_value(v) < 2 || json_integer_value(v) > 1 << 20) {
		qfail(t, s->name, "shape or blocksize out of range");
		goto out;
	}
	st->block = (int)json_integer_value(v);
	dt = str_of(j, "dtype");
	if (!dt || dtype_of_torch(dt, &st->dtype)) {
		qfail(t, s->name, "dtype %s; expected bfloat16, float16 or float32", dt ? dt : "missing");
		goto out;
	}
	st->nested = json_object_get(j, "nested_blocksize") != NULL;
	if (st->nested) {
		v = json_object_get(j, "nested_blocksize");
		ndt = str_of(j, "nested_dtype");
		if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 1 << 20 ||
		    !json_is_number(json_object_get(j, "nested_offset")) || (ndt && strcmp(ndt, "float32"))) {
			qfail(t, s->name, "nested_blocksize, nested_offset or nested_dtype (float32) missing or out of range");
			goto out;
		}
		st->nested_block = (int)json_integer_value(v);
		st->offset = (float)json_number_value(json_object_get(j, "nested_offset"));
	}
	rc = 0;
out:
	json_decref(j);
	return rc;
}

static void read_f32(float *dst, const hi3_tensor *s, int n)
{
	memcpy(dst, s->data, sizeof(float) * (size_t)n);
}

static int bnb_weight(const hi3_quant *q, const struct qt *t, const hi3_tensor *w, hi3_qweight *o)
{
	const hi3_tensor *s, *fmt;

	if (w->dtype == HI3_I8) {
		if (q && !q->bnb_8bit)
			return qfail(t, t->name, "an int8 weight in a 4-bit (load_in_4bit) checkpoint");
		if (w->ndim != 2 || !fits_int(w->shape[0]) || !fits_int(w->shape[1]))
			return qfail(t, t->name, "an int8 weight must be 2-D (out_features, in_features)");
		if (!(s = side(t, 0, ".SCB", HI3_F32, w->shape[0], 1)))
			return -1;
		if ((fmt = side(t, 0, ".weight_format", -1, -1, 0)) &&
		    (hi3_tensor_numel(fmt) != 1 || hi3_elem_f64(fmt->data, fmt->dtype, 0) != 0))
			return qfail(t, fmt->name, "weight_format is not 0 (row); hi3 reads row-major int8 weights");
		o->format = HI3_Q_INT8;
		o->N = (int)w->shape[0];
		o->K = (int)w->shape[1];
		o->scale = s->data;
		o->scale_dtype = HI3_F32;
		return 1;
	}
	if (w->dtype == HI3_U8) {
		struct nf4_state st;
		const hi3_tensor *qs, *map, *am, *nam, *nmap;
		int64_t blocks;
		char nm[320];

		if (q && q->bnb_8bit)
			return qfail(t, t->name, "a packed 4-bit weight in an 8-bit (load_in_8bit) checkpoint");
		snprintf(nm, sizeof(nm), "%s.quant_state.bitsandbytes__fp4", t->name);
		if (hi3_ckpt_find(t->ck, nm))
			return qfail(t, nm, "bitsandbytes fp4 is not read (nf4 is)");
		if (!(qs = side(t, 1, ".quant_state.bitsandbytes__nf4", -1, -1, 1)) || nf4_state(t, qs, &st))
			return -1;
		if (hi3_tensor_numel(w) != (st.N * st.K + 1) / 2)
			return qfail(t, t->name, "holds %lld bytes; the quant state's shape [%lld, %lld] packs into %lld",
			             (long long)hi3_tensor_numel(w), (long long)st.N, (long long)st.K,
			             (long long)((st.N * st.K + 1) / 2));
		blocks = (st.N * st.K + st.block - 1) / st.block;
		if (!(map = side(t, 1, ".quant_map", HI3_F32, 16, 1)))
			return -1;
		if (!(am = side(t, 1, ".absmax", st.nested ? HI3_U8 : HI3_F32, blocks, 1)))
			return -1;
		memset(o, 0, sizeof(*o));
		if (st.nested) {
			if (!(nam = side(t, 1, ".nested_absmax", HI3_F32, (blocks + st.nested_block - 1) / st.nested_block, 1)) ||
			    !(nmap = side(t, 1, ".nested_quant_map", HI3_F32, 256, 1)))
				return -1;
			o->nested = 1;
			o->nested_absmax = nam->data;
			read_f32(o->nested_map, nmap, 256);
			o->nested_block = st.nested_block;
			o->offset = st.offset;
		} else if (side(t, 1, ".nested_absmax", -1, -1, 0)) {
			return qfail(t, qs->name, "has no nested_blocksize but '%s.nested_absmax' exists", t->name);
		}
		o->format = HI3_Q_NF4;
		o->N = (int)st.N;
		o->K = (int)st.K;
		o->scale = am->data;
		o->scale_dtype = am->dtype;
		o->block = st.block;
		o->round_to = st.dtype;
		read_f32(o->map, map, 16);
		return 1;
	}
	return qfail(t, t->name, "dtype %s is not a bitsandbytes weight (I8 or packed U8)", hi3_dtype_name(w->dtype));
}

static int fp8_weight(const struct qt *t, const hi3_tensor *w, int allow_row, int allow_one, hi3_qweight *o)
{
	const hi3_tensor *s;
	int64_t n;

	if (w->ndim != 2 || !fits_int(w->shape[0]) || !fits_int(w->shape[1]))
		return qfail(t, t->name, "an fp8 weight must be 2-D (out_features, in_features)");
	if (!(s = side(t, 0, ".weight_scale", -1, -1, 1)))
		return -1;
	if (s->dtype != HI3_F32 && s->dtype != HI3_BF16 && s->dtype != HI3_F16)
		return qfail(t, s->name, "dtype %s; a weight scale is F32, BF16 or F16", hi3_dtype_name(s->dtype));
	n = hi3_tensor_numel(s);
	if (!((n == w->shape[0] && allow_row && (s->ndim == 1 || (s->ndim == 2 && s->shape[1] == 1))) ||
	      (n == 1 && allow_one))) {
		char b[96];
		return qfail(t, s->name, "shape %s; the checkpoint's scheme wants %s%s%s", hi3_shape_str(b, sizeof(b), s->ndim,
		             s->shape), allow_row ? "one scale per output channel" : "", allow_row && allow_one ? " or " : "",
		             allow_one ? "one scale for the tensor" : "");
	}
	memset(o, 0, sizeof(*o));
	o->format = HI3_Q_FP8;
	o->N = (int)w->shape[0];
	o->K = (int)w->shape[1];
	o->scale = s->data;
	o->scale_dtype = s->dtype;
	o->per_row = n == w->shape[0] && !(n == 1 && allow_one);
	o->round_to = s->dtype;
	return 1;
}

static int nvfp4_weight(const struct qt *t, const hi3_tensor *w, hi3_qweight *o)
{
	const hi3_tensor *s, *s2;

	if (w->ndim != 2 || !fits_int(w->shape[0]) || !fits_int(w->shape[1]) || w->shape[1] > INT_MAX / 2 ||
	    (w->shape[1] * 2) % 16)
		return qfail(t, t->name, "an NVFP4 weight is (out_features, in_features / 2) with in_features a multiple "
		             "of 16");
	if (!(s = side(t, 0, ".weight_scale", HI3_F8_E4M3, w->shape[0] * (w->shape[1] * 2 / 16), 1)) ||
	    !(s2 = side(t, 0, ".weight_scale_2", HI3_F32, 1, 1)))
		return -1;
	if (s->ndim != 2 || s->shape[0] != w->shape[0])
		return qfail(t, s->name, "must be (out_features, in_features / 16)");
	memset(o, 0, sizeof(*o));
	o->format = HI3_Q_NVFP4;
	o->N = (int)w->shape[0];
	o->K = (int)(w->shape[1] * 2);
	o->scale = s->data;
	o->scale_dtype = HI3_F8_E4M3;
	o->block = 16;
	memcpy(&o->scale2, s2->data, 4);
	o->round_to = HI3_F32;
	return 1;
}

static int modelopt_weight(const hi3_quant *q, const struct qt *t, const hi3_tensor *w, hi3_qweight *o)
{
	const char *algo = q->algo;
	char u[32];

	if (q->layers) {
		json_t *l = json_object_get(q->layers, t->base);
		if (!l)
			return qfail(t, t->name, "is stored %s but %s's quantized_layers has no '%s'", hi3_dtype_name(w->dtype),
			             q->file, t->base);
		upper(u, sizeof(u), str_of(l, "quant_algo"));
		algo = u;
	}
	if (w->dtype == HI3_F8_E4M3) {
		if (strncmp(algo, "FP8", 3))
			return qfail(t, t->name, "is stored F8_E4M3 but its quant_algo is %s", algo);
		return fp8_weight(t, w, !strcmp(algo, "FP8_PER_CHANNEL_PER_TOKEN"), !strcmp(algo, "FP8"), o);
	}
	if (w->dtype == HI3_U8) {
		if (!strstr(algo, "NVFP4"))
			return qfail(t, t->name, "is stored packed U8 but its quant_algo is %s", algo);
		return nvfp4_weight(t, w, o);
	}
	return qfail(t, t->name, "dtype %s is not a ModelOpt weight (F8_E4M3 or packed U8 NVFP4)",
	             hi3_dtype_name(w->dtype));
}

static int is_plain(hi3_dtype dt)
{
	return dt == HI3_F32 || dt == HI3_BF16 || dt == HI3_F16;
}

static int qt_init(struct qt *t, const hi3_ckpt *ck, const char *name, hi3_error *err)
{
	size_t n = strlen(name);

	t->ck = ck;
	t->name = name;
	t->err = err;
	if (n < 8 || strcmp(name + n - 7, ".weight") || n - 7 >= sizeof(t->base))
		return hi3_error_set(err, HI3_ERR_INPUT, "tensor '%s': a quantized matrix is named X.weight", name);
	memcpy(t->base, name, n - 7);
	t->base[n - 7] = 0;
	return 0;
}

static int weight_of(const hi3_quant *q, const struct qt *t, const hi3_tensor *w, hi3_qweight *out)
{
	switch (q->method) {
	case HI3_QM_BNB:
		return bnb_weight(q, t, w, out);
	case HI3_QM_CT:
		if (w->dtype != HI3_F8_E4M3)
			return qfail(t, t->name, "dtype %s; a compressed-tensors fp8 weight is F8_E4M3", hi3_dtype_name(w->dtype));
		return fp8_weight(t, w, q->ct_channel, q->ct_tensor, out);
	default:
		return modelopt_weight(q, t, w, out);
	}
}

int hi3i_quant_weight(const hi3_quant *q, const hi3_ckpt *ck, const char *name, hi3_qweight *out, hi3_error *err)
{
	const hi3_tensor *w = hi3_ckpt_find(ck, name);
	struct qt t;

	memset(out, 0, sizeof(*out));
	if (!w)
		return hi3_error_set(err, HI3_ERR_INPUT, "checkpoint: tensor '%s' is missing", name);
	if (is_plain(w->dtype))
		return 0;
	if (qt_init(&t, ck, name, err))
		return -1;
	if (!q)
		return qfail(&t, name, "dtype %s is a quantized code, but config.json has no quantization_config (and "
		             "there is no hf_quant_config.json)", hi3_dtype_name(w->dtype));
	if (weight_of(q, &t, w, out) < 0)
		return -1;
	out->codes = w->data;
	return 1;
}

int hi3i_quant_logical_shape(const hi3_ckpt *ck, const char *name, int64_t shape[2], hi3_error *err)
{
	const hi3_tensor *w = hi3_ckpt_find(ck, name), *s;
	struct qt t;
	char nm[384];

	if (!w || is_plain(w->dtype) || qt_init(&t, ck, name, err))
		return 0;
	if ((w->dtype == HI3_F8_E4M3 || w->dtype == HI3_I8) && w->ndim == 2) {
		if (!side(&t, 0, w->dtype == HI3_I8 ? ".SCB" : ".weight_scale", -1, -1, 1))
			return -1;
		shape[0] = w->shape[0];
		shape[1] = w->shape[1];
		return 1;
	}
	if (w->dtype != HI3_U8)
		return 0;
	snprintf(nm, sizeof(nm), "%s.quant_state.bitsandbytes__nf4", name);
	if ((s = hi3_ckpt_find(ck, nm))) {
		struct nf4_state st;
		if (nf4_state(&t, s, &st))
			return -1;
		if (hi3_tensor_numel(w) != (st.N * st.K + 1) / 2)
			return qfail(&t, t.name, "holds %lld bytes; the quant state's shape [%lld, %lld] packs into %lld",
			             (long long)hi3_tensor_numel(w), (long long)st.N, (long long)st.K,
			             (long long)((st.N * st.K + 1) / 2));
		shape[0] = st.N;
		shape[1] = st.K;
		return 1;
	}
	snprintf(nm, sizeof(nm), "%s.weight_scale", t.base);
	if (w->ndim == 2 && (s = hi3_ckpt_find(ck, nm)) && s->dtype == HI3_F8_E4M3) {
		shape[0] = w->shape[0];
		shape[1] = w->shape[1] * 2;
		return 1;
	}
	return qfail(&t, name, "packed U8 with neither a bitsandbytes quant state ('%s.quant_state.bitsandbytes__nf4') "
	             "nor an NVFP4 block scale ('%s.weight_scale', F8_E4M3)", name, t.base);
}

/* ------------------------------------------------------------- summary */

static const char *kind_of(const char *name)
{
	if (!strncmp(name, "model.layers.", 13)) {
		if (strstr(name, ".self_attn."))
			return "attention";
		if (strstr(name, ".mlp.experts."))
			return "routed experts";
		if (strstr(name, ".mlp.shared_mlp."))
			return "shared experts";
		if (strstr(name, ".mlp.gate."))
			return "router";
		if (strstr(name, ".mlp."))
			return "dense mlp";
	}
	if (!strcmp(name, "lm_head.weight"))
		return "lm_head";
	if (!strncmp(name, "model.wte.", 10))
		return "embedding";
	return "other";
}

json_t *hi3i_quant_summary(const char *dir, const char *config_json)
{
	json_t *o = json_object(), *kinds = json_object();
	hi3_quant *q = NULL;
	hi3_ckpt *ck = NULL;
	hi3_error err = {0};
	uint64_t saved = 0;

	if (!o || !kinds)
		goto fail;
	if (hi3i_quant_open(&q, dir, config_json, &err) != 0) {
		json_object_set_new(o, "error", json_string(err.msg));
		goto done;
	}
	json_object_set_new(o, "method", json_string(q ? q->desc : "none"));
	if (!q)
		goto done;
	json_object_set_new(o, "file", json_string(q->file));
	json_object_set_new(o, "activations_asked", json_string(q->acts));
	if (hi3_ckpt_open(&ck, dir, &err) != 0) {
		json_object_set_new(o, "error", json_string(err.msg));
		goto done;
	}
	for (int i = 0; i < hi3_ckpt_count(ck); i++) {
		const hi3_tensor *t = hi3_ckpt_at(ck, i);
		size_t n = strlen(t->name);
		hi3_qweight w;
		json_t *k, *f;
		const char *how;
		int r;

		if (n < 8 || strcmp(t->name + n - 7, ".weight") || t->ndim != 2)
			continue;             /* matrices only (an nf4 weight is (n, 1)) */
		r = hi3i_quant_weight(q, ck, t->name, &w, &err);
		if (r < 0) {
			json_object_set_new(o, "error", json_string(err.msg));
			break;
		}
		how = r ? hi3i_qformat_name(w.format) : hi3_dtype_name(t->dtype);
		if (!(k = json_object_get(kinds, kind_of(t->name))))
			json_object_set_new(kinds, kind_of(t->name), k = json_object());
		f = json_object_get(k, how);
		json_object_set_new(k, how, json_integer(f ? json_integer_value(f) + 1 : 1));
		if (r) {
			/* against bf16: two bytes an element, less the codes */
			uint64_t bf = (uint64_t)w.N * (uint64_t)w.K * 2;
			saved += bf > t->nbytes ? bf - t->nbytes : 0;
		}
	}
	json_object_set_new(o, "bytes_saved_vs_bf16", json_integer((json_int_t)saved));
done:
	json_object_set_new(o, "kinds", kinds);
	hi3_ckpt_close(ck);
	hi3i_quant_close(q);
	return o;
fail:
	json_decref(o);
	json_decref(kinds);
	return NULL;
}
