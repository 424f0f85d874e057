/*
 * init-model.c -- `hi3 init-model`: deterministic random-init checkpoints with the
 * upstream tensor names, plus a byte-level tokenizer.json holding every
 * special token the sequence template uses.
 *
 * The release presets (tiny-release, tiny-instruct, tiny-distil) copy the
 * released config.json field by field, with its value types (the
 * "routed_scaling_factor": false, the per-layer lists, the vae/vit blocks),
 * scaled down; they hold every module of upstream's HunyuanImage3ForCausalMM
 * (backbone, image heads, VAE encoder and decoder, SigLIP2 with its head,
 * aligner, and the Distil's guidance_emb/timestep_r_emb) with upstream's
 * names and shapes, in bf16, sharded with an index, and a tokenizer whose
 * special tokens sit where the release's do, shifted down (see
 * release_id()).
 *
 * Determinism: element i of tensor NAME is a function of (seed, NAME, i)
 * only (a counter-based stream), so a checkpoint does not depend on thread
 * count or on the order tensors are written.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include "model/config-internal.h"
#include "model/vae.h"

/* ------------------------------------------------------------- presets */

static const char *const preset_names[] = {"tiny", "tiny-moe", "small", "tiny-release", "tiny-instruct",
                                           "tiny-distil", NULL};

enum { P_TINY, P_TINY_MOE, P_SMALL, P_RELEASE, P_INSTRUCT, P_DISTIL };

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

/* The image heads and VAE decoder of the older presets (config fields as
 * upstream names them): patch_embed_hidden_dim by preset (a quarter of the
 * hidden size, as the release's 1024 of 4096), image base 256 (buckets of
 * 16 x 16 latent tokens at 1:1), and a VAE decoder of 32 channels on five
 * levels (ffactor_spatial 16, temporal 4, as the release) with 16 latent
 * channels and one block per level (two in the decoder). */
static const char preset_image_fields[] =
	"{\"image_base_size\": 256, \"vae_downsample_factor\": [16, 16], \"patch_size\": 1,"
	" \"img_proj_type\": \"unet\", \"rope_type\": \"2d\","
	" \"vae\": {\"_class_name\": \"AutoencoderKLConv3D\", \"block_out_channels\": [32, 32, 32, 32, 32],"
	" \"in_channels\": 3, \"out_channels\": 3, \"latent_channels\": 16, \"layers_per_block\": 1,"
	" \"ffactor_spatial\": 16, \"ffactor_temporal\": 4, \"sample_size\": 384, \"sample_tsize\": 96,"
	" \"downsample_match_channel\": true, \"upsample_match_channel\": true,"
	" \"scaling_factor\": 0.562679178327931}}";

/* Fields every older preset shares, named as in the upstream config.json. */
static const char common_fields[] =
	"{\"architectures\": [\"HunyuanImage3ForCausalMM\"], \"model_type\": \"hunyuan_image_3_moe\","
	" \"hidden_act\": \"silu\", \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0,"
	" \"rope_scaling\": {\"type\": \"custom\", \"factor\": 1.0}, \"max_position_embeddings\": 12800,"
	" \"moe_layer_num_skipped\": 0, \"norm_topk_prob\": true, \"routed_scaling_factor\": 1.0,"
	" \"tie_word_embeddings\": false, \"attention_bias\": false, \"mlp_bias\": false,"
	" \"norm_type\": \"hf_rms\", \"use_cla\": false, \"use_rotary_pos_emb\": true,"
	" \"moe_drop_tokens\": false, \"capacity_factor\": 1.0, \"initializer_range\": 0.02}";

/* The released config.json (tencent/HunyuanImage-3.0), field for field and
 * in its order, with the sizes scaled down: 2 layers of hidden 64 (4 query
 * heads and 1 kv head of 16), 4 experts top-2 of width 48 and a shared MLP;
 * image base 256; a VAE of 32 channels on all five levels (GroupNorm has 32
 * groups; five levels keep ffactor_spatial 16) and 16 latent channels; a
 * 2-layer SigLIP2 of width 32 (4 heads of 8) over a 4 x 4 position grid and
 * at most 64 patches; ids where the tokenizer puts them (release_id()). The
 * per-layer lists are written by release_config(). One field is added:
 * patch_embed_hidden_dim (upstream's default 1024 would be most of the
 * checkpoint). */
