/* cli.c -- global options, error reporting and progress for subcommands. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>
#include "cli.h"
#ifdef HI3_MPI
#include "par/comm-mpi.h"
#endif

struct cli_globals cli = {.backend = "cpu", .batch_invariant = -1};
static hi3_log_fn log_fn;     /* NULL: libhi3's own printer */

int cli_batch_invariant(void)
{
	return cli.batch_invariant >= 0 ? cli.batch_invariant : strcmp(cli.backend, "cuda") != 0;
}

void cli_log_to(hi3_log_fn fn)
{
	log_fn = fn;
	hi3_set_log(log_fn, NULL, cli.quiet ? HI3_LOG_WARN : cli.verbose ? HI3_LOG_DEBUG : HI3_LOG_INFO);
}
static hi3_par par;              /* --parallel's layout and communicator */
static int par_state;            /* 0 not started, 1 open, -1 failed */

static int set_quiet(const struct cli_option *opt, const char *arg)
{
	cli.quiet = 1;
	cli.verbose = 0;
	hi3_set_log(log_fn, NULL, HI3_LOG_WARN);
	return 0;
}

static int set_verbose(const struct cli_option *opt, const char *arg)
{
	cli.verbose = 1;
	cli.quiet = 0;
	hi3_set_log(log_fn, NULL, HI3_LOG_DEBUG);
	return 0;
}

static const struct cli_choice backends[] = {{"cpu", 0, NULL}, {"cuda", 1, NULL}, {NULL, 0, NULL}};
static const struct cli_choice on_off[] = {{"on", 1, NULL}, {"off", 0, NULL}, {NULL, 0, NULL}};
static const struct cli_choice graphs_on_off[] = {{"on", 1, NULL}, {"off", 2, NULL}, {NULL, 0, NULL}};

const struct cli_option cli_global_options[] = {
	OPT_GROUP("global options (also accepted after the command name):"),
	OPT_STRING('m', "model", &cli.model_dir, "DIR", "model directory (config.json, *.safetensors, tokenizer.json)"),
	OPT_STRING(0, "backend", &cli.backend, "NAME", "cpu (default) or cuda", .choices = backends),
	OPT_CHOICE(0, "batch-invariant", &cli.batch_invariant, on_off,
	           "on: reductions in an order independent of the batch, so a row gives the same bits alone or "
	           "batched (default on the CPU; cuda: no cuBLAS, slower prefill); off: OpenBLAS sgemm (CPU), "
	           "cuBLAS and split attention (cuda, its default)"),
	OPT_CHOICE(0, "cuda-graphs", &cli.cuda_graphs, graphs_on_off,
	           "cuda: decode steps replayed from CUDA graphs (the same bits; default on where the driver has "
	           "them, off under --parallel over several ranks); off: every kernel launched one by one"),
	OPT_INT('t', "threads", &cli.threads, 0, 4096, "N", "worker threads (default: all cores)"),
	OPT_STRING(0, "parallel", &cli.parallel, "tp=T,ep=E",
	           "run as one of T*E ranks: tensor parallel T, expert parallel E; add ,dispatch=alltoall to send "
	           "the experts' rows to their tokens' ranks instead of gathering them all (tp=1) (hi3-mpi under "
	           "mpirun; hi3-parallel(7))"),
	OPT_CALLBACK('q', "quiet", NULL, NULL, set_quiet, "only errors and warnings on stderr"),
	OPT_CALLBACK('v', "verbose", NULL, NULL, set_verbose, "more detail on stderr"),
	OPT_HELP('h', "help", "this help; 'hi3 help COMMAND' or 'hi3 COMMAND --help' for a command"),
	OPT_END(),
};

const struct cli_choice cli_dtype_choices[] = {{"f32", HI3_F32, NULL}, {"bf16", HI3_BF16, NULL}, {NULL, 0, NULL}};

const struct cli_choice cli_decode_mask_choices[] = {
	{"causal", HI3_MASK_CAUSAL, NULL},
	{"none", HI3_MASK_NONE, "--decode-mask=none reproduces a known upstream defect: decode attends pad slots "
	                        "and never-written cache slots; batched results will differ from rows run alone"},
	{NULL, 0, NULL},
};

