/*
 * init-model.c -- `hi3 init-model`: deterministic random-init checkpoints with the
 * upstream tensor names, plus a byte-level tokenizer.json holding every
 * special token the sequence template uses.
 *
 * Determinism: element i of tensor NAME is a function of (seed, NAME, i)
 * only (a counter-based stream), so a checkpoint does not depend on thread
 * count or on the order tensors are written.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include "core/internal.h"

/* ------------------------------------------------------------- presets */

static const char *const preset_names[] = {"tiny", "tiny-moe", "small", NULL};

static const char preset_tiny[] =
	"{\"vocab_size\": 512, \"hidden_size\": 128, \"intermediate_size\": 384,"
	" \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 4,"
	" \"attention_head_dim\": 32, \"use_qk_norm\": false, \"use_mixed_mlp_moe\": false,"
	" \"num_experts\": 1, \"moe_topk\": 1, \"moe_intermediate_size\": 384, \"num_shared_expert\": 1}";
static const char preset_tiny_moe[] =
	"{\"vocab_size\": 512, \"hidden_size\": 128, \"intermediate_size\": 256,"
	" \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
	" \"attention_head_dim\": 32, \"use_qk_norm\": true, \"use_mixed_mlp_moe\": true,"
	" \"num_experts\": 4, \"moe_topk\": 2, \"moe_intermediate_size\": 96, \"num_shared_expert\": 1}";
static const char preset_small[] =
	"{\"vocab_size\": 32000, \"hidden_size\": 1024, \"intermediate_size\": 2048,"
	" \"num_hidden_layers\": 8, \"num_attention_heads\": 16, \"num_key_value_heads\": 4,"
	" \"attention_head_dim\": 64, \"use_qk_norm\": true, \"use_mixed_mlp_moe\": true,"
	" \"num_experts\": 16, \"moe_topk\": 4, \"moe_intermediate_size\": 512, \"num_shared_expert\": 1}";

/* Fields every preset shares, named as in the upstream config.json. */
static const char common_fields[] =
	"{\"architectures\": [\"HunyuanImage3ForCausalMM\"], \"model_type\": \"hunyuan_image_3_moe\","
	" \"hidden_act\": \"silu\", \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0,"
	" \"rope_scaling\": {\"type\": \"custom\", \"factor\": 1.0}, \"max_position_embeddings\": 12800,"
	" \"moe_layer_num_skipped\": 0, \"norm_topk_prob\": true, \"routed_scaling_factor\": 1.0,"
	" \"tie_word_embeddings\": false, \"attention_bias\": false, \"mlp_bias\": false,"
	" \"norm_type\": \"hf_rms\", \"use_cla\": false, \"use_rotary_pos_emb\": true,"
	" \"moe_drop_tokens\": false, \"capacity_factor\": 1.0, \"initializer_range\": 0.02}";

const char *const *hi3_init_presets(void)
{
	return preset_names;
}

/* ------------------------------------------------------- random numbers */

static uint64_t splitmix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

