/* model-gen.c -- model directories from a counter-based generator (model-gen.h). */
#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include "core/internal.h"
#include "model-gen.h"

struct gen_tensor {
	char name[128];
	int ndim;
	int64_t shape[5];
};

struct gen_list {
	int n, cap;
	struct gen_tensor *t;
};

gen_list *gen_list_new(void)
{
	gen_list *l = calloc(1, sizeof(*l));

	HI3_ASSERT(l);
	return l;
}

void gen_list_free(gen_list *l)
{
	if (l)
		free(l->t);
	free(l);
}

void gen_list_add(void *ctx, const char *name, int ndim, const int64_t *shape)
{
	gen_list *l = ctx;

	if (l->n == l->cap) {
		l->cap = l->cap ? 2 * l->cap : 256;
		l->t = realloc(l->t, sizeof(*l->t) * (size_t)l->cap);
		HI3_ASSERT(l->t);
	}
	HI3_ASSERT(strlen(name) < sizeof(l->t[0].name) && ndim >= 1 && ndim <= 5);
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

static int64_t numel(const struct gen_tensor *t)
{
	int64_t n = 1;

	for (int d = 0; d < t->ndim; d++)
		n *= t->shape[d];
	return n;
}

static int by_name(const void *a, const void *b)
{
	return strcmp((*(const struct gen_tensor *const *)a)->name, (*(const struct gen_tensor *const *)b)->name);
}

int gen_model_write(const char *dir, const gen_list *l, const char *config_json, uint64_t seed, hi3_dtype dt,
                    double *checksum, hi3_error *err)
{
	hi3_st_writer *w = hi3_stw_new();
	void **data = calloc((size_t)l->n + 1, sizeof(*data));
	const struct gen_tensor **sorted = calloc((size_t)l->n + 1, sizeof(*sorted));
	char *path = NULL;
	double sum = 0;
	int rc = -1;

	if (!w || !data || !sorted || (mkdir(dir, 0777) && errno != EEXIST)) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "%s: cannot create the model", dir);
		goto out;
	}
	for (int i = 0; i < l->n; i++) {
		const struct gen_tensor *t = &l->t[i];
		const int64_t n = numel(t);
		const uint64_t key = hi3i_hash(HI3_HASH_INIT, t->name, strlen(t->name)) + seed;
		const size_t len = strlen(t->name);
		const int is_bias = len > 5 && !strcmp(t->name + len - 5, ".bias");

		if (!(data[i] = malloc((size_t)n * 4)))
			goto out;
#pragma omp parallel for schedule(static) if (n > (1 << 20))
		for (int64_t e = 0; e < n; e++) {
			double u = (double)(splitmix(key + (uint64_t)(e + 1) * 0x9e3779b97f4a7c15ULL) >> 40) / 16777216.0, v;
			if (is_bias)
				v = 0.1 * (2 * u - 1);
			else if (t->ndim == 1)
				v = 1 + 0.25 * (2 * u - 1);
			else
				v = (2 * u - 1) / sqrt((double)(n / t->shape[0]));
			if (dt == HI3_BF16)
				((uint16_t *)data[i])[e] = hi3_f32_to_bf16((float)v);
			else
				((float *)data[i])[e] = (float)v;
		}
		if (hi3_stw_add(w, t->name, dt, t->ndim, t->shape, data[i]))
			goto out;
		sorted[i] = t;
	}
	/* the checksum, in name order */
	qsort(sorted, (size_t)l->n, sizeof(*sorted), by_name);
	for (int i = 0; i < l->n; i++) {
		const int j = (int)(sorted[i] - l->t);
		const int64_t n = numel(sorted[i]);
		for (int64_t e = 0; e < n; e++) {
			double v = dt == HI3_BF16 ? hi3_bf16_to_f32(((uint16_t *)data[j])[e]) : ((float *)data[j])[e];
			sum += v * (double)(e % 13 + 1);
		}
	}
	if (!(path = hi3i_asprintf("%s/model.safetensors", dir)) || hi3_stw_write(w, path, err))
		goto out;
	free(path);
	if (!(path = hi3i_asprintf("%s/config.json", dir)) || hi3i_write_file(path, config_json, strlen(config_json), err))
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
	free(sorted);
	free(path);
	hi3_stw_free(w);
	return rc;
}
