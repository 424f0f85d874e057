/* vae-model.c -- VAE model directories from a counter-based generator (vae-model.h). */
#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include "core/internal.h"
#include "model/vae.h"
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

struct list {
	int n;
	struct {
		char name[128];
		int ndim;
		int64_t shape[5];
	} t[1024];
};

static void add(void *ctx, const char *name, int ndim, const int64_t *shape)
{
	struct list *l = ctx;

	HI3_ASSERT(l->n < (int)HI3_ARRAY_SIZE(l->t) && strlen(name) < sizeof(l->t[0].name));
	snprintf(l->t[l->n].name, sizeof(l->t[0].name), "%s", name);
	l->t[l->n].ndim = ndim;
	memcpy(l->t[l->n].shape, shape, sizeof(int64_t) * (size_t)ndim);
	l->n++;
}

static uint64_t splitmix(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static int by_name(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

int vae_model_write(const char *dir, const hi3_vae_config *c, int parts, uint64_t seed, hi3_dtype dt,
                    double *checksum, hi3_error *err)
{
	struct list *l = hi3i_calloc(1, sizeof(*l), err);
	hi3_st_writer *w = hi3_stw_new();
	void **data = NULL;
	const char **names = NULL;
	char *path = NULL, *cfg = NULL;
	double sum = 0;
	int rc = -1;

	if (!l || !w || (mkdir(dir, 0777) && errno != EEXIST)) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "%s: cannot create the model", dir);
		goto out;
	}
	if (hi3i_vae_tensors(c, parts, add, l, err))
		goto out;
	data = calloc((size_t)l->n, sizeof(*data));
	names = calloc((size_t)l->n, sizeof(*names));
	if (!data || !names)
		goto out;
	for (int i = 0; i < l->n; i++) {
		const char *nm = l->t[i].name;
		const int64_t *s = l->t[i].shape;
		int64_t n = 1;
		uint64_t key = hi3i_hash(HI3_HASH_INIT, nm, strlen(nm)) + seed;
		const size_t len = strlen(nm);
		const int is_bias = len > 5 && !strcmp(nm + len - 5, ".bias");

		for (int d = 0; d < l->t[i].ndim; d++)
			n *= s[d];
		if (!(data[i] = malloc((size_t)n * 4)))
			goto out;
		for (int64_t e = 0; e < n; e++) {
			double u = (double)(splitmix(key + (uint64_t)(e + 1) * 0x9e3779b97f4a7c15ULL) >> 40) / 16777216.0, v;
			if (is_bias)
				v = 0.1 * (2 * u - 1);
			else if (l->t[i].ndim == 1)
				v = 1 + 0.25 * (2 * u - 1);
			else
				v = (2 * u - 1) / sqrt((double)(n / s[0]));
			if (dt == HI3_BF16)
				((uint16_t *)data[i])[e] = hi3_f32_to_bf16((float)v);
			else
				((float *)data[i])[e] = (float)v;
		}
		if (hi3_stw_add(w, nm, dt, l->t[i].ndim, s, data[i]))
			goto out;
		names[i] = nm;
	}
	/* the checksum, in name order */
	{
		const char **sorted = malloc(sizeof(*sorted) * (size_t)l->n);
		if (!sorted)
			goto out;
		memcpy(sorted, names, sizeof(*sorted) * (size_t)l->n);
		qsort(sorted, (size_t)l->n, sizeof(*sorted), by_name);
		for (int i = 0; i < l->n; i++) {
			int j = 0;
			int64_t n = 1;
			while (names[j] != sorted[i])
				j++;
			for (int d = 0; d < l->t[j].ndim; d++)
				n *= l->t[j].shape[d];
			for (int64_t e = 0; e < n; e++) {
				double v = dt == HI3_BF16 ? hi3_bf16_to_f32(((uint16_t *)data[j])[e]) : ((float *)data[j])[e];
				sum += v * (double)(e % 13 + 1);
			}
		}
		free(sorted);
	}
	if (!(path = hi3i_asprintf("%s/model.safetensors", dir)) || hi3_stw_write(w, path, err))
		goto out;
	free(path);
	if (!(path = hi3i_asprintf("%s/config.json", dir)) || !(cfg = vae_model_config_json(c)) ||
	    hi3i_write_file(path, cfg, strlen(cfg), err))
		goto out;
	if (checksum)
		*checksum = sum;
	rc = 0;
out:
	if (rc && err && !err->status)
		hi3_error_set(err, HI3_ERR_RUNTIME, "%s: cannot write the model (out of memory?)", dir);
	for (int i = 0; data && i < l->n; i++)
		free(data[i]);
	free(data);
	free(names);
	free(path);
	free(cfg);
	free(l);
	hi3_stw_free(w);
	return rc;
}