/* Standard normal number i of stream key (Box-Muller on two uniforms). */
static float normal_at(uint64_t key, uint64_t i)
{
	uint64_t a = splitmix64(key ^ splitmix64(2 * i)), b = splitmix64(key ^ splitmix64(2 * i + 1));
	double u1 = ((double)(a >> 11) + 1.0) / 9007199254740993.0;   /* (0, 1] */
	double u2 = (double)(b >> 11) / 9007199254740992.0;           /* [0, 1) */

	return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

/* --------------------------------------------------------- the weights */

struct wspec {
	char name[128];
	int ndim;
	int64_t shape[2];
	float mean, std;
	int keep_f32;             /* the router stays fp32 */
};

struct wlist {
	struct wspec *w;
	int n, cap;
};

static int add_spec(struct wlist *l, const char *name, int64_t d0, int64_t d1, float mean, float std, int f32)
{
	struct wspec *s;

	if (l->n == l->cap) {
		int cap = l->cap ? 2 * l->cap : 64;
		struct wspec *nw = realloc(l->w, sizeof(*nw) * (size_t)cap);
		if (!nw)
			return -1;
		l->w = nw;
		l->cap = cap;
	}
	s = &l->w[l->n++];
	snprintf(s->name, sizeof(s->name), "%s", name);
	s->ndim = d1 ? 2 : 1;
	s->shape[0] = d0;
	s->shape[1] = d1;
	s->mean = mean;
	s->std = std;
	s->keep_f32 = f32;
	return 0;
}

static int add_mlp(struct wlist *l, const char *prefix, int64_t H, int64_t I, float out_std)
{
	char nm[192];

	snprintf(nm, sizeof(nm), "%s.gate_and_up_proj.weight", prefix);
	if (add_spec(l, nm, 2 * I, H, 0.0f, 1.0f / sqrtf((float)H), 0))
		return -1;
	snprintf(nm, sizeof(nm), "%s.down_proj.weight", prefix);
	return add_spec(l, nm, H, I, 0.0f, out_std / sqrtf((float)I), 0);
}

/* Scales keep activations O(1): linear layers ~ N(0, 1/fan_in), outputs
 * into the residual stream shrunk by the depth, norms ~ 1 + N(0, 0.1^2),
 * lm_head wide enough that logits are far from flat. */
static int build_specs(const hi3_config *c, struct wlist *l)
{
	int64_t H = c->hidden_size, d = c->attention_head_dim;
	int64_t nh = c->num_attention_heads, nkv = c->num_key_value_heads;
	float out_std = 1.0f / sqrtf(2.0f * (float)c->num_hidden_layers);
	char nm[192], pre[64];

	if (add_spec(l, "model.wte.weight", c->vocab_size, H, 0.0f, 1.0f, 0) ||
	    add_spec(l, "model.ln_f.weight", H, 0, 1.0f, 0.1f, 0) ||
	    add_spec(l, "lm_head.weight", c->vocab_size, H, 0.0f, 3.0f / sqrtf((float)H), 0))
		return -1;
	for (int i = 0; i < c->num_hidden_layers; i++) {
		snprintf(pre, sizeof(pre), "model.layers.%d", i);
#define SPEC(suffix, d0, d1, mean, std, f32) \
	(snprintf(nm, sizeof(nm), "%s.%s", pre, suffix), add_spec(l, nm, d0, d1, mean, std, f32))
		if (SPEC("input_layernorm.weight", H, 0, 1.0f, 0.1f, 0) ||
		    SPEC("post_attention_layernorm.weight", H, 0, 1.0f, 0.1f, 0) ||
		    SPEC("self_attn.qkv_proj.weight", (nh + 2 * nkv) * d, H, 0.0f, 1.0f / sqrtf((float)H), 0) ||
		    SPEC("self_attn.o_proj.weight", H, nh * d, 0.0f, out_std / sqrtf((float)(nh * d)), 0))
			return -1;
		if (c->use_qk_norm && (SPEC("self_attn.query_layernorm.weight", d, 0, 1.0f, 0.1f, 0) ||
		                       SPEC("self_attn.key_layernorm.weight", d, 0, 1.0f, 0.1f, 0)))
			return -1;
		if (!hi3_config_is_moe_layer(c, i)) {
			snprintf(nm, sizeof(nm), "%s.mlp", pre);
			if (add_mlp(l, nm, H, c->intermediate_size, out_std))
				return -1;
			continue;
		}
		/* router fp32, wide enough that expert choice is not a coin toss */
		if (SPEC("mlp.gate.wg.weight", c->num_experts[i], H, 0.0f, 2.0f / sqrtf((float)H), 1))
			return -1;
#undef SPEC
		for (int e = 0; e < c->num_experts[i]; e++) {
			snprintf(nm, sizeof(nm), "%s.mlp.experts.%d", pre, e);
			if (add_mlp(l, nm, H, c->moe_intermediate_size[i], out_std))
				return -1;
		}
		if (c->use_mixed_mlp_moe && c->num_shared_expert[i] > 0) {
			snprintf(nm, sizeof(nm), "%s.mlp.shared_mlp", pre);
			if (add_mlp(l, nm, H, hi3i_config_shared_width(c, i), out_std))
				return -1;
		}
	}
	return 0;
}

static void fill(const struct wspec *s, uint64_t seed, hi3_dtype dt, void *out)
{
	int64_t n = s->shape[0] * (s->ndim == 2 ? s->shape[1] : 1);
	uint64_t key = splitmix64(seed ^ hi3i_hash(HI3_HASH_INIT, s->name, strlen(s->name)));

#pragma omp parallel for schedule(static)
	for (int64_t i = 0; i < n; i++) {
		float v = s->mean + s->std * normal_at(key, (uint64_t)i);
		if (dt == HI3_BF16)
			((uint16_t *)out)[i] = hi3_f32_to_bf16(v);
		else
			((float *)out)[i] = v;
	}
}

/* ----------------------------------------------------------- tokenizer */

/* The special tokens of the sequence template, in id order after the 256
 * byte tokens. */
static const char *const specials_fixed[] = {
	"<|startoftext|>", "<|endoftext|>", "<pad>", "<boi>", "<eoi>", "<img>", "<cfg>", "<joint_img_sep>",
	"<timestep>", "<guidance>", "<answer>", "</answer>", "<think>", "</think>", "<recaption>", "</recaption>",
};
static const int img_sizes[] = {256, 512, 768, 1024, 1280, 1536, 2048};
#define N_RATIOS 33
#define BOS_NAME "<|startoftext|>"
#define EOS_NAME "<|endoftext|>"
#define PAD_NAME "<pad>"

static int n_specials(void)
{
	return (int)HI3_ARRAY_SIZE(specials_fixed) + (int)HI3_ARRAY_SIZE(img_sizes) + N_RATIOS;
}

static void special_name(int i, char *buf, size_t n)
{
	int nf = (int)HI3_ARRAY_SIZE(specials_fixed), ns = (int)HI3_ARRAY_SIZE(img_sizes);

	if (i < nf)
		snprintf(buf, n, "%s", specials_fixed[i]);
	else if (i < nf + ns)
		snprintf(buf, n, "<img_size_%d>", img_sizes[i - nf]);
	else
		snprintf(buf, n, "<img_ratio_%d>", i - nf - ns);
}

static int special_id(const char *name)
{
	char buf[64];

	for (int i = 0; i < n_specials(); i++) {
		special_name(i, buf, sizeof(buf));
		if (!strcmp(buf, name))
			return 256 + i;
	}
	return -1;
}

/* GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to
 * code points from U+0100 on; returned as UTF-8. */
static void byte_token(int byte, char out[4])
{
	int cp;

	if ((byte >= '!' && byte <= '~') || (byte >= 0xa1 && byte <= 0xac) || (byte >= 0xae && byte <= 0xff)) {
		cp = byte;
	} else {
		int n = 0;
		for (int b = 0; b < byte; b++)
			if (!((b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff)))
				n++;
		cp = 256 + n;
	}
	if (cp < 0x80) {
		out[0] = (char)cp;
		out[1] = 0;
	} else {
		out[0] = (char)(0xc0 | (cp >> 6));
		out[1] = (char)(0x80 | (cp & 0x3f));
		out[2] = 0;
	}
}

/* GPT-4 style split pattern (cl100k). */
static const char split_regex[] =
	"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
	"|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static json_t *build_tokenizer(void)
{
	json_t *vocab = json_object(), *added = json_array(), *root;
	char tok[4], name[64];

	for (int b = 0; b < 256; b++) {
		byte_token(b, tok);
		json_object_set_new(vocab, tok, json_integer(b));
	}
	for (int i = 0; i < n_specials(); i++) {
		special_name(i, name, sizeof(name));
		json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", 256 + i, "content",
		                                       name, "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0,
		                                       "special", 1));
	}
	root = json_pack(
		"{s:s, s:n, s:n, s:o, s:n, s:{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b, s:b}]},"
		" s:{s:s, s:b, s:b, s:b}, s:{s:s, s:b, s:b, s:b},"
		" s:{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:b, s:o, s:[]}}",
		"version", "1.0", "truncation", "padding", "added_tokens", added, "normalizer",
		"pre_tokenizer", "type", "Sequence", "pretokenizers",
		"type", "Split", "pattern", "Regex", split_regex, "behavior", "Isolated", "invert", 0,
		"type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 0,
		"post_processor", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 0,
		"decoder", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 0,
		"model", "type", "BPE", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
		"fuse_unk", 0, "byte_fallback", 0, "ignore_merges", 0, "vocab", vocab, "merges");
	return root;
}

