/*
 * hi3-tools.h -- the public interface of lib/tools/: import-rollout,
 * parity, bench, inspect, diff and the traces' first difference.
 * Part of hi3.h, the public interface: its conventions hold here.
 */
#ifndef HI3_LAYER_TOOLS_H
#define HI3_LAYER_TOOLS_H

#include "../cond/hi3-cond.h"
#include "../stage/hi3-stage.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------- import-rollout */

/* hi3 import-rollout (hi3-import-rollout(1)): another engine's rollout, JSONL
 * of vLLM's or SGLang's outputs (the fields the page lists), into a
 * conditions file and a segment file for model m. */
typedef struct hi3_import_opts {
	int64_t seed_base;        /* a row without "seed": seed_base + its index */
} hi3_import_opts;

typedef struct hi3_import_report {
	int lines, rows;          /* requests read, completions (rows) written */
	int64_t prompt_tokens, response_tokens;
	int routed;               /* the rows carry routed experts */
	char source[16];          /* where the log-probs came from: vllm, sglang, openai, hi3, mixed */
} hi3_import_report;

int hi3_import_rollout(hi3_model *m, const char *jsonl_path, const hi3_import_opts *o, const char *cond_path,
                       const char *seg_path, hi3_import_report *rep, hi3_error *err);

/* -------------------------------------------------------------- parity */

typedef struct hi3_parity_opts {
	const char *workdir;          /* every stage file goes here, and stays; NULL: a temporary
	                               * directory, removed afterwards */
	const int64_t *steps;         /* decode steps of each case */
	int n_steps;
	int greedy, sampled;          /* run greedy, and seeded sampling with `sampler` */
	hi3_sampler sampler;
	int64_t seed_base;            /* seed of a request without "seed": seed_base + index */
	int ablate;                   /* enum hi3_ablation, applied to the batched runs only */
	int pad_to;                   /* pad the batched constructions to at least this many columns */
	int vit_kernel;               /* cond images' ViT resize (hi3_cond_build_opts) */
	int vae_sample;               /* cond images' latents sampled (hi3_cond_build_opts) */
	hi3_dtype kv_dtype;
	double tol;                   /* a case passes with equal tokens and max |d| <= tol */
	hi3_progress_fn progress;
	void *progress_ctx;
} hi3_parity_opts;

typedef struct hi3_parity_row {
	int row;
	int64_t n;                    /* its true prompt length */
	int tokens_equal;
	int64_t first_diff;           /* first differing token, -1 when none */
	int64_t len_batched, len_alone;
	double logp_max;              /* over the tokens both runs produced */
	double kv_max, kv_slot0_max, kv_rest_max;  /* prefill K/V over slots [0, n) */
	/* gen_image requests: the trajectories */
	double latent_max;            /* over every step's latents */
	int64_t first_step;           /* the first latents[:, s] over the tolerance, -1 when none */
	double sde_logp_max;
} hi3_parity_row;

typedef struct hi3_parity_case {
	const char *construction;     /* "batch", "per-row+concat", "padded B=1" */
	int sampled, steps, L, pass, tokens_equal;
	double logp_max, kv_max, kv_slot0_max, kv_rest_max;
	int diffusion;                /* gen_image: steps are denoising steps, sampled the SDE */
	double latent_max, sde_logp_max;
	int n_rows;
	hi3_parity_row *rows;
} hi3_parity_case;

typedef struct hi3_parity_report {
	int B, n, pass;               /* pass: every case as expected (broken under an ablation) */
	int64_t *real_pos;            /* (B) */
	hi3_parity_case *cases;
} hi3_parity_report;

int hi3_parity(hi3_model *m, const hi3_template *t, const hi3_requests *rq, const hi3_parity_opts *o,
               hi3_parity_report *rep, hi3_error *err);
void hi3_parity_report_release(hi3_parity_report *rep);
const char *hi3_parity_ablation_name(int ablation);
/* The report: one line per case (rows: every row, else the rows that
 * fail), or one JSON object; *text is malloc'd. */
int hi3_parity_report_render(const hi3_parity_report *rep, const hi3_parity_opts *o, int json, int rows,
                             char **text, size_t *len, hi3_error *err);
int hi3_parity_ablation_parse(const char *name);   /* -1 when unknown */

/* ------------------------------------------------------------------ bench */

