/* test-config.c -- config.json as upstream reads it: the released file
 * (tests/fixtures/released/config.json, verbatim) parses with its values,
 * every one of its fields has a role, booleans are numbers where numbers
 * are expected, each field that would change the math is refused naming
 * it, wrong types and per-layer lists of the wrong length name the file and
 * the field; generation_config.json's defaults; the variants. */
#include <jansson.h>
#include <string.h>
#include "hi3.h"
#include "core/internal.h"
#include "tap.h"
#include "testdir.h"

static json_t *released;          /* the released config.json */
static const char *src;

/* The released config with key set to the JSON value val (NULL: removed). */
static char *with(const char *key, const char *val)
{
	json_t *c = json_deep_copy(released);
	char *text;

	if (val)
		json_object_set_new(c, key, json_loads(val, JSON_DECODE_ANY, NULL));
	else
		json_object_del(c, key);
	text = json_dumps(c, JSON_COMPACT);
	json_decref(c);
	return text;
}

/* Parse text; returns 0 or the error status, the message in err. */
static int parse(const char *text, hi3_config *c, hi3_error *err)
{
	memset(err, 0, sizeof(*err));
	if (hi3_config_parse(c, text, "DIR/config.json", err) != 0)
		return err->status;
	return 0;
}

static void refused(const char *key, const char *val, const char *expect)
{
	char *text = with(key, val);
	hi3_config c;
	hi3_error err;
	int st = parse(text, &c, &err);

	ok(st == HI3_ERR_INPUT && strstr(err.msg, "DIR/config.json") && strstr(err.msg, expect),
	   "%s: %s is refused naming the file and '%s': %s", key, val, expect, err.msg);
	if (!st)
		hi3_config_release(&c);
	free(text);
}

static void test_released(void)
{
	char *text = json_dumps(released, JSON_COMPACT);
	const char *key;
	json_t *v;
	hi3_config c;
	hi3_error err;
	int good = 1, unknown = 0;
	char why[200];

	if (!ok(parse(text, &c, &err) == 0, "the released config.json parses as it is: %s", err.msg)) {
		free(text);
		return;
	}
	for (int l = 0; l < 32; l++)
		good &= c.num_experts[l] == 64 && c.moe_topk[l] == 8 && c.moe_intermediate_size[l] == 3072 &&
		        c.num_shared_expert[l] == 1;
	ok(good && c.num_hidden_layers == 32 && c.hidden_size == 4096 && c.num_attention_heads == 32 &&
	   c.num_key_value_heads == 8 && c.attention_head_dim == 128 && c.vocab_size == 133120 && c.use_qk_norm &&
	   c.use_mixed_mlp_moe && c.norm_topk_prob && c.max_position_embeddings == 22800 && c.bos_token_id == 127958 &&
	   c.eos_token_id == 127957 && c.pad_token_id == 128009,
	   "the backbone as released: 32 layers of 4096, 32/8 heads of 128, 64 experts top-8 (per-layer lists), "
	   "vocabulary 133120, 22800 positions");
	ok(c.routed_scaling_factor == 0.0 && c.n_warnings == 0,
	   "\"routed_scaling_factor\": false reads as 0, and no warning: norm_topk_prob with top-8 never uses it");
	ok(c.vae.present && c.vae.n_levels == 5 && c.vae.block_out_channels[0] == 128 &&
	   c.vae.block_out_channels[4] == 1024 && c.vae.latent_channels == 32 && c.vae.ffactor_spatial == 16 &&
	   c.vae.ffactor_temporal == 4 && c.vae.scaling_factor > 0.5626 && c.vae.scaling_factor < 0.5627 &&
	   !c.vae.has_shift_factor, "the vae block: channels 128..1024 on 5 levels, latent 32, factors 16 and 4");
	ok(c.vit.present && c.vit.hidden_size == 1152 && c.vit.num_hidden_layers == 27 && c.vit.num_patches == 256 &&
	   c.vit.patch_size == 16 && !strcmp(c.vit.hidden_act, "gelu_pytorch_tanh") && c.vit_processor.present &&
	   c.vit_processor.max_num_patches == 1024 && c.vit_processor.image_mean[2] == 0.5 && c.vit_aligner.present &&
	   c.vit_aligner.input_dim == 1152 && c.vit_aligner.n_embed == 4096 && c.vit_aligner.depth == 2 &&
	   !strcmp(c.vit_aligner.projector_type, "mlp_gelu"), "the vit, vit_processor and vit_aligner blocks");
	ok(c.image_base_size == 1024 && c.vae_downsample_factor[0] == 16 && c.vae_downsample_factor[1] == 16 &&
	   c.patch_size == 1 && c.patch_embed_hidden_dim == 1024 && !strcmp(c.rope_type, "2d") &&
	   !strcmp(c.cond_token_attn_type, "joint_full") && !strcmp(c.cond_image_type, "vae_vit") &&
	   !strcmp(c.vae_dtype, "float32") && !strcmp(c.img_proj_type, "unet"),
	   "image fields; patch_size 1 and patch_embed_hidden_dim 1024 from the configuration class (absent)");
	ok(hi3_variant_of(&c, NULL, why, sizeof(why)) == HI3_VARIANT_BASE && strstr(why, "HunyuanImage-3.0"),
	   "the release is the base variant: %s", why);
	json_object_foreach(released, key, v)
		if (!hi3_config_field_role(key)) {
			diag("no role: %s", key);
			unknown++;
		}
	ok(unknown == 0 && json_object_size(released) == 98, "all 98 fields of the release have a role in the table");
	hi3_config_release(&c);
	free(text);
}

