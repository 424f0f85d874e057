/* fuzz-conditions.c -- hi3_cond_open on any bytes (lib/format/conditions.c):
 * an opened file passes the checks the stages rely on (real_pos, pads,
 * blocks), is checked against the tiny-moe model without harm, and what
 * hi3 writes from it reopens the same (fuzz_cond_round_trip). */
#include <string.h>
#include "core/internal.h"
#include "fuzz/fuzz.h"

static int init(void)
{
	return fuzz_model() ? 0 : -1;
}

static void one(const uint8_t *data, size_t size)
{
	const char *path = fuzz_write("in.safetensors", data, size);
	hi3_cond *c = NULL;
	hi3_error err = {0};
	int rc = hi3_cond_open(&c, path, &err);

	fuzz_check_status(rc, &err, "hi3_cond_open");
	if (rc != 0) {
		FUZZ_CHECK(c == NULL, "a failed open left conditions");
		return;
	}
	FUZZ_CHECK(c->B >= 1 && c->L >= 1 && c->S >= 0 && c->NS >= 0 && c->K >= 0 && c->mode && c->requests &&
	           hi3_cond_cfg_factor(c) >= 1 && c->B % hi3_cond_cfg_factor(c) == 0,
	           "opened: B %d, L %d, S %d, NS %d, K %d", c->B, c->L, c->S, c->NS, c->K);
	for (int b = 0; b < c->B; b++) {
		FUZZ_CHECK(c->real_pos[b] >= 1 && c->real_pos[b] <= c->L, "row %d: real_pos %lld of L %d", b,
		           (long long)c->real_pos[b], c->L);
		for (int s = 0; s < c->S; s++) {
			const int32_t *blk = c->image_blocks + ((size_t)b * c->S + s) * 2;
			FUZZ_CHECK(blk[0] >= 0 && blk[0] <= blk[1] && blk[1] <= c->L, "row %d: block [%d, %d)", b, blk[0],
			           blk[1]);
		}
	}
	rc = hi3_cond_check_model(c, fuzz_model(), &err);
	fuzz_check_status(rc, &err, "hi3_cond_check_model");
	fuzz_cond_round_trip(c);
	hi3_cond_close(c);
}

HI3_FUZZ_TARGET(conditions, init, one)