typedef struct hi3_bench_model_result {
	int threads;              /* the CPU threads the steps ran on */
	double first_prefill_s;   /* the first prefill: it also reads the weights in from the mapping */
	double prefill_s, prefill_tok_s, prefill_flops;   /* the same prefill again */
	double decode_s, decode_tok_s;
	double step_median_s;     /* the median decode step; */
	double floor_median_s;    /* with floor_bytes: the median read of floor_bytes right after a step */
	/* on the CPU backend (op_times set; else 0): the medians over the
	 * decode steps of the time each step spent in the matrix products
	 * (matmul and matmul_group), in attention, and in everything else
	 * (step - products - attention) */
	int op_times;
	double products_median_s, attention_median_s, other_median_s;
	/* with op_times and floor_bytes: the bytes of weights a step's
	 * products read (the mean over the steps; quantized matrices not
	 * counted), and the median time to read a step's weights again, in
	 * its order and with the floor's read between, after the steps (0:
	 * not measured; lib/tools/bench.c says how) */
	double replay_bytes, replay_median_s;
	/* after the steps, where /proc says (weights_known; else 0): the
	 * bytes of the model's checkpoint in memory, and of those the ones
	 * mapped by 2 MiB entries */
	int weights_known;
	double weights_resident, weights_huge;
	/* with floor_bytes on two threads or more (else 0): a cache line's
	 * round trip between the caller and a worker (bench.c's core_rtt_ns),
	 * measured after each step's floor read: the median and the largest
	 * over the steps, in ns */
	double rtt_median_ns, rtt_max_ns;
} hi3_bench_model_result;

/* The processor's name into buf (n bytes): /proc/cpuinfo's "model name"
 * (else the x86 brand string, else "unknown") with its family and model
 * where /proc/cpuinfo gives them: the figures are this machine's. */
void hi3_bench_cpu(char *buf, size_t n);
/* Best-of-reps read bandwidth over a buffer of bytes, in bytes/s. */
double hi3_bench_membw(size_t bytes, int reps);
/* One layer's prefill GEMMs at M tokens: total flops, and the best times
 * of OpenBLAS sgemm (f32 weights) and hi3's batch-invariant GEMM (weights wdt, in place). */
int hi3_bench_gemm(const hi3_config *c, int M, hi3_dtype wdt, int reps, double *flops, double *t_blas,
                   double *t_hi3);
/* Bytes one B = 1 decode step reads at ctx cached slots. */
double hi3_bench_step_bytes(const hi3_config *c, hi3_dtype wdt, hi3_dtype kvdt, int ctx);
/* In-memory prefill of B x P tokens into a cache of kv_dtype (F32 or
 * BF16), then N greedy decode steps; with
 * floor_bytes > 0, each step is followed by a read of that many bytes
 * (a buffer of at most 1 GiB, read over as often as it takes), so that
 * the floor is measured beside the steps, in the same moments of a
 * machine whose bandwidth moves. On the CPU backend the decode steps are
 * also split by op (r->op_times); not reentrant: one call at a time in a
 * process. */
int hi3_bench_model(hi3_model *m, int B, int P, int N, hi3_dtype kv_dtype, double floor_bytes,
                    hi3_bench_model_result *r, hi3_error *err);

/* ------------------------------------------------------- inspect and diff */

/* Statistics of a tensor of any dtype: min, max and mean over the finite
 * elements (NaN when there are none), and how many are NaN and +-Inf.
 * Deterministic for any thread count (threads 0: the OpenMP default). */
typedef struct hi3_stats {
	int64_t n, n_nan, n_inf;
	double min, max, mean;
} hi3_stats;
int hi3_tensor_stats(const hi3_tensor *t, int threads, hi3_stats *s, hi3_error *err);

/* hi3 inspect (see hi3-inspect(1)). path is a safetensors file or a
 * checkpoint directory (model.safetensors or model.safetensors.index.json). */
typedef struct hi3_inspect_opts {
	int json;                /* one JSON object instead of text */
	const char *tensor;      /* print this tensor's values (or render it with png) */
	const char *slice;       /* numpy-style selection of tensor, e.g. "0,:,3:7" */
	const char *png;         /* render a heatmap / attention mask / slot map here */
	int64_t row;             /* conditions file: the row whose mask png renders; -1: none */
	int scale;               /* png pixels per element; 0: automatic */
	int threads;             /* 0: the OpenMP default */
	int64_t max_image_pixels, max_image_bytes;  /* a picture FILE: as hi3_image_opts */
} hi3_inspect_opts;
/* Run inspect; the report (text or JSON, possibly empty) is returned in
 * *report (malloc'd, NUL-terminated; free it). A bad selection is a usage
 * error (status 2), an unreadable file an input error (status 3). A FILE
 * that starts as a picture (hi3_image_sniff) is decoded as the stages
 * would (hi3_image_load): its format, Pillow's mode, stored size, EXIF
 * orientation and size after it; png writes its RGB after the orientation. */
