/* cli.h -- what the subcommands share: global options, errors, progress. */
#ifndef HI3_CLI_H
#define HI3_CLI_H

#include <stdint.h>
#include "hi3.h"
#include "message.h"
#include "parse-options.h"

/* Global options; accepted before the command name and after it. */
struct cli_globals {
	const char *model_dir;   /* -m/--model */
	const char *backend;     /* --backend */
	int threads;             /* -t/--threads */
	int quiet, verbose;      /* -q, -v */
	int batch_invariant;     /* --batch-invariant=on|off; -1: not given (cli_batch_invariant) */
	int cuda_graphs;         /* --cuda-graphs: 0 default (on where the driver has graphs), 1 on, 2 off */
	const char *parallel;    /* --parallel tp=T,ep=E, or NULL */
	int keep_model;          /* hi3 run: the model stays open for the next command */
};
extern struct cli_globals cli;

/* A subcommand: `hi3 help NAME` runs it with --help. */
struct cli_command {
	const char *name;
	int (*run)(int argc, char **argv);
	const char *summary;
};

/*
 * Option definitions the commands share, so that one option has one name,
 * range and help wherever it is taken.
 */

/* -m, --backend, --batch-invariant, -t, -q, -v, -h (hi3 --help lists them). */
extern const struct cli_option cli_global_options[];
/* In a command's table: the global options, parsed there too, not shown in its help. */
#define OPT_GLOBALS() OPT_INCLUDE(cli_global_options, .flags = CLI_OPT_HIDDEN)

#define OPT_JSON(v, h, ...) OPT_FLAG(0, "json", v, h, __VA_ARGS__)
/* -o is required where it is taken. */
#define OPT_OUTPUT(v, a, h, ...) OPT_STRING('o', "output", v, a, h, .flags = CLI_OPT_REQUIRED, __VA_ARGS__)
#define OPT_RECORD_ROUTING(v, h, ...) OPT_FLAG(0, "record-routing", v, h, __VA_ARGS__)
#define OPT_CHUNK_TOKENS(v, h, ...) OPT_INT(0, "chunk-tokens", v, 1, INT32_MAX, "N", h, __VA_ARGS__)

/* f32 or bf16 into a hi3_dtype. */
extern const struct cli_choice cli_dtype_choices[];
#define OPT_DTYPE(s, l, v, h, ...) \
	{.type = CLI_OPT_CHOICE, .short_name = (s), .long_name = (l), .value = _Generic((v), hi3_dtype *: (v)), \
	 .size = sizeof(*(v)), .choices = cli_dtype_choices, .help = (h), __VA_ARGS__}
#define OPT_KV_DTYPE(v, ...) OPT_DTYPE(0, "kv-dtype", v, "cache dtype: f32 (default) or bf16", __VA_ARGS__)

/* Every seed is in [0, INT64_MAX]; what it seeds is the command's to say. */
#define OPT_SEED(s, v, h, ...) OPT_INT(s, "seed", v, 0, INT64_MAX, "N", h, __VA_ARGS__)
/* The seed of requests without one (tokenize-concat, parity): see cli_check_seed_base. */
#define OPT_SEED_BASE(v, ...) \
	OPT_SEED(0, v, "seed of request i (from 0) that has no \"seed\": N + i (default 0)", __VA_ARGS__)

/* Temperature, top-k and top-p of a hi3_sampler; *given counts them. A
 * temperature of 0 is greedy decoding (hi3_sample). */
#define OPT_SAMPLER(s, n)                                                                                  \
	OPT_DOUBLE(0, "temperature", &(s)->temperature, 0.0, 1e6, "T", "sample at temperature T (0: greedy)", \
	           .given = (n)),                                                                          \
	OPT_INT(0, "top-k", &(s)->top_k, 0, INT32_MAX, "K", "keep the K most likely tokens (0: all)", .given = (n)), \
	OPT_DOUBLE(0, "top-p", &(s)->top_p, 0.0, 1.0, "P", "keep the smallest set with mass >= P (1: all)",   \
	           .flags = CLI_OPT_LO_OPEN, .given = (n))

/* Reproducing the upstream defects, each of which breaks batch parity on
 * purpose; choosing one prints a warning that says what it does. */
