/*
 * kv.h -- the KV file (format hi3.kv): a static cache plus the decode
 * record, mapped writable and updated in place (internal).
 *
 * Tensors (B rows, C = L + max_new slots, G = max_new):
 *   k.<l>, v.<l>      (B, n_kv, C, d) F32|BF16   the cache, upstream layout
 *   kv_len            (B) I64    valid slots per row
 *   prompt_len        (B) I64    n_i, the row's true prompt length
 *   next_logits       (B, V) F32 logits for each row's next token
 *   next_logits_alt   (B, V) F32 second buffer used while decoding
 *   finished          (B) U8
 *   gen_tokens        (B, G) I64, gen_logprobs (B, G) F32, gen_len (B) I64
 *   commit            (B) I64    2 * gen_len + finished: the commit word
 *   gen_route_ids     (B, G, n_moe, k) I16, gen_route_w (B, G, n_moe, k) F32  (MoE models)
 *   prompt_route_ids  (B, L, n_moe, k) I16, prompt_route_w F32  (prefill --record-routing)
 *
 * Crash consistency: a decode step writes its payload (K/V slots, the
 * token and log-prob, the next logits into the buffer that is not current),
 * flushes it, then stores the row's commit word (one aligned 8-byte store),
 * then the derived kv_len/gen_len/finished, and flushes again. The current
 * logits buffer for a row with g tokens is next_logits when g is even, else
 * next_logits_alt; so a kill at any point leaves each row at its last
 * committed step with its logits intact, and a later call continues from
 * there. At the end of a call next_logits is made current for every row.
 */
#ifndef HI3_KV_H
#define HI3_KV_H

#include "format/provenance.h"

typedef struct hi3_kvfile {
	hi3_st *st;
	hi3_kvcache cache;        /* points into the mapping */
	int B, L, C, G, V, n_moe, k_route;
	int v0, nv;               /* the logits columns this rank writes: all of them, or its vocabulary slice */
	int64_t *kv_len, *prompt_len, *gen_tokens, *gen_len, *commit;  /* (B), (B), (B, G), (B), (B) */
	float *next_logits, *next_logits_alt, *gen_logprobs;            /* (B, V), (B, V), (B, G) */
	uint8_t *finished;                                              /* (B) */
	int16_t *gen_route_ids;   /* (B, G, n_moe, k) or NULL */
	float *gen_route_w;       /* (B, G, n_moe, k) or NULL */
	int16_t *prompt_route_ids;/* (B, L, n_moe, k) with prefill --record-routing, or NULL */
	float *prompt_route_w;    /* (B, L, n_moe, k) */
	void *priv;               /* a rank's own copy of the record (hi3i_kv_privatize), or NULL */
} hi3_kvfile;

/* Create a zeroed KV file for (model, conditions) at path, atomically. */
int hi3i_kv_create(const char *path, const struct hi3i_model_facts *m, const hi3_cond *c, const char *cond_path,
                   int max_new, hi3_dtype dt, int prompt_routing, hi3_error *err);
/* Open writable, with an exclusive lock when lock (the ranks of a layout
 * share the file: rank 0 holds the lock for them all); check the model
 * fingerprint and the conditions it belongs to (c may be NULL to skip
 * that); repair derived fields from commit. The stages open it on every
 * rank with hi3i_kv_open_ranks (stage/files.h). */
int hi3i_kv_open(hi3_kvfile *kv, const char *path, const struct hi3i_model_facts *m, const hi3_cond *c, int lock,
                 hi3_error *err);
void hi3i_kv_close(hi3_kvfile *kv);
/*
 * A rank other than 0 keeps its own copy of the decode record (everything
 * but k.* and v.*): it runs the same steps on the same numbers as rank 0,
 * which alone writes the record to the file, while each rank writes its kv
 * heads of k.* and v.* there. With lm_head split on the vocabulary (tp >
 * 1) the logits buffers are the exception: tensor slot t (ranks 0 .. tp-1)
 * writes and reads its own columns of next_logits and next_logits_alt in
 * the file, shared (logits_shared = 1); their copies (ranks tp and up)
 * keep them private. No rank reads what another writes.
 */
int hi3i_kv_privatize(hi3_kvfile *kv, int logits_shared, hi3_error *err);
/* The logits buffer holding row i's current logits. */
float *hi3i_kv_logits(hi3_kvfile *kv, int row);
float *hi3i_kv_logits_next(hi3_kvfile *kv, int row);
/* Flush the whole mapping (msync). */
int hi3i_kv_flush(hi3_kvfile *kv, hi3_error *err);
/* Store the commit word of a row, then its derived fields. */
void hi3i_kv_commit(hi3_kvfile *kv, int row, int64_t gen_len, int finished);
/* Make next_logits current for every row (end of a call), in this rank's columns. */
void hi3i_kv_settle(hi3_kvfile *kv);

#endif
