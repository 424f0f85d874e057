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

#endif