#define OPT_GROUP_DEFECTS() OPT_GROUP("reproducing upstream defects (each breaks batch parity on purpose):")
extern const struct cli_choice cli_decode_mask_choices[], cli_placement_choices[], cli_pad_positions_choices[],
	cli_ablate_choices[];
#define OPT_DECODE_MASK(v, ...) \
	OPT_CHOICE(0, "decode-mask", v, cli_decode_mask_choices, \
	           "none: attend every cache slot, pads and unwritten ones too (default causal)", __VA_ARGS__)
#define OPT_TOKEN_PLACEMENT(v, ...) \
	OPT_CHOICE(0, "token-placement", v, cli_placement_choices, \
	           "tail: feed the token at the padded tail column L + k (default index: at n_i + k)", __VA_ARGS__)
#define OPT_PAD_POSITIONS(v, ...) \
	OPT_CHOICE(0, "pad-positions", v, cli_pad_positions_choices, \
	           "zero: pads get position 0 and overwrite cache slot 0 (default continue: the row's own indices)", \
	           __VA_ARGS__)
#define OPT_ABLATE(v, ...) \
	OPT_CHOICE(0, "ablate", v, cli_ablate_choices, \
	           "the batched runs restore one defect (decode-mask, token-placement: decode's " \
	           "--decode-mask=none, --token-placement=tail; pos-pad: tokenize-concat's --pad-positions=zero; " \
	           "gen_image requests: pos-pad, rope-pad, rope-1d, eoi); every case must then break", __VA_ARGS__)

/* The bounds of every command that reads picture files (docs/IMAGES.md):
 * both int64_t, 0 for the defaults. */
#define OPT_PICTURE_LIMITS(pixels, bytes) \
	OPT_INT(0, "max-image-pixels", pixels, 1, INT64_MAX, "N", \
	        "refuse a picture whose header declares more than N pixels, before decoding it (default " \
	        "89478485, PIL's decompression-bomb limit)"), \
	OPT_INT(0, "max-image-bytes", bytes, 1, INT64_MAX, "N", \
	        "refuse a picture file of more than N bytes, before reading it (default 268435456, 256 MiB)")
/* Requests with "images" (tokenize-concat, parity): how they are read and
 * which ViT resize kernel makes their ViT view. */
struct cli_images {
	hi3_request_image_opts load;
	int vit_kernel;             /* enum hi3_tv_kernel */
	int vae_sample;             /* hi3_cond_build_opts.vae_sample */
};
extern const struct cli_choice cli_vit_resize_choices[];
#define OPT_IMAGES(io) \
	OPT_GROUP("requests with \"images\":"), \
	OPT_PICTURE_LIMITS(&(io)->load.max_pixels, &(io)->load.max_bytes), \
	OPT_FLAG(0, "safe-paths", &(io)->load.safe_paths, \
	         "refuse an image whose real path is outside the requests file's directory"), \
	OPT_CHOICE(0, "vit-resize", &(io)->vit_kernel, cli_vit_resize_choices, \
	           "the ViT view's resize: uint8 (torchvision's native kernel, as on AVX2 CPUs; default) or " \
	           "float (its float32 path, as on CPUs without AVX2 or with AVX-512)"), \
	OPT_FLAG(0, "vae-sample", &(io)->vae_sample, "the cond images' VAE latents are posterior samples drawn " \
	         "from the row seeds (metadata vae_posterior), as upstream draws them; default: the posterior mean")
