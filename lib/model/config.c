/*
 * config.c -- config.json with the upstream field names, checked against the
 * checkpoint's tensors, and the model fingerprint.
 */
#include <jansson.h>
#include <string.h>
#include "core/internal.h"

static int get_int(json_t *root, const char *name, const char *key, int def, int lo, int hi,
                   int *out, hi3_error *err)
{
	json_t *v = json_object_get(root, key);

	if (!v || json_is_null(v)) {
		if (def < lo)
			return hi3_error_set(err, HI3_ERR_INPUT, "%s: required field \"%s\" is missing", name, key);
		*out = def;
		return 0;
	}
	if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: field \"%s\": expected an integer in [%d, %d]", name,
		                     key, lo, hi);
	*out = (int)json_integer_value(v);
	return 0;
}

static int get_bool(json_t *root, const char *name, const char *key, int def, int *out, hi3_error *err)
{
	json_t *v = json_object_get(root, key);

	if (!v || json_is_null(v)) {
		*out = def;
		return 0;
	}
	if (!json_is_boolean(v))
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: field \"%s\": expected true or false", name, key);
	*out = json_is_true(v);
	return 0;
}

static int get_num(json_t *root, const char *name, const char *key, double def, double *out, hi3_error *err)
{
	json_t *v = json_object_get(root, key);

	if (!v || json_is_null(v)) {
		*out = def;
		return 0;
	}
	if (!json_is_number(v))
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: field \"%s\": expected a number", name, key);
	*out = json_number_value(v);
	return 0;
}

static int get_id(json_t *root, const char *key, int64_t *out)
{
	json_t *v = json_object_get(root, key);

	*out = json_is_integer(v) ? json_integer_value(v) : -1;
	return 0;
}

/* A field that is an int for every layer or a list with one per layer. */
static int get_per_layer(json_t *root, const char *name, const char *key, int def, int lo, int n_layers,
                         int *out, hi3_error *err)
{
	json_t *v = json_object_get(root, key), *e;
	size_t i;

	if (!v || json_is_null(v)) {
		for (int l = 0; l < n_layers; l++)
			out[l] = def;
		return 0;
	}
	if (json_is_integer(v)) {
		if (json_integer_value(v) < lo || json_integer_value(v) > 1 << 24)
			return hi3_error_set(err, HI3_ERR_INPUT, "%s: field \"%s\": %lld is out of range", name, key,
			                     (long long)json_integer_value(v));
		for (int l = 0; l < n_layers; l++)
			out[l] = (int)json_integer_value(v);
		return 0;
	}
	if (!json_is_array(v))
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: field \"%s\": expected an integer or a list of %d",
		                     name, key, n_layers);
	if ((int)json_array_size(v) != n_layers)
		return hi3_error_set(err, HI3_ERR_INPUT,
		                     "%s: field \"%s\": a list of %zu values, but num_hidden_layers is %d", name, key,
		                     json_array_size(v), n_layers);
	json_array_foreach(v, i, e) {
		if (!json_is_integer(e) || json_integer_value(e) < lo || json_integer_value(e) > 1 << 24)
			return hi3_error_set(err, HI3_ERR_INPUT, "%s: field \"%s\"[%zu]: expected an integer >= %d",
			                     name, key, i, lo);
		out[i] = (int)json_integer_value(e);
	}
	return 0;
}

static int unsupported_true(json_t *root, const char *name, const char *key, hi3_error *err)
{
	if (json_is_true(json_object_get(root, key)))
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: \"%s\": true is not supported by hi3", name, key);
	return 0;
}

