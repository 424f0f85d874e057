/*
 * hi3-tok.h -- the public interface of lib/tok/: the tokenizer.json
 * tokenizer.
 * Part of hi3.h, the public interface: its conventions hold here.
 */
#ifndef HI3_LAYER_TOK_H
#define HI3_LAYER_TOK_H

#include "../core/hi3-core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* -------------------------------------------------------------- tokenizer */

/* A Hugging Face tokenizer.json (byte-level BPE with regex pre-tokenizers,
 * added/special tokens), encoding exactly as the `tokenizers` library. */
typedef struct hi3_tok hi3_tok;

enum hi3_tok_flags {
	HI3_TOK_SPECIAL = 1,      /* encode: match added tokens in the text; decode: emit special tokens */
	HI3_TOK_CLEAN_UP = 2,     /* decode: then transformers' clean_up_tokenization (" ." to ".", " n't"
	                           * to "n't", ...), as a tokenizer_config.json with
	                           * clean_up_tokenization_spaces true asks */
	HI3_TOK_SKIP_UNKNOWN = 4, /* decode: leave out ids the tokenizer has no token for, as `tokenizers`
	                           * does, instead of refusing them */
};

int hi3_tok_load(hi3_tok **out, const char *path, hi3_error *err);
void hi3_tok_free(hi3_tok *t);
/* Encode len bytes of UTF-8 text; *ids is malloc'd (free it). No
 * begin/end tokens are added. */
int hi3_tok_encode(const hi3_tok *t, const char *text, size_t len, int flags, int64_t **ids, size_t *n,
                   hi3_error *err);
/* Decode ids to UTF-8; *text is malloc'd and NUL-terminated. */
int hi3_tok_decode(const hi3_tok *t, const int64_t *ids, size_t n, int flags, char **text, size_t *len,
                   hi3_error *err);
int64_t hi3_tok_id(const hi3_tok *t, const char *token);   /* -1 when absent */
const char *hi3_tok_token(const hi3_tok *t, int64_t id);   /* NULL when absent */
int64_t hi3_tok_vocab_size(const hi3_tok *t);              /* largest id + 1 */
const char *hi3_tok_hash(const hi3_tok *t);                /* 16 hex digits of the file's bytes */
/* The id of the token a tokenizer_config.json names under key (e.g.
 * "bos_token", "eos_token"; a string or an object with "content"). The
 * error names the file and the key when it is missing or unknown. */
int hi3_tok_config_id(const hi3_tok *t, const char *config_path, const char *key, int64_t *id,
                      hi3_error *err);

#ifdef __cplusplus
}
#endif
#endif /* HI3_LAYER_TOK_H */
