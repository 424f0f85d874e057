/*
 * model.h -- the model's weights as the backend prepared them (internal).
 */
#ifndef HI3_MODEL_H
#define HI3_MODEL_H

#include "backend/backend.h"

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
	struct hi3_mlp_w *experts;/* [E] */
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
};

struct hi3_model {
	char *dir;
	hi3_config cfg;
	hi3_ckpt *ck;
	char fingerprint[17];
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
};

/* Free the scratch buffers (forward.c); they grow again on demand. */
void hi3i_model_work_free(hi3_model *m);
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
