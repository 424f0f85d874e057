/* fuzz-replay.c -- hi3_replay_file_open on any bytes (lib/format/replay.c):
 * an opened replay file's prompt routing rows tile its prompt tensors, and
 * the file hi3 writes from it reopens the same. */
#include <string.h>
#include "core/internal.h"
#include "fuzz/fuzz.h"

static void one(const uint8_t *data, size_t size)
{
	const char *path = fuzz_write("in.replay.safetensors", data, size), *out = fuzz_path("out.replay");
	hi3_replay_file *r = NULL, *back = NULL;
	hi3_error err = {0};
	int rc = hi3_replay_file_open(&r, path, &err);

	fuzz_check_status(rc, &err, "hi3_replay_file_open");
	if (rc != 0) {
		FUZZ_CHECK(r == NULL, "a failed open left a replay file");
		return;
	}
	FUZZ_CHECK(r->T >= 0 && (!r->route_ids || (r->B >= 1 && r->prompt_cu_seqlens[0] == 0)), "T %lld, B %d",
	           (long long)r->T, r->B);
	for (int i = 0; r->route_ids && i < r->B; i++)
		FUZZ_CHECK(r->prompt_cu_seqlens[i] <= r->prompt_cu_seqlens[i + 1], "row %d: prompt_cu_seqlens decreases",
		           i);
	rc = hi3_replay_file_write(r, out, &err);
	FUZZ_CHECK(rc == 0, "hi3_replay_file_write of an opened file: %s", err.msg);
	rc = hi3_replay_file_open(&back, out, &err);
	FUZZ_CHECK(rc == 0, "a replay file hi3 wrote does not reopen: %s", err.msg);
	FUZZ_CHECK(back->T == r->T && back->B == r->B && (!back->route_ids) == (!r->route_ids) &&
	           back->n_moe == r->n_moe && back->k == r->k && !memcmp(back->logprobs, r->logprobs, 4 * (size_t)r->T),
	           "reopened: T %lld/%lld, B %d/%d", (long long)r->T, (long long)back->T, r->B, back->B);
	hi3_replay_file_close(back);
	hi3_replay_file_close(r);
}

HI3_FUZZ_TARGET(replay, NULL, one)
