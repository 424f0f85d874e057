/* fuzz-kv.c -- the KV file opener hi3i_kv_open on any bytes
 * (lib/format/kv.c), for the tiny-moe model: an opened file's rows are
 * consistent (prompt and generated lengths inside L and max_new, kv_len
 * inside C) and their logits buffers inside the file; closing and opening
 * again (the repair of derived fields is idempotent) gives the same rows. */
#include <string.h>
#include "core/internal.h"
#include "format/kv.h"
#include "model/model.h"
#include "fuzz/fuzz.h"

static int init(void)
{
	return fuzz_model() ? 0 : -1;
}

static void check_rows(const hi3_kvfile *kv, const hi3_st *st, size_t size)
{
	const unsigned char *lo = (const unsigned char *)hi3_st_at(st, 0)->data, *hi = lo + (size - 8 -
	                          hi3_st_header_size(st));

	FUZZ_CHECK(kv->B >= 1 && kv->C == kv->L + kv->G && kv->L >= 0 && kv->G >= 0, "B %d, L %d, C %d, G %d", kv->B,
	           kv->L, kv->C, kv->G);
	for (int i = 0; i < kv->B; i++) {
		const unsigned char *lg = (const unsigned char *)hi3i_kv_logits((hi3_kvfile *)kv, i);

		FUZZ_CHECK(kv->prompt_len[i] >= 1 && kv->prompt_len[i] <= kv->L && kv->gen_len[i] >= 0 &&
		           kv->gen_len[i] <= kv->G && kv->kv_len[i] >= kv->prompt_len[i] && kv->kv_len[i] <= kv->C &&
		           kv->finished[i] <= 1, "row %d: prompt %lld, generated %lld, kv_len %lld", i,
		           (long long)kv->prompt_len[i], (long long)kv->gen_len[i], (long long)kv->kv_len[i]);
		FUZZ_CHECK(lg >= lo && lg + sizeof(float) * (size_t)kv->V <= hi, "row %d: logits outside the file", i);
	}
}

static void one(const uint8_t *data, size_t size)
{
	const char *path = fuzz_write("in.kv.safetensors", data, size);
	hi3_kvfile kv, again;
	hi3_error err = {0};
	int64_t *len;
	int rc = hi3i_kv_open(&kv, path, hi3i_model_facts(fuzz_model()), NULL, 1, &err);

	fuzz_check_status(rc, &err, "hi3i_kv_open");
	if (rc != 0)
		return;
	check_rows(&kv, kv.st, size);
	len = malloc(sizeof(int64_t) * (size_t)kv.B);
	FUZZ_CHECK(len, "out of memory");
	memcpy(len, kv.kv_len, sizeof(int64_t) * (size_t)kv.B);
	hi3i_kv_close(&kv);
	rc = hi3i_kv_open(&again, path, hi3i_model_facts(fuzz_model()), NULL, 1, &err);
	FUZZ_CHECK(rc == 0, "a KV file that opened (and was repaired) does not open again: %s", err.msg);
	FUZZ_CHECK(!memcmp(len, again.kv_len, sizeof(int64_t) * (size_t)again.B), "kv_len changed on reopening");
	free(len);
	hi3i_kv_close(&again);
}

HI3_FUZZ_TARGET(kv, init, one)
