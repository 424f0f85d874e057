/*
 * pretok.c -- the text stages of the tokenizer: Oniguruma-style regexes on
 * PCRE2, normalizers and pre-tokenizers of a Hugging Face tokenizer.json.
 *
 * `tokenizers` compiles its regexes with Oniguruma (Ruby-like syntax), so a
 * pattern is translated before PCRE2 sees it: \s, \w, \d, \h and \b get
 * Oniguruma's Unicode meaning, ^ and $ match at every line, (?m) means
 * dot-all, and \uHHHH and {,n} are spelled the PCRE2 way; \C is refused.
 * Matches are then iterated exactly as the Rust `onig` crate does, empty
 * matches included.
 */
#include <string.h>
#include <utf8proc.h>
#include "tok/tok.h"

/* ------------------------------------------------------------- arenas */

int hi3i_tok_buf_reserve(struct tok_buf *b, size_t extra, hi3_error *err)
{
	size_t cap;
	char *p;

	if (b->n + extra <= b->cap)
		return 0;
	cap = b->cap ? b->cap : 4096;
	while (cap < b->n + extra)
		cap *= 2;
	p = realloc(b->p, cap);
	if (!p)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "tokenizer: out of memory");
	b->p = p;
	b->cap = cap;
	return 0;
}

int hi3i_tok_buf_add(struct tok_buf *b, const void *data, size_t n, hi3_error *err)
{
	if (hi3i_tok_buf_reserve(b, n, err))
		return -1;
	if (n)
		memcpy(b->p + b->n, data, n);
	b->n += n;
	return 0;
}

int hi3i_tok_spans_add(struct tok_spans *s, size_t off, size_t len, hi3_error *err)
{
	TOK_GROW(s->v, s->n, s->cap, err, return -1);
	s->v[s->n].off = off;
	s->v[s->n].len = len;
	s->n++;
	return 0;
}

static int ranges_add(struct tok_work *w, size_t start, size_t end, int match, hi3_error *err)
{
	TOK_GROW(w->ranges, w->n_ranges, w->cap_ranges, err, return -1);
	w->ranges[w->n_ranges].start = start;
	w->ranges[w->n_ranges].end = end;
	w->ranges[w->n_ranges].match = match;
	w->n_ranges++;
	return 0;
}

void hi3i_tok_work_release(struct tok_work *w)
{
	free(w->buf.p);
	free(w->a.v);
	free(w->b.v);
	free(w->ranges);
	if (w->md)
		pcre2_match_data_free(w->md);
	memset(w, 0, sizeof(*w));
}

/* --------------------------------------------------------------- UTF-8 */

size_t hi3i_utf8_valid_prefix(const char *str, size_t n)
{
	const unsigned char *s = (const unsigned char *)str;
	size_t i = 0;

	while (i < n) {
		unsigned c = s[i];
		size_t k;
		uint32_t cp;

		if (c < 0x80) {
			i++;
			continue;
		}
		if (c >= 0xc2 && c <= 0xdf)
			k = 1, cp = c & 0x1f;
		else if (c >= 0xe0 && c <= 0xef)
			k = 2, cp = c & 0x0f;
		else if (c >= 0xf0 && c <= 0xf4)
			k = 3, cp = c & 0x07;
		else
			return i;
		for (size_t j = 1; j <= k; j++) {
			if (i + j >= n || (s[i + j] & 0xc0) != 0x80)
				return i;
			cp = (cp << 6) | (s[i + j] & 0x3f);
		}
		if ((k == 2 && cp < 0x800) || (k == 3 && (cp < 0x10000 || cp > 0x10ffff)) ||
		    (cp >= 0xd800 && cp <= 0xdfff))
			return i;
		i += k + 1;
	}
	return n;
}

uint32_t hi3i_utf8_get(const char *str, size_t n, size_t *len)
{
	const unsigned char *s = (const unsigned char *)str;
	size_t k = s[0] < 0xc0 ? 1 : s[0] < 0xe0 ? 2 : s[0] < 0xf0 ? 3 : 4;
	uint32_t cp;

	HI3_ASSERT(n > 0);
	*len = 1;
	if (k == 1)
		return s[0] < 0x80 ? s[0] : 0xfffd;
	if (k > n)
		return 0xfffd;
	cp = s[0] & (0x7f >> k);
	for (size_t j = 1; j < k; j++) {
		if ((s[j] & 0xc0) != 0x80)
			return 0xfffd;
		cp = (cp << 6) | (s[j] & 0x3f);
	}
	*len = k;
	return cp;
}

