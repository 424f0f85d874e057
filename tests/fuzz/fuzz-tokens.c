/* fuzz-tokens.c -- encode and decode (lib/tok/) on the test tokenizers:
 * the tiny preset's and those of tests/fixtures/tok. Input: byte 0 picks
 * the tokenizer, byte 1 the mode (bit 0: special tokens; bit 1: decode
 * instead of encode), the rest is text, or ids as 16-bit little-endian
 * numbers. Valid UTF-8 always encodes, to ids in the vocabulary, and
 * decodes back to itself on the tokenizers that are meant to round-trip;
 * ids decode exactly when they are all in the vocabulary, to valid UTF-8. */
#include <string.h>
#include "core/internal.h"
#include "tok/tok.h"
#include "fuzz/fuzz.h"

static const struct {
	const char *name;          /* tests/fixtures/tok/NAME.json; "init": the tiny preset's */
	int round_trip;            /* decode(encode(s)) == s: no normalizer, nothing removed or added */
} names[] = {
	{"init", 1}, {"bpe", 1}, {"deepseek-style", 1}, {"ignore-merges", 1}, {"split-isolated-digits", 1},
	{"split-next-invert", 1}, {"split-prev", 1}, {"qwen2-style", 0}, {"regex-onig", 0}, {"nfkc-lower", 0},
	{"split-removed", 0}, {"split-contiguous", 0}, {"gpt2-prefix", 0}, {"nfc-replace-prepend", 0},
	{"unk-prefix-nodecoder", 0},
};
static hi3_tok *toks[HI3_ARRAY_SIZE(names)];

static int init(void)
{
	for (size_t i = 0; i < HI3_ARRAY_SIZE(names); i++) {
		hi3_error err = {0};
		char *path = strcmp(names[i].name, "init")
		                     ? hi3i_asprintf("%s/tests/fixtures/tok/%s.json", fuzz_srcdir(), names[i].name)
		                     : hi3i_asprintf("%s/tokenizer.json", fuzz_model_dir());
		int rc = hi3_tok_load(&toks[i], path, &err);

		if (rc != 0)
			fprintf(stderr, "fuzz: tokens: %s\n", err.msg);
		free(path);
		if (rc != 0)
			return -1;
	}
	return 0;
}

static void encode(size_t which, int flags, const char *s, size_t n)
{
	const hi3_tok *t = toks[which];
	hi3_error err = {0};
	int64_t *ids = NULL;
	char *back = NULL;
	size_t n_ids = 0, len = 0;
	int valid = hi3i_utf8_valid_prefix(s, n) == n;
	int rc = hi3_tok_encode(t, s, n, flags, &ids, &n_ids, &err);

	fuzz_check_status(rc, &err, "hi3_tok_encode");
	FUZZ_CHECK(valid ? rc == 0 : rc == -1 && err.status == HI3_ERR_INPUT,
	           "%s: encode of %s UTF-8: rc %d: %s", names[which].name, valid ? "valid" : "invalid", rc, err.msg);
	if (rc != 0)
		return;
	for (size_t i = 0; i < n_ids; i++)
		FUZZ_CHECK(ids[i] >= 0 && ids[i] < hi3_tok_vocab_size(t), "%s: id %lld outside the vocabulary",
		           names[which].name, (long long)ids[i]);
	rc = hi3_tok_decode(t, ids, n_ids, flags, &back, &len, &err);
	FUZZ_CHECK(rc == 0, "%s: the ids of an encode do not decode: %s", names[which].name, err.msg);
	FUZZ_CHECK(hi3i_utf8_valid_prefix(back, len) == len && back[len] == '\0', "%s: decode is not UTF-8",
	           names[which].name);
	if (names[which].round_trip)
		FUZZ_CHECK(len == n && !memcmp(back, s, n), "%s: %zu bytes encode to %zu ids that decode to %zu other "
		           "bytes", names[which].name, n, n_ids, len);
	free(ids);
	free(back);
}

static void decode(size_t which, int flags, const uint8_t *p, size_t n)
{
	const hi3_tok *t = toks[which];
	int64_t V = hi3_tok_vocab_size(t), *ids = malloc(sizeof(int64_t) * (n / 2 + 1));
	hi3_error err = {0};
	char *text = NULL;
	size_t n_ids = n / 2, len = 0;
	int all_known = 1, rc;

	FUZZ_CHECK(ids, "out of memory");
	for (size_t i = 0; i < n_ids; i++) {
		/* mostly ids of the vocabulary, sometimes one past it or negative */
		int v = p[2 * i] | p[2 * i + 1] << 8;
		ids[i] = v >= 0xfff0 ? (v == 0xffff ? -1 : V + (v - 0xfff0)) : v % (V + 1);
		all_known &= hi3_tok_token(t, ids[i]) != NULL;
	}
	rc = hi3_tok_decode(t, ids, n_ids, flags, &text, &len, &err);
	fuzz_check_status(rc, &err, "hi3_tok_decode");
	FUZZ_CHECK(all_known ? rc == 0 : rc == -1 && err.status == HI3_ERR_INPUT, "%s: decode rc %d: %s",
	           names[which].name, rc, err.msg);
	if (rc == 0)
		FUZZ_CHECK(text[len] == '\0' && hi3i_utf8_valid_prefix(text, len) == len,
		           "%s: decode of %zu ids is not UTF-8 of its length %zu", names[which].name, n_ids, len);
	free(text);
	free(ids);
}

static void one(const uint8_t *data, size_t size)
{
	size_t which;
	int flags;

	if (size < 2)
		return;
	which = data[0] % HI3_ARRAY_SIZE(names);
	flags = data[1] & 1 ? HI3_TOK_SPECIAL : 0;
	if (data[1] & 2)
		decode(which, flags, data + 2, size - 2);
	else
		encode(which, flags, (const char *)data + 2, size - 2);
}

HI3_FUZZ_TARGET(tokens, init, one)
