/*
 * hi3-stage.h -- the public interface of lib/stage/: sampling, prefill,
 * decode, replay and its mismatch metrics, diffusion (capture, replay,
 * PNGs), and the checks of conditions against the model.
 * Part of hi3.h, the public interface: its conventions hold here.
 */
#ifndef HI3_LAYER_STAGE_H
#define HI3_LAYER_STAGE_H

#include "../model/hi3-model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* --------------------------------------------------------------- sampling */

/* hi3-batching(7), SAMPLING. Temperature, then top-k, then top-p, then one draw from
 * Philox-4x32-10 keyed by the row's seed at counter = step (the index of
 * the token being generated in that row), so a row samples the same tokens
 * in any batch. greedy (or temperature 0) takes the argmax, ties to the
 * lowest id. */
typedef struct hi3_sampler {
	int greedy;
	double temperature;       /* > 0 unless greedy */
	int top_k;                /* 0: off */
	double top_p;             /* 1: off */
} hi3_sampler;
/* The sampler generation_config asks for (stage/sample.c): greedy unless
 * do_sample, then temperature, top_k (0: off) and top_p. */
void hi3_gen_defaults_sampler(const hi3_gen_defaults *g, hi3_sampler *s);

int64_t hi3_argmax(const float *logits, int V);
/* log-softmax of logits (V) at token tok, temperature 1. */
double hi3_logprob(const float *logits, int V, int64_t tok);
/* Sample one token; scratch holds hi3_sample_scratch_size(V) bytes. */
int64_t hi3_sample(const float *logits, int V, const hi3_sampler *s, uint64_t seed, uint64_t step,
                   void *scratch);
size_t hi3_sample_scratch_size(int V);

/* ---------------------------------------------------- prefill and decode */

typedef struct hi3_prefill_opts {
	int max_new;              /* cache slots beyond L: C = L + max_new */
	hi3_dtype kv_dtype;       /* HI3_F32 or HI3_BF16 */
	int max_tokens;           /* tokens per forward chunk (0: 8192) */
	int record_routing;       /* MoE: store each prompt token's experts and weights */
	hi3_trace *trace;         /* record activations of the prompts' tokens (position: column), or NULL */
	hi3_progress_fn progress;
	void *progress_ctx;
} hi3_prefill_opts;

/* Run the prompts of c through the model and write the KV file at kv_path
 * (format hi3.kv: the cache, kv_len, next_logits from column n_i - 1 of
 * each row, finished), atomically. cond_path is recorded in metadata. */
int hi3_prefill(hi3_model *m, const hi3_cond *c, const char *cond_path, const hi3_prefill_opts *o,
                const char *kv_path, hi3_error *err);

enum hi3_decode_mask {
	HI3_MASK_CAUSAL = 0,      /* row i's query at index p attends slots [0, p] */
	HI3_MASK_NONE = 1,        /* upstream defect: attends every slot of the cache */
};
enum hi3_placement {
	HI3_PLACE_INDEX = 0,      /* token p of row i is fed at index p, slot p */
	HI3_PLACE_TAIL = 1,       /* upstream defect: new tokens appended at column L + s */
};

typedef struct hi3_decode_opts {
	hi3_sampler sampler;
	int have_seed;            /* seed overrides the conditions' per-row seeds */
	uint64_t seed;
	int have_stop;            /* stop replaces the conditions' stop tokens */
	const int64_t *stop;
	int n_stop;
	int steps;                /* at most this many steps in this call; <= 0: until done */
	int max_new;              /* tokens per row, at most the cache's max_new; 0: the cache's */
	int decode_mask;          /* enum hi3_decode_mask */
	int placement;            /* enum hi3_placement */
	int record_routing;       /* store MoE routing of generated tokens in the segment */
	int no_fsync;             /* keep step commits ordered but skip msync */
	hi3_trace *trace;         /* record activations of the fed tokens (position: n_i + g), or NULL */
	hi3_progress_fn progress;
	void *progress_ctx;
} hi3_decode_opts;

typedef struct hi3_decode_stats {
	int64_t steps;            /* decode steps run in this call */
	int64_t tokens;           /* tokens generated in this call */
	int64_t total_tokens;     /* tokens in the segment */
	int rows, finished;       /* rows, rows finished */
	int64_t resumed_from;     /* tokens already generated before this call */
	double seconds;
} hi3_decode_stats;