int hi3_config_parse(hi3_config *cfg, const char *text, const char *name, hi3_error *err)
{
	json_error_t jerr;
	json_t *root = json_loads(text, 0, &jerr), *v;
	int n_layers, rc = -1;

	memset(cfg, 0, sizeof(*cfg));
	if (!root)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s:%d:%d: not valid JSON: %s", name, jerr.line, jerr.column,
		                     jerr.text);
	if (!json_is_object(root)) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: not a JSON object", name);
		goto out;
	}
	if (get_int(root, name, "vocab_size", -1, 1, 1 << 24, &cfg->vocab_size, err) ||
	    get_int(root, name, "hidden_size", -1, 1, 1 << 20, &cfg->hidden_size, err) ||
	    get_int(root, name, "num_hidden_layers", -1, 1, HI3_MAX_LAYERS, &cfg->num_hidden_layers, err) ||
	    get_int(root, name, "num_attention_heads", -1, 1, 4096, &cfg->num_attention_heads, err) ||
	    get_int(root, name, "num_key_value_heads", cfg->num_attention_heads, 1, 4096,
	            &cfg->num_key_value_heads, err) ||
	    get_int(root, name, "attention_head_dim", cfg->hidden_size / cfg->num_attention_heads, 4, 1024,
	            &cfg->attention_head_dim, err) ||
	    get_int(root, name, "intermediate_size", 0, 0, 1 << 24, &cfg->intermediate_size, err) ||
	    get_int(root, name, "moe_layer_num_skipped", 0, 0, HI3_MAX_LAYERS, &cfg->moe_layer_num_skipped, err) ||
	    get_num(root, name, "rms_norm_eps", 1e-5, &cfg->rms_norm_eps, err) ||
	    get_num(root, name, "rope_theta", 10000.0, &cfg->rope_theta, err) ||
	    get_num(root, name, "routed_scaling_factor", 1.0, &cfg->routed_scaling_factor, err) ||
	    get_bool(root, name, "use_qk_norm", 0, &cfg->use_qk_norm, err) ||
	    get_bool(root, name, "use_mixed_mlp_moe", 0, &cfg->use_mixed_mlp_moe, err) ||
	    get_bool(root, name, "norm_topk_prob", 1, &cfg->norm_topk_prob, err) ||
	    get_bool(root, name, "tie_word_embeddings", 0, &cfg->tie_word_embeddings, err))
		goto out;
	n_layers = cfg->num_hidden_layers;
	if (get_per_layer(root, name, "num_experts", 1, 1, n_layers, cfg->num_experts, err) ||
	    get_per_layer(root, name, "moe_topk", 1, 1, n_layers, cfg->moe_topk, err) ||
	    get_per_layer(root, name, "moe_intermediate_size", cfg->intermediate_size, 1, n_layers,
	                  cfg->moe_intermediate_size, err) ||
	    get_per_layer(root, name, "num_shared_expert", 1, 0, n_layers, cfg->num_shared_expert, err))
		goto out;
	get_id(root, "pad_token_id", &cfg->pad_token_id);
	get_id(root, "bos_token_id", &cfg->bos_token_id);
	get_id(root, "eos_token_id", &cfg->eos_token_id);
	v = json_object_get(root, "hidden_act");
	snprintf(cfg->hidden_act, sizeof(cfg->hidden_act), "%s", json_is_string(v) ? json_string_value(v) : "silu");
	if (strcmp(cfg->hidden_act, "silu")) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: \"hidden_act\": '%s' is not supported (expected \"silu\")", name,
		              cfg->hidden_act);
		goto out;
	}
	v = json_object_get(root, "norm_type");
	if (json_is_string(v) && strcmp(json_string_value(v), "hf_rms") && strcmp(json_string_value(v), "rms")) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: \"norm_type\": '%s' is not supported (expected \"hf_rms\")",
		              name, json_string_value(v));
		goto out;
	}
	if (unsupported_true(root, name, "attention_bias", err) || unsupported_true(root, name, "mlp_bias", err) ||
	    unsupported_true(root, name, "use_cla", err) || unsupported_true(root, name, "use_mla", err) ||
	    unsupported_true(root, name, "group_limited_greedy", err) ||
	    unsupported_true(root, name, "add_classification_head", err))
		goto out;
	if (cfg->num_attention_heads % cfg->num_key_value_heads) {
		hi3_error_set(err, HI3_ERR_INPUT,
		              "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", name,
		              cfg->num_attention_heads, cfg->num_key_value_heads);
		goto out;
	}
	if (cfg->attention_head_dim % 4) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: attention_head_dim %d is not a multiple of 4 (2-D RoPE)", name,
		              cfg->attention_head_dim);
		goto out;
	}
	for (int l = 0; l < n_layers; l++) {
		/* expert ids are stored as I16 (routing records) */
		if (cfg->num_experts[l] > HI3_MAX_EXPERTS) {
			hi3_error_set(err, HI3_ERR_INPUT, "%s: layer %d: num_experts %d is more than hi3 supports (%d: "
			              "expert ids are 16-bit)", name, l, cfg->num_experts[l], HI3_MAX_EXPERTS);
			goto out;
		}
		if (cfg->moe_topk[l] > cfg->num_experts[l] && hi3_config_is_moe_layer(cfg, l)) {
			hi3_error_set(err, HI3_ERR_INPUT, "%s: layer %d: moe_topk %d exceeds num_experts %d", name, l,
			              cfg->moe_topk[l], cfg->num_experts[l]);
			goto out;
		}
		if (hi3_config_is_moe_layer(cfg, l) && cfg->use_mixed_mlp_moe && cfg->num_shared_expert[l] > 0 &&
		    hi3i_config_shared_width(cfg, l) < 0) {
			hi3_error_set(err, HI3_ERR_INPUT, "%s: layer %d: the shared MLP, moe_intermediate_size %d x "
			              "num_shared_expert %d, is wider than %d", name, l, cfg->moe_intermediate_size[l],
			              cfg->num_shared_expert[l], HI3_MAX_WIDTH);
			goto out;
		}
		if (hi3_config_is_moe_layer(cfg, l) && cfg->moe_intermediate_size[l] <= 0) {
			hi3_error_set(err, HI3_ERR_INPUT, "%s: layer %d is MoE but moe_intermediate_size (or "
			              "intermediate_size) is missing", name, l);
			goto out;
		}
		if (!hi3_config_is_moe_layer(cfg, l) && cfg->intermediate_size <= 0) {
			hi3_error_set(err, HI3_ERR_INPUT, "%s: layer %d is dense but intermediate_size is missing", name, l);
			goto out;
		}
	}
	if (!(cfg->rms_norm_eps > 0) || !(cfg->rope_theta > 0)) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: rms_norm_eps and rope_theta must be positive", name);
		goto out;
	}
	cfg->json = strdup(text);
	if (!cfg->json) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		goto out;
	}
	rc = 0;
