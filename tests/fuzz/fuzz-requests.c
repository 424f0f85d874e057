/* fuzz-requests.c -- hi3_requests_parse on any text (lib/cond/request.c).
 * A failure names FUZZ:LINE (or the input); an accepted request is one
 * the template can take: lines in order, a pre-tokenized row or a prompt,
 * a known mode and bot_task, image sizes in range (or "auto": a text
 * stage chooses the size), image files named. */
#include <stdio.h>
#include <string.h>
#include "cond/cond-internal.h"
#include "fuzz/fuzz.h"

static void one(const uint8_t *data, size_t size)
{
	hi3_requests *rq = NULL;
	hi3_error err = {0};
	int rc = hi3_requests_parse(&rq, (const char *)data, size, "fuzz.jsonl", &err), lines = 1;

	fuzz_check_status(rc, &err, "hi3_requests_parse");
	if (rc != 0) {
		FUZZ_CHECK(rq == NULL && err.status == HI3_ERR_INPUT && !strncmp(err.msg, "fuzz.jsonl", 10),
		           "a refused request is not an input error naming the file: %s", err.msg);
		return;
	}
	for (size_t i = 0; i < size; i++)
		lines += data[i] == '\n';
	FUZZ_CHECK(hi3_requests_count(rq) >= 1, "no requests accepted");
	for (int i = 0; i < rq->n; i++) {
		const struct hi3i_request *r = &rq->r[i];

		FUZZ_CHECK(r->line >= 1 && r->line <= lines && (i == 0 || r->line > rq->r[i - 1].line),
		           "request %d on line %d of %d", i, r->line, lines);
		FUZZ_CHECK((r->tokens != NULL) + (r->prompt != NULL) == 1, "request %d: tokens %s, prompt %s", i,
		           r->tokens ? "given" : "absent", r->prompt ? "given" : "absent");
		FUZZ_CHECK(r->mode == HI3I_GEN_TEXT || r->size_kind != 0 || r->size_auto,
		           "request %d: gen_image without a size and not \"auto\"", i);
		FUZZ_CHECK(!r->size_auto || r->size_kind == 0, "request %d: image_size auto with a size", i);
		FUZZ_CHECK(r->n_cond >= 0 && (r->n_cond == 0 || r->cond) && r->n_stops >= 0,
		           "request %d: %d cond images, %d stops", i, r->n_cond, r->n_stops);
		/* "images" get their sizes when read (hi3_requests_load_images): here, names */
		for (int k = 0; k < r->n_cond; k++)
			FUZZ_CHECK(r->image_paths ? r->image_paths[k] && r->image_paths[k][0] && !r->images[k]
			                          : r->cond[k][0] >= 1 && r->cond[k][1] >= 1,
			           "request %d: cond image %d is %lldx%lld (%s)", i, k, (long long)r->cond[k][0],
			           (long long)r->cond[k][1], r->image_paths ? "a file" : "a size");
		FUZZ_CHECK(r->size_kind != 1 || (r->size_h >= 1 && r->size_w >= 1), "request %d: image %lldx%lld", i,
		           (long long)r->size_h, (long long)r->size_w);
	}
	FUZZ_CHECK(hi3_requests_need_tokenizer(rq) == 0 || hi3_requests_need_tokenizer(rq) == 1, "need_tokenizer");
	hi3_requests_free(rq);
}

HI3_FUZZ_TARGET(requests, NULL, one)
