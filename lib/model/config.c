/*
 * config.c -- config.json as upstream's configuration class reads it
 * (configuration_hunyuan_image_3.py), checked against the checkpoint's
 * tensors, and the model fingerprint.
 *
 * Every field upstream knows is in one table with the JSON type it has in
 * the released config.json and what hi3 does with it. Values are read the
 * way Python would use them: a boolean where a number is expected is 0 or 1
 * (the release has "routed_scaling_factor": false and "n_group": false), a
 * number where a flag is expected is its truth value, null is "not set"
 * (the class default). A field that would change the math in a way hi3
 * does not implement is refused, naming it; the rest are ignored.
 */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include "model/config-internal.h"
#include "model/quant.h"

/* ------------------------------------------------------------ the table */

enum ftype {
	FT_INT,      /* an integer (a boolean is 0 or 1) */
	FT_NUM,      /* a number (integers and booleans too) */
	FT_FLAG,     /* a boolean (a number is its truth value) */
	FT_STR,      /* a string */
	FT_OBJ,      /* an object */
	FT_LAYERS,   /* an integer, or a list of one per layer */
	FT_PAIR,     /* an integer, or a list of two */
	FT_ANY,      /* not read: any JSON value */
};

enum frole { FR_MODEL, FR_IMAGE, FR_VARIANT, FR_CHECKED, FR_IGNORED };

static const char *const role_names[] = {"model", "image", "variant", "checked", "ignored"};

struct field {
	const char *name;
	int type;            /* enum ftype */
	int role;            /* enum frole */
};

/* Every field of the released config.json (98) and of upstream's
 * configuration class, by what hi3 does with it. */
static const struct field fields[] = {
	/* the text forward */
	{"vocab_size", FT_INT, FR_MODEL},
	{"hidden_size", FT_INT, FR_MODEL},
	{"intermediate_size", FT_INT, FR_MODEL},
	{"num_hidden_layers", FT_INT, FR_MODEL},
	{"num_attention_heads", FT_INT, FR_MODEL},
	{"num_key_value_heads", FT_INT, FR_MODEL},
	{"attention_head_dim", FT_INT, FR_MODEL},
	{"rms_norm_eps", FT_NUM, FR_MODEL},
	{"rope_theta", FT_NUM, FR_MODEL},
	{"use_qk_norm", FT_FLAG, FR_MODEL},
	{"use_mixed_mlp_moe", FT_FLAG, FR_MODEL},
	{"moe_layer_num_skipped", FT_INT, FR_MODEL},
	{"norm_topk_prob", FT_FLAG, FR_MODEL},
	{"routed_scaling_factor", FT_NUM, FR_MODEL},
	{"tie_word_embeddings", FT_FLAG, FR_MODEL},
	{"max_position_embeddings", FT_INT, FR_MODEL},
	{"num_experts", FT_LAYERS, FR_MODEL},
	{"moe_topk", FT_LAYERS, FR_MODEL},
	{"moe_intermediate_size", FT_LAYERS, FR_MODEL},
	{"num_shared_expert", FT_LAYERS, FR_MODEL},
	{"pad_token_id", FT_INT, FR_MODEL},
	{"bos_token_id", FT_INT, FR_MODEL},
	{"eos_token_id", FT_INT, FR_MODEL},
	{"hidden_act", FT_STR, FR_MODEL},
	{"norm_type", FT_STR, FR_MODEL},
	{"rope_scaling", FT_OBJ, FR_MODEL},
	{"use_rotary_pos_emb", FT_FLAG, FR_MODEL},
	{"moe_impl", FT_STR, FR_MODEL},
	/* refused when set to what hi3 does not compute */
	{"attention_bias", FT_FLAG, FR_CHECKED},
	{"mlp_bias", FT_FLAG, FR_CHECKED},
	{"use_cla", FT_FLAG, FR_CHECKED},
	{"use_mla", FT_FLAG, FR_CHECKED},
	{"group_limited_greedy", FT_FLAG, FR_CHECKED},
	{"moe_drop_tokens", FT_FLAG, FR_CHECKED},
	{"add_classification_head", FT_FLAG, FR_CHECKED},
	/* the variant */
	{"model_version", FT_STR, FR_VARIANT},
	{"cfg_distilled", FT_FLAG, FR_VARIANT},
	{"use_meanflow", FT_FLAG, FR_VARIANT},
	/* image generation and image input */
	{"rope_type", FT_STR, FR_IMAGE},
	{"image_base_size", FT_INT, FR_IMAGE},
	{"vae_downsample_factor", FT_PAIR, FR_IMAGE},
	{"vit_downsample_factor", FT_PAIR, FR_IMAGE},
	{"patch_size", FT_INT, FR_IMAGE},
	{"patch_embed_hidden_dim", FT_INT, FR_IMAGE},
	{"img_proj_type", FT_STR, FR_IMAGE},
	{"cond_token_attn_type", FT_STR, FR_IMAGE},
	{"cond_image_type", FT_STR, FR_IMAGE},
	{"vae_type", FT_STR, FR_IMAGE},
	{"vae_dtype", FT_STR, FR_IMAGE},
	{"vae_autocast_dtype", FT_STR, FR_IMAGE},
	{"vit_type", FT_STR, FR_IMAGE},
	{"vae", FT_OBJ, FR_IMAGE},
	{"vit", FT_OBJ, FR_IMAGE},
	{"vit_processor", FT_OBJ, FR_IMAGE},
	{"vit_aligner", FT_OBJ, FR_IMAGE},
	/* not read by upstream's model code, or only on paths refused above */
	{"head_dim", FT_INT, FR_IGNORED},
	{"architectures", FT_ANY, FR_IGNORED},
	{"auto_map", FT_ANY, FR_IGNORED},
	{"model_type", FT_ANY, FR_IGNORED},
	{"torch_dtype", FT_ANY, FR_IGNORED},
	{"quantization_config", FT_ANY, FR_MODEL},   /* model/quant.c: hi3-quant(7) */
	{"transformers_version", FT_ANY, FR_IGNORED},
	{"use_cache", FT_ANY, FR_IGNORED},
	{"initializer_range", FT_ANY, FR_IGNORED},
	{"attention_dropout", FT_ANY, FR_IGNORED},
	{"pretraining_tp", FT_ANY, FR_IGNORED},
	{"cla_share_factor", FT_ANY, FR_IGNORED},
	{"kv_lora_rank", FT_ANY, FR_IGNORED},
	{"q_lora_rank", FT_ANY, FR_IGNORED},
	{"qk_rope_head_dim", FT_ANY, FR_IGNORED},
	{"qk_nope_head_dim", FT_ANY, FR_IGNORED},
	{"v_head_dim", FT_ANY, FR_IGNORED},
	{"n_group", FT_ANY, FR_IGNORED},
	{"topk_group", FT_ANY, FR_IGNORED},
	{"capacity_factor", FT_ANY, FR_IGNORED},
	{"moe_random_routing_dropped_token", FT_ANY, FR_IGNORED},
	{"class_num", FT_ANY, FR_IGNORED},
	{"dense_list", FT_ANY, FR_IGNORED},
	{"pool_type", FT_ANY, FR_IGNORED},
	{"pad_id", FT_ANY, FR_IGNORED},
	{"eod_token_id", FT_ANY, FR_IGNORED},
	{"im_start_id", FT_ANY, FR_IGNORED},
	{"im_end_id", FT_ANY, FR_IGNORED},
	{"im_newline_id", FT_ANY, FR_IGNORED},
	{"image_token_id", FT_ANY, FR_IGNORED},
	{"mask_init_id", FT_ANY, FR_IGNORED},
	{"text_start_id", FT_ANY, FR_IGNORED},
	{"text_end_id", FT_ANY, FR_IGNORED},
	{"video_start_id", FT_ANY, FR_IGNORED},
	{"video_end_id", FT_ANY, FR_IGNORED},
	{"num_media_embeds", FT_ANY, FR_IGNORED},
	{"position_embedding_xdrope", FT_ANY, FR_IGNORED},
	{"xdrope_section", FT_ANY, FR_IGNORED},
	{"skip_cls_token", FT_ANY, FR_IGNORED},
	{"anyres_pooling_size", FT_ANY, FR_IGNORED},
	{"anyres_vit_max_image_size", FT_ANY, FR_IGNORED},
	{"anyres_vit_two_views", FT_ANY, FR_IGNORED},
	{"vit_add_patchemb_bias", FT_ANY, FR_IGNORED},
	{"vit_input_resolution", FT_ANY, FR_IGNORED},
	{"vit_mapping_type", FT_ANY, FR_IGNORED},
	{"vit_norm_type", FT_ANY, FR_IGNORED},
	{"vit_patch", FT_ANY, FR_IGNORED},
	{"vit_path", FT_ANY, FR_IGNORED},
	{"vit_remove_prenorm", FT_ANY, FR_IGNORED},
	{"vit_token", FT_ANY, FR_IGNORED},
	{"vit_used_rms_norm", FT_ANY, FR_IGNORED},
};

