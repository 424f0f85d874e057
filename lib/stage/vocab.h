/*
 * vocab.h -- the next-token logits of a batch when lm_head is split on the
 * vocabulary (internal; stage/vocab.c, the sums and the sampler's walk in
 * stage/sample.c; hi3-parallel(7), "lm_head").
 *
 * Under tensor parallelism tensor slot t computes the vocabulary columns
 * [v0, v0 + nv) = split(V, tp, t) of each logits row and nothing else; no
 * rank holds a whole row. Argmax, log-softmax and sampling are computed
 * from what each slot sends about its slice, a few values per row (the
 * slice's maximum and argmax, its top-k candidates, its exact sum of
 * exp), never the row: the same tokens and log-probs, bit for bit, as one
 * process's hi3_argmax, hi3_sample and hi3_logprob on the whole row.
 *
 * Shapes: n rows, V vocabulary, K candidates a slot sends per row.
 */
#ifndef HI3_VOCAB_H
#define HI3_VOCAB_H

#include "core/internal.h"
#include "stage/hi3-stage.h"

/* A sum of terms in [0, 1], each rounded to a multiple of 2^-63 and added
 * as an integer: exact, so the same bits for any order and any split of
 * the terms. A NaN term (or one above 1) makes the sum NaN. */
typedef struct hi3i_fsum {
	uint64_t lo, hi;          /* the sum in units of 2^-63 */
	uint64_t nan;
} hi3i_fsum;
void hi3i_fsum_add(hi3i_fsum *s, double p);
void hi3i_fsum_merge(hi3i_fsum *s, const hi3i_fsum *o);
double hi3i_fsum_value(const hi3i_fsum *s);

/* The largest of x (n), NaN skipped; -inf when none. */
float hi3i_vmax(const float *x, int n);
/* s += exp(x[v] - mx) for v < n (hi3_logprob's terms). */
void hi3i_expsum(hi3i_fsum *s, const float *x, int n, float mx);
/* hi3_logprob from its parts: the token's logit, the row's maximum, the
 * sum of exp over the row. */
double hi3i_logprob_of(double x_tok, float mx, const hi3i_fsum *s);

/* A sampling candidate: z = logits / T; ordered by z descending, ties to the lower id. */
struct hi3i_cand {
	float z;
	int32_t id;
};
int hi3i_cand_cmp(const void *a, const void *b);
/* Keep the k best of c (V) at its front, sorted; returns how many (V when k <= 0 or k >= V). */
int hi3i_top_k_select(struct hi3i_cand *c, int V, int k);
/* hi3_sample after its candidates: c (avail) holds the first avail of the
 * n_all candidates in order, total their mass (the sum of exp(z - z0)
 * over all n_all); top-p, then the draw u. -1 when the answer lies beyond
 * the first avail candidates (avail < n_all): ask again with more. */
int64_t hi3i_sample_walk(const struct hi3i_cand *c, int avail, int n_all, double total, const hi3_sampler *s,
                         double u);

/* Where a rank's logits are: every column (one process, tp = 1), or its
 * tensor slot's slice. */
typedef struct hi3i_vocab {
	hi3_comm *comm;           /* NULL: every column is this rank's, nothing is exchanged */
	int V, v0, nv;            /* this rank's columns [v0, v0 + nv) */
	int tp;                   /* ranks 0 .. tp - 1 hold the slices, in order; the others copies */
} hi3i_vocab;
/* The model's: its tensor slot's columns (model/shard.c's split). */
void hi3i_model_vocab(const hi3_model *m, hi3i_vocab *vs);

/*
 * The next token and its log-prob for each of n rows: rows[i] is row i's
 * logits, indexed by token id, of which only this rank's columns are read.
 * A row with tok[i] >= 0 keeps that token (forced, or given by a replay);
 * the others take hi3_sample's token (s; hi3_argmax's when greedy) with
 * seed[i] at step[i]; s may be NULL when every token is given. lp[i] =
 * hi3_logprob of the unmodified row at tok[i]. scratch: NULL, or
 * hi3_sample_scratch_size(V) bytes kept by the caller. A collective: every
 * rank calls it with the same n, tokens and sampler.
 */
int hi3i_vocab_next(const hi3i_vocab *vs, const float *const *rows, int n, const hi3_sampler *s,
                    const uint64_t *seed, const uint64_t *step, int64_t *tok, float *lp, void *scratch,
                    hi3_error *err);
/* val (n) = row[id[j]] for ids in [0, V) (a collective, as above). */
int hi3i_vocab_pick(const hi3i_vocab *vs, const float *row, const int64_t *id, int n, float *val, hi3_error *err);

#endif