int hi3i_utf8_put(uint32_t cp, char out[4])
{
	if (cp < 0x80) {
		out[0] = (char)cp;
		return 1;
	}
	if (cp < 0x800) {
		out[0] = (char)(0xc0 | (cp >> 6));
		out[1] = (char)(0x80 | (cp & 0x3f));
		return 2;
	}
	if (cp < 0x10000) {
		out[0] = (char)(0xe0 | (cp >> 12));
		out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
		out[2] = (char)(0x80 | (cp & 0x3f));
		return 3;
	}
	out[0] = (char)(0xf0 | (cp >> 18));
	out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
	out[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
	out[3] = (char)(0x80 | (cp & 0x3f));
	return 4;
}

/* ------------------------------------------------------ byte-level map */

static int byte_is_printable(int b)
{
	return (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
}

uint32_t hi3i_tok_byte_cp(int b)
{
	static uint32_t map[256];
	static int ready;

	if (!ready) {
		uint32_t n = 0;
		for (int i = 0; i < 256; i++)
			map[i] = byte_is_printable(i) ? (uint32_t)i : 256 + n++;
		ready = 1;
	}
	return map[b & 0xff];
}

int hi3i_tok_cp_byte(uint32_t cp)
{
	if (cp < 256)
		return byte_is_printable((int)cp) ? (int)cp : -1;
	if (cp < 256 + 68) {
		uint32_t n = cp - 256;
		for (int b = 0; b < 256; b++)
			if (!byte_is_printable(b) && n-- == 0)
				return b;
	}
	return -1;
}

/* ------------------------------------------------- character classes */

int hi3i_tok_is_space(uint32_t cp)
{
	return (cp >= 0x09 && cp <= 0x0d) || cp == 0x20 || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
	       (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
	       cp == 0x3000;
}

/* Rust's char::is_numeric: general categories Nd, Nl, No. */
static int is_numeric(uint32_t cp)
{
	utf8proc_category_t c;

	if (cp < 0x80)
		return cp >= '0' && cp <= '9';
	c = utf8proc_category((utf8proc_int32_t)cp);
	return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

/* ------------------------------------------------------------- regexes */

/* Oniguruma's Unicode meaning of the class escapes, as PCRE2 class items
 * (measured against the `tokenizers` library over every code point). */
#define WS_ITEMS "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}" \
	"\\x{202F}\\x{205F}\\x{3000}"
/* Oniguruma's word characters: letters, marks, decimal and letter numbers,
 * connector punctuation and the alphabetic symbols (circled and squared
 * letters); outside a bracket class \w also takes the Latin-1 superscript
 * digits and fractions. */
#define WORD_CLASS_ITEMS "\\p{L}\\p{M}\\p{Nd}\\p{Nl}\\p{Pc}\\x{24B6}-\\x{24E9}\\x{1F130}-\\x{1F149}" \
	"\\x{1F150}-\\x{1F169}\\x{1F170}-\\x{1F189}"
#define WORD_ITEMS WORD_CLASS_ITEMS "\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}"

static const char *class_items(char c, int in_class)
{
	switch (c) {
	case 's': case 'S':
		return WS_ITEMS;
	case 'w': case 'W':
		return in_class ? WORD_CLASS_ITEMS : WORD_ITEMS;
	case 'd': case 'D':
		return "\\p{Nd}";
	case 'h': case 'H':
		return "0-9a-fA-F";
	default:
		return NULL;
	}
}

struct xlate {
	struct tok_buf out;
	const char *pat, *what;
	size_t n, i;
	hi3_error *err;
};

static int xl_puts(struct xlate *x, const char *s)
{
	return hi3i_tok_buf_add(&x->out, s, strlen(s), x->err);
}

static int xl_put(struct xlate *x, const char *s, size_t n)
{
	return hi3i_tok_buf_add(&x->out, s, n, x->err);
}

static int xl_bad(struct xlate *x, const char *why)
{
	return hi3_error_set(x->err, HI3_ERR_INPUT, "%s: regex '%.*s': %s at offset %zu", x->what, (int)x->n, x->pat,
	                     why, x->i);
}

/* PCRE2's \C matches one byte: it would cut a UTF-8 character into pieces
 * that are not text. (Oniguruma's \C-x, a control character, is not
 * translated either.) Refused here, and compiled out by
 * PCRE2_NEVER_BACKSLASH_C in case some other spelling reaches PCRE2. */
#define NO_BACKSLASH_C "\\C (one byte, not one character) would split UTF-8 characters and is not supported"

/* \uHHHH at x->i (pointing at the backslash): write \x{HHHH}. */
static int xl_u4(struct xlate *x)
{
	const char *p = x->pat + x->i + 2;

	if (x->i + 6 > x->n)
		return xl_bad(x, "incomplete \\u escape");
	for (int k = 0; k < 4; k++)
		if (!strchr("0123456789abcdefABCDEF", p[k]) || !p[k])
			return xl_bad(x, "bad \\u escape");
	if (xl_puts(x, "\\x{") || xl_put(x, p, 4) || xl_puts(x, "}"))
		return -1;
	x->i += 6;
	return 0;
}

/* Length of the escape at x->i (backslash included) that is copied as is. */
static size_t escape_len(const struct xlate *x)
{
	size_t len = 1;

	if (x->i + 1 >= x->n)
		return 1;
	hi3i_utf8_get(x->pat + x->i + 1, x->n - x->i - 1, &len);
	return 1 + len;
}

/* A bracket class starting at x->i ('['). Items of negated escapes (\S, \W,
 * \D, \H) cannot be written inside a PCRE2 class, so such a class becomes a
 * group: [P\S] -> (?:[P]|[^WS]), [^P\S] -> (?:(?![P])[WS]). */
static int xl_class(struct xlate *x)
{
	struct tok_buf pos = {0};
	const char *neg[8];
	int n_neg = 0, negated = 0, rc = -1;
	size_t start = x->i;
	struct tok_buf saved = x->out;

	x->i++;
	if (x->i < x->n && x->pat[x->i] == '^')
		negated = 1, x->i++;
	/* collect the items into pos, reusing the out arena temporarily */
	x->out = pos;
	if (x->i < x->n && x->pat[x->i] == ']') {
		if (xl_puts(x, "\\]"))
			goto out;
		x->i++;
	}
	for (;;) {
		char c;

		if (x->i >= x->n) {
			x->i = start;
			xl_bad(x, "unterminated character class");
			goto out;
		}
		c = x->pat[x->i];
		if (c == ']') {
			x->i++;
			break;
		}
		if (c == '\\') {
			char e = x->i + 1 < x->n ? x->pat[x->i + 1] : 0;
			const char *items = class_items(e, 1);
			if (items && e >= 'a') {
				if (xl_puts(x, items))
					goto out;
				x->i += 2;
			} else if (items) {
				if (n_neg == (int)HI3_ARRAY_SIZE(neg)) {
					xl_bad(x, "too many negated escapes in one class");
					goto out;
				}
				neg[n_neg++] = items;
				x->i += 2;
			} else if (e == 'u') {
				if (xl_u4(x))
					goto out;
			} else if (e == 'C') {
				xl_bad(x, NO_BACKSLASH_C);
				goto out;
			} else {
				size_t len = escape_len(x);
				if (xl_put(x, x->pat + x->i, len))
					goto out;
				x->i += len;
			}
			continue;
		}
		if (c == '[') {
			if (x->i + 1 < x->n && x->pat[x->i + 1] == ':') {
				const char *end = strstr(x->pat + x->i, ":]");
				if (!end || (size_t)(end - x->pat) > x->n) {
					xl_bad(x, "unterminated POSIX class");
					goto out;
				}
				if (xl_put(x, x->pat + x->i, (size_t)(end - (x->pat + x->i)) + 2))
					goto out;
				x->i = (size_t)(end - x->pat) + 2;
				continue;
			}
			xl_bad(x, "nested character classes are not supported");
			goto out;
		}
		if (c == '&' && x->i + 1 < x->n && x->pat[x->i + 1] == '&') {
			xl_bad(x, "class intersection (&&) is not supported");
			goto out;
		}
		if (xl_put(x, &x->pat[x->i], 1))
			goto out;
		x->i++;
	}
	pos = x->out;
	x->out = saved;
	if (n_neg == 0) {
		if (xl_puts(x, negated ? "[^" : "[") || xl_put(x, pos.p, pos.n) || xl_puts(x, "]"))
			goto out_pos;
	} else if (!negated) {
		if (xl_puts(x, "(?:"))
			goto out_pos;
		if (pos.n && (xl_puts(x, "[") || xl_put(x, pos.p, pos.n) || xl_puts(x, "]|")))
			goto out_pos;
		for (int k = 0; k < n_neg; k++)
			if (xl_puts(x, k ? "|[^" : "[^") || xl_puts(x, neg[k]) || xl_puts(x, "]"))
				goto out_pos;
		if (xl_puts(x, ")"))
			goto out_pos;
	} else {
		if (xl_puts(x, "(?:"))
			goto out_pos;
		if (pos.n && (xl_puts(x, "(?![") || xl_put(x, pos.p, pos.n) || xl_puts(x, "])")))
			goto out_pos;
		for (int k = 0; k < n_neg; k++)
			if (xl_puts(x, k + 1 < n_neg ? "(?=[" : "[") || xl_puts(x, neg[k]) ||
			    xl_puts(x, k + 1 < n_neg ? "])" : "]"))
				goto out_pos;
		if (xl_puts(x, ")"))
			goto out_pos;
	}
	rc = 0;
out_pos:
	free(pos.p);
	return rc;
out:
	if (x->out.p != saved.p)
		free(x->out.p);
	x->out = saved;
	return -1;
}

static int translate(struct xlate *x)
{
	while (x->i < x->n) {
		char c = x->pat[x->i];

		if (c == '[') {
			if (xl_class(x))
				return -1;
			continue;
		}
		if (c == '\\') {
			char e = x->i + 1 < x->n ? x->pat[x->i + 1] : 0;
			const char *items = class_items(e, 0);
			size_t len = 2;
			int rc;
			if (items)
				rc = xl_puts(x, e >= 'a' ? "[" : "[^") || xl_puts(x, items) || xl_puts(x, "]");
			else if (e == 'b')
				rc = xl_puts(x, "(?:(?<=[" WORD_ITEMS "])(?![" WORD_ITEMS "])|(?<![" WORD_ITEMS "])(?=["
				             WORD_ITEMS "]))");
			else if (e == 'B')
				rc = xl_puts(x, "(?:(?<=[" WORD_ITEMS "])(?=[" WORD_ITEMS "])|(?<![" WORD_ITEMS "])(?!["
				             WORD_ITEMS "]))");
			else if (e == 'u')
				rc = xl_u4(x), len = 0;
			else if (e == 'C')
				return xl_bad(x, NO_BACKSLASH_C);
			else
				len = escape_len(x), rc = xl_put(x, x->pat + x->i, len);
			if (rc)
				return -1;
			x->i += len;
			continue;
		}
		if (c == '(' && x->i + 1 < x->n && x->pat[x->i + 1] == '?') {
			size_t j = x->i + 2;
			while (j < x->n && strchr("imx-", x->pat[j]) && x->pat[j])
				j++;
			if (j > x->i + 2 && j < x->n && (x->pat[j] == ':' || x->pat[j] == ')')) {
				/* an option group: Ruby's m is PCRE2's s */
				for (size_t k = x->i; k <= j; k++) {
					char o = x->pat[k] == 'm' && k >= x->i + 2 ? 's' : x->pat[k];
					if (xl_put(x, &o, 1))
						return -1;
				}
				x->i = j + 1;
				continue;
			}
			if (x->i + 2 < x->n && x->pat[x->i + 2] == '~')
				return xl_bad(x, "absent groups (?~...) are not supported");
		}
		if (c == '{' && x->i + 1 < x->n && x->pat[x->i + 1] == ',') {
			size_t j = x->i + 2;
			while (j < x->n && x->pat[j] >= '0' && x->pat[j] <= '9')
				j++;
			if (j > x->i + 2 && j < x->n && x->pat[j] == '}') {
				if (xl_puts(x, "{0"))
					return -1;
				x->i++;
				continue;
			}
		}
		if (xl_put(x, &c, 1))
			return -1;
		x->i++;
	}
	return 0;
}

int hi3i_tok_re_compile(struct tok_re *re, const char *pat, size_t len, int regex, const char *what,
                        hi3_error *err)
{
	struct xlate x = {.pat = pat, .n = len, .what = what, .err = err};
	pcre2_compile_context *cc = NULL;
	int ecode = 0;
	PCRE2_SIZE eoff = 0;
	uint32_t jit = 0;

	memset(re, 0, sizeof(*re));
	cc = pcre2_compile_context_create(NULL);
	if (!cc)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "tokenizer: out of memory");
	pcre2_set_newline(cc, PCRE2_NEWLINE_LF);
	if (regex) {
		if (translate(&x)) {
			free(x.out.p);
			pcre2_compile_context_free(cc);
			return -1;
		}
		re->code = pcre2_compile((PCRE2_SPTR)(x.out.p ? x.out.p : ""), x.out.n,
		                         PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE | PCRE2_NEVER_BACKSLASH_C, &ecode, &eoff,
		                         cc);
	} else {
		re->code = pcre2_compile((PCRE2_SPTR)pat, len, PCRE2_UTF | PCRE2_LITERAL, &ecode, &eoff, cc);
	}
	pcre2_compile_context_free(cc);
	if (!re->code) {
		PCRE2_UCHAR msg[256];
		pcre2_get_error_message(ecode, msg, sizeof(msg));
		hi3_error_set(err, HI3_ERR_INPUT, "%s: pattern '%.*s' does not compile: %s (offset %zu of '%.*s')",
		              what, (int)len, pat, (const char *)msg, (size_t)eoff, (int)x.out.n,
		              x.out.p ? x.out.p : pat);
		free(x.out.p);
		return -1;
	}
	free(x.out.p);
	pcre2_config(PCRE2_CONFIG_JIT, &jit);
	if (jit && pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE) == 0)
		re->jit = 1;
	return 0;
}

void hi3i_tok_re_release(struct tok_re *re)
{
	if (re->code)
		pcre2_code_free(re->code);
	re->code = NULL;
}

int hi3i_tok_re_ranges(const struct tok_re *re, const char *s, size_t n, struct tok_work *w, hi3_error *err)
{
	size_t prev = 0, last_end = 0;
	int skip_empty = 0;

	w->n_ranges = 0;
	if (n == 0)
		return ranges_add(w, 0, 0, 0, err);
	if (!w->md) {
		w->md = pcre2_match_data_create(1, NULL);
		if (!w->md)
			return hi3_error_set(err, HI3_ERR_RUNTIME, "tokenizer: out of memory");
	}
	while (last_end <= n) {
		PCRE2_SIZE *ov;
		size_t ms, me;
		int rc = re->jit ? pcre2_jit_match(re->code, (PCRE2_SPTR)s, n, last_end, 0, w->md, NULL)
		                 : pcre2_match(re->code, (PCRE2_SPTR)s, n, last_end, PCRE2_NO_UTF_CHECK, w->md, NULL);

		if (rc == PCRE2_ERROR_NOMATCH)
			break;
		if (rc < 0) {
			PCRE2_UCHAR msg[256];
			pcre2_get_error_message(rc, msg, sizeof(msg));
			return hi3_error_set(err, HI3_ERR_RUNTIME, "tokenizer: regex match failed: %s",
			                     (const char *)msg);
		}
		ov = pcre2_get_ovector_pointer(w->md);
		ms = ov[0];
		me = ov[1];
		if (ms > me)  /* \K past the end: take the match as empty at its end */
			ms = me;
		last_end = me;
		if (ms == me) {
			size_t len = 1;
			if (me < n)
				hi3i_utf8_get(s + me, n - me, &len);
			last_end += len;
			if (skip_empty) {
				skip_empty = 0;
				continue;
			}
		} else {
			skip_empty = 1;
		}
		if (prev != ms && ranges_add(w, prev, ms, 0, err))
			return -1;
		if (ranges_add(w, ms, me, 1, err))
			return -1;
		prev = me;
	}
	if (prev != n && ranges_add(w, prev, n, 0, err))
		return -1;
	return 0;
}

/* Matches of a character predicate, as `tokenizers` splits on a closure. */
static int pred_ranges(int (*pred)(uint32_t), const char *s, size_t n, struct tok_work *w, hi3_error *err)
{
	size_t last = 0, i = 0;

	w->n_ranges = 0;
	if (n == 0)
		return ranges_add(w, 0, 0, 0, err);
	while (i < n) {
		size_t len;
		uint32_t cp = hi3i_utf8_get(s + i, n - i, &len);
		if (pred(cp)) {
			if (last < i && ranges_add(w, last, i, 0, err))
				return -1;
			if (ranges_add(w, i, i + len, 1, err))
				return -1;
			last = i + len;
		}
		i += len;
	}
	if (n > last && ranges_add(w, last, n, 0, err))
		return -1;
	return 0;
}

/* Apply a split behaviour to w->ranges (in place), marking removed ranges
 * with match = -1. */
static void apply_behavior(struct tok_work *w, enum tok_split_behavior bh)
{
	struct tok_range *r = w->ranges;
	size_t n = w->n_ranges, k = 0;
	int prev = 0;

	switch (bh) {
	case TOK_ISOLATED:
		for (size_t i = 0; i < n; i++)
			r[i].match = 0;
		return;
	case TOK_REMOVED:
		for (size_t i = 0; i < n; i++)
			r[i].match = r[i].match ? -1 : 0;
		return;
	case TOK_CONTIGUOUS:
	case TOK_MERGED_PREV:
		for (size_t i = 0; i < n; i++) {
			int m = r[i].match;
			int join = bh == TOK_CONTIGUOUS ? m == prev : (m && !prev);
			if (join && k > 0) {
				r[k - 1].end = r[i].end;
			} else {
				r[k] = r[i];
				r[k].match = 0;
				k++;
			}
			prev = m;
		}
		w->n_ranges = k;
		return;
	case TOK_MERGED_NEXT:
		/* fold from the right; results collected from the end */
		k = n;
		for (size_t i = n; i-- > 0;) {
			int m = r[i].match;
			if (m && !prev && k < n) {
				r[k].start = r[i].start;
			} else {
				k--;
				r[k] = r[i];
				r[k].match = 0;
			}
			prev = m;
		}
		memmove(r, r + k, (n - k) * sizeof(*r));
		w->n_ranges = n - k;
		return;
	}
}

/* Append the kept, non-empty ranges of the piece at off to out. */
static int emit_ranges(struct tok_work *w, size_t off, struct tok_spans *out, hi3_error *err)
{
	for (size_t i = 0; i < w->n_ranges; i++) {
		const struct tok_range *r = &w->ranges[i];
		if (r->match >= 0 && r->end > r->start && hi3i_tok_spans_add(out, off + r->start, r->end - r->start, err))
			return -1;
	}
	return 0;
}

/* --------------------------------------------------------- normalizers */

enum norm_type { NORM_SEQUENCE, NORM_NFC, NORM_NFD, NORM_NFKC, NORM_NFKD, NORM_LOWERCASE, NORM_PREPEND,
	         NORM_REPLACE, NORM_STRIP };

struct tok_norm {
	enum norm_type type;
	void **kids;                /* Sequence: struct tok_norm * */
	size_t n_kids;
	char *text;                 /* Prepend: the prefix; Replace: the content */
	size_t text_len;
	struct tok_re re;           /* Replace */
	int strip_left, strip_right;
};

void hi3i_tok_norm_free(struct tok_norm *nm)
{
	if (!nm)
		return;
	for (size_t i = 0; i < nm->n_kids; i++)
		hi3i_tok_norm_free((struct tok_norm *)nm->kids[i]);
	free(nm->kids);
	free(nm->text);
	hi3i_tok_re_release(&nm->re);
	free(nm);
}

int hi3i_tok_json_bool(json_t *obj, const char *key, int def)
{
	json_t *v = json_object_get(obj, key);

	if (!v || json_is_null(v))
		return def;
	if (!json_is_boolean(v))
		return -1;
	return json_is_true(v);
}

/* The pattern object of Split and Replace: {"Regex": "..."} or {"String": "..."}. */
static int parse_pattern(struct tok_re *re, json_t *obj, const char *path, const char *what, hi3_error *err)
{
	json_t *pat = json_object_get(obj, "pattern"), *v;
	char where[160];
	int regex;

	snprintf(where, sizeof(where), "%s: %s", path, what);
	if (json_is_object(pat) && (v = json_object_get(pat, "Regex")) && json_is_string(v))
		regex = 1;
	else if (json_is_object(pat) && (v = json_object_get(pat, "String")) && json_is_string(v))
		regex = 0;
	else
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: expected \"pattern\": {\"Regex\": ...} or {\"String\": ...}",
		                     where);
	return hi3i_tok_re_compile(re, json_string_value(v), json_string_length(v), regex, where, err);
}

static const char *type_of(json_t *js)
{
	json_t *t = json_object_get(js, "type");
	return json_is_string(t) ? json_string_value(t) : NULL;
}

/* The components of a Sequence (a list under key), each parsed by one(). */
static int parse_seq(json_t *js, const char *key, const char *what, const char *path, void ***kids, size_t *n,
                     int (*one)(void **, json_t *, const char *, hi3_error *), hi3_error *err)
{
	json_t *list = json_object_get(js, key);

	if (!json_is_array(list))
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: %s 'Sequence' without a \"%s\" list", path, what, key);
	*kids = calloc(json_array_size(list) + 1, sizeof(**kids));
	if (!*kids)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "tokenizer: out of memory");
	for (size_t k = 0; k < json_array_size(list); k++) {
		if (one(&(*kids)[k], json_array_get(list, k), path, err))
			return -1;
		*n = k + 1;
	}
	return 0;
}

