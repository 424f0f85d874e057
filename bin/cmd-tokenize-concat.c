/* cmd-tokenize-concat.c -- hi3 tokenize-concat: requests to a conditions
 * file, conditions files merged into one, or the image stage after a text
 * stage. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "cli.h"
#include "commands.h"

static const struct cli_help help = {
	.usage = {"hi3 tokenize-concat [-m DIR] [--tokenizer FILE] [--template NAME] [--batch | --per-row] "
	          "[--pad-positions continue|zero] [--max-length N] [--seed N] [--pad-id N] [--drop-think] "
	          "[--exact-size | --strict-size] [--max-image-pixels N] [--max-image-bytes N] [--safe-paths] "
	          "[--vit-resize uint8|float] "
	          "[--vae-sample] [--encode] [--dump-images DIR] -o OUT REQUESTS",
	          "hi3 tokenize-concat --concat [--pad-positions continue|zero] -o OUT COND...",
	          "hi3 tokenize-concat --continue -m DIR [--drop-think] [--rows LIST] [--batch | --per-row] "
	          "[--pad-positions continue|zero] [--max-length N] [--by-size] [--dump-images DIR] -o OUT COND SEG"},
	.description =
	"Encode JSONL requests (one JSON object per line; '-' reads standard input)\n"
	"with the sequence template into a conditions file (hi3-files(5)), right\n"
	"padded: pads take the pad id, and their position ids continue the row's own\n"
	"indices. Requests with \"images\" (files relative to the requests file's\n"
	"directory) get one joint image block per image, and the conditions carry\n"
	"each image's ViT view. With --concat, merge conditions files of any B and L\n"
	"into one. A gen_image request with \"image_size\": \"auto\" gives the text\n"
	"stage that chooses the size (think, recaption, the ratio token); with\n"
	"--continue, the text stage's conditions COND and the segment SEG decode wrote\n"
	"from them give the image stage: every row's gen_image request with its cot\n"
	"and the size of its ratio token, as upstream's generate_image builds it.\n",

};

static const struct cli_choice templates[] = {{"pretrain", 0, NULL}, {"instruct", 1, NULL}, {NULL, 0, NULL}};

static int concat(char **files, int n, const char *out, int pad_zero)
{
	hi3_cond **in = calloc((size_t)n, sizeof(*in)), *merged = NULL;
	hi3_error err = {0};
	int rc = -1;

	if (!in) {
		hi3_error_set(&err, HI3_ERR_RUNTIME, "out of memory");
		return cli_fail(&err);
	}
	for (int i = 0; i < n; i++)
		if (hi3_cond_open(&in[i], files[i], &err) != 0)
			goto out;
	if (hi3_cond_concat(&merged, (const hi3_cond *const *)in, n, pad_zero, &err) != 0 ||
	    hi3_cond_write(merged, out, &err) != 0)
		goto out;
	cli_info("merged %d files: %d rows, L = %d, into %s", n, merged->B, merged->L, out);
	rc = 0;
out:
	hi3_cond_close(merged);
	for (int i = 0; i < n; i++)
		hi3_cond_close(in[i]);
	free(in);
	return rc ? cli_fail(&err) : 0;
}

/* Each cond image's two views as DIR/row<B>-image<K>-vit.png and
 * -vae.png (K counts within the row); DIR is made when missing. */
static int dump_images(const hi3_cond *c, const char *dir, hi3_error *err)
{
	size_t off = 0;

	if (c->NI && mkdir(dir, 0777) != 0 && errno != EEXIST)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "%s: cannot make the directory: %s", dir, strerror(errno));

	for (int k = 0, j = 0; k < c->NI; k++) {
		const int vh = c->vae_shape[2 * k], vw = c->vae_shape[2 * k + 1];
		uint8_t *rgb = NULL;
		char *path;
		int w, h, rc;
		j = k && c->image_row[k] == c->image_row[k - 1] ? j + 1 : 0;
		if (!(path = malloc(strlen(dir) + 64)))
			return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		sprintf(path, "%s/row%lld-image%d-vit.png", dir, (long long)c->image_row[k], j);
		rc = hi3_cond_vit_image(c, k, &rgb, &w, &h, err) || hi3_png_write_rgb(path, w, h, rgb, err);
		if (!rc) {
			cli_info("%s: %d x %d", path, w, h);
			sprintf(path, "%s/row%lld-image%d-vae.png", dir, (long long)c->image_row[k], j);
			rc = hi3_png_write_rgb(path, vw, vh, c->vae_pixels + off, err);
		}
		if (!rc)
			cli_info("%s: %d x %d", path, vw, vh);
		off += (size_t)vh * vw * 3;
		free(rgb);
		free(path);
		if (rc)
			return -1;
	}
	return 0;
}

