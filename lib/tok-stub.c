/* tok-stub.c -- placeholder until the tokenizer (lib/tok.c) is merged:
 * every load fails, so only pre-tokenized requests work. */
#include "internal.h"

int hi3_tok_load(hi3_tok **out, const char *path, hi3_error *err)
{
	*out = NULL;
	return hi3_error_set(err, HI3_ERR_RUNTIME, "%s: the tokenizer is not built yet", path);
}

void hi3_tok_free(hi3_tok *t) { (void)t; }

int hi3_tok_encode(const hi3_tok *t, const char *text, size_t len, int flags, int64_t **ids, size_t *n,
                   hi3_error *err)
{
	(void)t, (void)text, (void)len, (void)flags, (void)ids, (void)n;
	return hi3_error_set(err, HI3_ERR_RUNTIME, "the tokenizer is not built yet");
}

int64_t hi3_tok_id(const hi3_tok *t, const char *token) { (void)t, (void)token; return -1; }
int64_t hi3_tok_vocab_size(const hi3_tok *t) { (void)t; return 0; }
const char *hi3_tok_hash(const hi3_tok *t) { (void)t; return ""; }