static const char release_config[] =
	"{\"model_version\": \"HunyuanImage-3.0\", \"add_classification_head\": false, \"anyres_pooling_size\": 2,"
	" \"anyres_vit_max_image_size\": null, \"anyres_vit_two_views\": false,"
	" \"architectures\": [\"HunyuanImage3ForCausalMM\"],"
	" \"auto_map\": {\"AutoConfig\": \"configuration_hunyuan.HunyuanImage3Config\","
	" \"AutoModel\": \"hunyuan.HunyuanImage3Model\", \"AutoModelForCausalLM\": \"hunyuan.HunyuanImage3ForCausalMM\"},"
	" \"attention_bias\": false, \"attention_dropout\": 0.0, \"attention_head_dim\": 16, \"bos_token_id\": 301,"
	" \"cla_share_factor\": 2, \"class_num\": 0, \"dense_list\": [64, 0], \"eod_token_id\": 3,"
	" \"eos_token_id\": 300, \"group_limited_greedy\": false, \"hidden_act\": \"silu\", \"hidden_size\": 64,"
	" \"im_end_id\": 344, \"im_newline_id\": 11, \"im_start_id\": 343, \"image_token_id\": 349,"
	" \"initializer_range\": 0.02, \"intermediate_size\": 48, \"kv_lora_rank\": null, \"mask_init_id\": 12,"
	" \"max_position_embeddings\": 22800, \"mlp_bias\": false, \"model_type\": \"hunyuan_image_3_moe\","
	" \"moe_drop_tokens\": false, \"moe_intermediate_size\": 48, \"moe_layer_num_skipped\": 0,"
	" \"moe_random_routing_dropped_token\": false, \"moe_topk\": 2, \"n_group\": false,"
	" \"norm_topk_prob\": true, \"norm_type\": \"rms\", \"num_attention_heads\": 4, \"num_experts\": 4,"
	" \"num_hidden_layers\": 2, \"num_key_value_heads\": 1, \"num_media_embeds\": 257,"
	" \"num_shared_expert\": 1, \"pad_id\": 352, \"pad_token_id\": 352, \"pool_type\": \"last\","
	" \"position_embedding_xdrope\": false, \"pretraining_tp\": 1, \"q_lora_rank\": null,"
	" \"qk_nope_head_dim\": null, \"qk_rope_head_dim\": null, \"rms_norm_eps\": 1e-05,"
	" \"rope_scaling\": {\"alpha\": 1.0, \"beta_fast\": 32, \"beta_slow\": 1, \"factor\": 1.0, \"mscale\": 1.0,"
	" \"mscale_all_dim\": 1.0, \"type\": \"custom\"}, \"rope_theta\": 10000.0, \"routed_scaling_factor\": false,"
	" \"skip_cls_token\": false, \"text_end_id\": 7, \"text_start_id\": 6, \"tie_word_embeddings\": false,"
	" \"topk_group\": false, \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.50.0\","
	" \"use_cache\": true, \"use_cla\": false, \"use_mixed_mlp_moe\": true, \"use_mla\": false,"
	" \"use_qk_norm\": true, \"use_rotary_pos_emb\": true, \"v_head_dim\": null, \"video_end_id\": 10,"
	" \"video_start_id\": 9, \"vit_add_patchemb_bias\": false, \"vit_input_resolution\": 224,"
	" \"vit_mapping_type\": \"resampler\", \"vit_norm_type\": \"fused\", \"vit_patch\": 1, \"vit_path\": null,"
	" \"vit_remove_prenorm\": false, \"vit_token\": 64, \"vit_type\": \"siglip2-so400m-patch16-naflex\","
	" \"vit_used_rms_norm\": false, \"vocab_size\": 512, \"xdrope_section\": null, \"head_dim\": 16,"
	" \"rope_type\": \"2d\", \"vae_downsample_factor\": [16, 16], \"vit_downsample_factor\": [16, 16],"
	" \"cond_token_attn_type\": \"joint_full\", \"cond_image_type\": \"vae_vit\","
	" \"vae_type\": \"hunyuan-image-vae-v1\", \"vae_dtype\": \"float32\", \"vae_autocast_dtype\": \"float16\","
	" \"image_base_size\": 256, \"patch_embed_hidden_dim\": 32,"
	" \"vae\": {\"_class_name\": \"AutoencoderKLConv3D\", \"block_out_channels\": [32, 32, 32, 32, 32],"
	" \"in_channels\": 3, \"out_channels\": 3, \"latent_channels\": 16, \"layers_per_block\": 2,"
	" \"ffactor_spatial\": 16, \"ffactor_temporal\": 4, \"sample_size\": 384, \"sample_tsize\": 96,"
	" \"downsample_match_channel\": true, \"upsample_match_channel\": true,"
	" \"scaling_factor\": 0.562679178327931},"
	" \"vit\": {\"_attn_implementation\": \"sdpa\", \"attention_dropout\": 0.0,"
	" \"hidden_act\": \"gelu_pytorch_tanh\", \"hidden_size\": 32, \"intermediate_size\": 64,"
	" \"layer_norm_eps\": 1e-06, \"num_attention_heads\": 4, \"num_channels\": 3, \"num_hidden_layers\": 2,"
	" \"num_patches\": 16, \"patch_size\": 16, \"torch_dtype\": \"float32\", \"output_attentions\": false,"
	" \"output_hidden_states\": false, \"use_return_dict\": true},"
	" \"vit_processor\": {\"do_convert_rgb\": null, \"do_normalize\": true, \"do_rescale\": true,"
	" \"do_resize\": true, \"image_mean\": [0.5, 0.5, 0.5], \"image_processor_type\": \"Siglip2ImageProcessorFast\","
	" \"image_std\": [0.5, 0.5, 0.5], \"max_num_patches\": 64, \"patch_size\": 16,"
	" \"processor_class\": \"Siglip2Processor\", \"resample\": 2, \"rescale_factor\": 0.00392156862745098},"
	" \"vit_aligner\": {\"projector_type\": \"mlp_gelu\", \"input_dim\": 32, \"n_embed\": 64, \"depth\": 2,"
	" \"torch_dtype\": \"float32\"}}";

