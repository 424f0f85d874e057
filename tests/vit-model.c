/* vit-model.c -- vision encoder model directories from the counter-based generator of model-gen.h (vit-model.h). */
#include <string.h>
#include "core/internal.h"
#include "model/vit.h"
#include "model-gen.h"
#include "vit-model.h"

char *vit_model_config_json(const hi3_vit_config *c, const hi3_vit_aligner_config *a)
{
	return hi3i_asprintf("{\"vit\": {\"_attn_implementation\": \"sdpa\", \"attention_dropout\": 0.0, "
	                     "\"hidden_act\": \"%s\", \"hidden_size\": %d, \"intermediate_size\": %d, "
	                     "\"layer_norm_eps\": %.17g, \"num_attention_heads\": %d, \"num_channels\": %d, "
	                     "\"num_hidden_layers\": %d, \"num_patches\": %d, \"patch_size\": %d, "
	                     "\"output_attentions\": false, \"output_hidden_states\": false, \"use_return_dict\": true}, "
	                     "\"vit_aligner\": {\"projector_type\": \"%s\", \"input_dim\": %d, \"n_embed\": %d, "
	                     "\"depth\": %d}}\n",
	                     c->hidden_act, c->hidden_size, c->intermediate_size, c->layer_norm_eps,
	                     c->num_attention_heads, c->num_channels, c->num_hidden_layers, c->num_patches,
	                     c->patch_size, a->projector_type, a->input_dim, a->n_embed, a->depth);
}

/* Siglip2MultiheadAttentionPoolingHead's tensors */
static void head_tensors(gen_list *l, int64_t H, int64_t I)
{
	const struct {
		const char *name;
		int ndim;
		int64_t s[3];
	} t[] = {
		{"vision_model.head.probe", 3, {1, 1, H}},
		{"vision_model.head.attention.in_proj_weight", 2, {3 * H, H}},
		{"vision_model.head.attention.in_proj_bias", 1, {3 * H}},
		{"vision_model.head.attention.out_proj.weight", 2, {H, H}},
		{"vision_model.head.attention.out_proj.bias", 1, {H}},
		{"vision_model.head.layernorm.weight", 1, {H}},
		{"vision_model.head.layernorm.bias", 1, {H}},
		{"vision_model.head.mlp.fc1.weight", 2, {I, H}},
		{"vision_model.head.mlp.fc1.bias", 1, {I}},
		{"vision_model.head.mlp.fc2.weight", 2, {H, I}},
		{"vision_model.head.mlp.fc2.bias", 1, {H}},
	};

	for (size_t i = 0; i < HI3_ARRAY_SIZE(t); i++)
		gen_list_add(l, t[i].name, t[i].ndim, t[i].s);
}

int vit_model_write(const char *dir, const hi3_vit_config *c, const hi3_vit_aligner_config *a, int head,
                    uint64_t seed, hi3_dtype dt, double *checksum, hi3_error *err)
{
	gen_list *l = gen_list_new();
	char *cfg = NULL;
	int rc = -1;

	if (hi3i_vit_tensors(c, a, gen_list_add, l, err))
		goto out;
	if (head)
		head_tensors(l, c->hidden_size, c->intermediate_size);
	if (!(cfg = vit_model_config_json(c, a))) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		goto out;
	}
	rc = gen_model_write(dir, l, cfg, seed, dt, checksum, err);
out:
	free(cfg);
	gen_list_free(l);
	return rc;
}
