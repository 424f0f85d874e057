/*
 * images.h -- the cond images of a conditions file as input rows of a
 * forward batch (prefill, replay and diffusion-capture share it; images.c).
 */
#ifndef HI3_STAGE_IMAGES_H
#define HI3_STAGE_IMAGES_H

#include "core/internal.h"
#include "stage/hi3-stage.h"

/* The rows that replace token embeddings at cond image columns. */
struct hi3i_image_embeds {
	int n;                       /* rows */
	int32_t *at;                 /* (n, 2) (batch row, column), grouped by batch row in order */
	float *rows;                 /* (n, H) */
};

/* The encoders of a model for the cond images of one conditions file: the
 * ViT and aligner, the VAE encoder, and the heads that embed a latent
 * (patch_embed, time_embed, timestep_emb). */
struct hi3i_image_enc;

/* The model's encoders when c has cond images (*out NULL when it has
 * none). A model without them, or whose sizes do not fit the conditions,
 * is an input error naming the conditions file and the missing part. */
int hi3i_image_enc_open(struct hi3i_image_enc **out, hi3_model *m, const hi3_cond *c, const char *cond_path,
                        hi3_error *err);
void hi3i_image_enc_close(struct hi3i_image_enc *enc);

/* The embedding rows of the images of conditions rows rows[0 .. nb), for a
 * batch whose row j is the cond row rows[j] at the same columns. For each
 * row's k-th image (its k-th run of cond_vae_mask columns and its k-th run
 * of P cond_vit_mask columns):
 *   VAE columns (row-major y, x): patch_embed(z, time_embed(0)), z the
 *     posterior mean of the VAE encoder (or, with the conditions' metadata
 *     vae_posterior "sample", mean + std N(0, 1) drawn from the row's seed,
 *     stream HI3I_STREAM_VAE(k), diffusion.h), times the scaling factor;
 *   its <timestep> column (the one before the VAE run): timestep_emb(0);
 *   ViT columns: slot s of aligner(ViT(image)), pad slots included
 *     (upstream scatters all P).
 * enc may be NULL (no images: no rows). Each image runs alone through its
 * encoders, so on the CPU backend a row's rows do not depend on the rest of
 * the batch. */
int hi3i_image_embeds(struct hi3i_image_enc *enc, const hi3_cond *c, const int *rows, int nb,
                      struct hi3i_image_embeds *e, hi3_error *err);
void hi3i_image_embeds_release(struct hi3i_image_embeds *e);

#endif
