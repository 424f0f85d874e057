/* vae-model.c -- VAE model directories from the counter-based generator of model-gen.h (vae-model.h). */
#include <string.h>
#include "core/internal.h"
#include "model/vae.h"
#include "model-gen.h"
#include "vae-model.h"

char *vae_model_config_json(const hi3_vae_config *c)
{
	char boc[256] = "", sh[64] = "null";
	size_t n = 0;

	for (int i = 0; i < c->n_levels; i++)
		n += (size_t)snprintf(boc + n, sizeof(boc) - n, "%s%d", i ? ", " : "", c->block_out_channels[i]);
	if (c->has_shift_factor)
		snprintf(sh, sizeof(sh), "%.17g", c->shift_factor);
	return hi3i_asprintf("{\"vae\": {\"_class_name\": \"AutoencoderKLConv3D\", \"block_out_channels\": [%s], "
	                     "\"in_channels\": %d, \"out_channels\": %d, \"latent_channels\": %d, \"layers_per_block\": %d, "
	                     "\"ffactor_spatial\": %d, \"ffactor_temporal\": %d, \"downsample_match_channel\": %s, "
	                     "\"upsample_match_channel\": %s, \"scaling_factor\": %.17g, \"shift_factor\": %s}}\n",
	                     boc, c->in_channels, c->out_channels, c->latent_channels, c->layers_per_block,
	                     c->ffactor_spatial, c->ffactor_temporal, c->downsample_match_channel ? "true" : "false",
	                     c->upsample_match_channel ? "true" : "false", c->scaling_factor, sh);
}

int vae_model_write(const char *dir, const hi3_vae_config *c, int parts, uint64_t seed, hi3_dtype dt,
                    double *checksum, hi3_error *err)
{
	gen_list *l = gen_list_new();
	char *cfg = NULL;
	int rc = -1;

	if (hi3i_vae_tensors(c, parts, gen_list_add, l, err))
		goto out;
	if (!(cfg = vae_model_config_json(c))) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		goto out;
	}
	rc = gen_model_write(dir, l, cfg, seed, dt, checksum, err);
out:
	free(cfg);
	gen_list_free(l);
	return rc;
}