static int norm_one(void **out, json_t *js, const char *path, hi3_error *err)
{
	struct tok_norm *nm = NULL;
	int rc = hi3i_tok_norm_parse(&nm, js, path, err);

	*out = nm;
	return rc;
}

static int pre_one(void **out, json_t *js, const char *path, hi3_error *err)
{
	struct tok_pre *pt = NULL;
	int rc = hi3i_tok_pre_parse(&pt, js, path, err);

	*out = pt;
	return rc;
}

int hi3i_tok_norm_parse(struct tok_norm **out, json_t *js, const char *path, hi3_error *err)
{
	static const struct { const char *name; enum norm_type type; } types[] = {
		{"Sequence", NORM_SEQUENCE}, {"NFC", NORM_NFC}, {"NFD", NORM_NFD}, {"NFKC", NORM_NFKC},
		{"NFKD", NORM_NFKD}, {"Lowercase", NORM_LOWERCASE}, {"Prepend", NORM_PREPEND},
		{"Replace", NORM_REPLACE}, {"Strip", NORM_STRIP},
	};
	struct tok_norm *nm;
	const char *type;
	size_t i;

	*out = NULL;
	if (!js || json_is_null(js))
		return 0;
	type = type_of(js);
	if (!type)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: normalizer without a \"type\"", path);
	for (i = 0; i < HI3_ARRAY_SIZE(types); i++)
		if (!strcmp(type, types[i].name))
			break;
	if (i == HI3_ARRAY_SIZE(types))
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: normalizer '%s' is not supported", path, type);
	nm = calloc(1, sizeof(*nm));
	if (!nm)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "tokenizer: out of memory");
	nm->type = types[i].type;
	switch (nm->type) {
	case NORM_SEQUENCE:
		if (parse_seq(js, "normalizers", "normalizer", path, &nm->kids, &nm->n_kids, norm_one, err))
			goto fail;
		break;
	case NORM_PREPEND:
	case NORM_REPLACE: {
		json_t *v = json_object_get(js, nm->type == NORM_PREPEND ? "prepend" : "content");
		if (!json_is_string(v)) {
			hi3_error_set(err, HI3_ERR_INPUT, "%s: normalizer '%s' without its string", path, type);
			goto fail;
		}
		nm->text_len = json_string_length(v);
		nm->text = malloc(nm->text_len + 1);
		if (!nm->text) {
			hi3_error_set(err, HI3_ERR_RUNTIME, "tokenizer: out of memory");
			goto fail;
		}
		memcpy(nm->text, json_string_value(v), nm->text_len + 1);
		if (nm->type == NORM_REPLACE && parse_pattern(&nm->re, js, path, "normalizer 'Replace'", err))
			goto fail;
		break;
	}
	case NORM_STRIP:
		nm->strip_left = hi3i_tok_json_bool(js, "strip_left", 1);
		nm->strip_right = hi3i_tok_json_bool(js, "strip_right", 1);
		if (nm->strip_left < 0 || nm->strip_right < 0) {
			hi3_error_set(err, HI3_ERR_INPUT, "%s: normalizer 'Strip': expected booleans", path);
			goto fail;
		}
		break;
	default:
		break;
	}
	*out = nm;
	return 0;