static int tokenize(const char *input, const char *out, const hi3_template_opts *to, const hi3_cond_build_opts *bo,
                    const struct cli_images *io, const char *dump, int encode)
{
	hi3_requests *rq = NULL;
	hi3_template *t = NULL;
	hi3_cond *c = NULL;
	hi3_model *m = NULL;
	hi3_template_opts o = *to;
	hi3_error err = {0};
	int rc = -1;

	if (hi3_requests_read(&rq, input, &err) != 0 || cli_load_images(rq, io, &err) != 0)
		goto out;
	if (cli_check_seed_base(bo->seed_base, hi3_requests_count(rq)) != 0) {
		hi3_requests_free(rq);
		return HI3_ERR_USAGE;
	}
	o.load_tokenizer = o.tokenizer || hi3_requests_need_tokenizer(rq);
	if (hi3_template_open(&t, &o, &err) != 0 || hi3_cond_build(&c, t, rq, bo, &err) != 0)
		goto out;
	if (encode && c->NI) {
		/* the images' encoder outputs, so that the stages need not run them */
		hi3_cond *e = NULL;
		double t0 = cli_now();
		if (cli_open_model(&m, &err) != 0 || hi3_cond_encode(&e, c, m, &err) != 0)
			goto out;
		hi3_cond_close(c);
		c = e;
		cli_info("encoded %d images in %.3f s", c->NI, cli_now() - t0);
	}
	if (hi3_cond_write(c, out, &err) != 0 || (dump && dump_images(c, dump, &err) != 0))
		goto out;
	cli_info("%d requests: %d rows, L = %d (%s, template %s, %s model) into %s", hi3_requests_count(rq), c->B,
	         c->L, bo->per_row ? "per row" : "batch", c->template_name, hi3_variant_name(hi3_template_variant(t)),
	         out);
	rc = 0;
out:
	cli_close_model(m);
	hi3_cond_close(c);
	hi3_template_free(t);
	hi3_requests_free(rq);
	return rc ? cli_fail(&err) : 0;
}

/* --by-size: the image size of each continued request ("HxW", as
 * --continue writes it) into sizes[q] (room for 32 characters each). */
static int request_sizes(const hi3_cond *c, char (*sizes)[32], hi3_error *err)
{
	json_t *all = json_loads(c->requests, JSON_ALLOW_NUL, NULL);
	size_t q;
	json_t *r;

	if (!json_is_array(all)) {
		json_decref(all);
		return hi3_error_set(err, HI3_ERR_RUNTIME, "the continued requests are not a JSON array");
	}
	json_array_foreach(all, q, r)
		snprintf(sizes[q], 32, "%s", json_string_value(json_object_get(r, "image_size")));
	json_decref(all);
	return 0;
}

/* The image stage after the text stage cond_path + seg_path: into out, or
 * with by_size one file out-HxW.st for each image size, its rows in order,
 * their names on standard output. */