/* generation_config.json: the released one, ids mapped; Instruct and Distil
 * as upstream's README runs them (think_recaption, en_unified, guidance
 * 2.5; the Distil 8 steps). */
static const char release_generation[] =
	"{\"bot_task\": \"image\", \"diff_guidance_scale\": 5.0, \"diff_infer_steps\": 50, \"disable_compile\": true,"
	" \"do_sample\": true, \"drop_think\": false, \"eos_token_id\": [300], \"flow_shift\": 3.0,"
	" \"max_length\": 12800, \"moe_impl\": \"eager\", \"pad_token_id\": 352, \"sequence_template\": \"pretrain\","
	" \"temperature\": 0.6, \"top_k\": 1024, \"top_p\": 0.95, \"use_system_prompt\": \"None\"}";

static const char release_tokenizer_config[] =
	"{\"bos_token\": \"<|startoftext|>\", \"clean_up_tokenization_spaces\": true, \"eos_token\": \"<|endoftext|>\","
	" \"model_max_length\": 1048576, \"pad_token\": \"<pad>\", \"tokenizer_class\": \"PreTrainedTokenizerFast\"}";

const char *const *hi3_init_presets(void)
{
	return preset_names;
}

static int preset_of(const char *name)
{
	return hi3i_name_index(preset_names, name);
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
	int64_t shape[HI3_MAX_DIMS];
	float mean, std;
	int keep_f32;             /* the router stays fp32 */
	int shard;                /* release presets: 0 backbone, 1 image heads and ViT, 2 VAE */
};

struct wlist {
	struct wspec *w;
	int n, cap;
	int shard;                /* of the specs added now */
	int failed;               /* out of memory */
};

static struct wspec *new_spec(struct wlist *l, const char *name)
{
	struct wspec *s;

	if (l->n == l->cap) {
		int cap = l->cap ? 2 * l->cap : 64;
		struct wspec *nw = realloc(l->w, sizeof(*nw) * (size_t)cap);
		if (!nw) {
			l->failed = 1;
			return NULL;
		}
		l->w = nw;
		l->cap = cap;
	}
	s = &l->w[l->n++];
	memset(s, 0, sizeof(*s));
	snprintf(s->name, sizeof(s->name), "%s", name);
	s->shard = l->shard;
	return s;
}