fail:
	hi3i_tok_norm_free(nm);
	return -1;
}

static int norm_utf8proc(struct tok_work *w, struct tok_span in, utf8proc_option_t opt, struct tok_span *out,
                         hi3_error *err)
{
	utf8proc_uint8_t *dst = NULL;
	utf8proc_ssize_t n;

	if (in.len == 0) {
		*out = in;
		return 0;
	}
	n = utf8proc_map((const utf8proc_uint8_t *)w->buf.p + in.off, (utf8proc_ssize_t)in.len, &dst,
	                 opt | UTF8PROC_STABLE);
	if (n < 0)
		return hi3_error_set(err, n == UTF8PROC_ERROR_NOMEM ? HI3_ERR_RUNTIME : HI3_ERR_INPUT,
		                     "tokenizer: normalization failed: %s", utf8proc_errmsg(n));
	out->off = w->buf.n;
	out->len = (size_t)n;
	n = hi3i_tok_buf_add(&w->buf, dst, (size_t)n, err);
	free(dst);
	return (int)n;
}

int hi3i_tok_norm_apply(const struct tok_norm *nm, struct tok_work *w, struct tok_span in, struct tok_span *out,
                        hi3_error *err)
{
	switch (nm->type) {
	case NORM_SEQUENCE:
		for (size_t k = 0; k < nm->n_kids; k++)
			if (hi3i_tok_norm_apply((const struct tok_norm *)nm->kids[k], w, in, &in, err))
				return -1;
		*out = in;
		return 0;
	case NORM_NFC:
		return norm_utf8proc(w, in, UTF8PROC_COMPOSE, out, err);
	case NORM_NFD:
		return norm_utf8proc(w, in, UTF8PROC_DECOMPOSE, out, err);
	case NORM_NFKC:
		return norm_utf8proc(w, in, UTF8PROC_COMPOSE | UTF8PROC_COMPAT, out, err);
	case NORM_NFKD:
		return norm_utf8proc(w, in, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, out, err);
	case NORM_LOWERCASE: {
		size_t i = 0;
		if (hi3i_tok_buf_reserve(&w->buf, in.len + 8, err))
			return -1;
		out->off = w->buf.n;
		while (i < in.len) {
			size_t len;
			uint32_t cp = hi3i_utf8_get(w->buf.p + in.off + i, in.len - i, &len);
			char u[8];
			int k;
			i += len;
			if (cp == 0x130) {  /* the one unconditional multi-character lowercase mapping */
				k = hi3i_utf8_put('i', u);
				k += hi3i_utf8_put(0x307, u + k);
			} else {
				k = hi3i_utf8_put((uint32_t)utf8proc_tolower((utf8proc_int32_t)cp), u);
			}
			if (hi3i_tok_buf_add(&w->buf, u, (size_t)k, err))
				return -1;
		}
		out->len = w->buf.n - out->off;
		return 0;
	}
	case NORM_PREPEND:
		if (in.len == 0) {
			*out = in;
			return 0;
		}
		if (hi3i_tok_buf_reserve(&w->buf, nm->text_len + in.len, err))
			return -1;
		out->off = w->buf.n;
		hi3i_tok_buf_add(&w->buf, nm->text, nm->text_len, err);
		hi3i_tok_buf_add(&w->buf, w->buf.p + in.off, in.len, err);
		out->len = nm->text_len + in.len;
		return 0;
	case NORM_REPLACE: {
		size_t need = 0;
		if (hi3i_tok_re_ranges(&nm->re, w->buf.p + in.off, in.len, w, err))
			return -1;
		for (size_t i = 0; i < w->n_ranges; i++)
			need += w->ranges[i].match ? nm->text_len : w->ranges[i].end - w->ranges[i].start;
		if (hi3i_tok_buf_reserve(&w->buf, need, err))
			return -1;
		out->off = w->buf.n;
		for (size_t i = 0; i < w->n_ranges; i++) {
			const struct tok_range *r = &w->ranges[i];
			if (r->match)
				hi3i_tok_buf_add(&w->buf, nm->text, nm->text_len, err);
			else
				hi3i_tok_buf_add(&w->buf, w->buf.p + in.off + r->start, r->end - r->start, err);
		}
		out->len = w->buf.n - out->off;
		return 0;
	}
	case NORM_STRIP: {
		const char *s = w->buf.p + in.off;
		size_t a = 0, b = in.len, len;
		while (nm->strip_left && a < b && hi3i_tok_is_space(hi3i_utf8_get(s + a, b - a, &len)))
			a += len;
		while (nm->strip_right && b > a) {
			size_t p = b - 1;
			while (p > a && ((unsigned char)s[p] & 0xc0) == 0x80)
				p--;
			if (!hi3i_tok_is_space(hi3i_utf8_get(s + p, b - p, &len)))
				break;
			b = p;
		}
		out->off = in.off + a;
		out->len = b - a;
		return 0;
	}
	}
	return hi3_error_set(err, HI3_ERR_RUNTIME, "tokenizer: unknown normalizer");
}