static const struct field *field_of(const char *name)
{
	for (size_t i = 0; i < HI3_ARRAY_SIZE(fields); i++)
		if (!strcmp(fields[i].name, name))
			return &fields[i];
	return NULL;
}

const char *hi3_config_field_role(const char *name)
{
	const struct field *f = field_of(name);

	return f ? role_names[f->role] : NULL;
}

/* ------------------------------------------------------- reading values */

/* Where values are read from, for messages: the file and, inside a block,
 * the block's name ("vae", ...). */
struct src {
	const char *file;
	const char *block;           /* NULL at the top level */
	hi3_error *err;
};

static const char *jtype(const json_t *v)
{
	switch (json_typeof(v)) {
	case JSON_OBJECT: return "an object";
	case JSON_ARRAY: return "a list";
	case JSON_STRING: return "a string";
	case JSON_INTEGER: return "an integer";
	case JSON_REAL: return "a real number";
	case JSON_TRUE: return "true";
	case JSON_FALSE: return "false";
	default: return "null";
	}
}

static int bad(const struct src *s, const char *key, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int bad(const struct src *s, const char *key, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (s->block)
		return hi3_error_set(s->err, HI3_ERR_INPUT, "%s: field \"%s.%s\": %s", s->file, s->block, key, msg);
	return hi3_error_set(s->err, HI3_ERR_INPUT, "%s: field \"%s\": %s", s->file, key, msg);
}

/* An integer as Python sees one: an integer or a boolean. */
static int as_int(const json_t *v, int64_t *out)
{
	if (json_is_integer(v))
		*out = json_integer_value(v);
	else if (json_is_boolean(v))
		*out = json_is_true(v);
	else
		return -1;
	return 0;
}

static int as_num(const json_t *v, double *out)
{
	if (json_is_number(v))
		*out = json_number_value(v);
	else if (json_is_boolean(v))
		*out = json_is_true(v);
	else
		return -1;
	return 0;
}

/* An integer field in [lo, hi]; absent or null gives def (def < lo: the
 * field is required). */
static int get_int(json_t *obj, const struct src *s, const char *key, int64_t def, int64_t lo, int64_t hi, int *out)
{
	json_t *v = json_object_get(obj, key);
	int64_t x;

	if (!v || json_is_null(v)) {
		if (def < lo)
			return s->block ? bad(s, key, "required, missing")
			                : hi3_error_set(s->err, HI3_ERR_INPUT, "%s: required field \"%s\" is missing", s->file,
			                                key);
		*out = (int)def;
		return 0;
	}
	if (as_int(v, &x) != 0)
		return bad(s, key, "expected an integer, found %s", jtype(v));
	if (x < lo || x > hi)
		return bad(s, key, "%lld is out of range: expected an integer in [%lld, %lld]", (long long)x, (long long)lo,
		           (long long)hi);
	*out = (int)x;
	return 0;
}

static int get_num(json_t *obj, const struct src *s, const char *key, double def, double *out)
{
	json_t *v = json_object_get(obj, key);

	if (!v || json_is_null(v)) {
		*out = def;
		return 0;
	}
	if (as_num(v, out) != 0)
		return bad(s, key, "expected a number, found %s", jtype(v));
	if (!isfinite(*out))
		return bad(s, key, "expected a finite number");
	return 0;
}

/* A flag: true/false, or a number read as its truth value. */
static int get_flag(json_t *obj, const struct src *s, const char *key, int def, int *out)
{
	json_t *v = json_object_get(obj, key);

	if (!v || json_is_null(v)) {
		*out = def;
		return 0;
	}
	if (json_is_boolean(v))
		*out = json_is_true(v);
	else if (json_is_number(v))
		*out = json_number_value(v) != 0;
	else
		return bad(s, key, "expected true or false, found %s", jtype(v));
	return 0;
}

static int get_str(json_t *obj, const struct src *s, const char *key, const char *def, char *out, size_t n)
{
	json_t *v = json_object_get(obj, key);
	const char *str = def;

	if (v && !json_is_null(v)) {
		if (!json_is_string(v))
			return bad(s, key, "expected a string, found %s", jtype(v));
		str = json_string_value(v);
		if (strlen(str) >= n)
			return bad(s, key, "'%.40s...' is longer than hi3 keeps (%zu bytes)", str, n - 1);
	}
	snprintf(out, n, "%s", str);
	return 0;
}

/* An integer per layer: an int for every layer or a list of one each. */
static int get_layers(json_t *obj, const struct src *s, const char *key, int def, int lo, int n_layers, int *out)
{
	json_t *v = json_object_get(obj, key), *e;
	int64_t x;
	size_t i;

	if (!v || json_is_null(v)) {
		for (int l = 0; l < n_layers; l++)
			out[l] = def;
		return 0;
	}
	if (!json_is_array(v)) {
		if (as_int(v, &x) != 0)
			return bad(s, key, "expected an integer or a list of %d (one per layer), found %s", n_layers, jtype(v));
		if (x < lo || x > HI3_MAX_WIDTH)
			return bad(s, key, "%lld is out of range: expected an integer in [%d, %d]", (long long)x, lo, HI3_MAX_WIDTH);
		for (int l = 0; l < n_layers; l++)
			out[l] = (int)x;
		return 0;
	}
	if ((int)json_array_size(v) != n_layers)
		return bad(s, key, "a list of %zu values, but num_hidden_layers is %d (one per layer)", json_array_size(v),
		           n_layers);
	json_array_foreach(v, i, e) {
		int is_int = as_int(e, &x) == 0;
		if (!is_int || x < lo || x > HI3_MAX_WIDTH) {
			char k[96];
			snprintf(k, sizeof(k), "%s[%zu]", key, i);
			return is_int ? bad(s, k, "%lld is out of range: expected an integer in [%d, %d]", (long long)x, lo,
			                    HI3_MAX_WIDTH)
			              : bad(s, k, "expected an integer, found %s", jtype(e));
		}
		out[i] = (int)x;
	}
	return 0;
}

/* An (h, w) pair: one integer for both, or a list of two (upstream indexes
 * [0] and [1]; a longer list is refused). */
static int get_pair(json_t *obj, const struct src *s, const char *key, int def, int out[2])
{
	json_t *v = json_object_get(obj, key);
	int64_t a, b;

	if (!v || json_is_null(v)) {
		out[0] = out[1] = def;
		return 0;
	}
	if (!json_is_array(v)) {
		if (as_int(v, &a) != 0)
			return bad(s, key, "expected an integer or [h, w], found %s", jtype(v));
		b = a;
	} else if (json_array_size(v) != 2 || as_int(json_array_get(v, 0), &a) || as_int(json_array_get(v, 1), &b)) {
		return bad(s, key, "expected [h, w] (two integers)");
	}
	if (a < 1 || b < 1 || a > 1 << 16 || b > 1 << 16)
		return bad(s, key, "expected factors in [1, 65536]");
	out[0] = (int)a;
	out[1] = (int)b;
	return 0;
}

static int get_id(json_t *obj, const struct src *s, const char *key, int64_t *out)
{
	json_t *v = json_object_get(obj, key);

	*out = -1;
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return bad(s, key, "expected a token id (an integer >= 0), found %s", jtype(v));
	*out = json_integer_value(v);
	return 0;
}

/* A list of n numbers. */
static int get_num3(json_t *obj, const struct src *s, const char *key, double def, double out[3])
{
	json_t *v = json_object_get(obj, key);

	for (int i = 0; i < 3; i++)
		out[i] = def;
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_array(v) || json_array_size(v) != 3)
		return bad(s, key, "expected a list of 3 numbers (one per channel), found %s", jtype(v));
	for (int i = 0; i < 3; i++)
		if (as_num(json_array_get(v, (size_t)i), &out[i]) != 0)
			return bad(s, key, "expected a list of 3 numbers");
	return 0;
}