static void test_numbers(void)
{
	json_t *c = json_deep_copy(released);
	char *text;
	hi3_config cfg;
	hi3_error err;

	/* top-1 routing uses the factor: false (0) zeroes the routed experts */
	json_object_set_new(c, "moe_topk", json_integer(1));
	text = json_dumps(c, JSON_COMPACT);
	ok(parse(text, &cfg, &err) == 0 && cfg.n_warnings == 1 && strstr(cfg.warnings[0], "routed_scaling_factor") &&
	   strstr(cfg.warnings[0], "false"), "false on a path that uses it (moe_topk 1) warns: %s",
	   cfg.n_warnings ? cfg.warnings[0] : err.msg);
	hi3_config_release(&cfg);
	free(text);
	json_object_set_new(c, "routed_scaling_factor", json_true());
	json_object_set_new(c, "norm_topk_prob", json_false());
	json_object_set_new(c, "moe_topk", json_integer(8));
	text = json_dumps(c, JSON_COMPACT);
	ok(parse(text, &cfg, &err) == 0 && cfg.routed_scaling_factor == 1.0 && cfg.n_warnings == 0 &&
	   !cfg.norm_topk_prob, "true reads as 1 (norm_topk_prob false uses it; nothing to say)");
	hi3_config_release(&cfg);
	free(text);
	json_object_set_new(c, "use_qk_norm", json_integer(0));
	json_object_set_new(c, "hidden_size", json_true());
	json_object_set_new(c, "attention_head_dim", json_integer(4));
	json_object_set_new(c, "num_attention_heads", json_integer(1));
	json_object_set_new(c, "num_key_value_heads", json_integer(1));
	text = json_dumps(c, JSON_COMPACT);
	ok(parse(text, &cfg, &err) == 0 && !cfg.use_qk_norm && cfg.hidden_size == 1,
	   "a number in a flag is its truth value, a boolean in an integer field is 0 or 1: %s", err.msg);
	hi3_config_release(&cfg);
	free(text);
	json_decref(c);
}

