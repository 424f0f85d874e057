/*
 * vit.h -- the vision encoder's internals that tests and model writers
 * share: its tensor list (names and shapes, walked from the same code that
 * loads them), opening it on a backend and checkpoint one already holds,
 * and the per-image position grid.
 */
#ifndef HI3_VIT_H
#define HI3_VIT_H

#include "backend/backend.h"
#include "model/hi3-model.h"

/* Call fn for every tensor the ViT of config c and the aligner of config a
 * read, in load order, with its name (vision_model...., vision_aligner....)
 * and shape; the pooling head (vision_model.head.*) is not among them.
 * 0, or -1 with err set when the configs are not a model hi3 can build. */
int hi3i_vit_tensors(const hi3_vit_config *c, const hi3_vit_aligner_config *a,
                     void (*fn)(void *ctx, const char *name, int ndim, const int64_t *shape), void *ctx,
                     hi3_error *err);

/* Open the ViT and aligner of configs c and a from ck on be (both
 * borrowed: they must outlive it); where names the model in messages. */
int hi3i_vit_open(hi3_vit **out, hi3_backend *be, const hi3_ckpt *ck, const hi3_vit_config *c,
                  const hi3_vit_aligner_config *a, const char *where, hi3_error *err);

/* pos (P, H) host = the position embeddings an image of grid (nph, npw)
 * gets in P slots: position_embedding.weight as a (g, g, H) grid resized
 * to (nph, npw) (hi3i_resize_aa_f32), flattened row-major, then slots
 * nph npw .. P - 1 filled with its row 0. */
int hi3i_vit_position_grid(const hi3_vit *v, int nph, int npw, int P, float *pos, hi3_error *err);

#endif
