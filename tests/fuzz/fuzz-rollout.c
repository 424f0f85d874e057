/* fuzz-rollout.c -- hi3_import_rollout on any bytes as JSONL
 * (lib/tools/import-rollout.c), for a tiny-moe model: an import either
 * fails by the error contract with nothing written, or writes conditions
 * and a segment that reopen, agree on their rows, hold tokens of the
 * vocabulary, and replay (as the importer promises). */
#include <string.h>
#include <unistd.h>
#include "core/internal.h"
#include "fuzz/fuzz.h"

static int init(void)
{
	return fuzz_model() ? 0 : -1;
}

static void one(const uint8_t *data, size_t size)
{
	const char *path = fuzz_write("in.jsonl", data, size), *cp = fuzz_path("out.cond"), *sp = fuzz_path("out.seg");
	hi3_model *m = fuzz_model();
	hi3_import_report rep;
	hi3_cond *c = NULL;
	hi3_segment *s = NULL;
	hi3_error err = {0};
	int rc;

	unlink(cp);
	unlink(sp);
	rc = hi3_import_rollout(m, path, &(hi3_import_opts){0}, cp, sp, &rep, &err);
	fuzz_check_status(rc, &err, "hi3_import_rollout");
	if (rc != 0) {
		FUZZ_CHECK(access(cp, F_OK) != 0 && access(sp, F_OK) != 0, "a failed import wrote a file");
		return;
	}
	rc = hi3_cond_open(&c, cp, &err);
	FUZZ_CHECK(rc == 0, "imported conditions do not reopen: %s", err.msg);
	rc = hi3_segment_open(&s, sp, &err);
	FUZZ_CHECK(rc == 0, "an imported segment does not reopen: %s", err.msg);
	FUZZ_CHECK(c->B == rep.rows && s->B == rep.rows && s->T == rep.response_tokens, "rows %d/%d/%d", c->B, s->B,
	           rep.rows);
	FUZZ_CHECK(hi3_cond_check_model(c, m, &err) == 0, "imported conditions refused: %s", err.msg);
	for (int64_t j = 0; j < s->T; j++)
		FUZZ_CHECK(s->tokens[j] >= 0 && s->tokens[j] < hi3_model_config(m)->vocab_size && s->logprobs[j] <= 0,
		           "token %lld: id %lld, log-prob %g", (long long)j, (long long)s->tokens[j], s->logprobs[j]);
	if (s->T <= 256) {
		float *lp = calloc((size_t)s->T + 1, sizeof(float));
		hi3_replay_report r;
		rc = lp ? hi3_replay(m, c, s, &(hi3_replay_opts){.routing_recorded = s->route_ids != NULL}, lp, &r, &err) : -1;
		FUZZ_CHECK(rc == 0, "an imported rollout does not replay: %s", err.msg);
		hi3_replay_report_release(&r);
		free(lp);
	}
	hi3_segment_close(s);
	hi3_cond_close(c);
}

HI3_FUZZ_TARGET(rollout, init, one)
