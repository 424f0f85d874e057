/*
 * trajectory.h -- a capture's checkpoint (format hi3.diffusion-checkpoint,
 * hi3-files(5); trajectory.c): a trajectory file with the commit word
 * steps_done, mapped writable and updated in place, so that a killed
 * diffusion-capture resumes from its last completed step (internal).
 */
#ifndef HI3_FORMAT_TRAJECTORY_H
#define HI3_FORMAT_TRAJECTORY_H

#include "format/format.h"

/* Write t (its latents up to the first step at least, the rest zeros as
 * given) as a checkpoint with steps_done 0, atomically. */
int hi3i_traj_ckpt_create(const char *path, const hi3_trajectory *t, hi3_error *err);
/* Open a checkpoint writable, locked, with *done its commit word (0 to T);
 * close with hi3_trajectory_close. */
int hi3i_traj_ckpt_open(hi3_trajectory **out, int64_t **done, const char *path, hi3_error *err);
/* Flush what was written into the mapping, store *done = steps (one aligned
 * 8-byte store), flush it. */
int hi3i_traj_ckpt_commit(hi3_trajectory *t, int64_t *done, int64_t steps, hi3_error *err);

#endif