/* One of the given names. */
static int one_of(const struct src *s, const char *key, const char *val, const char *const *names, const char *why)
{
	char list[256] = "";

	for (int i = 0; names[i]; i++) {
		if (!strcmp(val, names[i]))
			return 0;
		snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s", i ? ", " : "", names[i]);
	}
	return bad(s, key, "'%s' %s (expected %s)", val, why, list);
}

/* ------------------------------------------------------------ the blocks */

static int vae_block(hi3_vae_config *b, json_t *root, struct src *s)
{
	json_t *v = json_object_get(root, "vae"), *boc, *e;
	size_t i;

	if (!v || json_is_null(v))
		return 0;
	s->block = "vae";
	b->present = 1;
	boc = json_object_get(v, "block_out_channels");
	if (boc && !json_is_array(boc))
		return bad(s, "block_out_channels", "expected a list of integers, found %s", jtype(boc));
	if (boc && (json_array_size(boc) < 1 || json_array_size(boc) > HI3_ARRAY_SIZE(b->block_out_channels)))
		return bad(s, "block_out_channels", "expected 1 to %zu levels, found %zu",
		           HI3_ARRAY_SIZE(b->block_out_channels), json_array_size(boc));
	json_array_foreach(boc, i, e) {
		int64_t x;
		if (as_int(e, &x) != 0 || x < 1 || x > 1 << 20)
			return bad(s, "block_out_channels", "element %zu: expected a positive integer", i);
		b->block_out_channels[i] = (int)x;
	}
	b->n_levels = boc ? (int)json_array_size(boc) : 0;
	if (get_int(v, s, "in_channels", 3, 1, 1 << 16, &b->in_channels) ||
	    get_int(v, s, "out_channels", 3, 1, 1 << 16, &b->out_channels) ||
	    get_int(v, s, "latent_channels", 32, 1, 1 << 16, &b->latent_channels) ||
	    get_int(v, s, "layers_per_block", 2, 1, 64, &b->layers_per_block) ||
	    get_int(v, s, "ffactor_spatial", 16, 1, 1 << 10, &b->ffactor_spatial) ||
	    get_int(v, s, "ffactor_temporal", 4, 1, 1 << 10, &b->ffactor_temporal) ||
	    get_int(v, s, "sample_size", 384, 1, 1 << 20, &b->sample_size) ||
	    get_int(v, s, "sample_tsize", 96, 1, 1 << 20, &b->sample_tsize) ||
	    get_flag(v, s, "downsample_match_channel", 1, &b->downsample_match_channel) ||
	    get_flag(v, s, "upsample_match_channel", 1, &b->upsample_match_channel) ||
	    get_num(v, s, "scaling_factor", 1.0, &b->scaling_factor))
		return -1;
	if (json_object_get(v, "shift_factor") && !json_is_null(json_object_get(v, "shift_factor"))) {
		b->has_shift_factor = 1;
		if (get_num(v, s, "shift_factor", 0.0, &b->shift_factor))
			return -1;
	}
	s->block = NULL;
	return 0;
}

