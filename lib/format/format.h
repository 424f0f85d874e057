/*
 * format.h -- what the format modules share, and what they offer the
 * layers above beyond hi3.h (internal).
 */
#ifndef HI3_FORMAT_H
#define HI3_FORMAT_H

#include "core/internal.h"
#include "format/hi3-format.h"

/* What a stage file records of the model that made it, and the sizes of
 * the model it is laid out by: plain values, which the model fills
 * (hi3i_model_facts, model/model.h) and the stages hand down, so that a
 * format module never needs the model itself. */
struct hi3i_model_facts {
	char fingerprint[17];     /* hi3_fingerprint: 16 hex digits */
	const char *dir;          /* the model's directory, for messages */
	int vocab;                /* V */
	int n_layers, n_kv, d;    /* the KV cache: (B, n_kv, C, d) per layer */
	int n_moe, k;             /* routing records: MoE layers, experts per token (0 0: none) */
};

/* ------------------------------------------------------- safetensors.c */

/* Take an exclusive lock on an open file (released when it is closed);
 * fails at once when another process holds it. */
int hi3i_st_lock(hi3_st *st, hi3_error *err);
/* A writer for a stage file of this format: "format", "format_version" and
 * the n (key, value) pairs of meta whose value is not NULL; NULL when out
 * of memory. */
hi3_st_writer *hi3i_stw_format(const char *format, const char *const (*meta)[2], size_t n);

/* ------------------------------------------- trajectory.c and replay.c */

/* A --noise file (trajectory.c): x_T (B, C, h, w) and, with K > 0,
 * sde_noise (B, K, C, h, w), F32, copied out; the error names the file and
 * the tensor (status 3). */
int hi3i_noise_read(const char *path, int B, int C, int h, int w, int K, float *x_T, float *sde_noise,
                    hi3_error *err);

/* The replay file of a diffusion replay (replay.c, format hi3.replay):
 * sde_logp (B, K) F32 and sde_steps (K) I64, written atomically. */
int hi3i_replay_sde_write(const char *path, int B, int K, const float *sde_logp, const int64_t *sde_steps,
                          const char *fingerprint, const char *conditions_hash, const char *traj_file, hi3_error *err);

#endif
