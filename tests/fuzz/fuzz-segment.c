/* fuzz-segment.c -- hi3_segment_open on any bytes (lib/format/segment.c):
 * an opened segment's rows tile its tokens (cu_seqlens from 0 to T, never
 * decreasing), and the segment hi3 writes from it reopens the same. */
#include <string.h>
#include "core/internal.h"
#include "fuzz/fuzz.h"

static void one(const uint8_t *data, size_t size)
{
	const char *path = fuzz_write("in.segment.safetensors", data, size), *out = fuzz_path("out.segment");
	hi3_segment *s = NULL, *back = NULL;
	hi3_error err = {0};
	int rc = hi3_segment_open(&s, path, &err);

	fuzz_check_status(rc, &err, "hi3_segment_open");
	if (rc != 0) {
		FUZZ_CHECK(s == NULL, "a failed open left a segment");
		return;
	}
	FUZZ_CHECK(s->B >= 1 && s->T >= 0 && s->cu_seqlens[0] == 0 && s->cu_seqlens[s->B] == s->T, "B %d, T %lld",
	           s->B, (long long)s->T);
	for (int i = 0; i < s->B; i++)
		FUZZ_CHECK(s->cu_seqlens[i] <= s->cu_seqlens[i + 1], "row %d: cu_seqlens decreases", i);
	FUZZ_CHECK(!s->route_ids || (s->n_moe >= 0 && s->k >= 0 && s->route_w), "routing %d x %d", s->n_moe, s->k);
	rc = hi3_segment_write(s, out, &err);
	FUZZ_CHECK(rc == 0, "hi3_segment_write of an opened segment: %s", err.msg);
	rc = hi3_segment_open(&back, out, &err);
	FUZZ_CHECK(rc == 0, "a segment hi3 wrote does not reopen: %s", err.msg);
	FUZZ_CHECK(back->B == s->B && back->T == s->T && (!s->route_ids) == (!back->route_ids) &&
	           back->n_moe == s->n_moe && back->k == s->k, "reopened: B %d/%d, T %lld/%lld", s->B, back->B,
	           (long long)s->T, (long long)back->T);
	FUZZ_CHECK(!memcmp(s->tokens, back->tokens, 8 * (size_t)s->T) &&
	           !memcmp(s->logprobs, back->logprobs, 4 * (size_t)s->T) &&
	           !memcmp(s->cu_seqlens, back->cu_seqlens, 8 * (size_t)(s->B + 1)) &&
	           !memcmp(s->stop_reason, back->stop_reason, (size_t)s->B), "reopened tensors differ");
	hi3_segment_close(back);
	hi3_segment_close(s);
}

HI3_FUZZ_TARGET(segment, NULL, one)