const struct cli_choice cli_placement_choices[] = {
	{"index", HI3_PLACE_INDEX, NULL},
	{"tail", HI3_PLACE_TAIL, "--token-placement=tail reproduces a known upstream defect: new tokens go to the "
	                         "padded tail, so short rows re-read their own pad as input"},
	{NULL, 0, NULL},
};

const struct cli_choice cli_pad_positions_choices[] = {
	{"continue", 0, NULL},
	{"zero", 1, "--pad-positions=zero: pad columns get position id 0, the upstream defect, on purpose: "
	            "every pad writes cache slot 0 and overwrites the row's first token"},
	{NULL, 0, NULL},
};

const struct cli_choice cli_ablate_choices[] = {
	{"decode-mask", HI3_ABLATE_DECODE_MASK,
	 "--ablate decode-mask: the batched runs attend every cache slot, as upstream did"},
	{"token-placement", HI3_ABLATE_TOKEN_PLACEMENT,
	 "--ablate token-placement: the batched runs append new tokens at the padded tail, as upstream did"},
	{"pos-pad", HI3_ABLATE_POS_PAD,
	 "--ablate pos-pad: the batched conditions pad position ids with 0, as upstream did"},
	{"rope-pad", HI3_ABLATE_ROPE_PAD,
	 "--ablate rope-pad: the batched gen_image runs pad position ids with 0 and the RoPE table with zeros, as "
	 "UniRL's ragged concat did"},
	{"rope-1d", HI3_ABLATE_ROPE_1D,
	 "--ablate rope-1d: the batched gen_image runs give image tokens 1-D RoPE, as UniRL's replay did before its "
	 "ROPE-FIX"},
	{"eoi", HI3_ABLATE_EOI,
	 "--ablate eoi: in the batched gen_image runs every token after row 0's <timestep> attends every key, "
	 "<eoi> too, as upstream's flash-attention branch does"},
	{NULL, 0, NULL},
};

const struct cli_choice cli_vit_resize_choices[] = {
	{"uint8", HI3_TV_UINT8, NULL}, {"float", HI3_TV_FLOAT, NULL}, {NULL, 0, NULL},
};

int cli_load_images(hi3_requests *rq, const struct cli_images *io, hi3_error *err)
{
	return hi3_requests_have_images(rq) ? hi3_requests_load_images(rq, &io->load, err) : 0;
}

/* --trace-positions P,A:B,...: each item one position or a range [A, B). */
int cli_trace_positions(const struct cli_option *opt, const char *arg)
{
	struct cli_trace *t = opt->value;
	char *copy = strdup(arg), *save = NULL;
	int rc = 0;

	if (!copy)
		return cli_usage_error("--trace-positions: out of memory"), -1;
	t->n_ranges = 0;
	for (char *item = strtok_r(copy, ",", &save); item && !rc; item = strtok_r(NULL, ",", &save)) {
		char *colon = strchr(item, ':');
		int64_t lo, hi;

		if (t->n_ranges >= (int)(sizeof(t->ranges) / sizeof(t->ranges[0]) / 2)) {
			rc = (cli_usage_error("--trace-positions: at most %d items",
			                     (int)(sizeof(t->ranges) / sizeof(t->ranges[0]) / 2)), -1);
			break;
		}
		if (colon)
			*colon = '\0';
		if (cli_int("--trace-positions", item, 0, INT32_MAX, &lo) != 0) {
			rc = -1;
			break;
		}
		hi = lo + 1;
		if (colon && (cli_int("--trace-positions", colon + 1, 0, INT32_MAX, &hi) != 0 ||
		              (hi <= lo && (cli_usage_error("--trace-positions: %lld:%lld is empty (A:B takes A <= p < B)",
		                                            (long long)lo, (long long)hi), 1)))) {
			rc = -1;
			break;
		}
		t->ranges[2 * t->n_ranges] = lo;
		t->ranges[2 * t->n_ranges + 1] = hi;
		t->n_ranges++;
	}
	if (!rc && !t->n_ranges)
		rc = (cli_usage_error("--trace-positions: expected P or A:B items, found '%s'", arg), -1);
	free(copy);
	return rc;
}

