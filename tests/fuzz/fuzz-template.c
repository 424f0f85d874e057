/* fuzz-template.c -- requests -> template -> conditions (lib/cond/): any
 * JSONL through hi3_requests_parse, hi3_cond_build on the template test
 * model (tests/fixtures/template), and the conditions written, reopened,
 * selected and merged. Byte 0 picks the template (bit 0: instruct, bit 1:
 * drop_think) and the build (bit 2: per row, bit 3: pad_zero); the rest
 * is the JSONL. Built conditions have one row per request and cfg
 * factor, the file hi3 writes reopens to the same tensors, and a row
 * selected or the conditions merged with themselves are conditions too
 * (fuzz_cond_round_trip). */
#include <string.h>
#include "core/internal.h"
#include "fuzz/fuzz.h"

static hi3_template *tmpl[4];

static int init(void)
{
	char *dir = hi3i_asprintf("%s/tests/fixtures/template", fuzz_srcdir());
	int rc = 0;

	for (int i = 0; i < 4 && rc == 0; i++) {
		hi3_template_opts o = {.model_dir = dir, .load_tokenizer = 1, .name = i & 1 ? "instruct" : "pretrain",
		                       .drop_think = i >> 1, .pad_id = -1};
		hi3_error err = {0};

		rc = hi3_template_open(&tmpl[i], &o, &err);
		if (rc != 0)
			fprintf(stderr, "fuzz: template: %s\n", err.msg);
	}
	free(dir);
	return rc;
}

static void one(const uint8_t *data, size_t size)
{
	hi3_requests *rq = NULL;
	hi3_cond *c = NULL;
	hi3_error err = {0};
	hi3_cond_build_opts bo;
	int rc;

	if (size < 1)
		return;
	bo = (hi3_cond_build_opts){.per_row = data[0] >> 2 & 1, .pad_zero = data[0] >> 3 & 1, .max_length = 16384,
	                           .seed_base = 1};
	rc = hi3_requests_parse(&rq, (const char *)data + 1, size - 1, "fuzz.jsonl", &err);
	fuzz_check_status(rc, &err, "hi3_requests_parse");
	if (rc != 0)
		return;
	rc = hi3_cond_build(&c, tmpl[data[0] & 3], rq, &bo, &err);
	fuzz_check_status(rc, &err, "hi3_cond_build");
	if (rc == 0) {
		FUZZ_CHECK(c->B == hi3_requests_count(rq) * hi3_cond_cfg_factor(c) && c->L >= 1 && c->L <= 16384,
		           "%d requests built into B %d (cfg factor %d), L %d", hi3_requests_count(rq), c->B,
		           hi3_cond_cfg_factor(c), c->L);
		fuzz_cond_round_trip(c);
		hi3_cond_close(c);
	}
	hi3_requests_free(rq);
}

HI3_FUZZ_TARGET(template, init, one)