static void test_refused(void)
{
	static const char *const flags[] = {"attention_bias", "mlp_bias", "use_cla", "use_mla", "group_limited_greedy",
	                                    "moe_drop_tokens", "add_classification_head"};

	for (size_t i = 0; i < HI3_ARRAY_SIZE(flags); i++)
		refused(flags[i], "true", flags[i]);
	refused("use_rotary_pos_emb", "false", "use_rotary_pos_emb");
	refused("rope_scaling", "{\"type\": \"linear\", \"factor\": 2.0}", "rope_scaling");
	refused("rope_scaling", "{\"factor\": 2.0}", "rope_scaling");
	refused("norm_type", "\"fused\"", "norm_type");
	refused("hidden_act", "\"gelu\"", "hidden_act");
	refused("rope_type", "\"3d\"", "rope_type");
	refused("img_proj_type", "\"linear\"", "img_proj_type");
	refused("cond_token_attn_type", "\"sparse\"", "cond_token_attn_type");
	refused("patch_size", "3", "patch_size");
}

static void test_types(void)
{
	refused("hidden_size", "\"4096\"", "field \"hidden_size\": expected an integer, found a string");
	refused("num_hidden_layers", "32.0", "field \"num_hidden_layers\": expected an integer, found a real number");
	refused("rms_norm_eps", "\"1e-5\"", "field \"rms_norm_eps\": expected a number, found a string");
	refused("use_qk_norm", "\"yes\"", "field \"use_qk_norm\": expected true or false, found a string");
	refused("model_version", "3", "field \"model_version\": expected a string, found an integer");
	refused("vae", "[128, 256]", "field \"vae\": expected an object, found a list");
	refused("rope_scaling", "\"custom\"", "field \"rope_scaling\": expected an object");
	refused("vae_downsample_factor", "[16, 16, 16]", "field \"vae_downsample_factor\": expected [h, w]");
	refused("moe_topk", "[8, 8, 8]", "field \"moe_topk\": a list of 3 values, but num_hidden_layers is 32");
	refused("num_experts", "\"64\"", "field \"num_experts\": expected an integer or a list of one per layer, found "
	        "a string");
	{
		json_t *c = json_deep_copy(released), *v;
		char *text;
		hi3_config cfg;
		hi3_error err;

		v = json_object_get(c, "moe_intermediate_size");
		json_array_set_new(v, 5, json_string("3072"));
		text = json_dumps(c, JSON_COMPACT);
		ok(parse(text, &cfg, &err) == HI3_ERR_INPUT && strstr(err.msg, "field \"moe_intermediate_size[5]\": expected "
		   "an integer, found a string"), "a bad element of a per-layer list is named by its index: %s", err.msg);
		free(text);
		json_object_set_new(json_object_get(c, "moe_intermediate_size"), "x", json_null());
		json_object_set_new(json_object_get(c, "vae"), "latent_channels", json_string("32"));
		json_array_set_new(v, 5, json_integer(3072));
		text = json_dumps(c, JSON_COMPACT);
		ok(parse(text, &cfg, &err) == HI3_ERR_INPUT && strstr(err.msg, "field \"vae.latent_channels\": expected an "
		   "integer, found a string"), "a field inside a block is named block.field: %s", err.msg);
		free(text);
		json_decref(c);
	}
}