/* ------------------------------------------------------ pre-tokenizers */

enum pre_type { PRE_SEQUENCE, PRE_SPLIT, PRE_BYTELEVEL, PRE_DIGITS };

struct tok_pre {
	enum pre_type type;
	void **kids;                    /* Sequence: struct tok_pre * */
	size_t n_kids;
	struct tok_re re;               /* Split; ByteLevel with use_regex */
	enum tok_split_behavior behavior;
	int invert;
	int add_prefix_space, use_regex;
	int individual_digits;
};

/* The GPT-2 pattern ByteLevel splits with when use_regex is true. */
static const char gpt2_regex[] =
	"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

void hi3i_tok_pre_free(struct tok_pre *pt)
{
	if (!pt)
		return;
	for (size_t i = 0; i < pt->n_kids; i++)
		hi3i_tok_pre_free((struct tok_pre *)pt->kids[i]);
	free(pt->kids);
	hi3i_tok_re_release(&pt->re);
	free(pt);
}

static int parse_behavior(const char *s, enum tok_split_behavior *out)
{
	static const char *const names[] = {"Isolated", "Removed", "MergedWithPrevious", "MergedWithNext",
	                                    "Contiguous", NULL};

	int i = hi3i_name_index(names, s);

	if (i < 0)
		return -1;
	*out = (enum tok_split_behavior)i;
	return 0;
}