int hi3_inspect(const char *path, const hi3_inspect_opts *o, char **report, size_t *len,
                hi3_error *err);

/* hi3 diff (see hi3-diff(1)): two safetensors files compared tensor by tensor. */
typedef struct hi3_diff_opts {
	double atol, rtol;       /* an element differs when |a - b| > atol + rtol * |b| */
	int valid_only;          /* kv files: only each row's valid slots / generated steps */
	int64_t row_a, row_b;    /* compare row row_a of A with row row_b of B; -1: all rows */
	const char *const *tensors;  /* restrict to these names (n_tensors of them) */
	int n_tensors;
	int threads;             /* 0: the OpenMP default */
} hi3_diff_opts;

enum hi3_diff_status {
	HI3_DIFF_OK,             /* compared: every element within tolerance */
	HI3_DIFF_OVER,           /* compared: some element over tolerance */
	HI3_DIFF_ONLY_A,         /* the tensor is only in A */
	HI3_DIFF_ONLY_B,         /* the tensor is only in B */
	HI3_DIFF_DTYPE,          /* dtypes differ (not compared) */
	HI3_DIFF_SHAPE,          /* shapes differ (not compared) */
	HI3_DIFF_LENGTH,         /* --row on segments: the rows' lengths differ (the overlap compared) */
	HI3_DIFF_SKIPPED,        /* --row: the tensor has no row axis */
};

/* An element: its index in A's tensor, and the same place named by the
 * meaning of each dimension where the file format is known. */
typedef struct hi3_diff_loc {
	int ndim;
	int64_t idx[HI3_MAX_DIMS];        /* index into A's tensor */
	int n_named;                      /* 0: no names, use idx */
	const char *label[HI3_MAX_DIMS];  /* "row", "head", "slot", "col", "pos", ... */
	int64_t val[HI3_MAX_DIMS];
	double a, b;                      /* the two values there */
} hi3_diff_loc;

typedef struct hi3_diff_tensor {
	char *name;
	int status;                       /* enum hi3_diff_status */
	hi3_dtype dtype_a, dtype_b;
	int ndim_a, ndim_b;
	int64_t shape_a[HI3_MAX_DIMS], shape_b[HI3_MAX_DIMS];
	int64_t n_compared, n_over;
	int64_t len_a, len_b;             /* HI3_DIFF_LENGTH: the two rows' lengths */
	double max_abs;                   /* max |a - b|; +Inf for NaN against a number */
	hi3_diff_loc worst;               /* the first element where |a - b| = max_abs (max_abs > 0) */
	hi3_diff_loc first;               /* the first element over tolerance (n_over > 0) */
} hi3_diff_tensor;

typedef struct hi3_diff_result {
	char *path_a, *path_b;
	char *format_a, *format_b;        /* "" when the file names none */
	hi3_diff_opts opts;               /* as run (tensors not kept) */
	int valid_only;                   /* in effect (--row on kv files implies it) */
	int n;
	hi3_diff_tensor *t;               /* natural name order (k.2 before k.10); kv files: k.0, v.0, k.1, ... first */
	int n_differ;                     /* tensors with a status other than OK and SKIPPED */
	int first, worst;                 /* indices into t (first differing, largest max_abs); -1: none */
	int format_differs;               /* the files name different formats */
	int equal;                        /* no tensor differs and the formats agree */
} hi3_diff_result;

/* Compare A and B. Returns 0 with *out filled whether or not they differ
 * (see n_differ); -1 when a file cannot be read (status 3) or the options
 * do not fit the files (status 2). */
int hi3_diff(const char *path_a, const char *path_b, const hi3_diff_opts *o, hi3_diff_result **out,
             hi3_error *err);
void hi3_diff_free(hi3_diff_result *r);
/* The report: one line per tensor and a summary line, or one JSON object.
 * *text is malloc'd (free it); returns 0 or -1 when out of memory. */