static void test_variants(void)
{
	static const struct {
		const char *model_version, *distilled, *template_name;
		int want;
	} cases[] = {
		{"\"HunyuanImage-3.0\"", NULL, "instruct", HI3_VARIANT_BASE},
		{"\"HunyuanImage-3.0-Instruct\"", NULL, NULL, HI3_VARIANT_INSTRUCT},
		{"\"HunyuanImage-3.0-Instruct\"", "true", NULL, HI3_VARIANT_DISTIL},
		{NULL, NULL, "instruct", HI3_VARIANT_INSTRUCT},
		{NULL, NULL, "pretrain", HI3_VARIANT_BASE},
	};

	for (size_t i = 0; i < HI3_ARRAY_SIZE(cases); i++) {
		json_t *c = json_deep_copy(released);
		hi3_gen_defaults g = {.present = 1};
		hi3_config cfg;
		hi3_error err;
		char *text, why[200];
		int v;

		if (cases[i].model_version)
			json_object_set_new(c, "model_version", json_loads(cases[i].model_version, JSON_DECODE_ANY, NULL));
		else
			json_object_del(c, "model_version");
		if (cases[i].distilled)
			json_object_set_new(c, "cfg_distilled", json_true());
		snprintf(g.sequence_template, sizeof(g.sequence_template), "%s",
		         cases[i].template_name ? cases[i].template_name : "");
		text = json_dumps(c, JSON_COMPACT);
		v = parse(text, &cfg, &err) == 0 ? hi3_variant_of(&cfg, &g, why, sizeof(why)) : -1;
		ok(v == cases[i].want, "model_version %s, cfg_distilled %s, sequence_template %s: %s (%s)",
		   cases[i].model_version ? cases[i].model_version : "absent", cases[i].distilled ? "true" : "absent",
		   cases[i].template_name ? cases[i].template_name : "absent", hi3_variant_name(v), v < 0 ? err.msg : why);
		if (v >= 0)
			hi3_config_release(&cfg);
		free(text);
		json_decref(c);
	}
}

static void test_generation(void)
{
	char *dir = hi3i_asprintf("%s/tests/fixtures/released", src);
	char *tmp = testdir_new("config");
	hi3_gen_defaults g;
	hi3_sampler s;
	hi3_error err = {0};

	ok(hi3_gen_defaults_load(&g, dir, &err) == 0 && g.present && !strcmp(g.bot_task, "image") &&
	   !strcmp(g.sequence_template, "pretrain") && !strcmp(g.use_system_prompt, "None") && g.do_sample &&
	   g.temperature == 0.6 && g.top_k == 1024 && g.top_p == 0.95 && g.max_length == 12800 && g.n_eos == 1 &&
	   g.eos_token_id[0] == 127957 && g.diff_infer_steps == 50 && g.diff_guidance_scale == 5.0 &&
	   g.flow_shift == 3.0 && g.pad_token_id == 128009, "the released generation_config.json: %s", err.msg);
	hi3_gen_defaults_sampler(&g, &s);
	ok(!s.greedy && s.temperature == 0.6 && s.top_k == 1024 && s.top_p == 0.95,
	   "its sampler: do_sample, temperature 0.6, top_k 1024, top_p 0.95");
	if (!ok(tmp != NULL, "scratch directory")) {
		free(dir);
		return;
	}
	ok(hi3_gen_defaults_load(&g, tmp, &err) == 0 && !g.present && !strcmp(g.bot_task, "auto") && !g.do_sample &&
	   g.top_k == 50 && g.max_length == -1, "no generation_config.json: GenerationConfig's defaults, greedy");
	{
		char *p = hi3i_asprintf("%s/generation_config.json", tmp);
		FILE *f = fopen(p, "w");
		fputs("{\"top_k\": \"1024\"}\n", f);
		fclose(f);
		ok(hi3_gen_defaults_load(&g, tmp, &err) == -1 && err.status == HI3_ERR_INPUT &&
		   strstr(err.msg, "generation_config.json: field \"top_k\": expected an integer >= 0, found a string"),
		   "a wrong type names the file and the field: %s", err.msg);
		remove(p);
		free(p);
	}
	testdir_done(tmp);
	free(dir);
}

int main(void)
{
	char *path;
	json_error_t je;

	src = getenv("SRCDIR") ? getenv("SRCDIR") : ".";
	path = hi3i_asprintf("%s/tests/fixtures/released/config.json", src);
	released = json_load_file(path, JSON_PRESERVE_ORDER, &je);
	free(path);
	if (!ok(json_is_object(released), "the released config.json (tests/fixtures/released) reads: %s", je.text))
		return done_testing();
	test_released();
	test_numbers();
	test_refused();
	test_types();
	test_variants();
	test_generation();
	json_decref(released);
	return done_testing();
}