out:
	json_decref(root);
	return rc;
}

int hi3_config_load(hi3_config *cfg, const char *path, hi3_error *err)
{
	char *text;
	int rc;

	memset(cfg, 0, sizeof(*cfg));
	if (hi3i_read_file(path, &text, NULL, err) != 0)
		return -1;
	rc = hi3_config_parse(cfg, text, path, err);
	free(text);
	return rc;
}

void hi3_config_release(hi3_config *cfg)
{
	free(cfg->json);
	cfg->json = NULL;
}

int hi3i_config_shared_width(const hi3_config *cfg, int layer)
{
	int64_t w;

	if (hi3i_mul_size(cfg->moe_intermediate_size[layer], cfg->num_shared_expert[layer], HI3_MAX_WIDTH, &w))
		return -1;
	return (int)w;
}

int hi3_config_is_moe_layer(const hi3_config *cfg, int layer)
{
	int any = 0;

	for (int l = 0; l < cfg->num_hidden_layers; l++)
		any |= cfg->num_experts[l] > 1;
	return any && layer >= cfg->moe_layer_num_skipped;
}

static int expect(const hi3_ckpt *ck, const char *what, int64_t d0, int64_t d1, int ndim, hi3_error *err)
{
	const hi3_tensor *t = hi3_ckpt_find(ck, what);
	int64_t want[2] = {d0, d1};
	char a[96], b[96];

	if (!t)
		return hi3_error_set(err, HI3_ERR_INPUT, "checkpoint: tensor '%s' is missing (the config needs it)",
		                     what);
	if (!hi3_dtype_is_float(t->dtype) || t->dtype == HI3_F8_E4M3 || t->dtype == HI3_F8_E5M2)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor '%s': dtype %s is not supported for weights "
		                     "(F32, BF16, F16)", hi3_ckpt_file_of(ck, what), what, hi3_dtype_name(t->dtype));
	if (t->ndim != ndim || t->shape[0] != d0 || (ndim == 2 && t->shape[1] != d1))
		return hi3_error_set(err, HI3_ERR_INPUT,
		                     "%s: tensor '%s': the config implies shape %s, the checkpoint has %s",
		                     hi3_ckpt_file_of(ck, what), what, hi3_shape_str(a, sizeof(a), ndim, want),
		                     hi3_shape_str(b, sizeof(b), t->ndim, t->shape));
	return 0;
}