int hi3_diff_report(const hi3_diff_result *r, int json, char **text, size_t *len, hi3_error *err);

/* hi3 diff --first (see hi3-diff(1)): two trace files aligned by (row,
 * position), compared point by point in forward order, and the first point
 * where they differ. */
typedef struct hi3_trace_diff_opts {
	double tol;              /* an element differs when |a - b| > tol (0: bitwise); ids always exactly */
	int64_t row_a, row_b;    /* align row row_a of A with row row_b of B; -1: each row with itself */
	int threads;             /* 0: the OpenMP default */
} hi3_trace_diff_opts;

/* A place in two traces: the aligned token and the element of the point. */
typedef struct hi3_trace_diff_loc {
	int64_t row_a, row_b, pos;
	int n_index;                      /* 0 (tokens, logits.lse), 1, or 2 (expert_out: slot, element) */
	int64_t index[2];
	double a, b;
} hi3_trace_diff_loc;

typedef struct hi3_trace_diff_point {
	char *name;                       /* "tokens" (the ids fed) first, then the points */
	int kind;                         /* enum hi3_trace_kind; -1 for tokens */
	int layer, sub;
	int status;                       /* HI3_DIFF_OK, _OVER, _ONLY_A, _ONLY_B, _DTYPE or _SHAPE */
	int integer;                      /* ids (tokens, experts, logits.topk_ids): compared exactly */
	int64_t compared, over;           /* elements */
	int64_t tokens_over;              /* aligned tokens with some element over tolerance */
	double max_abs;
	hi3_trace_diff_loc first;         /* over tolerance: the lowest position (then row), lowest index */
	hi3_trace_diff_loc worst;         /* where |a - b| = max_abs first occurs in that order */
} hi3_trace_diff_point;

typedef struct hi3_trace_diff {
	char *path_a, *path_b;
	hi3_trace_diff_opts opts;
	int64_t aligned, only_a, only_b;  /* tokens (of the rows compared) */
	int64_t pos_lo, pos_hi;           /* the aligned positions' range */
	int n_layers;                     /* layers named by either trace */
	int n;
	hi3_trace_diff_point *p;          /* forward order: tokens, embed, layer.0.in, ... */
	int first;                        /* index into p of the first difference; -1: none */
	int n_differ;                     /* points that differ (over, dtype, shape) */
	int equal;
	int n_meta_a, n_meta_b;
	char **meta_a, **meta_b;          /* (n_meta, 2) each file's metadata */
} hi3_trace_diff;

/* Compare the traces at path_a and path_b. 0 with *out filled whether or
 * not they differ; -1 when a file cannot be read (status 3), or when the
 * options do not fit them or no token is in both (status 2). */
int hi3_trace_diff_run(const char *path_a, const char *path_b, const hi3_trace_diff_opts *o, hi3_trace_diff **out,
                       hi3_error *err);
void hi3_trace_diff_free(hi3_trace_diff *d);
/* The report (text: the first difference, what it means, the table of max
 * |A - B| by layer and point; or one JSON object); *text is malloc'd. */
int hi3_trace_diff_report(const hi3_trace_diff *d, int json, char **text, size_t *len, hi3_error *err);
/* log10 max |A - B| by layer, a line per kind of point, as a PNG at path. */
int hi3_trace_diff_png(const hi3_trace_diff *d, const char *path, hi3_error *err);

#ifdef __cplusplus
}
#endif
/* hi3 quantize (quantize.c, hi3-quant(7)): dir's checkpoint written to out
 * with its transformer matrices quantized weight-only, shard by shard. */
typedef struct hi3_quantize_opts {
	int int8;                 /* 1: bitsandbytes int8; 0: compressed-tensors fp8 per channel */
	const char *const *skip;  /* fnmatch patterns of module or tensor names kept as stored */
	int n_skip;
} hi3_quantize_opts;

typedef struct hi3_quantize_result {
	int shards, quantized, kept;  /* files written; tensors quantized and kept */
	size_t bytes_in, bytes_out;   /* of the quantized matrices, before and after (codes + scales) */
	double max_abs_error;         /* max |dequantized - source| over every quantized weight */
} hi3_quantize_result;

int hi3_quantize(const char *dir, const char *out, const hi3_quantize_opts *o, hi3_quantize_result *r,
                 hi3_error *err);

#endif /* HI3_LAYER_TOOLS_H */
