/*
 * vae.h -- the VAE's internals that tests and model writers share: its
 * tensor list (names and shapes, walked from the same code that loads
 * them), and opening it on a backend and checkpoint one already holds.
 */
#ifndef HI3_VAE_H
#define HI3_VAE_H

#include "backend/backend.h"
#include "model/hi3-model.h"

/* Call fn for every tensor the parts (enum hi3_vae_parts) of a VAE of
 * config c hold, in load order, with its name (vae.decoder....) and shape.
 * 0, or -1 with err set when c is not a VAE hi3 can build. */
int hi3i_vae_tensors(const hi3_vae_config *c, int parts,
                     void (*fn)(void *ctx, const char *name, int ndim, const int64_t *shape), void *ctx,
                     hi3_error *err);

/* Open the parts of the VAE of config c from ck on be (both borrowed:
 * they must outlive the VAE); where names the model in messages. */
int hi3i_vae_open(hi3_vae **out, hi3_backend *be, const hi3_ckpt *ck, const hi3_vae_config *c, const char *where,
                  int parts, hi3_error *err);

#endif