int hi3i_tok_pre_parse(struct tok_pre **out, json_t *js, const char *path, hi3_error *err)
{
	struct tok_pre *pt;
	const char *type;

	*out = NULL;
	if (!js || json_is_null(js))
		return 0;
	type = type_of(js);
	if (!type)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: pre_tokenizer without a \"type\"", path);
	pt = calloc(1, sizeof(*pt));
	if (!pt)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "tokenizer: out of memory");
	if (!strcmp(type, "Sequence")) {
		pt->type = PRE_SEQUENCE;
		if (parse_seq(js, "pretokenizers", "pre_tokenizer", path, &pt->kids, &pt->n_kids, pre_one, err))
			goto fail;
	} else if (!strcmp(type, "Split")) {
		json_t *bh = json_object_get(js, "behavior");
		pt->type = PRE_SPLIT;
		if (parse_behavior(json_string_value(bh), &pt->behavior)) {
			hi3_error_set(err, HI3_ERR_INPUT, "%s: pre_tokenizer 'Split': behavior '%s' is not supported", path,
			              json_is_string(bh) ? json_string_value(bh) : "(missing)");
			goto fail;
		}
		pt->invert = hi3i_tok_json_bool(js, "invert", 0);
		if (pt->invert < 0) {
			hi3_error_set(err, HI3_ERR_INPUT, "%s: pre_tokenizer 'Split': \"invert\" is not a boolean", path);
			goto fail;
		}
		if (parse_pattern(&pt->re, js, path, "pre_tokenizer 'Split'", err))
			goto fail;
	} else if (!strcmp(type, "ByteLevel")) {
		pt->type = PRE_BYTELEVEL;
		pt->add_prefix_space = hi3i_tok_json_bool(js, "add_prefix_space", 1);
		pt->use_regex = hi3i_tok_json_bool(js, "use_regex", 1);
		if (pt->add_prefix_space < 0 || pt->use_regex < 0) {
			hi3_error_set(err, HI3_ERR_INPUT, "%s: pre_tokenizer 'ByteLevel': expected booleans", path);
			goto fail;
		}
		if (pt->use_regex && hi3i_tok_re_compile(&pt->re, gpt2_regex, strlen(gpt2_regex), 1,
		                                          "pre_tokenizer 'ByteLevel'", err))
			goto fail;
	} else if (!strcmp(type, "Digits")) {
		pt->type = PRE_DIGITS;
		pt->individual_digits = hi3i_tok_json_bool(js, "individual_digits", 0);
		if (pt->individual_digits < 0) {
			hi3_error_set(err, HI3_ERR_INPUT, "%s: pre_tokenizer 'Digits': expected a boolean", path);
			goto fail;
		}
	} else {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: pre_tokenizer '%s' is not supported", path, type);
		goto fail;
	}
	*out = pt;
	return 0;