static int continue_stage(const char *cond_path, const char *seg_path, const char *out, hi3_template_opts *to,
                          hi3_continue_opts *co, const char *dump, int by_size)
{
	hi3_template *t = NULL;
	hi3_cond *text = NULL, *c = NULL, *part = NULL;
	hi3_segment *seg = NULL;
	hi3_error err = {0};
	char (*sizes)[32] = NULL, name[4096];
	int *rows = NULL, rc = -1, n;

	if (hi3_cond_open(&text, cond_path, &err) || hi3_segment_open(&seg, seg_path, &err))
		goto out;
	/* the text stage's template and pad id */
	to->name = strcmp(text->template_name, "none") ? text->template_name : NULL;
	to->pad_id = text->pad_id;
	to->load_tokenizer = 1;
	/* every row first: a refusal leaves no file written */
	if (hi3_template_open(&t, to, &err) || hi3_cond_continue(&c, t, text, seg, co, &err))
		goto out;
	if (!by_size) {
		if (hi3_cond_write(c, out, &err) || (dump && dump_images(c, dump, &err)))
			goto out;
		cli_info("%d rows of %s continued: %d rows, L = %d (%s, %s model) into %s", c->B / hi3_cond_cfg_factor(c),
		         cond_path, c->B, c->L, co->build.per_row ? "per row" : "batch",
		         hi3_variant_name(hi3_template_variant(t)), out);
		rc = 0;
		goto out;
	}
	n = c->B / hi3_cond_cfg_factor(c);
	if (!(sizes = calloc((size_t)n, sizeof(*sizes))) || !(rows = calloc((size_t)n, sizeof(int)))) {
		hi3_error_set(&err, HI3_ERR_RUNTIME, "out of memory");
		goto out;
	}
	if (request_sizes(c, sizes, &err))
		goto out;
	for (int q = 0; q < n; q++) {
		hi3_continue_opts po = *co;
		int k = 0;
		if (!sizes[q][0])
			continue;       /* a size written already */
		for (int j = q; j < n; j++)
			if (j == q || !strcmp(sizes[j], sizes[q])) {
				rows[k++] = co->rows ? co->rows[j] : j;
				if (j != q)
					sizes[j][0] = 0;
			}
		po.rows = rows;
		po.n_rows = k;
		if ((size_t)snprintf(name, sizeof(name), "%s-%s.st", out, sizes[q]) >= sizeof(name)) {
			hi3_error_set(&err, HI3_ERR_USAGE, "-o %s: the name is too long", out);
			goto out;
		}
		hi3_cond_close(part);
		part = NULL;
		if (hi3_cond_continue(&part, t, text, seg, &po, &err) || hi3_cond_write(part, name, &err))
			goto out;
		printf("%s\n", name);
		cli_info("%d rows of %s of image size %s: %d rows, L = %d into %s", k, cond_path, sizes[q], part->B,
		         part->L, name);
	}
	rc = 0;
out:
	hi3_cond_close(part);
	hi3_cond_close(c);
	hi3_template_free(t);
	hi3_segment_close(seg);
	hi3_cond_close(text);
	free(sizes);
	free(rows);
	return rc ? cli_fail(&err) : 0;
}

