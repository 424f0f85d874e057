/* fuzz-tokenizer.c -- hi3_tok_load on any tokenizer.json (lib/tok/), then
 * the loaded tokenizer on fixed probes and on ids taken from the input:
 * every call keeps the error contract, ids stay in the vocabulary, and a
 * decode is valid UTF-8 of the length it reports. */
#include <string.h>
#include "core/internal.h"
#include "tok/tok.h"
#include "fuzz/fuzz.h"

static const char *const probes[] = {
	"", "a", "hello world", "  two  spaces\n\ttab", "caf\xc3\xa9 na\xc3\xafve \xe2\x82\xac 12345",
	"\xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80 <|endoftext|> <s></s>", "don't I'll 3.14 x=1+2",
};

static void check_decode(const hi3_tok *t, const int64_t *ids, size_t n, int flags)
{
	hi3_error err = {0};
	char *text = NULL;
	size_t len = 0;
	int rc = hi3_tok_decode(t, ids, n, flags, &text, &len, &err);

	fuzz_check_status(rc, &err, "hi3_tok_decode");
	FUZZ_CHECK(rc == 0, "ids the tokenizer made (or has) do not decode: %s", err.msg);
	FUZZ_CHECK(text && text[len] == '\0' && hi3i_utf8_valid_prefix(text, len) == len,
	           "decode is not valid UTF-8 of its length %zu", len);
	free(text);
}

static void one(const uint8_t *data, size_t size)
{
	const char *path = fuzz_write("tokenizer.json", data, size);
	hi3_error err = {0};
	hi3_tok *t = NULL;
	int64_t V, ids[64];
	size_t n_ids = 0;
	int rc = hi3_tok_load(&t, path, &err);

	fuzz_check_status(rc, &err, "hi3_tok_load");
	if (rc != 0) {
		FUZZ_CHECK(t == NULL, "a failed load left a tokenizer");
		return;
	}
	V = hi3_tok_vocab_size(t);
	FUZZ_CHECK(V >= 0 && strlen(hi3_tok_hash(t)) == 16, "vocab %lld", (long long)V);
	for (size_t p = 0; p < HI3_ARRAY_SIZE(probes); p++) {
		for (int flags = 0; flags <= HI3_TOK_SPECIAL; flags += HI3_TOK_SPECIAL) {
			int64_t *enc = NULL;
			size_t n = 0;

			rc = hi3_tok_encode(t, probes[p], strlen(probes[p]), flags, &enc, &n, &err);
			fuzz_check_status(rc, &err, "hi3_tok_encode");
			if (rc != 0)
				continue;
			for (size_t i = 0; i < n; i++)
				FUZZ_CHECK(enc[i] >= 0 && enc[i] < V, "id %lld outside the vocabulary of %lld",
				           (long long)enc[i], (long long)V);
			check_decode(t, enc, n, flags);
			free(enc);
		}
	}
	/* ids from the tail of the input, folded into the vocabulary */
	for (size_t i = 0; V > 0 && i + 2 <= size && n_ids < HI3_ARRAY_SIZE(ids); i += 2) {
		int64_t id = (data[size - 1 - i] | data[size - 2 - i] << 8) % V;
		if (hi3_tok_token(t, id))
			ids[n_ids++] = id;
	}
	check_decode(t, ids, n_ids, HI3_TOK_SPECIAL);
	check_decode(t, ids, n_ids, 0);
	for (size_t i = 0; i < n_ids; i++) {
		const char *tok = hi3_tok_token(t, ids[i]);
		FUZZ_CHECK(tok && hi3_tok_id(t, tok) >= 0, "token of id %lld is not found again", (long long)ids[i]);
	}
	hi3_tok_free(t);
}

HI3_FUZZ_TARGET(tokenizer, NULL, one)