static int vit_blocks(hi3_config *c, json_t *root, struct src *s)
{
	json_t *v = json_object_get(root, "vit");

	if (v && !json_is_null(v)) {
		hi3_vit_config *b = &c->vit;
		s->block = "vit";
		b->present = 1;
		if (get_int(v, s, "hidden_size", 1152, 1, 1 << 20, &b->hidden_size) ||
		    get_int(v, s, "intermediate_size", 4304, 1, 1 << 22, &b->intermediate_size) ||
		    get_int(v, s, "num_attention_heads", 16, 1, 4096, &b->num_attention_heads) ||
		    get_int(v, s, "num_hidden_layers", 27, 0, 4096, &b->num_hidden_layers) ||
		    get_int(v, s, "num_channels", 3, 1, 64, &b->num_channels) ||
		    get_int(v, s, "num_patches", 256, 1, 1 << 20, &b->num_patches) ||
		    get_int(v, s, "patch_size", 16, 1, 1024, &b->patch_size) ||
		    get_num(v, s, "layer_norm_eps", 1e-6, &b->layer_norm_eps) ||
		    get_str(v, s, "hidden_act", "gelu_pytorch_tanh", b->hidden_act, sizeof(b->hidden_act)))
			return -1;
		if (b->hidden_size % b->num_attention_heads)
			return bad(s, "num_attention_heads", "%d does not divide hidden_size %d", b->num_attention_heads,
			           b->hidden_size);
	}
	v = json_object_get(root, "vit_processor");
	if (v && !json_is_null(v)) {
		hi3_vit_processor_config *b = &c->vit_processor;
		s->block = "vit_processor";
		b->present = 1;
		if (get_int(v, s, "patch_size", 16, 1, 1024, &b->patch_size) ||
		    get_int(v, s, "max_num_patches", 256, 1, 1 << 24, &b->max_num_patches) ||
		    get_int(v, s, "resample", 2, 0, 16, &b->resample) ||
		    get_flag(v, s, "do_normalize", 1, &b->do_normalize) || get_flag(v, s, "do_rescale", 1, &b->do_rescale) ||
		    get_flag(v, s, "do_resize", 1, &b->do_resize) ||
		    get_num(v, s, "rescale_factor", 1.0 / 255, &b->rescale_factor) ||
		    get_num3(v, s, "image_mean", 0.5, b->image_mean) || get_num3(v, s, "image_std", 0.5, b->image_std))
			return -1;
	} else {
		/* upstream cannot run without the block; the template's ViT
		 * grid takes the released values */
		c->vit_processor.patch_size = 16;
		c->vit_processor.max_num_patches = 1024;
	}
	v = json_object_get(root, "vit_aligner");
	if (v && !json_is_null(v)) {
		hi3_vit_aligner_config *b = &c->vit_aligner;
		s->block = "vit_aligner";
		b->present = 1;
		if (get_str(v, s, "projector_type", "mlp_gelu", b->projector_type, sizeof(b->projector_type)) ||
		    get_int(v, s, "input_dim", 1152, 1, 1 << 20, &b->input_dim) ||
		    get_int(v, s, "n_embed", c->hidden_size, 1, 1 << 20, &b->n_embed) ||
		    get_int(v, s, "depth", 2, 1, 64, &b->depth))
			return -1;
	}
	s->block = NULL;
	return 0;
}

