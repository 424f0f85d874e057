/*
 * heads.h -- the image heads of the diffusion path (internal; heads.c):
 * the timestep embedders, patch_embed (UNetDown) and final_layer (UNetUp)
 * of upstream's HunyuanImage3ForCausalMM, on the backend ops table.
 *
 * Layout: channels-last images (R, h, w, C) as backend.h holds them: an
 * image's h w positions in raster order are exactly its tokens in the
 * sequence, so patch_embed's output rows are the <img> tokens' inputs and
 * final_layer reads the hidden states of those tokens as they come.
 *
 * Shape letters: R images (rows), h, w the latent (= token) grid, N = h w,
 * H hidden size, P patch_embed_hidden_dim, Z latent channels.
 */
#ifndef HI3_HEADS_H
#define HI3_HEADS_H

#include "backend/backend.h"
#include "model/hi3-model.h"

/* The timestep embedders (TimestepEmbedder: sinusoid of 256, Linear,
 * GELU, Linear), by their upstream module names. */
enum hi3i_temb {
	HI3I_TEMB_TIMESTEP,       /* timestep_emb: the <timestep> token */
	HI3I_TEMB_PATCH,          /* time_embed: patch_embed's conditioning */
	HI3I_TEMB_FINAL,          /* time_embed_2: final_layer's conditioning */
	HI3I_TEMB_GUIDANCE,       /* guidance_emb: the Distil's <guidance> token */
	HI3I_TEMB_TIMESTEP_R,     /* timestep_r_emb: the meanflow <timestep_r> token */
	HI3I_TEMB_COUNT
};
extern const char *const hi3i_temb_names[HI3I_TEMB_COUNT];

#define HI3I_TEMB_FREQ 256        /* frequency_embedding_size */

struct hi3i_heads;

/* The heads of config c from ck on be (borrowed: they outlive the heads);
 * guidance_emb and timestep_r_emb when c has cfg_distilled / use_meanflow.
 * A missing tensor or a config hi3 cannot build (img_proj_type other than
 * unet, patch_size other than 1, channels GroupNorm cannot split in 32) is
 * an input error naming where (the model directory) and the field or
 * tensor. */
int hi3i_heads_open(struct hi3i_heads **out, hi3_backend *be, const hi3_ckpt *ck, const hi3_config *c,
                    const char *where, hi3_error *err);
void hi3i_heads_close(struct hi3i_heads *hd);
/* Whether the checkpoint has the heads at all (timestep_emb.mlp.0.weight). */
int hi3i_heads_present(const hi3_ckpt *ck);

/* out (256) = [cos(t f_k), sin(t f_k)], f_k = exp(-ln(10000) k / 128), in
 * fp32 as upstream's timestep_embedding computes it (cos first). */
void hi3i_timestep_sinusoid(float t, float *out);

/* out (n, H) backend = embedder `which` of the values t (n) host. */
int hi3i_heads_temb(struct hi3i_heads *hd, int which, const float *t, int n, float *out, hi3_error *err);
/* out (R, N, H) backend = patch_embed of x (R, h, w, Z) backend, conditioned
 * on temb (R, H) backend (time_embed's output). */
int hi3i_heads_patch_embed(struct hi3i_heads *hd, const float *x, int R, int h, int w, const float *temb, float *out,
                           hi3_error *err);
/* v (R, h, w, Z) backend = final_layer of the image tokens' hidden states
 * hid (R, N, H) backend, conditioned on temb (R, H) backend
 * (time_embed_2's output). */
int hi3i_heads_final(struct hi3i_heads *hd, const float *hid, int R, int h, int w, const float *temb, float *v,
                     hi3_error *err);

#endif