fail:
	hi3i_tok_pre_free(pt);
	return -1;
}

/* ByteLevel on one piece: optional prefix space, optional GPT-2 split, then
 * every byte replaced by its stand-in character. */
static int bytelevel_piece(const struct tok_pre *pt, struct tok_work *w, struct tok_span in, hi3_error *err)
{
	size_t nr;

	if (pt->add_prefix_space && w->buf.p[in.off] != ' ') {
		size_t off = w->buf.n;
		if (hi3i_tok_buf_reserve(&w->buf, in.len + 1, err))
			return -1;
		w->buf.p[w->buf.n++] = ' ';
		hi3i_tok_buf_add(&w->buf, w->buf.p + in.off, in.len, err);
		in.off = off;
		in.len++;
	}
	if (pt->use_regex) {
		if (hi3i_tok_re_ranges(&pt->re, w->buf.p + in.off, in.len, w, err))
			return -1;
	} else {
		w->n_ranges = 0;
		if (ranges_add(w, 0, in.len, 0, err))
			return -1;
	}
	nr = w->n_ranges;
	for (size_t i = 0; i < nr; i++) {
		size_t a = in.off + w->ranges[i].start, len = w->ranges[i].end - w->ranges[i].start, off;
		if (len == 0)
			continue;
		if (hi3i_tok_buf_reserve(&w->buf, 2 * len, err))
			return -1;
		off = w->buf.n;
		for (size_t j = 0; j < len; j++)
			w->buf.n += (size_t)hi3i_utf8_put(hi3i_tok_byte_cp((unsigned char)w->buf.p[a + j]),
			                                  w->buf.p + w->buf.n);
		if (hi3i_tok_spans_add(&w->b, off, w->buf.n - off, err))
			return -1;
	}
	return 0;
}

