/*
 * images.h -- the cond images of a conditions file as input rows of a
 * forward batch (prefill and replay share it; images.c).
 */
#ifndef HI3_STAGE_IMAGES_H
#define HI3_STAGE_IMAGES_H

#include "core/internal.h"

/* The rows that replace token embeddings at cond image columns. */
struct hi3i_image_embeds {
	int n;                       /* rows */
	int32_t *at;                 /* (n, 2) (batch row, column) */
	float *rows;                 /* (n, H) */
};

/* The ViT and aligner outputs of the images of conditions rows rows[0 ..
 * nb), placed where batch row j = the cond row rows[j] has its cond_vit_mask
 * columns (the same columns in the batch): the k-th such column gets slot
 * k mod P of the row's image k / P, pad slots included (upstream scatters
 * all P). v is the model's ViT (its aligner width must be the model's
 * hidden size H). All the rows' images run as one ViT batch: on the CPU
 * backend each image's bits do not depend on the others. */
int hi3i_image_embeds(hi3_vit *v, const hi3_cond *c, const int *rows, int nb, int H, struct hi3i_image_embeds *e,
                      hi3_error *err);
void hi3i_image_embeds_release(struct hi3i_image_embeds *e);

/* The model's ViT when c has cond images (*v NULL when it has none); a
 * model without one is an input error naming the conditions file. */
int hi3i_image_vit_for(hi3_vit **v, hi3_model *m, const hi3_cond *c, const char *cond_path, hi3_error *err);

#endif
