/*
 * format.h -- what the format modules share, and what they offer the
 * layers above beyond hi3.h (internal).
 */
#ifndef HI3_FORMAT_H
#define HI3_FORMAT_H

#include "core/internal.h"

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