/* Decode from the KV file (updated in place) and write the segment file
 * (format hi3.segment) with every row's tokens so far, atomically. */
int hi3_decode(hi3_model *m, const hi3_cond *c, const char *kv_path, const hi3_decode_opts *o,
               const char *seg_path, hi3_decode_stats *stats, hi3_error *err);

/* -------------------------------------------------------------- replay */

typedef struct hi3_replay_opts {
	int batched;              /* rows right padded into batches, else one row per forward */
	int max_tokens;           /* token budget of a batched forward (0: 8192) */
	int routing_recorded;     /* force the segment's recorded experts */
	int weights_recorded;     /* ... and their recorded weights */
	double is_cap;            /* C of the importance-ratio metrics (0: 2, as TIS uses) */
	/* optional outputs (caller allocated; n_moe * k entries per token):
	 * the routing of the pass that gave the log-probs */
	int16_t *rec_ids;         /* (T, n_moe, k) response tokens, or NULL */
	float *rec_w;             /* (T, n_moe, k) */
	int16_t *rec_prompt_ids;  /* (P, n_moe, k) prompt tokens, P = sum of n_i, or NULL */
	float *rec_prompt_w;      /* (P, n_moe, k) */
	hi3_trace *trace;         /* record the activations of the pass that gives the log-probs (position:
	                           * the prompt column, n_i + j for response token j), or NULL */
	hi3_progress_fn progress;
	void *progress_ctx;
} hi3_replay_opts;

/* The mismatch metrics RL trainers log for a rollout scored again
 * (hi3-replay(1), MISMATCH METRICS), named as verl's rollout correction
 * names them (rollout_corr/...). Per token t the log ratio is
 * r_t = replay_t - rollout_t (log-probs, natural log); a row's sequence
 * log ratio is S = sum of its r_t. Rows without tokens are left out. */
typedef struct hi3_mismatch_is {
	/* the importance weights w at one level: token (w_t = exp(r_t)) or
	 * sequence (every token of a row weighted exp(S)); exp of a log ratio
	 * clamped to [-20, 20]; C the cap */
	double mean, std, min, max;           /* std: of w clamped to [1/C, C] */
	double fraction_high, fraction_low;   /* share of w > C, of w < 1/C */
	double eff_sample_size;               /* 1 / mean((w'/mean w')^2), w' clamped to [1/C, C] */
	double seq_mean, seq_std, seq_min, seq_max, seq_max_deviation;  /* of each row's mean weight */
	double seq_fraction_high, seq_fraction_low;
} hi3_mismatch_is;

typedef struct hi3_mismatch {
	int64_t tokens;
	int rows;                     /* rows with tokens */
	double kl;                    /* mean of -r_t: the direct estimator of KL(rollout || replay) */
	double k3_kl;                 /* mean of exp(r_t) - r_t - 1 */
	double chi2_token, chi2_seq;  /* mean of exp(2 r_t) - 1; mean over rows of exp(2 S) - 1 */
	double training_ppl, training_log_ppl;   /* over rows: exp(-mean replay_t), -mean replay_t */
	double rollout_ppl, rollout_log_ppl;
	double log_ppl_diff, log_ppl_abs_diff, log_ppl_diff_max, log_ppl_diff_min;  /* over rows of
	                               * mean rollout_t - mean replay_t */
	double ppl_ratio;             /* mean over rows of exp(log_ppl_diff) */
	double log_ratio_sum;         /* sum of r_t over every token (a row: its S) */
	double cap;                   /* C */
	hi3_mismatch_is token, sequence;
} hi3_mismatch;

/* The metrics of rows (B of them; row i is [cu[i], cu[i+1]) of the two
 * log-prob arrays) with cap C > 1: over all rows into *all, and each row
 * alone into rows (B entries) when not NULL. */
int hi3_mismatch_compute(const float *replay, const float *rollout, const int64_t *cu, int B, double cap,
                         hi3_mismatch *all, hi3_mismatch *rows, hi3_error *err);