int hi3i_tok_pre_apply(const struct tok_pre *pt, struct tok_work *w, hi3_error *err)
{
	struct tok_spans tmp;

	if (pt->type == PRE_SEQUENCE) {
		for (size_t k = 0; k < pt->n_kids; k++)
			if (hi3i_tok_pre_apply((const struct tok_pre *)pt->kids[k], w, err))
				return -1;
		return 0;
	}
	w->b.n = 0;
	for (size_t i = 0; i < w->a.n; i++) {
		struct tok_span in = w->a.v[i];
		switch (pt->type) {
		case PRE_SPLIT:
			if (hi3i_tok_re_ranges(&pt->re, w->buf.p + in.off, in.len, w, err))
				return -1;
			if (pt->invert)
				for (size_t r = 0; r < w->n_ranges; r++)
					w->ranges[r].match = !w->ranges[r].match;
			apply_behavior(w, pt->behavior);
			if (emit_ranges(w, in.off, &w->b, err))
				return -1;
			break;
		case PRE_DIGITS:
			if (pred_ranges(is_numeric, w->buf.p + in.off, in.len, w, err))
				return -1;
			apply_behavior(w, pt->individual_digits ? TOK_ISOLATED : TOK_CONTIGUOUS);
			if (emit_ranges(w, in.off, &w->b, err))
				return -1;
			break;
		case PRE_BYTELEVEL:
			if (bytelevel_piece(pt, w, in, err))
				return -1;
			break;
		default:
			break;
		}
	}
	tmp = w->a;
	w->a = w->b;
	w->b = tmp;
	return 0;
}