int cmd_tokenize_concat(int argc, char **argv)
{
	hi3_template_opts to = {.pad_id = -1};
	hi3_cond_build_opts bo = {0};
	struct cli_images images = {0};
	const char *out = NULL, *dump = NULL;
	int do_concat = 0, do_continue = 0, by_size = 0, n_mode = 0, n_build = 0, n_size = 0, encode = 0;
	int n_rows = 0, n_cont = 0;
	int rows[1024];
	int64_t rows64[1024];
	struct cli_option options[] = {
		OPT_STRING('m', "model", &cli.model_dir, "DIR", "config.json, tokenizer.json, tokenizer_config.json "
		           "and generation_config.json; the weights give the fingerprint"),
		OPT_STRING(0, "tokenizer", &to.tokenizer, "FILE",
		           "the tokenizer.json to use (default: DIR/tokenizer.json)", .given = &n_build),
		OPT_STRING(0, "template", &to.name, "NAME", "pretrain or instruct (default: generation_config.json's "
		           "sequence_template, else pretrain)", .choices = templates, .given = &n_build),
		OPT_SET_INT(0, "batch", &bo.per_row, 0, "encode the whole batch and pad it at once (default)",
		            .given = &n_mode),
		OPT_SET_INT(0, "per-row", &bo.per_row, 1, "encode each row alone into its own conditions, then merge",
		            .given = &n_mode),
		OPT_INT(0, "max-length", &bo.max_length, 1, INT32_MAX, "N", "refuse a row of more than N tokens "
		        "(default: the model's generation_config.json max_length, when it has one)",
		        .given = &n_cont),
		OPT_SEED_BASE(&bo.seed_base, .given = &n_build),
		OPT_INT(0, "pad-id", &to.pad_id, 0, INT64_MAX, "N", "the pad token id (default: from the model)",
		        .given = &n_build),
		OPT_FLAG(0, "drop-think", &to.drop_think, "drop the <think>...</think> parts of cot texts (--continue: "
		         "keep only the <recaption> part of the cot and switch the system prompt, as generate_image)",
		         .given = &n_cont),
		OPT_SET_INT(0, "exact-size", &to.image_size, HI3_SIZE_EXACT, "gen_image: keep an \"HxW\" that is a "
		            "multiple of the latent factor (the ratio token of its nearest bucket) instead of the bucket",
		            .given = &n_size),
		OPT_SET_INT(0, "strict-size", &to.image_size, HI3_SIZE_STRICT, "gen_image: refuse an \"HxW\" that is "
		            "not one of the model's buckets (exit 3)", .given = &n_size),
		OPT_FLAG(0, "concat", &do_concat, "merge the conditions files COND... instead"),
		OPT_FLAG(0, "continue", &do_continue, "the image stage after the text stage COND (of gen_image "
		         "requests with image_size auto) and its segment SEG"),
		OPT_INT_LIST(0, "rows", rows64, &n_rows, 0, INT32_MAX, "LIST", "with --continue: continue these rows of "
		             "COND, in this order (default: all)"),
		OPT_FLAG(0, "by-size", &by_size, "with --continue: one file OUT-HxW.st for each image size (a "
		         "trajectory holds one), its name on standard output"),
		OPT_IMAGES(&images),
		OPT_FLAG(0, "encode", &encode, "also store the images' encoder outputs (ViT and aligner, the VAE "
		         "latents) made by the model of -m, so that the stages do not run the encoders",
		         .given = &n_build),
		OPT_STRING(0, "dump-images", &dump, "DIR", "also write each cond image's ViT and VAE views, as the "
		           "encoders see them, to DIR/row<B>-image<K>-vit.png and -vae.png"),
		OPT_OUTPUT(&out, "OUT", "the conditions file to write ('-': standard output)"),
		OPT_GROUP_DEFECTS(),
		OPT_PAD_POSITIONS(&bo.pad_zero),
		OPT_GLOBALS(),
		OPT_END(),
	};

	if ((argc = cli_parse_options(argc, argv, options, &help, 0)) < 0)
		return CLI_PARSE_STATUS(argc);
	if (n_mode > 1)
		return cli_usage_error("give one of --batch and --per-row");
	if (n_size > 1)
		return cli_usage_error("give one of --exact-size and --strict-size");
	if (do_concat + do_continue > 1)
		return cli_usage_error("give one of --concat and --continue");
	if ((n_rows || by_size) && !do_continue)
		return cli_usage_error("%s needs --continue", n_rows ? "--rows" : "--by-size");
	if (do_continue) {
		hi3_continue_opts co = {.build = bo};
		if (n_build || encode || images.load.max_pixels || images.load.max_bytes || images.load.safe_paths ||
		    images.vit_kernel || images.vae_sample)
			return cli_usage_error("--continue takes the text stage's template, tokenizer, seeds, pad id and "
			                       "images: only -m, --drop-think, --rows, --batch/--per-row, --pad-positions, "
			                       "--max-length, --by-size, --dump-images and -o");
		if (argc != 2)
			return cli_usage_error("--continue needs the text stage's conditions COND and segment SEG");
		if (!cli.model_dir)
			return cli_usage_error("--continue needs the model: -m DIR");
		for (int i = 0; i < n_rows; i++)
			rows[i] = (int)rows64[i];
		co.rows = n_rows ? rows : NULL;
		co.n_rows = n_rows;
		to.model_dir = cli.model_dir;
		to.fingerprint = 1;
		if (by_size && (dump || !strcmp(out, "-")))
			return cli_usage_error("--by-size writes files named after OUT: not '-', nor with --dump-images");
		return continue_stage(argv[0], argv[1], out, &to, &co, dump, by_size);
	}
	n_build += n_size + n_cont;
	if (do_concat) {
		if (n_build || n_mode)
			return cli_usage_error("--concat takes only --pad-positions and -o (the other options build "
			                       "conditions from requests)");
		if (argc < 1)
			return cli_usage_error("--concat needs at least one conditions file");
		return concat(argv, argc, out, bo.pad_zero);
	}
	if (argc != 1)
		return cli_usage_error("expected one REQUESTS file ('-' for standard input)");
	if (encode && !cli.model_dir)
		return cli_usage_error("--encode needs the model: -m DIR");
	to.model_dir = cli.model_dir;
	to.fingerprint = cli.model_dir != NULL;
	bo.vit_kernel = images.vit_kernel;
	bo.vae_sample = images.vae_sample;
	bo.max_image_pixels = images.load.max_pixels;
	return tokenize(argv[0], out, &to, &bo, &images, dump, encode);
}