typedef struct hi3_replay_row {
	int64_t tokens;           /* 0: empty response, nothing to compare */
	double mean_abs, max_abs; /* |replay - rollout| log-prob */
	double ratio_mean, ratio_min, ratio_max;   /* exp(replay - rollout) */
	int64_t worst;            /* index within the row of the largest gap */
	double mean_abs_free, max_abs_free;        /* without routing replay */
	int64_t routing_flips, routing_tokens;
	hi3_mismatch mismatch;    /* the trainers' metrics of this row */
} hi3_replay_row;

typedef struct hi3_replay_report {
	int B;
	hi3_replay_row *rows;     /* (B) */
	int64_t tokens, empty_rows, worst;         /* worst: index in the segment */
	double mean_abs, max_abs, ratio_mean, ratio_min, ratio_max;
	double mean_abs_free, max_abs_free;
	int64_t routing_flips, routing_tokens;
	double seconds;
	/* how it was run, for the report */
	int batched, routing_recorded;
	int have_routes;          /* the segment recorded routing and the model is MoE */
	int64_t worst_row, worst_token; /* the worst token as (row, index within it); -1 when no tokens */
	hi3_mismatch mismatch;    /* the trainers' metrics over every row */
} hi3_replay_report;

/* Teacher-forced log-probs of the segment's tokens into logprobs (T). */
int hi3_replay(hi3_model *m, const hi3_cond *c, const hi3_segment *s, const hi3_replay_opts *o, float *logprobs,
               hi3_replay_report *rep, hi3_error *err);
void hi3_replay_report_release(hi3_replay_report *rep);
/* hi3_replay, then the replay file at path (hi3.replay; with record_routing
 * on an MoE model, the routing of every response and prompt token),
 * written atomically. seg_path is recorded in its metadata. */
int hi3_replay_to_file(hi3_model *m, const hi3_cond *c, const hi3_segment *s, const char *seg_path,
                       const hi3_replay_opts *o, int record_routing, const char *path, hi3_replay_report *rep,
                       hi3_error *err);
/* The report as one JSON object (hi3-replay(1)); *text is malloc'd. c and
 * s are the files replayed: a part of a two-stage rollout (the text stage
 * of image_size auto, or the image stage continued from it) is named in
 * its "stage" object. */
int hi3_replay_report_json(const hi3_replay_report *rep, const hi3_cond *c, const hi3_segment *s, char **text,
                           size_t *len, hi3_error *err);

/* -------------------------------------------------------------- diffusion */

enum hi3_diffusion_sampler { HI3_SAMPLER_EULER, HI3_SAMPLER_SDE };

/* The SDE step a trainer's log-prob is computed with (hi3-diffusion-capture(1),
 * SDE KERNELS): each as its project's code computes it. */
enum hi3_sde_kernel {
	HI3_SDE_FLOW_GRPO,            /* Flow-GRPO sde_type "sde" (UniRL's FlowSDEStrategy): the default */
	HI3_SDE_CPS,                  /* coefficients-preserving sampling (Flow-GRPO sde_type "cps", FlowCPS) */
	HI3_SDE_DANCE_GRPO,           /* DanceGRPO's flux_step with its SDE solver */
};
/* How a step's per-element log-densities become its log-prob. */
enum hi3_logprob_reduce {
	HI3_LOGP_KERNEL = 0,          /* the kernel's own: the mean for all three */
	HI3_LOGP_MEAN,
	HI3_LOGP_SUM,
};
/* "flow-grpo", "cps", "dance-grpo"; NULL for another value. */
const char *hi3_sde_kernel_name(int kernel);
/* The kernel of that name, or -1. */
int hi3_sde_kernel_of(const char *name);
/* The kernel's own eta: 1 for flow-grpo (UniRL's), 0.7 for cps (Flow-GRPO's
 * noise_level), 0.3 for dance-grpo (DanceGRPO's scripts). */
double hi3_sde_kernel_eta(int kernel);
/* "mean" or "sum" (HI3_LOGP_KERNEL: the mean); -1 from _of for another name. */
const char *hi3_logprob_reduce_name(int reduce);
int hi3_logprob_reduce_of(const char *name);