/* ------------------------------------------------------------ writing */

static int write_json(const char *dir, const char *file, json_t *js, hi3_error *err)
{
	char *path = hi3i_asprintf("%s/%s", dir, file);
	char *text = js ? json_dumps(js, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
	int rc;

	if (!path || !text) {
		free(path);
		free(text);
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	}
	{
		size_t n = strlen(text);
		char *t2 = realloc(text, n + 2);
		if (!t2) {
			free(text);
			free(path);
			return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		}
		text = t2;
		text[n] = '\n';
		text[n + 1] = 0;
	}
	rc = hi3i_write_file(path, text, strlen(text), err);
	free(text);
	free(path);
	return rc;
}

static json_t *build_config(const hi3_init_opts *o, hi3_error *err)
{
	const char *preset = !strcmp(o->preset, "tiny") ? preset_tiny
	                     : !strcmp(o->preset, "tiny-moe") ? preset_tiny_moe
	                     : !strcmp(o->preset, "small") ? preset_small : NULL;
	json_t *cfg, *p, *ov;
	json_error_t je;

	if (!preset) {
		hi3_error_set(err, HI3_ERR_USAGE, "unknown preset '%s' (expected tiny, tiny-moe or small)", o->preset);
		return NULL;
	}
	cfg = json_loads(common_fields, 0, NULL);
	p = json_loads(preset, 0, NULL);
	HI3_ASSERT(cfg && p);
	json_object_update(cfg, p);
	json_decref(p);
	json_object_set_new(cfg, "bos_token_id", json_integer(special_id(BOS_NAME)));
	json_object_set_new(cfg, "eos_token_id", json_integer(special_id(EOS_NAME)));
	json_object_set_new(cfg, "pad_token_id", json_integer(special_id(PAD_NAME)));
	json_object_set_new(cfg, "torch_dtype", json_string(o->dtype == HI3_BF16 ? "bfloat16" : "float32"));
	if (o->overrides && *o->overrides) {
		ov = json_loads(o->overrides, 0, &je);
		if (!ov || !json_is_object(ov)) {
			hi3_error_set(err, HI3_ERR_USAGE, "overrides: not a JSON object: %s", ov ? "" : je.text);
			json_decref(ov);
			json_decref(cfg);
			return NULL;
		}
		json_object_update(cfg, ov);
		json_decref(ov);
	}
	return cfg;
}

int hi3_init_model(const char *dir, const hi3_init_opts *o, hi3_error *err)
{
	json_t *cfg_js = NULL, *tok = NULL, *gen = NULL, *tcfg = NULL;
	char *cfg_text = NULL, *path = NULL;
	hi3_config cfg = {0};
	struct wlist specs = {0};
	hi3_st_writer *w = NULL;
	void **bufs = NULL;
	int rc = -1;

	if (o->dtype != HI3_F32 && o->dtype != HI3_BF16)
		return hi3_error_set(err, HI3_ERR_USAGE, "--dtype: expected f32 or bf16");
	if (!(cfg_js = build_config(o, err)))
		goto out;
	cfg_text = json_dumps(cfg_js, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	if (!cfg_text || hi3_config_parse(&cfg, cfg_text, "config (preset and overrides)", err) != 0)
		goto out;
	if (cfg.vocab_size < 256 + n_specials()) {
		hi3_error_set(err, HI3_ERR_USAGE, "vocab_size %d is smaller than the tokenizer's %d tokens",
		              cfg.vocab_size, 256 + n_specials());
		goto out;
	}
	if (build_specs(&cfg, &specs) != 0) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		goto out;
	}
	if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "%s: cannot create the directory: %s", dir, strerror(errno));
		goto out;
	}
	w = hi3_stw_new();
	bufs = calloc((size_t)specs.n, sizeof(void *));
	if (!w || !bufs) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		goto out;
	}
	hi3_stw_meta(w, "format", "pt");
	for (int i = 0; i < specs.n; i++) {
		const struct wspec *s = &specs.w[i];
		hi3_dtype dt = s->keep_f32 ? HI3_F32 : o->dtype;
		size_t n = (size_t)s->shape[0] * (size_t)(s->ndim == 2 ? s->shape[1] : 1);

		bufs[i] = hi3i_malloc(n * hi3_dtype_size(dt), err);
		if (!bufs[i])
			goto out;
		fill(s, o->seed, dt, bufs[i]);
		if (hi3_stw_add(w, s->name, dt, s->ndim, s->shape, bufs[i]) != 0) {
			hi3_error_set(err, HI3_ERR_RUNTIME, "cannot add tensor '%s'", s->name);
			goto out;
		}
	}
	path = hi3i_asprintf("%s/model.safetensors", dir);
	if (!path || hi3_stw_write(w, path, err) != 0)
		goto out;
	tok = build_tokenizer();
	gen = json_pack("{s:I, s:I, s:I, s:s, s:b, s:i}", "bos_token_id", (json_int_t)special_id(BOS_NAME),
	                "eos_token_id", (json_int_t)special_id(EOS_NAME), "pad_token_id",
	                (json_int_t)special_id(PAD_NAME), "sequence_template", "pretrain", "do_sample", 0,
	                "max_new_tokens", 64);
	tcfg = json_pack("{s:s, s:s, s:s, s:b, s:b, s:s}", "bos_token", BOS_NAME, "eos_token", EOS_NAME,
	                 "pad_token", PAD_NAME, "add_bos_token", 0, "add_eos_token", 0, "tokenizer_class",
	                 "PreTrainedTokenizerFast");
	if (write_json(dir, "config.json", cfg_js, err) || write_json(dir, "tokenizer.json", tok, err) ||
	    write_json(dir, "generation_config.json", gen, err) ||
	    write_json(dir, "tokenizer_config.json", tcfg, err))
		goto out;
	rc = 0;
out:
	for (int i = 0; bufs && i < specs.n; i++)
		free(bufs[i]);
	free(bufs);
	free(specs.w);
	hi3_stw_free(w);
	hi3_config_release(&cfg);
	json_decref(cfg_js);
	json_decref(tok);
	json_decref(gen);
	json_decref(tcfg);
	free(cfg_text);
	free(path);
	return rc;
}
