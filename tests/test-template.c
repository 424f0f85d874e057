/* test-template.c -- the sequence template against the Python reference
 * (tests/ref/template_ref.py): for every case of
 * tests/fixtures/template/cases.txt, the conditions built from NAME.jsonl,
 * as a batch and row by row, equal NAME.safetensors exactly: token ids,
 * position ids, RoPE positions, blocks, masks, <timestep> indices, stop
 * tokens, seeds. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "cond/cond-internal.h"
#include "tap.h"
#include "testdir.h"

static const char *const tensors[] = {"input_ids",      "position_ids",  "real_pos",      "rope_pos",
                                      "image_blocks",   "seeds",         "stop_tokens",   "gen_image_mask",
                                      "cond_vit_mask",  "cond_vae_mask", "timestep_index", NULL};
static const char *const meta[] = {"format", "format_version", "mode", "bot_task", "template", "cfg_factor",
                                   "pad_id", "pad_positions", NULL};

static char *scratch;          /* where the built conditions are written */

/* Write c to path and compare it with the expected file, tensor by tensor. */
static int compare(const char *what, const hi3_cond *c, const char *path, const hi3_st *want)
{
	hi3_st *got = NULL;
	hi3_error err = {0};
	int good = 1;

	if (hi3_cond_write(c, path, &err) != 0 || hi3_st_open(&got, path, HI3_ST_READ, &err) != 0) {
		diag("%s: %s", what, err.msg);
		return 0;
	}
	for (int i = 0; tensors[i]; i++) {
		const hi3_tensor *a = hi3_st_find(got, tensors[i]), *b = hi3_st_find(want, tensors[i]);
		char sa[64], sb[64];
		if (!a && !b)
			continue;
		if (!a || !b || a->dtype != b->dtype || a->ndim != b->ndim ||
		    memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim)) {
			diag("%s: tensor '%s': built %s %s, expected %s %s", what, tensors[i],
			     a ? hi3_dtype_name(a->dtype) : "(absent)", a ? hi3_shape_str(sa, 64, a->ndim, a->shape) : "",
			     b ? hi3_dtype_name(b->dtype) : "(absent)", b ? hi3_shape_str(sb, 64, b->ndim, b->shape) : "");
			good = 0;
			continue;
		}
		if (memcmp(a->data, b->data, a->nbytes)) {
			size_t es = hi3_dtype_size(a->dtype), k = 0;
			while (k < a->nbytes / es && !memcmp((char *)a->data + k * es, (char *)b->data + k * es, es))
				k++;
			diag("%s: tensor '%s' differs first at element %zu: built %g, expected %g", what, tensors[i], k,
			     hi3_elem_f64(a->data, a->dtype, k), hi3_elem_f64(b->data, b->dtype, k));
			good = 0;
		}
	}
	for (int i = 0; meta[i]; i++) {
		const char *a = hi3_st_meta(got, meta[i]), *b = hi3_st_meta(want, meta[i]);
		if (!a || !b || strcmp(a, b)) {
			diag("%s: metadata '%s': built '%s', expected '%s'", what, meta[i], a ? a : "(absent)",
			     b ? b : "(absent)");
			good = 0;
		}
	}
	hi3_st_close(got);
	remove(path);
	return good;
}

static void run_case(const char *dir, const char *name, const char *sub, const char *tname, int drop)
{
	char *mdir = hi3i_asprintf("%s/%s", dir, sub), *tokp = hi3i_asprintf("%s/tokenizer.json", dir);
	char *jsonl = hi3i_asprintf("%s/%s.jsonl", dir, name), *want_path = hi3i_asprintf("%s/%s.safetensors", dir, name);
	char *out = hi3i_asprintf("%s/%s.st", scratch, name);
	hi3_template_opts to = {.model_dir = mdir, .tokenizer = tokp, .load_tokenizer = 1, .name = tname,
	                        .drop_think = drop, .pad_id = -1};
	hi3_template *t = NULL;
	hi3_requests *rq = NULL;
	hi3_st *want = NULL;
	hi3_error err = {0};

	if (hi3_template_open(&t, &to, &err) || hi3_requests_read(&rq, jsonl, &err) ||
	    hi3_st_open(&want, want_path, HI3_ST_READ, &err)) {
		ok(0, "%s: open the case: %s", name, err.msg);
		goto out;
	}
	for (int per_row = 0; per_row < 2; per_row++) {
		hi3_cond_build_opts bo = {.per_row = per_row};
		hi3_cond *c = NULL;
		char what[256];
		snprintf(what, sizeof(what), "%s (%s)", name, per_row ? "per row" : "batch");
		if (hi3_cond_build(&c, t, rq, &bo, &err) != 0) {
			ok(0, "%s: build: %s", what, err.msg);
			continue;
		}
		ok(compare(what, c, out, want), "%s: %d rows, L %d equal the reference", what, c->B, c->L);
		hi3_cond_close(c);
	}
out:
	hi3_st_close(want);
	hi3_requests_free(rq);
	hi3_template_free(t);
	free(mdir);
	free(tokp);
	free(jsonl);
	free(want_path);
	free(out);
}

int main(void)
{
	const char *src = getenv("SRCDIR") ? getenv("SRCDIR") : ".";
	char *dir, *path, line[512];
	FILE *f;
	int n = 0;

	if (!(scratch = testdir_new("test-template")))
		return 1;
	dir = hi3i_asprintf("%s/tests/fixtures/template", src);
	path = hi3i_asprintf("%s/cases.txt", dir);
	if (!dir || !path || !(f = fopen(path, "r"))) {
		ok(0, "open %s/tests/fixtures/template/cases.txt", src);
		testdir_done(scratch);
		return done_testing();
	}
	while (fgets(line, sizeof(line), f)) {
		char name[128], sub[128], tname[32];
		int drop;
		if (line[0] == '#' || sscanf(line, "%127s %127s %31s %d", name, sub, tname, &drop) != 4)
			continue;
		run_case(dir, name, sub, tname, drop);
		n++;
	}
	fclose(f);
	free(dir);
	free(path);
	ok(n >= 10, "%d cases (both templates; gen_text, i2t, gen_image, drop_think, pre-tokenized, released geometry)",
	   n);
	testdir_done(scratch);
	return done_testing();
}