typedef struct hi3_diffusion_opts {
	int steps;                    /* T; 0: generation_config's diff_infer_steps */
	int have_guidance;            /* else generation_config's diff_guidance_scale */
	double guidance;              /* v = v_u + g (v_c - v_u) when g > 1; else the cond rows alone */
	int have_flow_shift;          /* else generation_config's flow_shift */
	double flow_shift;
	int sampler;                  /* enum hi3_diffusion_sampler */
	int sde_kernel;               /* enum hi3_sde_kernel */
	double eta;                   /* the SDE's noise scale (hi3_sde_kernel_eta of the kernel) */
	int logprob_reduce;           /* enum hi3_logprob_reduce */
	const int64_t *sde_steps;     /* the SDE steps, increasing; NULL: every step */
	int n_sde_steps;
	hi3_dtype latent_dtype;       /* F32 (default), BF16, F16: rounded to before each log-prob */
	hi3_dtype cfg_dtype;          /* F32 (default, upstream's pipeline) or F16/BF16 (UniRL's trainer) */
	int no_kv_reuse;              /* every step over the whole sequence */
	const char *noise;            /* a safetensors file with x_T and sde_noise, or NULL: the rows' seeds */
	int capture_velocity;         /* record velocity (T, R, C, h, w) */
	int ablate;                   /* enum hi3_ablation: a diffusion defect restored, recorded in the
	                               * trajectory (pos-pad, rope-pad, rope-1d, eoi) */
	hi3_trace *trace;             /* record the forward pass of step trace_step (rows: the conditions'
	                               * rows, cond then uncond; positions: columns), or NULL */
	int trace_step;               /* in [0, T) */
	const char *checkpoint;       /* the completed steps kept in this file (format hi3.diffusion-checkpoint), in
	                               * place, so that a killed capture resumes; NULL: none */
	int resume;                   /* continue from the checkpoint when it exists (it must be of this run) */
	hi3_progress_fn progress;     /* per step */
	void *progress_ctx;
} hi3_diffusion_opts;

typedef struct hi3_diffusion_stats {
	int B, R, T, K, h, w;
	int64_t L, image_tokens;      /* columns of the conditions, image tokens per row */
	double seconds, step0_seconds, step_seconds;  /* total, the first step, the mean of the others */
	int cond_images;              /* the requests' cond images (image editing; the uncond rows' copies not counted) */
	double encode_seconds;        /* making their rows (the encoders), before the first step */
	int checkpoint_found;         /* o->resume found the checkpoint */
	int resumed_from;             /* the steps it held already */
	double checkpoint_seconds;    /* writing and flushing the checkpoint */
} hi3_diffusion_stats;

/* Denoise the gen_image rows of c from noise (the rows' seeds, or
 * o->noise) by flow matching, and write the trajectory at traj_path
 * (hi3.trajectory), atomically. The conditions must be gen_image rows
 * made for m, of one image size. With o->checkpoint every completed step
 * is committed there first (the caller removes the file when it is done
 * with the trajectory); with o->resume a capture killed at any point
 * continues from its last committed step and writes the same trajectory
 * as an uninterrupted run. */
int hi3_diffusion_capture(hi3_model *m, const hi3_cond *c, const hi3_diffusion_opts *o, const char *traj_path,
                          hi3_diffusion_stats *st, hi3_error *err);

/* Diffusion replay: for each SDE step i of the trajectory, the velocity at
 * its recorded x_i by a stateless forward over the whole sequence (as a
 * trainer recomputes it), the transition mean, and the log-prob of the
 * recorded x_{i+1}: logp (B, K). The report compares them with the
 * trajectory's sde_logp. */
typedef struct hi3_diffusion_replay_row {
	int steps;                    /* K */
	double mean_abs, max_abs;     /* |replay - rollout| log-prob */
	int worst;                    /* index into sde_steps of the largest gap */
} hi3_diffusion_replay_row;

typedef struct hi3_diffusion_replay_report {
	int B, K;
	hi3_diffusion_replay_row *rows;  /* (B) */
	double mean_abs, max_abs, seconds;
	int worst_row, worst_step;    /* the step index (not its place in sde_steps); -1 when K = 0 */
	int as_captured;              /* the capture's path was followed (hi3_diffusion_replay_opts) */
	int ablate;                   /* enum hi3_ablation: the defect the trajectory was captured with, restored */
	int sde_kernel, logprob_reduce;  /* the trajectory's */
} hi3_diffusion_replay_report;