#define NAME(...) (snprintf(nm, sizeof(nm), __VA_ARGS__), nm)

static int validate_mlp(const hi3_config *cfg, const hi3_ckpt *ck, const char *prefix, int width,
                        hi3_error *err)
{
	char nm[256];
	int64_t H = cfg->hidden_size;

	if (expect(ck, NAME("%s.gate_and_up_proj.weight", prefix), 2 * (int64_t)width, H, 2, err) ||
	    expect(ck, NAME("%s.down_proj.weight", prefix), H, width, 2, err))
		return -1;
	return 0;
}

int hi3_config_validate(const hi3_config *cfg, const hi3_ckpt *ck, hi3_error *err)
{
	int64_t H = cfg->hidden_size, d = cfg->attention_head_dim;
	int64_t nh = cfg->num_attention_heads, nkv = cfg->num_key_value_heads;
	char nm[256], pre[128];

	if (expect(ck, "model.wte.weight", cfg->vocab_size, H, 2, err) ||
	    expect(ck, "model.ln_f.weight", H, 0, 1, err))
		return -1;
	if (!cfg->tie_word_embeddings || hi3_ckpt_find(ck, "lm_head.weight"))
		if (expect(ck, "lm_head.weight", cfg->vocab_size, H, 2, err))
			return -1;
	for (int l = 0; l < cfg->num_hidden_layers; l++) {
		snprintf(pre, sizeof(pre), "model.layers.%d", l);
		if (expect(ck, NAME("%s.input_layernorm.weight", pre), H, 0, 1, err) ||
		    expect(ck, NAME("%s.post_attention_layernorm.weight", pre), H, 0, 1, err) ||
		    expect(ck, NAME("%s.self_attn.qkv_proj.weight", pre), (nh + 2 * nkv) * d, H, 2, err) ||
		    expect(ck, NAME("%s.self_attn.o_proj.weight", pre), H, nh * d, 2, err))
			return -1;
		if (cfg->use_qk_norm &&
		    (expect(ck, NAME("%s.self_attn.query_layernorm.weight", pre), d, 0, 1, err) ||
		     expect(ck, NAME("%s.self_attn.key_layernorm.weight", pre), d, 0, 1, err)))
			return -1;
		if (!hi3_config_is_moe_layer(cfg, l)) {
			if (validate_mlp(cfg, ck, NAME("%s.mlp", pre), cfg->intermediate_size, err))
				return -1;
			continue;
		}
		if (expect(ck, NAME("%s.mlp.gate.wg.weight", pre), cfg->num_experts[l], H, 2, err))
			return -1;
		for (int e = 0; e < cfg->num_experts[l]; e++) {
			char ep[160];
			snprintf(ep, sizeof(ep), "%s.mlp.experts.%d", pre, e);
			if (validate_mlp(cfg, ck, ep, cfg->moe_intermediate_size[l], err))
				return -1;
		}
		if (cfg->use_mixed_mlp_moe && cfg->num_shared_expert[l] > 0 &&
		    validate_mlp(cfg, ck, NAME("%s.mlp.shared_mlp", pre),
		                 hi3i_config_shared_width(cfg, l), err))
			return -1;
	}
	return 0;
}

int hi3_fingerprint(const hi3_config *cfg, const hi3_ckpt *ck, char out[17])
{
	json_t *root = json_loads(cfg->json, 0, NULL);
	char *canon = root ? json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
	uint64_t h = HI3_HASH_INIT;

	json_decref(root);
	if (!canon)
		return -1;
	h = hi3i_hash(h, canon, strlen(canon) + 1);
	free(canon);
	for (int i = 0; i < hi3_ckpt_count(ck); i++) {
		const hi3_tensor *t = hi3_ckpt_at(ck, i);
		const char *dt = hi3_dtype_name(t->dtype);

		h = hi3i_hash(h, t->name, strlen(t->name) + 1);
		h = hi3i_hash(h, dt, strlen(dt) + 1);
		for (int j = 0; j < t->ndim; j++)
			h = hi3i_hash(h, &t->shape[j], sizeof(t->shape[j]));
	}
	snprintf(out, 17, "%016llx", (unsigned long long)h);
	return 0;
}
