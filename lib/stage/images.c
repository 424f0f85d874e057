/*
 * images.c -- the cond images of a conditions file through the vision
 * encoder and aligner into a forward batch's input rows (images.h).
 *
 * Upstream (hunyuan.py at 1201fe8, instantiate_continuous_tokens) scatters
 * aligner(ViT(image)) of each row's images, P rows per image in image
 * order, into the row's cond_vit_image_mask positions in order; that is
 * what these rows are. The cond VAE tokens and the cond <timestep> token
 * keep their token embeddings here (see docs/IMAGES.md: the VAE encoder's
 * scatter needs patch_embed, not yet in hi3).
 *
 * Shape letters: n images, P ViT slots, D features per slot, E = H the
 * aligner's width, the model's hidden size.
 */
#include <string.h>
#include "cond/image-internal.h"
#include "format/conditions.h"
#include "stage/images.h"

void hi3i_image_embeds_release(struct hi3i_image_embeds *e)
{
	free(e->at);
	free(e->rows);
	memset(e, 0, sizeof(*e));
}

int hi3i_image_vit_for(hi3_vit **v, hi3_model *m, const hi3_cond *c, const char *cond_path, hi3_error *err)
{
	*v = NULL;
	if (!c->NI)
		return 0;
	if (hi3_vit_open(v, m, err))
		return hi3_error_prefix(err, "%s has %d cond images", cond_path ? cond_path : "the conditions", c->NI);
	if (hi3_vit_get_aligner_config(*v)->n_embed != hi3_model_config(m)->hidden_size) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s/config.json: vit_aligner.n_embed %d differs from hidden_size %d",
		              hi3_model_dir(m), hi3_vit_get_aligner_config(*v)->n_embed, hi3_model_config(m)->hidden_size);
		hi3_vit_close(*v);
		*v = NULL;
		return -1;
	}
	if (hi3_vit_get_config(*v)->num_channels * hi3_vit_get_config(*v)->patch_size *
	        hi3_vit_get_config(*v)->patch_size != c->VD) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: cond images of %d features a patch, but the model's ViT takes %d x "
		              "%d x %d", cond_path ? cond_path : "the conditions", c->VD, hi3_vit_get_config(*v)->num_channels,
		              hi3_vit_get_config(*v)->patch_size, hi3_vit_get_config(*v)->patch_size);
		hi3_vit_close(*v);
		*v = NULL;
		return -1;
	}
	return 0;
}

int hi3i_image_embeds(hi3_vit *v, const hi3_cond *c, const int *rows, int nb, int H, struct hi3i_image_embeds *e,
                      hi3_error *err)
{
	const int P = c->VP, D = c->VD;
	int n = 0, *first = NULL, *count = NULL, rc = -1;
	float *pv = NULL, *emb = NULL;
	int32_t *mask = NULL, *shapes = NULL;

	memset(e, 0, sizeof(*e));
	if (!c->NI || !v)
		return 0;
	first = hi3i_malloc(sizeof(int) * (size_t)nb, err);
	count = hi3i_calloc((size_t)nb, sizeof(int), err);
	if (!first || !count)
		goto out;
	for (int j = 0; j < nb; j++) {
		first[j] = -1;
		for (int k = 0; k < c->NI; k++)
			if (c->image_row[k] == rows[j] && !count[j]++)
				first[j] = k;
		n += count[j];
	}
	if (!n) {
		rc = 0;
		goto out;
	}
	pv = hi3i_malloc(sizeof(float) * (size_t)n * P * D, err);
	mask = hi3i_calloc((size_t)n * P, sizeof(int32_t), err);
	shapes = hi3i_malloc(sizeof(int32_t) * 2 * (size_t)n, err);
	emb = hi3i_malloc(sizeof(float) * (size_t)n * P * H, err);
	e->at = hi3i_malloc(sizeof(int32_t) * 2 * (size_t)n * P, err);
	if (!pv || !mask || !shapes || !emb || !e->at)
		goto out;
	/* the ViT batch: the rows' images in order */
	for (int j = 0, i = 0; j < nb; j++)
		for (int k = first[j]; k >= 0 && k < first[j] + count[j]; k++, i++) {
			const uint8_t *u = c->vit_pixels + (size_t)k * P * D;
			const int real = c->vit_grid[2 * k] * c->vit_grid[2 * k + 1];
			/* real patches normalised; pad rows 0, as the processor pads */
			for (size_t x = 0; x < (size_t)P * D; x++)
				pv[(size_t)i * P * D + x] = x < (size_t)real * D ? hi3i_vit_value(u[x]) : 0.0f;
			for (int s = 0; s < real; s++)
				mask[(size_t)i * P + s] = 1;
			shapes[2 * i] = c->vit_grid[2 * k];
			shapes[2 * i + 1] = c->vit_grid[2 * k + 1];
		}
	if (hi3_vit_encode(v, pv, mask, shapes, n, P, NULL, emb, err))
		goto out;
	/* their places: row j's cond_vit_mask columns in order */
	for (int j = 0; j < nb; j++) {
		const uint8_t *m = c->cond_vit_mask + (size_t)rows[j] * c->L;
		int k = 0;
		for (int t = 0; t < c->L; t++)
			if (m[t]) {
				e->at[2 * (e->n + k)] = j;
				e->at[2 * (e->n + k) + 1] = t;
				k++;
			}
		/* hi3_cond_open checked: k == count[j] P */
		HI3_ASSERT(k == count[j] * P);
		e->n += k;
	}
	HI3_ASSERT(e->n == n * P);
	e->rows = emb;
	emb = NULL;
	rc = 0;
out:
	if (rc)
		hi3i_image_embeds_release(e);
	free(first);
	free(count);
	free(pv);
	free(mask);
	free(shapes);
	free(emb);
	return rc;
}