/* --trace-points KIND,...: names of hi3_trace_kind. */
int cli_trace_points(const struct cli_option *opt, const char *arg)
{
	struct cli_trace *t = opt->value;
	char *copy = strdup(arg), *save = NULL;
	int rc = 0;

	if (!copy)
		return cli_usage_error("--trace-points: out of memory"), -1;
	t->kinds = 0;
	for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
		int k = hi3_trace_kind_parse(item);
		if (k < 0) {
			rc = (cli_usage_error("--trace-points: '%s' is not a point (see hi3-files(5), TRACE)", item), -1);
			break;
		}
		t->kinds |= 1u << k;
	}
	if (!rc && !t->kinds)
		rc = (cli_usage_error("--trace-points: expected KIND,..., found '%s'", arg), -1);
	free(copy);
	return rc;
}

int cli_same_file(const char *a, const char *b)
{
	struct stat sa, sb;

	if (!strcmp(a, b))
		return 1;
	return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

int cli_trace_open(struct cli_trace *t, hi3_model *m, const char *const *files, hi3_trace **out, hi3_error *err)
{
	hi3_trace_opts o = {.rows = t->n_rows ? t->rows : NULL, .n_rows = t->n_rows,
	                    .ranges = t->n_ranges ? t->ranges : NULL, .n_ranges = t->n_ranges, .kinds = t->kinds};

	*out = NULL;
	if (!t->path)
		return t->given ? hi3_error_set(err, HI3_ERR_USAGE, "--trace-rows, --trace-positions and --trace-points "
		                                "need --trace FILE") : 0;
	if (!strcmp(t->path, "-"))
		return hi3_error_set(err, HI3_ERR_USAGE, "--trace: the trace is a file, not standard output");
	for (; files && *files; files++)
		if (strcmp(*files, "-") && cli_same_file(t->path, *files))
			return strcmp(t->path, *files) ?
			       hi3_error_set(err, HI3_ERR_USAGE, "--trace: '%s' is '%s', a file this command also reads or "
			                     "writes", t->path, *files) :
			       hi3_error_set(err, HI3_ERR_USAGE, "--trace: '%s' is a file this command also reads or writes",
			                     t->path);
	return hi3_trace_new(out, m, &o, err);
}

int cli_trace_write(const struct cli_trace *t, hi3_trace *tr, hi3_error *err)
{
	if (!tr)
		return 0;
	if (hi3_trace_count(tr) == 0)
		cli_warn("--trace: no token of the rows and positions asked for was run; %s holds no points", t->path);
	if (hi3_trace_write(tr, t->path, err) != 0)
		return -1;
	cli_info("traced %lld tokens into %s", (long long)hi3_trace_count(tr), t->path);
	return 0;
}

int cli_check_seed_base(int64_t base, int n)
{
	if (n > 1 && base > INT64_MAX - (n - 1))
		return cli_usage_error("--seed: %lld + %d (the last request's index) is beyond %lld", (long long)base,
		                       n - 1, (long long)INT64_MAX);
	return 0;
}

int cli_fail(const hi3_error *err)
{
	/* a rank that fails before its model opened still joins the others,
	 * so that its message names it and cli_parallel_end ends them all */
	if (cli.parallel && par_state == 0) {
		hi3_error ignored = {0};
		cli_parallel(&ignored);
	}
	cli_message_prefix(stderr);
	if (par_state == 1 && par.comm->size > 1)
		fprintf(stderr, "rank %d of %d: ", par.comm->rank, par.comm->size);
	fprintf(stderr, "error: %s\n", err->msg[0] ? err->msg : "failed");
	return err->status ? err->status : HI3_ERR_RUNTIME;
}

void cli_info(const char *fmt, ...)
{
	va_list ap;

	if (cli.quiet)
		return;
	cli_message_prefix(stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

int cli_open_cond_model(const char *cond_path, hi3_cond **c, hi3_model **m, hi3_error *err)
{
	*c = NULL;
	*m = NULL;
	if (hi3_cond_open(c, cond_path, err) != 0)
		return -1;
	if (cli_open_model(m, err) != 0) {
		hi3_cond_close(*c);
		*c = NULL;
		return -1;
	}
	return 0;
}

#ifdef HI3_MPI
/* The communicator of the activations on device buffers, for the cuda
 * backend: NCCL on GPUs (none when ranks share a GPU, or without NCCL: the
 * activations then go through host buffers), MPI on the CUDA emulator's
 * device memory; HI3_PAR_COMM=host keeps them in host buffers. */
static int open_device_comm(hi3_error *err)
{
	const char *how = getenv("HI3_PAR_COMM");

	if (strcmp(cli.backend, "cuda") != 0 || (how && !strcmp(how, "host")))
		return 0;
	if (how && *how && strcmp(how, "device") != 0)
		return hi3_error_set(err, HI3_ERR_USAGE, "HI3_PAR_COMM: '%s' is not host or device", how);
#ifdef HI3_CUDA_EMU
	return hi3_comm_mpi_device(&par.dev, par.comm, err);
#else
	return hi3_comm_nccl_open(&par.dev, par.comm, err) < 0 ? -1 : 0;
#endif
}
#endif

const hi3_par *cli_parallel(hi3_error *err)
{
	if (!cli.parallel)
		return NULL;
	if (par_state == 1)
		return &par;
	if (par_state < 0) {
		hi3_error_set(err, HI3_ERR_USAGE, "--parallel: the communicator could not be started");
		return NULL;
	}
	par_state = -1;
	if (hi3_par_parse(&par, cli.parallel, err) != 0)
		return NULL;
#ifdef HI3_MPI
	if (hi3_comm_mpi_open(&par.comm, NULL, NULL, err) != 0)
		return NULL;
	par_state = 1;
	/* results for machines come from rank 0 alone */
	if (par.comm->rank != 0 && !freopen("/dev/null", "w", stdout)) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "rank %d: cannot redirect standard output to /dev/null",
		              par.comm->rank);
		return NULL;
	}
	if (par.comm->size != par.tp * par.ep) {
		hi3_error_set(err, HI3_ERR_USAGE, "--parallel tp=%d,ep=%d needs %d ranks; the launcher started %d",
		              par.tp, par.ep, par.tp * par.ep, par.comm->size);
		return NULL;
	}
	if (open_device_comm(err) != 0)
		return NULL;
	return &par;
#else
	hi3_error_set(err, HI3_ERR_USAGE, "--parallel: this hi3 is built without MPI; run the layout as 'mpirun -np "
	              "%d hi3-mpi ... --parallel %s' (hi3-parallel(7))", par.tp * par.ep, cli.parallel);
	return NULL;
#endif
}

int cli_rank(void)
{
	return par_state == 1 ? par.comm->rank : 0;
}

int cli_parallel_end(int rc)
{
	if (par_state != 1)
		return rc;
	par_state = 0;
	if (rc != 0 && par.comm->size > 1)
		(par.dev ? par.dev : par.comm)->ops->abort(par.dev ? par.dev : par.comm, rc, NULL);
	if (!cli.quiet) {
		/* the totals, then the device buffers' share: one line in one
		 * write, so that the ranks' lines never interleave */
		const hi3_comm *d = par.dev;
		char line[512];
		int n = snprintf(line, sizeof(line), "hi3 %s: rank %d of %d: %.3f s in collectives, %.3f MiB received",
		                 cli_voice.cmd ? cli_voice.cmd : "", par.comm->rank, par.comm->size,
		                 par.comm->seconds + (d ? d->seconds : 0),
		                 (double)(par.comm->bytes + (d ? d->bytes : 0)) / 1048576.0);
		if (d && n > 0 && (size_t)n < sizeof(line))
			n += snprintf(line + n, sizeof(line) - (size_t)n, " (%s: %.3f s, %.3f MiB)", d->name, d->seconds,
			              (double)d->bytes / 1048576.0);
		if (n > 0 && (size_t)n < sizeof(line) - 1) {
			line[n++] = '\n';
			fflush(stderr);
			if (write(STDERR_FILENO, line, (size_t)n) < 0)
				return rc;
		}
	}
	if (par.dev)
		par.dev->ops->destroy(par.dev);
	par.dev = NULL;
	par.comm->ops->destroy(par.comm);
	par.comm = NULL;
	return rc;
}

/* The model hi3 run keeps open between commands, and what it was opened with. */
static struct {
	hi3_model *m;
	char *dir, *backend;
	int threads, batch_invariant, cuda_graphs;
} kept;

static int kept_matches(void)
{
	return kept.m && !strcmp(kept.dir, cli.model_dir) && !strcmp(kept.backend, cli.backend) &&
	       kept.threads == cli.threads && kept.batch_invariant == cli.batch_invariant &&
	       kept.cuda_graphs == cli.cuda_graphs;
}

int cli_open_model(hi3_model **m, hi3_error *err)
{
	hi3_model_opts o = {.backend = cli.backend, .threads = cli.threads, .batch_invariant = cli_batch_invariant(),
	                    .cuda_graphs = cli.cuda_graphs};
	char *dir, *backend;

	*m = NULL;
	if (!cli.model_dir) {
		hi3_error_set(err, HI3_ERR_USAGE, "no model: give -m DIR (a directory made by 'hi3 init-model' "
		              "or a Hugging Face checkpoint)");
		return -1;
	}
	if (cli.parallel && !(o.par = cli_parallel(err)))
		return -1;
	if (!cli.keep_model)
		return hi3_model_open(m, cli.model_dir, &o, err);
	if (kept_matches()) {
		*m = kept.m;
		return 0;
	}
	cli_release_model();
	if (!(dir = strdup(cli.model_dir)) || !(backend = strdup(cli.backend))) {
		free(dir);
		hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		return -1;
	}
	if (hi3_model_open(m, cli.model_dir, &o, err) != 0) {
		free(dir);
		free(backend);
		return -1;
	}
	kept.m = *m;
	kept.dir = dir;
	kept.backend = backend;
	kept.threads = cli.threads;
	kept.batch_invariant = cli.batch_invariant;
	kept.cuda_graphs = cli.cuda_graphs;
	return 0;
}

void cli_close_model(hi3_model *m)
{
	if (m && m != kept.m)
		hi3_model_close(m);
}

/* Bytes of a checkpoint in memory from which cli_warn_pages speaks (a few
 * MB fit the TLB's reach either way). */
#define PAGES_WORTH 64e6

void cli_warn_pages(const hi3_model *m, double resident, double huge, int none_too)
{
	if (strcmp(hi3_model_backend(m), "cpu") != 0 || resident < PAGES_WORTH || huge >= 0.9 * resident ||
	    (huge == 0 && !none_too))
		return;
	/* a checkpoint cached in small pages reads slower, whatever hi3 does
	 * with it: say so, and how to have it read anew; with none of it in
	 * huge pages the system may give none to files at all */
	if (huge > 0)
		cli_warn("only %.0f%% of the checkpoint's %.0f MB in memory is mapped in 2 MiB pages: its page cache "
		         "holds small pages, and decode steps read it slower than they can; dropping its cached pages "
		         "(dd if=FILE iflag=nocache count=0, for each of its files) has the next run read it in anew",
		         100.0 * huge / resident, resident / 1e6);
	else
		cli_warn("none of the checkpoint's %.0f MB in memory is mapped in 2 MiB pages, and decode steps read "
		         "it slower than they can: its page cache holds small pages (dropping them, dd if=FILE "
		         "iflag=nocache count=0 for each of its files, has the next run read it in anew), or this "
		         "system maps no file in huge pages (transparent huge pages off, or a file system without "
		         "large folios)", resident / 1e6);
}

void cli_release_model(void)
{
	hi3_model_close(kept.m);
	free(kept.dir);
	free(kept.backend);
	memset(&kept, 0, sizeof(kept));
}

double cli_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int progress_shown;
static struct timespec progress_t0, progress_last;

void cli_progress(const char *what, int64_t done, int64_t total)
{
	struct timespec now;
	double el, since;
	int width = 30, fill;

	if (cli.quiet || !isatty(STDERR_FILENO))
		return;
	clock_gettime(CLOCK_MONOTONIC, &now);
	if (!progress_shown) {
		progress_t0 = now;
		progress_last.tv_sec = 0;
	}
	since = (double)(now.tv_sec - progress_last.tv_sec) + 1e-9 * (double)(now.tv_nsec - progress_last.tv_nsec);
	if (progress_shown && since < 0.1 && done < total)
		return;
	progress_last = now;
	progress_shown = 1;
	el = (double)(now.tv_sec - progress_t0.tv_sec) + 1e-9 * (double)(now.tv_nsec - progress_t0.tv_nsec);
	fill = total > 0 ? (int)(width * done / total) : 0;
	fprintf(stderr, "\r%s [%.*s%*s] %lld/%lld %.1fs", what, fill, "==============================",
	        width - fill, "", (long long)done, (long long)total, el);
	fflush(stderr);
}

void cli_progress_fn(void *what, int64_t done, int64_t total)
{
	cli_progress(what, done, total);
}

void cli_progress_end(void)
{
	if (progress_shown) {
		fputc('\n', stderr);
		progress_shown = 0;
	}
}