/* Read the requests' images (hi3_requests_load_images). */
int cli_load_images(hi3_requests *rq, const struct cli_images *io, hi3_error *err);
/* Tracing (prefill, decode, replay, diffusion-capture): --trace FILE and what to record. */
struct cli_trace {
	const char *path;        /* --trace; NULL: no trace */
	int64_t rows[1024];      /* --trace-rows */
	int n_rows;
	int64_t ranges[2 * 256]; /* --trace-positions, [lo, hi) pairs */
	int n_ranges;
	uint32_t kinds;          /* --trace-points; 0: all */
	int given;               /* how many of the three were given */
};
int cli_trace_positions(const struct cli_option *opt, const char *arg);
int cli_trace_points(const struct cli_option *opt, const char *arg);
#define OPT_TRACE(t) \
	OPT_GROUP("tracing (hi3-files(5), TRACE; compare two traces with hi3 diff --first):"), \
	OPT_STRING(0, "trace", &(t)->path, "FILE", "record the named activation points of the chosen tokens into " \
	           "FILE (format hi3.trace)"), \
	OPT_INT_LIST(0, "trace-rows", (t)->rows, &(t)->n_rows, 0, INT32_MAX, "I,...", \
	             "the rows to trace (default 0)", .given = &(t)->given), \
	OPT_CALLBACK(0, "trace-positions", (t), "P,A:B,...", cli_trace_positions, \
	             "the positions in the row to trace: P, or A:B for A <= p < B (default: every real token)", \
	             .given = &(t)->given), \
	OPT_CALLBACK(0, "trace-points", (t), "KIND,...", cli_trace_points, \
	             "record only these kinds of point (embed, in, in_norm, q, k, v, attn, attn_out, mlp_in, " \
	             "router_logits, experts, expert_weights, expert_out, shared_out, mlp_out, final, final_norm, " \
	             "logits; default all)", .given = &(t)->given)
/* The recorder --trace asks for (*out NULL without --trace; the other trace
 * options without it are a usage error, status 2), and after the stage the
 * trace written to its file. */
/* files: the command's other inputs and outputs (NULL-terminated; "-" and
 * NULL entries skipped), none of which --trace may name. */
int cli_trace_open(struct cli_trace *t, hi3_model *m, const char *const *files, hi3_trace **out, hi3_error *err);
int cli_trace_write(const struct cli_trace *t, hi3_trace *tr, hi3_error *err);

/* Refuse a seed base whose last row's seed, base + n - 1, would not fit. */
int cli_check_seed_base(int64_t base, int n);

/* Library messages to fn (NULL: libhi3's printer), at the level -q/-v chose;
 * -q and -v given later keep fn. */
void cli_log_to(hi3_log_fn fn);
/* 1 when paths a and b name one file: the same string, or both exist with
 * the same device and inode (a link, another spelling of the path). */
int cli_same_file(const char *a, const char *b);
/* Print an hi3_error and return its exit status. */
int cli_fail(const hi3_error *err);
/* --batch-invariant, or when not given the backend's default: on for the
 * CPU, off for CUDA (whose invariant mode gives up cuBLAS: hi3(1)). */
int cli_batch_invariant(void);
void cli_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The layout of --parallel, its communicator started on first use (hi3-mpi
 * under an MPI launcher); NULL without --parallel or on error (err set). */
const hi3_par *cli_parallel(hi3_error *err);
/* At the end of a command: with --parallel, a failure (rc != 0) ends every
 * rank with rc (the error was printed, naming this rank); success
 * finalizes MPI. Returns rc. */
int cli_parallel_end(int rc);
/* This process's rank among --parallel's (0 without --parallel): rank 0
 * alone writes the files every rank computes alike. */
int cli_rank(void);

/* Open the model named by -m (usage error when missing), with --parallel's layout. With cli.keep_model
 * the model stays open after cli_close_model, and the next open with the same
 * -m, --backend, -t and --batch-invariant returns it again. */
int cli_open_model(hi3_model **m, hi3_error *err);
/* Close what cli_open_model opened (a kept model stays open). */
void cli_close_model(hi3_model *m);
/* Warn when the CPU reads m's checkpoint, 64 MB or more of it in memory,
 * over a tenth of it through 4 KiB pages (resident and huge as
 * hi3_model_pages gives them, 0 where unknown): decode steps then run
 * slower (hi3(1), FILES IN USE), and the warning says why and what to do.
 * When none of it is in 2 MiB pages, only with none_too: the system may
 * map no file in huge pages, which no run can change (a warning each run
 * would say nothing new). */
void cli_warn_pages(const hi3_model *m, double resident, double huge, int none_too);
/* Close the kept model, if any. */
void cli_release_model(void);
/* Open a conditions file, then the model; on failure nothing stays open. */
int cli_open_cond_model(const char *cond_path, hi3_cond **c, hi3_model **m, hi3_error *err);

/* Monotonic seconds. */
double cli_now(void);

/* Progress on stderr when it is a terminal and not quiet. */
void cli_progress(const char *what, int64_t done, int64_t total);
/* A hi3_progress_fn for cli_progress: the ctx is what. */
void cli_progress_fn(void *what, int64_t done, int64_t total);
void cli_progress_end(void);

#endif