static int add_spec(struct wlist *l, const char *name, int64_t d0, int64_t d1, float mean, float std, int f32)
{
	struct wspec *s = new_spec(l, name);

	if (!s)
		return -1;
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

/* ------------------------------------------------- the image modules */

/* The scale of an image-module tensor: ".bias" ~ N(0, 0.02^2), a norm's
 * weight (a 1-D weight) ~ 1 + N(0, 0.1^2), the rest ~ N(0, 1/fan_in). */
static void spec_scale(struct wspec *s, int64_t fan_in)
{
	size_t n = strlen(s->name);

	if (n > 5 && !strcmp(s->name + n - 5, ".bias"))
		s->std = 0.02f;
	else if (s->ndim == 1) {
		s->mean = 1.0f;
		s->std = 0.1f;
	} else {
		s->std = 1.0f / sqrtf((float)fan_in);
	}
}

/* A tensor of any rank named prefix.suffix, scaled by spec_scale. */
static void nd(struct wlist *l, const char *prefix, const char *suffix, int ndim, ...)
{
	char nm[192];
	struct wspec *s;
	int64_t fan_in = 1;
	va_list ap;

	snprintf(nm, sizeof(nm), "%s%s%s", prefix, *suffix ? "." : "", suffix);
	if (!(s = new_spec(l, nm)))
		return;
	s->ndim = ndim;
	va_start(ap, ndim);
	for (int i = 0; i < ndim; i++) {
		s->shape[i] = va_arg(ap, int64_t);
		if (i > 0)
			fan_in *= s->shape[i];
	}
	va_end(ap);
	spec_scale(s, fan_in);
}

#define I64(x) ((int64_t)(x))

static void linear(struct wlist *l, const char *prefix, int64_t out, int64_t in, int bias)
{
	nd(l, prefix, "weight", 2, out, in);
	if (bias)
		nd(l, prefix, "bias", 1, out);
}

static void norm(struct wlist *l, const char *prefix, int64_t c)
{
	nd(l, prefix, "weight", 1, c);
	nd(l, prefix, "bias", 1, c);
}

/* A convolution of kernel k (2-D or 3-D), with bias. */
static void conv(struct wlist *l, const char *prefix, int dims, int64_t out, int64_t in, int64_t k)
{
	if (dims == 2)
		nd(l, prefix, "weight", 4, out, in, k, k);
	else
		nd(l, prefix, "weight", 5, out, in, k, k, k);
	nd(l, prefix, "bias", 1, out);
}

/* TimestepEmbedder: mlp.0 Linear(256, H), mlp.2 Linear(H, H). */
static void timestep_embedder(struct wlist *l, const char *name, int64_t H)
{
	char p[96];

	snprintf(p, sizeof(p), "%s.mlp.0", name);
	linear(l, p, H, 256, 1);
	snprintf(p, sizeof(p), "%s.mlp.2", name);
	linear(l, p, H, H, 1);
}

/* ResBlock(in, emb, out) of the patch embedding and the final layer. */
static void resblock(struct wlist *l, const char *pre, int64_t in, int64_t emb, int64_t out)
{
	char p[160];

	snprintf(p, sizeof(p), "%s.in_layers.0", pre);
	norm(l, p, in);
	snprintf(p, sizeof(p), "%s.in_layers.2", pre);
	conv(l, p, 2, out, in, 3);
	snprintf(p, sizeof(p), "%s.emb_layers.1", pre);
	linear(l, p, 2 * out, emb, 1);
	snprintf(p, sizeof(p), "%s.out_layers.0", pre);
	norm(l, p, out);
	snprintf(p, sizeof(p), "%s.out_layers.3", pre);
	conv(l, p, 2, out, out, 3);
	if (in != out) {
		snprintf(p, sizeof(p), "%s.skip_connection", pre);
		conv(l, p, 2, out, in, 1);
	}
}

/* The VAE's tensors: the list model/vae.c loads (hi3i_vae_tensors), so
 * that what init-model writes is what the VAE reads. */
static void vae_spec(void *ctx, const char *name, int ndim, const int64_t *shape)
{
	struct wlist *l = ctx;
	struct wspec *s = new_spec(l, name);
	int64_t fan_in = 1;

	if (!s)
		return;
	s->ndim = ndim;
	for (int i = 0; i < ndim; i++) {
		s->shape[i] = shape[i];
		if (i > 0)
			fan_in *= shape[i];
	}
	spec_scale(s, fan_in);
}

/* Siglip2VisionTransformer (with its pooling head) and the aligner. */
static void vit_specs(const hi3_config *c, struct wlist *l)
{
	const hi3_vit_config *v = &c->vit;
	const hi3_vit_aligner_config *a = &c->vit_aligner;
	int64_t D = v->hidden_size, I = v->intermediate_size;
	char p[160];

	linear(l, "vision_model.embeddings.patch_embedding", D, I64(v->num_channels) * v->patch_size * v->patch_size, 1);
	nd(l, "vision_model.embeddings.position_embedding", "weight", 2, I64(v->num_patches), D);
	for (int i = 0; i < v->num_hidden_layers; i++) {
		static const char *const proj[] = {"k_proj", "v_proj", "q_proj", "out_proj"};
		for (int k = 0; k < 4; k++) {
			snprintf(p, sizeof(p), "vision_model.encoder.layers.%d.self_attn.%s", i, proj[k]);
			linear(l, p, D, D, 1);
		}
		snprintf(p, sizeof(p), "vision_model.encoder.layers.%d.layer_norm1", i);
		norm(l, p, D);
		snprintf(p, sizeof(p), "vision_model.encoder.layers.%d.mlp.fc1", i);
		linear(l, p, I, D, 1);
		snprintf(p, sizeof(p), "vision_model.encoder.layers.%d.mlp.fc2", i);
		linear(l, p, D, I, 1);
		snprintf(p, sizeof(p), "vision_model.encoder.layers.%d.layer_norm2", i);
		norm(l, p, D);
	}
	norm(l, "vision_model.post_layernorm", D);
	nd(l, "vision_model.head", "probe", 3, I64(1), I64(1), D);
	nd(l, "vision_model.head.attention", "in_proj_weight", 2, 3 * D, D);
	nd(l, "vision_model.head.attention", "in_proj_bias", 1, 3 * D);
	linear(l, "vision_model.head.attention.out_proj", D, D, 1);
	norm(l, "vision_model.head.layernorm", D);
	linear(l, "vision_model.head.mlp.fc1", I, D, 1);
	linear(l, "vision_model.head.mlp.fc2", D, I, 1);
	if (!strcmp(a->projector_type, "linear")) {
		linear(l, "vision_aligner.layers", a->n_embed, a->input_dim, 1);
		return;
	}
	linear(l, "vision_aligner.layers.0", a->n_embed, a->input_dim, 1);
	for (int k = 1; k < a->depth; k++) {
		snprintf(p, sizeof(p), "vision_aligner.layers.%d", 2 * k);
		linear(l, p, a->n_embed, a->n_embed, 1);
	}
}

/* Every module of HunyuanImage3ForCausalMM beside the backbone: the
 * timestep embedders, patch_embed (UNetDown), final_layer (UNetUp with its
 * output norm), the VAE, the ViT and the aligner; a Distil model's
 * guidance_emb and timestep_r_emb. Patch size 1 (the release's). The
 * older presets (full 0) hold what image generation needs: the heads and
 * the VAE decoder. */
static int image_specs(const hi3_config *c, struct wlist *l, int full, hi3_error *err)
{
	int64_t H = c->hidden_size, P = c->patch_embed_hidden_dim, Z = c->vae.latent_channels;

	l->shard = 1;
	timestep_embedder(l, "timestep_emb", H);
	if (c->cfg_distilled)
		timestep_embedder(l, "guidance_emb", H);
	if (c->use_meanflow)
		timestep_embedder(l, "timestep_r_emb", H);
	conv(l, "patch_embed.model.0", 2, P, Z, 3);
	resblock(l, "patch_embed.model.1", P, H, H);
	timestep_embedder(l, "time_embed", H);
	resblock(l, "final_layer.model.0", H, H, P);
	norm(l, "final_layer.model.1.0", P);
	conv(l, "final_layer.model.1.2", 2, Z, P, 3);
	timestep_embedder(l, "time_embed_2", H);
	if (full)
		vit_specs(c, l);
	l->shard = 2;
	if (hi3i_vae_tensors(&c->vae, HI3_VAE_DECODER | (full ? HI3_VAE_ENCODER : 0), vae_spec, l, err))
		return -1;
	return l->failed ? -1 : 0;
}

static int64_t spec_numel(const struct wspec *s)
{
	int64_t n = 1;

	for (int i = 0; i < s->ndim; i++)
		n *= s->shape[i];
	return n;
}

static void fill(const struct wspec *s, uint64_t seed, hi3_dtype dt, void *out)
{
	int64_t n = spec_numel(s);
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
 * byte tokens (the older presets). */
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

/* The release presets' special tokens: where the released tokenizer has
 * them (facts/released/special_token_ids.json: <|endoftext|> 127957 ...
 * <img_ratio_32> 128076, <img_ratio_33> .. <img_ratio_36> 130103 ..
 * 130106), the block from 127957 moved down to 300 and the four late ratio
 * tokens to 500 .. 503, apart from the rest as in the release. Ids the
 * facts do not give (<timestep>, <guidance>, <timestep_r>, <joint_img_sep>,
 * the other <img_size_N>) take free places in the block. */
#define RELEASE_SHIFT (127957 - 300)
static const struct {
	const char *name;
	int release_id;
} release_tokens[] = {
	{"<|endoftext|>", 127957}, {"<|startoftext|>", 127958}, {"<boi>", 128000}, {"<eoi>", 128001},
	{"<timestep>", 128002}, {"<guidance>", 128003}, {"<timestep_r>", 128004}, {"<joint_img_sep>", 128005},
	{"<img>", 128006}, {"<pad>", 128009}, {"<cfg>", 128010}, {"<recaption>", 128018}, {"</recaption>", 128019},
	{"<think>", 128023}, {"</think>", 128024}, {"<answer>", 128025}, {"</answer>", 128026},
	{"<img_size_256>", 128034}, {"<img_size_512>", 128035}, {"<img_size_768>", 128036},
	{"<img_size_1024>", 128037}, {"<img_size_1280>", 128038}, {"<img_size_1536>", 128039},
	{"<img_size_2048>", 128040},
};

static int n_release_specials(void)
{
	return (int)HI3_ARRAY_SIZE(release_tokens) + 37;
}

/* Special token i of the release layout: its name and id. */
static int release_special(int i, char *buf, size_t n)
{
	int nt = (int)HI3_ARRAY_SIZE(release_tokens);

	if (i < nt) {
		snprintf(buf, n, "%s", release_tokens[i].name);
		return release_tokens[i].release_id - RELEASE_SHIFT;
	}
	i -= nt;
	snprintf(buf, n, "<img_ratio_%d>", i);
	return i < 33 ? 128044 + i - RELEASE_SHIFT : 500 + i - 33;
}

static int release_id(const char *name)
{
	char buf[64];

	for (int i = 0; i < n_release_specials(); i++) {
		int id = release_special(i, buf, sizeof(buf));
		if (!strcmp(buf, name))
			return id;
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

/* Hunyuan's split pattern (tokenization_hy.py PAT_STR: single digits), as a
 * tokenizer converted from its tiktoken file carries it. */
static const char hunyuan_regex[] =
	"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
	"|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* The release presets' merges (ids 256 ..): common English pairs, each of
 * two tokens already in the vocabulary ("Ġ" is the byte-level space). */
static const char *const release_merges[][2] = {
	{"Ġ", "t"}, {"h", "e"}, {"Ġ", "a"}, {"i", "n"}, {"e", "r"}, {"o", "n"}, {"Ġt", "he"}, {"r", "e"},
	{"a", "n"}, {"o", "r"}, {"e", "n"}, {"a", "t"}, {"Ġ", "s"}, {"Ġ", "w"}, {"Ġ", "c"}, {"i", "s"},
	{"e", "s"}, {"i", "t"}, {"Ġ", "o"}, {"Ġ", "b"}, {"e", "d"}, {"a", "r"}, {"Ġ", "f"}, {"in", "g"},
	{"Ġ", "p"}, {"Ġ", "m"}, {"a", "l"}, {"o", "u"}, {"Ġa", "n"}, {"l", "e"}, {"Ġ", "d"}, {"Ġ", "h"},
	{"Ġ", "l"}, {"Ġ", "i"}, {"r", "o"}, {"i", "c"}, {"Ġan", "d"}, {"Ġo", "f"}, {"Ġ", "r"}, {"s", "t"},
	{"Ġc", "at"}, {"Ġ", "g"}, {"Ġ", "n"}, {"l", "i"},
};

/* A byte-level BPE tokenizer.json. release: the Hunyuan pattern, merges,
 * the release layout of special tokens (also in the model vocabulary, so
 * that `tokenizers` keeps their ids), ignore_merges as converted from
 * tiktoken; else the older presets' (no merges, specials from 256). */
static json_t *build_tokenizer(int release)
{
	json_t *vocab = json_object(), *added = json_array(), *merges = json_array(), *root;
	char tok[8], name[64];
	int n = release ? n_release_specials() : n_specials();

	for (int b = 0; b < 256; b++) {
		byte_token(b, tok);
		json_object_set_new(vocab, tok, json_integer(b));
	}
	for (size_t m = 0; release && m < HI3_ARRAY_SIZE(release_merges); m++) {
		char *joined = hi3i_asprintf("%s%s", release_merges[m][0], release_merges[m][1]);
		if (joined && !json_object_get(vocab, joined))
			json_object_set_new(vocab, joined, json_integer((json_int_t)json_object_size(vocab)));
		json_array_append_new(merges, json_pack("[s, s]", release_merges[m][0], release_merges[m][1]));
		free(joined);
	}
	for (int i = 0; i < n; i++) {
		int id = release ? release_special(i, name, sizeof(name)) : (special_name(i, name, sizeof(name)), 256 + i);
		if (release)
			json_object_set_new(vocab, name, json_integer(id));
		json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", id, "content", name,
		                                       "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0,
		                                       "special", 1));
	}
	root = json_pack(
		"{s:s, s:n, s:n, s:o, s:n, s:{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b, s:b}]},"
		" s:{s:s, s:b, s:b, s:b}, s:{s:s, s:b, s:b, s:b},"
		" s:{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:b, s:o, s:o}}",
		"version", "1.0", "truncation", "padding", "added_tokens", added, "normalizer",
		"pre_tokenizer", "type", "Sequence", "pretokenizers",
		"type", "Split", "pattern", "Regex", release ? hunyuan_regex : split_regex, "behavior", "Isolated",
		"invert", 0, "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 0,
		"post_processor", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", release ? 0 : 1, "use_regex", 0,
		"decoder", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 0,
		"model", "type", "BPE", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
		"fuse_unk", 0, "byte_fallback", 0, "ignore_merges", release, "vocab", vocab, "merges", merges);
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

/* A list of n copies of v (consumed). */
static json_t *layers_list(json_t *v, int n)
{
	json_t *a = json_array();

	for (int i = 0; i < n; i++)
		json_array_append(a, v);
	json_decref(v);
	return a;
}

/* The release presets' config: the released field set, scaled; per-layer
 * fields as lists of one per layer (as the release writes them, after the
 * overrides so that num_hidden_layers may change). */
static json_t *release_config_of(int preset)
{
	json_t *cfg = json_loads(release_config, 0, NULL);
	static const struct {
		const char *key, *token;
	} ids[] = {{"bos_token_id", BOS_NAME}, {"eos_token_id", EOS_NAME}, {"pad_id", PAD_NAME},
	           {"pad_token_id", PAD_NAME}, {"im_start_id", "<boi>"}, {"im_end_id", "<eoi>"},
	           {"image_token_id", "<img>"}};

	HI3_ASSERT(cfg);
	/* the ids the tokenizer gives these tokens (the release's, moved) */
	for (size_t i = 0; i < HI3_ARRAY_SIZE(ids); i++)
		json_object_set_new(cfg, ids[i].key, json_integer(release_id(ids[i].token)));
	if (preset == P_INSTRUCT || preset == P_DISTIL) {
		json_object_set_new(cfg, "model_version", json_string(preset == P_INSTRUCT ? "HunyuanImage-3.0-Instruct"
		                                                      : "HunyuanImage-3.0-Instruct-Distil"));
		json_object_set_new(cfg, "cfg_distilled", json_boolean(preset == P_DISTIL));
		json_object_set_new(cfg, "use_meanflow", json_boolean(preset == P_DISTIL));
	}
	return cfg;
}

static void per_layer_lists(json_t *cfg)
{
	static const char *const keys[] = {"moe_intermediate_size", "moe_topk", "num_shared_expert"};
	json_t *nl = json_object_get(cfg, "num_hidden_layers");
	int n = json_is_integer(nl) ? (int)json_integer_value(nl) : 0;

	if (n < 1 || n > HI3_MAX_LAYERS)
		return;   /* the parse names the field */
	for (size_t k = 0; k < HI3_ARRAY_SIZE(keys); k++) {
		json_t *v = json_object_get(cfg, keys[k]);
		if (json_is_integer(v))
			json_object_set_new(cfg, keys[k], layers_list(json_incref(v), n));
	}
}

static json_t *build_config(const hi3_init_opts *o, int preset, hi3_error *err)
{
	const char *text = preset == P_TINY ? preset_tiny : preset == P_TINY_MOE ? preset_tiny_moe : preset_small;
	json_t *cfg, *p, *ov;
	json_error_t je;

	if (preset >= P_RELEASE) {
		cfg = release_config_of(preset);
	} else {
		cfg = json_loads(common_fields, 0, NULL);
		p = json_loads(text, 0, NULL);
		HI3_ASSERT(cfg && p);
		json_object_update(cfg, p);
		json_decref(p);
		p = json_loads(preset_image_fields, 0, NULL);
		HI3_ASSERT(p);
		json_object_update(cfg, p);
		json_decref(p);
		json_object_set_new(cfg, "patch_embed_hidden_dim",
		                    json_integer(json_integer_value(json_object_get(cfg, "hidden_size")) / 4));
		json_object_set_new(cfg, "bos_token_id", json_integer(special_id(BOS_NAME)));
		json_object_set_new(cfg, "eos_token_id", json_integer(special_id(EOS_NAME)));
		json_object_set_new(cfg, "pad_token_id", json_integer(special_id(PAD_NAME)));
		json_object_set_new(cfg, "torch_dtype", json_string(o->dtype == HI3_BF16 ? "bfloat16" : "float32"));
	}
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
	if (preset >= P_RELEASE)
		per_layer_lists(cfg);
	return cfg;
}

static json_t *build_generation(int preset)
{
	json_t *g;

	if (preset < P_RELEASE)
		return json_pack("{s:I, s:I, s:I, s:s, s:b, s:i}", "bos_token_id", (json_int_t)special_id(BOS_NAME),
		                 "eos_token_id", (json_int_t)special_id(EOS_NAME), "pad_token_id",
		                 (json_int_t)special_id(PAD_NAME), "sequence_template", "pretrain", "do_sample", 0,
		                 "max_new_tokens", 64);
	g = json_loads(release_generation, 0, NULL);
	HI3_ASSERT(g);
	json_object_set_new(g, "eos_token_id", json_pack("[i]", release_id(EOS_NAME)));
	json_object_set_new(g, "pad_token_id", json_integer(release_id(PAD_NAME)));
	if (preset != P_RELEASE) {
		json_object_set_new(g, "bot_task", json_string("think_recaption"));
		json_object_set_new(g, "diff_guidance_scale", json_real(2.5));
		json_object_set_new(g, "sequence_template", json_string("instruct"));
		json_object_set_new(g, "use_system_prompt", json_string("en_unified"));
	}
	if (preset == P_DISTIL)
		json_object_set_new(g, "diff_infer_steps", json_integer(8));
	return g;
}

/* Write the weights: one model.safetensors, or (release presets) a shard
 * per part with model.safetensors.index.json. */
static int write_weights(const char *dir, const struct wlist *specs, void **bufs, hi3_dtype dtype, int sharded,
                         hi3_error *err)
{
	int n_shards = sharded ? 3 : 1, rc = -1;
	json_t *map = json_object(), *index = NULL;
	size_t total = 0;

	for (int k = 0; k < n_shards; k++) {
		hi3_st_writer *w = hi3_stw_new();
		char *file = sharded ? hi3i_asprintf("model-%05d-of-%05d.safetensors", k + 1, n_shards)
		                     : hi3i_strdup("model.safetensors");
		char *path = file ? hi3i_asprintf("%s/%s", dir, file) : NULL;
		int bad = !w || !path;

		if (!bad)
			hi3_stw_meta(w, "format", "pt");
		for (int i = 0; !bad && i < specs->n; i++) {
			const struct wspec *s = &specs->w[i];
			hi3_dtype dt = s->keep_f32 ? HI3_F32 : dtype;
			if (sharded && s->shard != k)
				continue;
			bad |= hi3_stw_add(w, s->name, dt, s->ndim, s->shape, bufs[i]) != 0;
			bad |= json_object_set_new(map, s->name, json_string(file)) != 0;
			total += (size_t)spec_numel(s) * hi3_dtype_size(dt);
		}
		if (bad)
			hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		else
			bad = hi3_stw_write(w, path, err) != 0;
		hi3_stw_free(w);
		free(file);
		free(path);
		if (bad)
			goto out;
	}
	if (sharded) {
		index = json_pack("{s:{s:I}, s:O}", "metadata", "total_size", (json_int_t)total, "weight_map", map);
		if (write_json(dir, "model.safetensors.index.json", index, err) != 0)
			goto out;
	}
	rc = 0;
out:
	json_decref(map);
	json_decref(index);
	return rc;
}

int hi3_init_model(const char *dir, const hi3_init_opts *o, hi3_error *err)
{
	json_t *cfg_js = NULL, *tok = NULL, *gen = NULL, *tcfg = NULL;
	char *cfg_text = NULL;
	hi3_config cfg = {0};
	struct wlist specs = {0};
	void **bufs = NULL;
	int preset = o->preset ? preset_of(o->preset) : -1, release, rc = -1;
	hi3_dtype dtype;

	if (preset < 0)
		return hi3_error_set(err, HI3_ERR_USAGE, "unknown preset '%s' (expected tiny, tiny-moe, small, "
		                     "tiny-release, tiny-instruct or tiny-distil)", o->preset ? o->preset : "");
	release = preset >= P_RELEASE;
	dtype = o->dtype_given || !release ? o->dtype : HI3_BF16;
	if (dtype != HI3_F32 && dtype != HI3_BF16)
		return hi3_error_set(err, HI3_ERR_USAGE, "--dtype: expected f32 or bf16");
	if (!(cfg_js = build_config(o, preset, err)))
		goto out;
	cfg_text = json_dumps(cfg_js, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	if (!cfg_text || hi3_config_parse(&cfg, cfg_text, "config (preset and overrides)", err) != 0)
		goto out;
	if (cfg.vocab_size < (release ? 504 : 256 + n_specials())) {
		hi3_error_set(err, HI3_ERR_USAGE, "vocab_size %d is smaller than the tokenizer's %d ids", cfg.vocab_size,
		              release ? 504 : 256 + n_specials());
		goto out;
	}
	if (release && (!cfg.vae.present || !cfg.vit.present || !cfg.vit_aligner.present || cfg.patch_size != 1)) {
		hi3_error_set(err, HI3_ERR_USAGE, "the release presets need the vae, vit and vit_aligner blocks and "
		              "patch_size 1");
		goto out;
	}
	if (!release && cfg.vae.present && cfg.patch_size != 1) {
		hi3_error_set(err, HI3_ERR_USAGE, "the image heads of init-model have patch_size 1");
		goto out;
	}
	if (build_specs(&cfg, &specs) != 0) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		goto out;
	}
	if ((release || cfg.vae.present) && image_specs(&cfg, &specs, release, err) != 0) {
		if (!err->msg[0] || specs.failed)
			hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		goto out;
	}
	if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "%s: cannot create the directory: %s", dir, strerror(errno));
		goto out;
	}
	if (!(bufs = hi3i_calloc((size_t)specs.n, sizeof(void *), err)))
		goto out;
	for (int i = 0; i < specs.n; i++) {
		const struct wspec *s = &specs.w[i];
		hi3_dtype dt = s->keep_f32 ? HI3_F32 : dtype;

		if (!(bufs[i] = hi3i_malloc((size_t)spec_numel(s) * hi3_dtype_size(dt), err)))
			goto out;
		fill(s, o->seed, dt, bufs[i]);
	}
	if (write_weights(dir, &specs, bufs, dtype, release, err) != 0)
		goto out;
	tok = build_tokenizer(release);
	gen = build_generation(preset);
	tcfg = release ? json_loads(release_tokenizer_config, 0, NULL)
	               : json_pack("{s:s, s:s, s:s, s:b, s:b, s:s}", "bos_token", BOS_NAME, "eos_token", EOS_NAME,
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
	hi3_config_release(&cfg);
	json_decref(cfg_js);
	json_decref(tok);
	json_decref(gen);
	json_decref(tcfg);
	free(cfg_text);
	return rc;
}
