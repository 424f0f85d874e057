/*
 * tok.h -- internals of the tokenizer, shared by tok.c (loading, added
 * tokens, BPE, encode/decode) and pretok.c (regexes, normalizers,
 * pre-tokenizers). Not installed.
 *
 * Encoding follows the Hugging Face `tokenizers` pipeline: added tokens are
 * cut out of the text first, the remaining segments are normalized, split
 * into pieces by the pre-tokenizer, and each piece is encoded by the BPE
 * model. Strings live in a growable byte arena and are referred to by
 * (offset, length) so the arena may move while they are being built.
 */
#ifndef HI3_TOK_H
#define HI3_TOK_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>
#include "core/internal.h"
#include "tok/hi3-tok.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

/* A growable byte arena. */
struct tok_buf {
	char *p;
	size_t n, cap;
};

/* A piece of text inside an arena. */
struct tok_span {
	size_t off, len;
};

/* A list of spans. */
struct tok_spans {
	struct tok_span *v;
	size_t n, cap;
};

/* A compiled pattern: a regex in Oniguruma syntax translated for PCRE2, or
 * a literal string. */
struct tok_re {
	pcre2_code *code;
	int jit;
};

/* How a split treats its delimiters (the `behavior` field). */
enum tok_split_behavior {
	TOK_ISOLATED, TOK_REMOVED, TOK_MERGED_PREV, TOK_MERGED_NEXT, TOK_CONTIGUOUS,
};

struct tok_norm;
struct tok_pre;

/* Per-call scratch shared by the pipeline stages. */
struct tok_work {
	struct tok_buf buf;              /* the arena all spans point into */
	struct tok_spans a, b;           /* two span lists the stages swap */
	pcre2_match_data *md;
	struct tok_range *ranges;        /* find_matches output */
	size_t n_ranges, cap_ranges;
};

/* One (start, end, is_match) triple of a split, relative to the piece. */
struct tok_range {
	size_t start, end;
	int match;
};

/* Make room for element n of the array arr of cap elements (doubling, 64 at
 * first); when out of memory, set err and run on_fail. */
#define TOK_GROW(arr, n, cap, err, on_fail)                                              \
	do {                                                                             \
		if ((n) >= (cap)) {                                                      \
			size_t cap_ = (cap) ? 2 * (cap) : 64;                            \
			void *p_ = realloc((arr), cap_ * sizeof(*(arr)));                \
			if (!p_) {                                                       \
				hi3_error_set((err), HI3_ERR_RUNTIME, "tokenizer: out of memory"); \
				on_fail;                                                 \
			}                                                                \
			(arr) = p_;                                                      \
			(cap) = cap_;                                                    \
		}                                                                        \
	} while (0)

/* Arena and list helpers; each returns 0 or -1 (out of memory, err set). */
int hi3i_tok_buf_reserve(struct tok_buf *b, size_t extra, hi3_error *err);
int hi3i_tok_buf_add(struct tok_buf *b, const void *data, size_t n, hi3_error *err);
int hi3i_tok_spans_add(struct tok_spans *s, size_t off, size_t len, hi3_error *err);
void hi3i_tok_work_release(struct tok_work *w);

/* UTF-8: length of the valid prefix of s (n when all valid). */
size_t hi3i_utf8_valid_prefix(const char *s, size_t n);
/* Decode the code point at s, which has n > 0 bytes left; *len gets its
 * byte length. Meant for valid UTF-8, but never reads past s + n: a
 * truncated sequence or a stray byte reads as U+FFFD of length 1. */
uint32_t hi3i_utf8_get(const char *s, size_t n, size_t *len);
/* Encode cp; returns the byte count (1..4). */
int hi3i_utf8_put(uint32_t cp, char out[4]);

/* The GPT-2 byte-to-character map: byte b stands for code point
 * hi3i_tok_byte_cp(b) (0x21..0x7e, 0xa1..0xac, 0xae..0xff map to
 * themselves, the rest to 0x100 + n in byte order). */