/* ------------------------------------------------------------- checks */

static void warn(hi3_config *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void warn(hi3_config *c, const char *fmt, ...)
{
	va_list ap;

	if (c->n_warnings >= HI3_MAX_CONFIG_WARNINGS)
		return;
	va_start(ap, fmt);
	vsnprintf(c->warnings[c->n_warnings++], sizeof(c->warnings[0]), fmt, ap);
	va_end(ap);
}

/* Every field of the table with a type: its value has that type. */
static int check_types(json_t *root, const struct src *s)
{
	const char *key;
	json_t *v;

	json_object_foreach(root, key, v) {
		const struct field *f = field_of(key);
		int64_t x;
		int okay = 1;

		if (!f || json_is_null(v))
			continue;
		switch (f->type) {
		case FT_INT: okay = as_int(v, &x) == 0; break;
		case FT_NUM: okay = json_is_number(v) || json_is_boolean(v); break;
		case FT_FLAG: okay = json_is_boolean(v) || json_is_number(v); break;
		case FT_STR: okay = json_is_string(v); break;
		case FT_OBJ: okay = json_is_object(v); break;
		case FT_LAYERS: okay = json_is_array(v) || as_int(v, &x) == 0; break;
		case FT_PAIR: okay = json_is_array(v) || as_int(v, &x) == 0; break;
		default: break;
		}
		if (!okay) {
			static const char *const want[] = {"an integer", "a number", "true or false", "a string", "an object",
			                                   "an integer or a list of one per layer", "an integer or [h, w]"};
			return bad(s, key, "expected %s, found %s", want[f->type], jtype(v));
		}
	}
	return 0;
}

/* Fields whose value would change the math in a way hi3 does not compute.
 * (upstream's model code reads attention_bias, mlp_bias, moe_drop_tokens,
 * group_limited_greedy, add_classification_head, use_rotary_pos_emb,
 * rope_scaling, norm_type, hidden_act; use_cla and use_mla name layer
 * kinds whose weights hi3 could not load.) */
static int refuse_unsupported(json_t *root, const struct src *s)
{
	static const struct {
		const char *key, *what;
	} flags[] = {
		{"attention_bias", "biases on the attention projections"},
		{"mlp_bias", "biases on the MLP projections"},
		{"use_cla", "cross-layer attention (CLA)"},
		{"use_mla", "multi-head latent attention (MLA)"},
		{"group_limited_greedy", "group-limited expert routing"},
		{"moe_drop_tokens", "capacity-limited expert routing that drops tokens"},
		{"add_classification_head", "a classification head instead of ln_f and lm_head"},
	};
	static const char *const norms[] = {"hf_rms", "rms", NULL};
	json_t *v, *type;
	int on;

	for (size_t i = 0; i < HI3_ARRAY_SIZE(flags); i++) {
		if (get_flag(root, s, flags[i].key, 0, &on) != 0)
			return -1;
		if (on)
			return bad(s, flags[i].key, "true is not supported by hi3 (%s)", flags[i].what);
	}
	if (get_flag(root, s, "use_rotary_pos_emb", 1, &on) != 0)
		return -1;
	if (!on)
		return bad(s, "use_rotary_pos_emb", "false is not supported by hi3 (attention without RoPE)");
	v = json_object_get(root, "rope_scaling");
	if (v && !json_is_null(v)) {
		type = json_object_get(v, "type");
		if (!json_is_string(type) || strcmp(json_string_value(type), "custom"))
			return bad(s, "rope_scaling", "type %s%s%s is not supported (expected \"custom\": upstream's own 2-D "
			           "RoPE, no scaling)", json_is_string(type) ? "'" : "",
			           json_is_string(type) ? json_string_value(type) : jtype(type ? type : json_null()),
			           json_is_string(type) ? "'" : "");
	}
	v = json_object_get(root, "norm_type");
	if (json_is_string(v) && one_of(s, "norm_type", json_string_value(v), norms,
	                                "is not supported by hi3 (only RMSNorm; 'fused' and 'torch_nn' are LayerNorm)"))
		return -1;
	return 0;
}

/* routed_scaling_factor matters where upstream uses it: on MoE layers with
 * norm_topk_prob false or top-1 routing (weights p * factor). */
static void check_routed_scaling(hi3_config *c, json_t *root)
{
	json_t *v = json_object_get(root, "routed_scaling_factor");
	int used = -1;

	for (int l = 0; l < c->num_hidden_layers && used < 0; l++)
		if (hi3_config_is_moe_layer(c, l) && (!c->norm_topk_prob || c->moe_topk[l] == 1))
			used = l;
	if (used < 0)
		return;
	if (c->routed_scaling_factor == 0.0)
		warn(c, "\"routed_scaling_factor\" is %s, and layer %d uses it (%s): every routed expert's weight is 0, "
		     "so the MoE layers add only the shared MLP (upstream computes the same)",
		     json_is_false(v) ? "false (0, as Python reads it)" : "0", used,
		     c->norm_topk_prob ? "moe_topk 1" : "norm_topk_prob false");
}

static int check_shapes(hi3_config *c, const struct src *s)
{
	int n_layers = c->num_hidden_layers;

	if (c->num_attention_heads % c->num_key_value_heads)
		return hi3_error_set(s->err, HI3_ERR_INPUT,
		                     "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", s->file,
		                     c->num_attention_heads, c->num_key_value_heads);
	if (c->attention_head_dim % 4)
		return hi3_error_set(s->err, HI3_ERR_INPUT, "%s: attention_head_dim %d is not a multiple of 4 (2-D RoPE)",
		                     s->file, c->attention_head_dim);
	for (int l = 0; l < n_layers; l++) {
		int moe = hi3_config_is_moe_layer(c, l);
		/* expert ids are stored as I16 (routing records) */
		if (c->num_experts[l] > HI3_MAX_EXPERTS)
			return hi3_error_set(s->err, HI3_ERR_INPUT, "%s: layer %d: num_experts %d is more than hi3 supports "
			                     "(%d: expert ids are 16-bit)", s->file, l, c->num_experts[l], HI3_MAX_EXPERTS);
		if (moe && c->moe_topk[l] > c->num_experts[l])
			return hi3_error_set(s->err, HI3_ERR_INPUT, "%s: layer %d: moe_topk %d exceeds num_experts %d",
			                     s->file, l, c->moe_topk[l], c->num_experts[l]);
		if (!moe && c->intermediate_size <= 0)
			return hi3_error_set(s->err, HI3_ERR_INPUT, "%s: layer %d is dense but intermediate_size is missing",
			                     s->file, l);
		if (moe && c->use_mixed_mlp_moe && c->num_shared_expert[l] > 0 && hi3i_config_shared_width(c, l) < 0)
			return hi3_error_set(s->err, HI3_ERR_INPUT, "%s: layer %d: the shared MLP, moe_intermediate_size %d x "
			                     "num_shared_expert %d, is wider than %d", s->file, l, c->moe_intermediate_size[l],
			                     c->num_shared_expert[l], HI3_MAX_WIDTH);
		if (moe && c->moe_intermediate_size[l] <= 0)
			return hi3_error_set(s->err, HI3_ERR_INPUT, "%s: layer %d is MoE but moe_intermediate_size (or "
			                     "intermediate_size) is missing", s->file, l);
	}
	if (!(c->rms_norm_eps > 0) || !(c->rope_theta > 0))
		return hi3_error_set(s->err, HI3_ERR_INPUT, "%s: rms_norm_eps and rope_theta must be positive", s->file);
	return 0;
}

/* ------------------------------------------------------------- parsing */

/* The token ids and the position bound, all a template needs; a partial
 * read still checks the per-layer lists against num_hidden_layers. */
static int parse_ids(hi3_config *c, json_t *root, struct src *s, int partial)
{
	static const char *const layered[] = {"num_experts", "moe_topk", "moe_intermediate_size", "num_shared_expert"};
	int scratch[HI3_MAX_LAYERS];

	if (partial && json_is_integer(json_object_get(root, "num_hidden_layers"))) {
		if (get_int(root, s, "num_hidden_layers", -1, 1, HI3_MAX_LAYERS, &c->num_hidden_layers))
			return -1;
		for (size_t i = 0; i < HI3_ARRAY_SIZE(layered); i++)
			if (get_layers(root, s, layered[i], 1, 0, c->num_hidden_layers, scratch))
				return -1;
	}
	return get_int(root, s, "vocab_size", partial ? 0 : -1, partial ? 0 : 1, 1 << 24, &c->vocab_size) ||
	       get_int(root, s, "max_position_embeddings", partial ? 0 : 2048, partial ? 0 : 1, INT32_MAX,
	               &c->max_position_embeddings) ||
	       get_id(root, s, "pad_token_id", &c->pad_token_id) || get_id(root, s, "bos_token_id", &c->bos_token_id) ||
	       get_id(root, s, "eos_token_id", &c->eos_token_id)
	               ? -1 : 0;
}

static int parse_model(hi3_config *c, json_t *root, struct src *s)
{
	static const char *const acts[] = {"silu", NULL};
	int n_layers;

	if (get_int(root, s, "hidden_size", -1, 1, 1 << 20, &c->hidden_size) ||
	    get_int(root, s, "hidden_size", -1, 1, 1 << 20, &c->hidden_size) ||
	    get_int(root, s, "num_hidden_layers", -1, 1, HI3_MAX_LAYERS, &c->num_hidden_layers) ||
	    get_int(root, s, "num_attention_heads", -1, 1, 4096, &c->num_attention_heads) ||
	    get_int(root, s, "num_key_value_heads", c->num_attention_heads, 1, 4096, &c->num_key_value_heads) ||
	    get_int(root, s, "attention_head_dim", c->hidden_size / c->num_attention_heads, 4, 1024,
	            &c->attention_head_dim) ||
	    get_int(root, s, "intermediate_size", 0, 0, HI3_MAX_WIDTH, &c->intermediate_size) ||
	    get_int(root, s, "moe_layer_num_skipped", 0, 0, HI3_MAX_LAYERS, &c->moe_layer_num_skipped) ||
	    get_num(root, s, "rms_norm_eps", 1e-5, &c->rms_norm_eps) ||
	    get_num(root, s, "rope_theta", 10000.0, &c->rope_theta) ||
	    get_num(root, s, "routed_scaling_factor", 1.0, &c->routed_scaling_factor) ||
	    get_flag(root, s, "use_qk_norm", 0, &c->use_qk_norm) ||
	    get_flag(root, s, "use_mixed_mlp_moe", 0, &c->use_mixed_mlp_moe) ||
	    get_flag(root, s, "norm_topk_prob", 1, &c->norm_topk_prob) ||
	    get_flag(root, s, "tie_word_embeddings", 0, &c->tie_word_embeddings) ||
	    get_str(root, s, "hidden_act", "silu", c->hidden_act, sizeof(c->hidden_act)) ||
	    get_str(root, s, "moe_impl", "eager", c->moe_impl, sizeof(c->moe_impl)))
		return -1;
	if (one_of(s, "hidden_act", c->hidden_act, acts, "is not supported by hi3 (SwiGLU MLPs only)"))
		return -1;
	n_layers = c->num_hidden_layers;
	if (get_layers(root, s, "num_experts", 1, 1, n_layers, c->num_experts) ||
	    get_layers(root, s, "moe_topk", 1, 1, n_layers, c->moe_topk) ||
	    get_layers(root, s, "moe_intermediate_size", c->intermediate_size, 1, n_layers, c->moe_intermediate_size) ||
	    get_layers(root, s, "num_shared_expert", 1, 0, n_layers, c->num_shared_expert))
		return -1;
	if (strcmp(c->moe_impl, "eager"))
		warn(c, "\"moe_impl\" is '%s': hi3 computes upstream's eager routing (top-k weights normalised only "
		     "with norm_topk_prob and k > 1, else p * routed_scaling_factor)", c->moe_impl);
	return 0;
}

static int parse_image(hi3_config *c, json_t *root, struct src *s)
{
	static const char *const rope_types[] = {"2d", "default", NULL};
	static const char *const attn_types[] = {"full", "full_causal", "causal", "joint_full", NULL};
	static const char *const image_types[] = {"vae", "vit", "vae_vit", NULL};
	static const char *const proj_types[] = {"unet", NULL};

	if (get_str(root, s, "model_version", "", c->model_version, sizeof(c->model_version)) ||
	    get_flag(root, s, "cfg_distilled", 0, &c->cfg_distilled) ||
	    get_flag(root, s, "use_meanflow", 0, &c->use_meanflow) ||
	    get_str(root, s, "rope_type", "2d", c->rope_type, sizeof(c->rope_type)) ||
	    get_int(root, s, "image_base_size", 1024, 16, 1 << 16, &c->image_base_size) ||
	    get_pair(root, s, "vae_downsample_factor", 16, c->vae_downsample_factor) ||
	    get_pair(root, s, "vit_downsample_factor", 16, c->vit_downsample_factor) ||
	    get_int(root, s, "patch_size", 1, 1, 1 << 10, &c->patch_size) ||
	    get_int(root, s, "patch_embed_hidden_dim", 1024, 1, 1 << 20, &c->patch_embed_hidden_dim) ||
	    get_str(root, s, "img_proj_type", "unet", c->img_proj_type, sizeof(c->img_proj_type)) ||
	    get_str(root, s, "cond_token_attn_type", "full", c->cond_token_attn_type, sizeof(c->cond_token_attn_type)) ||
	    get_str(root, s, "cond_image_type", "vae_vit", c->cond_image_type, sizeof(c->cond_image_type)) ||
	    get_str(root, s, "vae_type", "", c->vae_type, sizeof(c->vae_type)) ||
	    get_str(root, s, "vae_dtype", "float32", c->vae_dtype, sizeof(c->vae_dtype)) ||
	    get_str(root, s, "vae_autocast_dtype", "float16", c->vae_autocast_dtype, sizeof(c->vae_autocast_dtype)) ||
	    get_str(root, s, "vit_type", "", c->vit_type, sizeof(c->vit_type)))
		return -1;
	if (one_of(s, "rope_type", c->rope_type, rope_types, "is not known to upstream") ||
	    one_of(s, "cond_token_attn_type", c->cond_token_attn_type, attn_types, "is not known to upstream") ||
	    one_of(s, "cond_image_type", c->cond_image_type, image_types, "is not known to upstream") ||
	    one_of(s, "img_proj_type", c->img_proj_type, proj_types, "is not known to upstream"))
		return -1;
	if (c->patch_size != 1 && c->patch_size != 2 && c->patch_size != 4 && c->patch_size != 8)
		return bad(s, "patch_size", "%d: upstream's patch embedding takes 1, 2, 4 or 8", c->patch_size);
	return vae_block(&c->vae, root, s) || vit_blocks(c, root, s) ? -1 : 0;
}

/* partial: the template's view (no text model dimensions required). */
static int parse(hi3_config *cfg, const char *text, const char *name, int partial, hi3_error *err)
{
	json_error_t jerr;
	json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &jerr), *hd;
	struct src s = {.file = name, .err = err};
	int rc = -1;

	memset(cfg, 0, sizeof(*cfg));
	if (!root)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s:%d:%d: not valid JSON: %s", name, jerr.line, jerr.column,
		                     jerr.text);
	if (!json_is_object(root)) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: not a JSON object", name);
		goto out;
	}
	if (check_types(root, &s) || refuse_unsupported(root, &s) || parse_ids(cfg, root, &s, partial) ||
	    (!partial && parse_model(cfg, root, &s)) || parse_image(cfg, root, &s) || (!partial && check_shapes(cfg, &s)))
		goto out;
	if (!partial)
		check_routed_scaling(cfg, root);
	hd = json_object_get(root, "head_dim");
	if (!partial && json_is_integer(hd) && json_integer_value(hd) != cfg->attention_head_dim)
		warn(cfg, "\"head_dim\" %lld differs from attention_head_dim %d; upstream (and hi3) use "
		     "attention_head_dim", (long long)json_integer_value(hd), cfg->attention_head_dim);
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

