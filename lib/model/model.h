/*
 * model.h -- the model's weights as the backend prepared them (internal).
 */
#ifndef HI3_MODEL_H
#define HI3_MODEL_H

#include "backend/backend.h"
#include "format/format.h"
#include "model/config-internal.h"

struct hi3_mlp_w {
	hi3_wt *gate_up;          /* (2I, H) */
	hi3_wt *down;             /* (H, I) */
	int I;
};

struct hi3_layer_w {
	hi3_wt *ln_in, *ln_post;  /* (H) */
	hi3_wt *qkv;              /* ((n_h + 2 n_kv) d, H) */
	hi3_wt *o;                /* (H, n_h d) */
	hi3_wt *qn, *kn;          /* (d), when use_qk_norm */
	int moe;                  /* MoE layer? */
	int moe_index;            /* its index among MoE layers */
	struct hi3_mlp_w mlp;     /* dense layers */
	hi3_wt *router;           /* (E, H) f32 */
	int E, k;
	struct hi3_mlp_w *experts;/* [E]; a rank loads its group's [e0, e0 + ne) only */
	int e0, ne;
	struct hi3_mlp_w shared;  /* when use_mixed_mlp_moe */
	int has_shared;
};

/* Device scratch, grown on demand, never per token. */
struct hi3_work {
	size_t M;                 /* rows the buffers hold */
	size_t n_logit;
	float *x, *h, *qkv, *att, *y, *ab, *mid, *ye, *xe, *ys, *rl, *sab, *smid;
	float *lx, *logits;
	int64_t *ids;
	int32_t *pos, *rows, *idx;
	int64_t *slots;
	hi3_attn_q *plan;
	float *scale;
	int32_t *cidx;            /* (M, k): each token's rows of ye, ascending expert (combine) */
	float *cscale;            /* (M, k): their weights */
};

/*
 * A rank's part of a parallel layout (shard.c, hi3-parallel(7)). Every
 * product that is split runs on contiguous rows of its weight, as the
 * checkpoint stores them (a pointer offset into the mapping): qkv_proj by
 * whole (g + 2)-head blocks of the rank's kv heads; o_proj, the MLPs'
 * gate_and_up_proj and down_proj and lm_head on their output rows. Each
 * output element is then the same dot product, over the whole K in the
 * GEMM's one order, as in one process, and an all-gather puts the
 * columns together: the same bits for any tp and ep, by construction.
 * Experts are split by expert (E / ep per group), each expert's products
 * on rows over tp like the dense ones; every rank routes every token, so
 * no token moves: the (token, expert) rows of the group are gathered, or
 * (alltoall) sent to the group of their token, which adds them up. lm_head
 * is split like the others, but its slices are not gathered for the
 * stages (stage/vocab.h).
 */
struct hi3_shard {
	const hi3_par *par;       /* NULL: one process */
	int rank, size, tp, ep, t, e;    /* t = rank % tp, e = rank / tp */
	int alltoall;             /* experts' rows to their tokens' group by all-to-all (tp = 1) */
	int kv0, n_kv;            /* this rank's kv heads */
	float *dev;               /* device scratch: this rank's block of a product */
	float *drecv;             /* device scratch: what a collective on device buffers receives */
	size_t drecv_cap;         /* floats */
	float *send, *recv, *full;/* host staging for the gathers */
	size_t dev_cap, send_cap, recv_cap, full_cap;   /* floats */
	size_t *counts, *displs;  /* (size) bytes */
	hi3_tensor *views;        /* row slices of checkpoint tensors handed to the backend */
	int n_views, cap_views;
};

/* A block of a (R, N) product computed by one rank: rows [r0, r0 + nr), columns [c0, c0 + nc). */
struct hi3_block {
	int r0, nr, c0, nc;
};

struct hi3_model {
	char *dir;
	hi3_config cfg;
	hi3_ckpt *ck;
	struct hi3_quant *quant;  /* the checkpoint's quantization (model/quant.h), or NULL */
	char fingerprint[17];
	struct hi3i_model_facts facts; /* what the stage files check and are shaped by */
	hi3_gen_defaults gen;       /* generation_config.json */
	hi3_backend *be;
	hi3_wt *wte, *lm_head, *ln_f;
	struct hi3_layer_w *layers;
	int n_moe, max_k, max_I;
	float *theta;             /* (d/2) device */
	struct hi3_dims dims;
	struct hi3_work w;
	hi3_kvcache *attached;    /* the cache the backend mirrors */
	double t_open, open_s;    /* when the open began (hi3i_now), how long it took */
	size_t mapped;            /* bytes of the checkpoint's files */
	size_t touched;           /* weight bytes the backend has read (be->first_use) */
	int64_t forwards;         /* forward calls done */
	struct hi3_shard sh;
	/* the cond images' encoder outputs lately made (stage/images.c), and their free */
	void *image_memo;
	void (*image_memo_free)(void *memo);
};

/* The backend opts names ("cpu", NULL or opts NULL: the CPU; "cuda"), with
 * its threads and batch_invariant; an unknown name is a usage error
 * (weights.c: hi3_model_open, and the VAE and ViT opened alone). */
int hi3i_backend_open(hi3_backend **out, const hi3_model_opts *opts, hi3_error *err);
/* The model's facts for the format modules (weights.c): fingerprint,
 * directory, vocabulary, cache and routing shapes. */