uint32_t hi3i_tok_byte_cp(int b);
/* The inverse: the byte for cp, or -1 when cp stands for no byte. */
int hi3i_tok_cp_byte(uint32_t cp);

/* White space as the `tokenizers` library sees it (Unicode White_Space). */
int hi3i_tok_is_space(uint32_t cp);

/* Compile a pattern. regex: Oniguruma syntax (translated); otherwise a
 * literal string. what names the component in error messages. */
int hi3i_tok_re_compile(struct tok_re *re, const char *pat, size_t len, int regex, const char *what,
                        hi3_error *err);
void hi3i_tok_re_release(struct tok_re *re);
/* Split s[0..n) into matched and unmatched ranges, in order, the way the
 * `tokenizers` library iterates Oniguruma matches (w->ranges). */
int hi3i_tok_re_ranges(const struct tok_re *re, const char *s, size_t n, struct tok_work *w,
                       hi3_error *err);

/* Normalizers: parse a tokenizer.json "normalizer" value (NULL or JSON null
 * gives *out = NULL); apply one to s[0..n), appending the result to w->buf
 * and returning its span. */
int hi3i_tok_norm_parse(struct tok_norm **out, json_t *js, const char *path, hi3_error *err);
void hi3i_tok_norm_free(struct tok_norm *nm);
int hi3i_tok_norm_apply(const struct tok_norm *nm, struct tok_work *w, struct tok_span in,
                        struct tok_span *out, hi3_error *err);

/* Pre-tokenizers: parse a "pre_tokenizer" value; apply one to the spans in
 * w->a, leaving the resulting non-empty pieces in w->a. */
int hi3i_tok_pre_parse(struct tok_pre **out, json_t *js, const char *path, hi3_error *err);
void hi3i_tok_pre_free(struct tok_pre *pt);
int hi3i_tok_pre_apply(const struct tok_pre *pt, struct tok_work *w, hi3_error *err);

/* Fast reading of model.vocab and model.merges (json.c). */
struct tok_jspan {
	size_t start, end;               /* the value's bytes */
	size_t count;                    /* members or elements */
	int found;
};

struct tok_jiter {
	const char *s, *path;
	size_t i, end, n;
	int done;
	struct tok_buf a, b;             /* decoded strings with escapes */
};

/* Locate the two members; -1 (err: line and column) when the text is not
 * well-formed around them. Absent members have found == 0. */
int hi3i_tok_json_find_model(const char *s, size_t n, struct tok_jspan *vocab, struct tok_jspan *merges,
                             const char *path, hi3_error *err);
/* Replace a located object or array by {} or [] (newlines kept). */
void hi3i_tok_json_blank(char *s, const struct tok_jspan *sp);
/* Iterate over an object (open '{') or array ('['); -1 if the span is not one. */
int hi3i_tok_json_iter(struct tok_jiter *it, const char *s, const struct tok_jspan *sp, char open, const char *path,
                       hi3_error *err);
void hi3i_tok_json_iter_release(struct tok_jiter *it);
/* Next "key": integer member (val -1 when not a non-negative integer):
 * 1, 0 at the end, -1 on error. Key and value may point into the iterator. */
int hi3i_tok_json_next_entry(struct tok_jiter *it, const char **key, size_t *klen, int64_t *val, hi3_error *err);
/* Next merge: a string (b NULL) or a pair of strings: 1, 0 at the end, 2 when
 * the element is neither, -1 on error. */
int hi3i_tok_json_next_merge(struct tok_jiter *it, const char **a, size_t *na, const char **b, size_t *nb,
                             hi3_error *err);

/* Read a boolean field that may be absent (then def). -1 if present but not
 * a boolean. */
int hi3i_tok_json_bool(json_t *obj, const char *key, int def);

#endif