int hi3_config_parse(hi3_config *cfg, const char *text, const char *name, hi3_error *err)
{
	return parse(cfg, text, name, 0, err);
}

static int load(hi3_config *cfg, const char *path, int partial, hi3_error *err)
{
	char *text;
	int rc;

	memset(cfg, 0, sizeof(*cfg));
	if (hi3i_read_file(path, &text, NULL, err) != 0)
		return -1;
	rc = parse(cfg, text, path, partial, err);
	free(text);
	return rc;
}

int hi3_config_load(hi3_config *cfg, const char *path, hi3_error *err)
{
	return load(cfg, path, 0, err);
}

int hi3i_config_load_partial(hi3_config *cfg, const char *path, hi3_error *err)
{
	return load(cfg, path, 1, err);
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

/* ------------------------------------------------------------ variants */

const char *hi3_variant_name(int variant)
{
	static const char *const names[] = {"base", "instruct", "instruct-distil"};

	return variant >= 0 && variant < (int)HI3_ARRAY_SIZE(names) ? names[variant] : "unknown";
}

int hi3_variant_of(const hi3_config *c, const hi3_gen_defaults *g, char *why, size_t n)
{
	char scratch[8];

	if (!why) {
		why = scratch;
		n = sizeof(scratch);
	}
	if (c->cfg_distilled || c->use_meanflow) {
		snprintf(why, n, "config.json: %s%s%s", c->cfg_distilled ? "cfg_distilled true" : "",
		         c->cfg_distilled && c->use_meanflow ? ", " : "", c->use_meanflow ? "use_meanflow true" : "");
		return HI3_VARIANT_DISTIL;
	}
	if (c->model_version[0]) {
		int instruct = !strncmp(c->model_version, "HunyuanImage-3.0-Instruct", 25);
		snprintf(why, n, "config.json: model_version '%s'", c->model_version);
		return instruct ? HI3_VARIANT_INSTRUCT : HI3_VARIANT_BASE;
	}
	if (g && !strcmp(g->sequence_template, "instruct")) {
		snprintf(why, n, "config.json has no model_version; generation_config.json: sequence_template instruct");
		return HI3_VARIANT_INSTRUCT;
	}
	snprintf(why, n, "config.json has no model_version%s", g && g->present ? ", generation_config.json's "
	         "sequence_template is not instruct" : " and there is no generation_config.json");
	return HI3_VARIANT_BASE;
}

/* ------------------------------------------------------------ validate */

static int expect(const hi3_ckpt *ck, const char *what, int64_t d0, int64_t d1, int ndim, hi3_error *err)
{
	const hi3_tensor *t = hi3_ckpt_find(ck, what);
	int64_t want[2] = {d0, d1};
	char a[96], b[96];

	int64_t q[2];
	int qr;

	if (!t)
		return hi3_error_set(err, HI3_ERR_INPUT, "checkpoint: tensor '%s' is missing (the config needs it)",
		                     what);
	if (ndim == 2 && (qr = hi3i_quant_logical_shape(ck, what, q, err)) != 0) {
		if (qr < 0)
			return -1;
		/* a quantized matrix: the shape it stands for (model/quant.h) */
		if (q[0] != d0 || q[1] != d1)
			return hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor '%s': the config implies shape %s, the "
			                     "quantized checkpoint has %s", hi3_ckpt_file_of(ck, what), what,
			                     hi3_shape_str(a, sizeof(a), ndim, want), hi3_shape_str(b, sizeof(b), 2, q));
		return 0;
	}
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

int hi3i_config_vae_block(hi3_vae_config *b, json_t *root, const char *name, hi3_error *err)
{
	struct src s = {.file = name, .err = err};

	memset(b, 0, sizeof(*b));
	return vae_block(b, root, &s);
}