const struct hi3i_model_facts *hi3i_model_facts(const hi3_model *m);
/* Free the scratch buffers (forward.c); they grow again on demand. */
void hi3i_model_work_free(hi3_model *m);
/* shard.c: check and set up m->sh for opts->par (at open, before weights). */
int hi3i_shard_init(hi3_model *m, const hi3_par *par, hi3_error *err);
void hi3i_shard_release(hi3_model *m);
/* Scale-out (model/shard.c, hi3-parallel(7)): the communicator of a model
 * opened as one rank of several, else NULL. */
hi3_comm *hi3i_model_comm(const hi3_model *m);
/* Whether this process writes the stages' files: rank 0 of a layout (the
 * other ranks compute their part and send it), or the one process. */
int hi3i_model_writes_files(const hi3_model *m);
/* Every rank was given the same conditions (their hash), or an
 * HI3_ERR_INPUT error naming the rank that differs; 0 in one process. */
int hi3i_par_check_cond(const hi3_model *m, const hi3_cond *c, hi3_error *err);

/* A view of rows [r0, r0 + n) of t (dimension 0), owned by the model. */
const hi3_tensor *hi3i_shard_rows(hi3_model *m, const hi3_tensor *t, int64_t r0, int64_t n, hi3_error *err);
/* Device scratch of n floats (m->sh.dev), grown on demand; NULL when out of memory. */
float *hi3i_shard_scratch(hi3_model *m, size_t n, hi3_error *err);
/* y (R, N) on the device = the blocks of every rank put together: rank r
 * computed blk[r] of it into its `mine` (blk[r].nr, blk[r].nc) (device); a
 * block with nr = 0 is not sent (a replica's copy). The blocks of ranks
 * that send must tile y. */
int hi3i_shard_gather(hi3_model *m, float *y, int R, int N, const float *mine, const struct hi3_block *blk,
                      hi3_error *err);
/* y (M, N) = x (M, K) . W^T, where w holds this rank's output rows split(N, tp, t) of W
 * (all of it when tp = 1): the product of those rows, then the gather. */
int hi3i_shard_matmul(hi3_model *m, float *y, const float *x, const hi3_wt *w, int N, int M, hi3_error *err);

/* Rows of H floats between ranks (all-to-all): src (sum send_rows, H) on the
 * device holds the rows for rank 0, then those for rank 1, ...; dst
 * (sum recv_rows, H) gets rank 0's rows for this rank, then rank 1's, ... */
int hi3i_shard_alltoall_rows(hi3_model *m, float *dst, const float *src, int H, const int *send_rows,
                             const int *recv_rows, hi3_error *err);
/* This rank's columns split(N, tp, t) of y (M, ldy) on the host = x (M, K) . W^T
 * for w, this rank's output rows of W: the product of those rows, no gather
 * (lm_head split on the vocabulary, stage/vocab.h). */
int hi3i_shard_matmul_host(hi3_model *m, float *y, int ldy, const float *x, const hi3_wt *w, int N, int M,
                           hi3_error *err);

/* After each forward call (forward.c): -v reports the first one. */
void hi3i_model_forward_done(hi3_model *m);

/*
 * The recorder's side of tracing (trace.c), called by hi3_forward only when
 * the batch has a trace. hi3i_trace_begin chooses the call's tokens to keep
 * (none: every point below returns at once); each point takes a device
 * buffer with one row per token of the call and keeps the chosen rows;
 * hi3i_trace_end returns the first failure of the call's points.
 */
int hi3i_trace_begin(hi3_trace *t, const hi3_batch *b);
int hi3i_trace_end(hi3_trace *t, hi3_error *err);
/* The call failed: the recorder refuses to write what it holds. */
void hi3i_trace_abort(hi3_trace *t, const hi3_error *err);
/* 1 when this call keeps tokens and the kind is recorded. */
int hi3i_trace_wants(const hi3_trace *t, int kind);
/* A point of buf (M, w). HI3_TRACE_Q takes the fused qkv (M, W) and
 * records q, k and v. */
void hi3i_trace_point(hi3_trace *t, int kind, int layer, const float *buf, int w);
/* A point of buf (M, w) on the host (w elements of the point's dtype per token). */
void hi3i_trace_host(hi3_trace *t, int kind, int layer, const void *host, int w);
/* A (n, k, w) point: row where[m k + j] of buf for the j-th entry of token m
 * (where (M, k) host). */
void hi3i_trace_rows(hi3_trace *t, int kind, int layer, const float *buf, int w, const int32_t *where, int k);
/* The kept tokens' indices into the call's M rows (device, n of them), or
 * NULL when none; a point of buf (n, w) already holding just those rows;
 * and the logits (n, V) of the next n kept tokens, kept as top-K and the
 * log-sum-exp. */
const int32_t *hi3i_trace_kept(const hi3_trace *t, int *n);
void hi3i_trace_point_kept(hi3_trace *t, int kind, int layer, const float *buf, int w);
void hi3i_trace_logits(hi3_trace *t, const float *logits, int V, int n);
/* Device scratch the recorder owns (which: 0 or 1), at least floats long;
 * NULL (failure recorded) when out of memory. */
void *hi3i_trace_scratch(hi3_trace *t, int which, size_t floats);

#endif