typedef struct hi3_diffusion_replay_opts {
	/* 0: every SDE step by a stateless forward over the whole sequence,
	 * as a trainer recomputes it; 1: the capture's own path (its step 0
	 * over the whole sequence into the cache, then KV reuse), which
	 * reproduces the captured log-probs under a defect that acts through
	 * the cache (pos-pad, rope-pad, eoi) */
	int as_captured;
	hi3_progress_fn progress;     /* per SDE step */
	void *progress_ctx;
} hi3_diffusion_replay_opts;

/* A trajectory captured with an ablation (its metadata 'ablate') is
 * replayed with the same defect restored; the report says which. */
int hi3_diffusion_replay(hi3_model *m, const hi3_cond *c, const hi3_trajectory *t,
                         const hi3_diffusion_replay_opts *o, float *logp, hi3_diffusion_replay_report *rep,
                         hi3_error *err);
/* hi3_diffusion_replay, then the replay file at path (hi3.replay with
 * sde_logp (B, K) and sde_steps (K)), atomically; traj_path is recorded. */
int hi3_diffusion_replay_to_file(hi3_model *m, const hi3_cond *c, const hi3_trajectory *t, const char *traj_path,
                                 const hi3_diffusion_replay_opts *o, const char *path,
                                 hi3_diffusion_replay_report *rep, hi3_error *err);
void hi3_diffusion_replay_report_release(hi3_diffusion_replay_report *rep);
/* The report as one JSON object, c's part of a two-stage rollout named as
 * hi3_replay_report_json names it. */
int hi3_diffusion_replay_report_json(const hi3_diffusion_replay_report *rep, const hi3_cond *c, char **text,
                                     size_t *len, hi3_error *err);

/* Decode the final latents of a trajectory with the model's VAE decoder
 * and write one PNG per request, DIR/row-<i>.png (the directory is made
 * when missing), with the prompt, seed and sampler settings in text
 * chunks. A model without VAE weights is an input error naming the
 * tensor, before anything is written. */
int hi3_trajectory_png(hi3_model *m, const hi3_trajectory *t, const char *dir, hi3_error *err);

/* ------------------------------------------------------------- ablations */

/* The upstream defects parity restores on purpose (hi3-parity(1), --ablate):
 * the stages take one where their options say so. */
enum hi3_ablation {
	HI3_ABLATE_NONE = 0,
	HI3_ABLATE_DECODE_MASK,       /* decode attends every cache slot */
	HI3_ABLATE_TOKEN_PLACEMENT,   /* new tokens appended at the padded tail */
	HI3_ABLATE_POS_PAD,           /* pads get position id 0 */
	/* diffusion (gen_image rows) */
	HI3_ABLATE_ROPE_PAD,          /* pads: position id 0 and a zero RoPE table (UniRL's ragged concat) */
	HI3_ABLATE_ROPE_1D,           /* image tokens take 1-D RoPE (the replay before UniRL's ROPE-FIX) */
	HI3_ABLATE_EOI,               /* tokens after <timestep> attend every key, <eoi> too (flash attention) */
};
/* "none", "decode-mask", "token-placement", "pos-pad", "rope-pad", "rope-1d",
 * "eoi"; "?" for another value. */
const char *hi3_ablation_name(int ablation);
/* The ablation of that name, or -1. */
int hi3_ablation_of(const char *name);

/* -------------------------------------------- conditions and the model */

/* Refuse conditions made for another model (both fingerprints named; a
 * file without a fingerprint is not checked), and token ids or stop tokens
 * outside the model's vocabulary. */
int hi3_cond_check_model(const hi3_cond *c, const hi3_model *m, hi3_error *err);
/* *out = a copy of c (in memory) that also holds its images' encoder
 * outputs, made by m's encoders as the stages would make them
 * (vit_embeds, latent_shape, vae_latents), so that the stages need not run
 * the encoders again; c without images is copied as it is. */
int hi3_cond_encode(hi3_cond **out, const hi3_cond *c, hi3_model *m, hi3_error *err);

#ifdef __cplusplus
}
#endif
#endif /* HI3_LAYER_STAGE_H */
