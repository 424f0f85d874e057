/*
 * json.c -- fast reading of the two big members of a tokenizer.json,
 * model.vocab and model.merges, straight from the text.
 *
 * A 200k-token tokenizer.json is ~10 MB, most of it vocab and merges; a
 * general JSON tree for it costs a million allocations. The rest of the
 * file is small and goes through jansson (tok.c blanks these two members
 * out of a copy first, keeping line numbers).
 */
#include <string.h>
#include "tok/tok.h"

static void line_col(const char *s, size_t at, long *line, long *col)
{
	*line = 1;
	*col = 1;
	for (size_t i = 0; i < at; i++) {
		if (s[i] == '\n')
			++*line, *col = 1;
		else
			++*col;
	}
}

static int scan_fail(const char *s, size_t at, const char *path, const char *what, hi3_error *err)
{
	long line, col;

	line_col(s, at, &line, &col);
	return hi3_error_set(err, HI3_ERR_INPUT, "%s: line %ld column %ld: %s", path, line, col, what);
}

static size_t skip_ws(const char *s, size_t n, size_t i)
{
	while (i < n && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t'))
		i++;
	return i;
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

static int hex4(const char *s, size_t n, size_t i, uint32_t *out)
{
	uint32_t v = 0;

	if (i + 4 > n)
		return -1;
	for (int k = 0; k < 4; k++) {
		int h = hexval(s[i + k]);
		if (h < 0)
			return -1;
		v = v << 4 | (uint32_t)h;
	}
	*out = v;
	return 0;
}

/* The string starting at s[*i] ('"'). Without escapes the result points into
 * s; otherwise it is decoded into tmp. On success *i is past the closing
 * quote. Returns 0, or -1 with err set. */
static int read_string(const char *s, size_t n, size_t *i, struct tok_buf *tmp, const char **out, size_t *len,
                       const char *path, hi3_error *err)
{
	size_t p = *i + 1, run = p;
	int escaped = 0;

	if (*i >= n || s[*i] != '"')
		return scan_fail(s, *i, path, "expected a string", err);
	tmp->n = 0;
	for (;;) {
		unsigned char c;
		if (p >= n)
			return scan_fail(s, *i, path, "unterminated string", err);
		c = (unsigned char)s[p];
		if (c == '"')
			break;
		if (c < 0x20)
			return scan_fail(s, p, path, "control character in a string", err);
		if (c >= 0x80) {
			size_t v = hi3i_utf8_valid_prefix(s + p, HI3_MIN(4, n - p));
			size_t len1;
			if (v == 0)
				return scan_fail(s, p, path, "invalid UTF-8 in a string", err);
			hi3i_utf8_get(s + p, n - p, &len1);
			p += len1;
			continue;
		}
		if (c != '\\') {
			p++;
			continue;
		}
		/* an escape: flush the plain run, then decode */
		if (hi3i_tok_buf_add(tmp, s + run, p - run, err))
			return -1;
		escaped = 1;
		if (p + 1 >= n)
			return scan_fail(s, p, path, "unterminated escape", err);
		{
			char e = s[p + 1], u[4];
			const char *simple = strchr("\"\\/bfnrt", e);
			if (e && simple) {
				static const char map[] = "\"\\/\b\f\n\r\t";
				if (hi3i_tok_buf_add(tmp, &map[simple - "\"\\/bfnrt"], 1, err))
					return -1;
				p += 2;
			} else if (e == 'u') {
				uint32_t cp, lo;
				if (hex4(s, n, p + 2, &cp))
					return scan_fail(s, p, path, "invalid \\u escape", err);
				p += 6;
				if (cp >= 0xd800 && cp <= 0xdbff) {
					if (p + 6 > n || s[p] != '\\' || s[p + 1] != 'u' || hex4(s, n, p + 2, &lo) ||
					    lo < 0xdc00 || lo > 0xdfff)
						return scan_fail(s, p, path, "invalid Unicode surrogate pair", err);
					cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
					p += 6;
				} else if (cp >= 0xdc00 && cp <= 0xdfff) {
					return scan_fail(s, p, path, "invalid Unicode surrogate", err);
				}
				if (hi3i_tok_buf_add(tmp, u, (size_t)hi3i_utf8_put(cp, u), err))
					return -1;
			} else {
				return scan_fail(s, p, path, "invalid escape", err);
			}
		}
		run = p;
	}
	if (escaped) {
		if (hi3i_tok_buf_add(tmp, s + run, p - run, err))
			return -1;
		*out = tmp->p ? tmp->p : "";
		*len = tmp->n;
	} else {
		*out = s + *i + 1;
		*len = p - (*i + 1);
	}
	*i = p + 1;
	return 0;
}

/* Read an object key and its ':' at s[*p]; *p ends at the value. */
static int read_key(const char *s, size_t n, size_t *p, struct tok_buf *tmp, const char *path, hi3_error *err)
{
	const char *str;
	size_t len;

	if (read_string(s, n, p, tmp, &str, &len, path, err))
		return -1;
	*p = skip_ws(s, n, *p);
	if (*p >= n || s[*p] != ':')
		return scan_fail(s, *p, path, "expected ':'", err);
	*p = skip_ws(s, n, *p + 1);
	return 0;
}

/* Skip the value at s[*i]; count gets the number of members or elements when
 * it is an object or array. Scalars are only delimited here (the parts of
 * the file that are not blanked out are checked again by jansson). */
static int skip_value(const char *s, size_t n, size_t *i, size_t *count, const char *path, hi3_error *err)
{
	struct tok_buf tmp = {0};
	char stack[512];
	size_t depth = 0, p = skip_ws(s, n, *i);
	int rc = -1;
	const char *str;
	size_t len;

	*count = 0;
	for (;;) {
		/* a value at p */
		if (p >= n) {
			scan_fail(s, p, path, "unexpected end of text", err);
			goto out;
		}
		if (s[p] == '{' || s[p] == '[') {
			if (depth == sizeof(stack)) {
				scan_fail(s, p, path, "nesting too deep", err);
				goto out;
			}
			stack[depth++] = s[p];
			p = skip_ws(s, n, p + 1);
			if (p < n && s[p] == (stack[depth - 1] == '{' ? '}' : ']')) {
				p++;
				depth--;
			} else {
				if (depth == 1)
					++*count;
				if (stack[depth - 1] == '{' && read_key(s, n, &p, &tmp, path, err))
					goto out;
				continue;
			}
		} else if (s[p] == '"') {
			if (read_string(s, n, &p, &tmp, &str, &len, path, err))
				goto out;
		} else {
			size_t q = p;
			while (q < n && s[q] && strchr("0123456789+-.eEtrufalsn", s[q]))
				q++;
			if (q == p) {
				scan_fail(s, p, path, "unexpected character", err);
				goto out;
			}
			p = q;
		}
		/* after a value: close containers, or go on to the next item */
		for (;;) {
			p = skip_ws(s, n, p);
			if (depth == 0) {
				*i = p;
				rc = 0;
				goto out;
			}
			if (p < n && s[p] == (stack[depth - 1] == '{' ? '}' : ']')) {
				p++;
				depth--;
				continue;
			}
			if (p < n && s[p] == ',') {
				p = skip_ws(s, n, p + 1);
				if (depth == 1)
					++*count;
				if (stack[depth - 1] == '{' && read_key(s, n, &p, &tmp, path, err))
					goto out;
				break;
			}
			scan_fail(s, p, path, "expected ',' or the end of a list or object", err);
			goto out;
		}
	}
out:
	free(tmp.p);
	return rc;
}

int hi3i_tok_json_find_model(const char *s, size_t n, struct tok_jspan *vocab, struct tok_jspan *merges,
                             const char *path, hi3_error *err)
{
	struct tok_buf tmp = {0};
	size_t p = skip_ws(s, n, 0), count;
	const char *key;
	size_t klen;
	int rc = -1;

	memset(vocab, 0, sizeof(*vocab));
	memset(merges, 0, sizeof(*merges));
	if (p >= n || s[p] != '{') {
		rc = 0;   /* not an object: jansson will say what it is */
		goto out;
	}
	p = skip_ws(s, n, p + 1);
	while (p < n && s[p] != '}') {
		int is_model;
		if (read_string(s, n, &p, &tmp, &key, &klen, path, err))
			goto out;
		is_model = klen == 5 && !memcmp(key, "model", 5);
		p = skip_ws(s, n, p);
		if (p >= n || s[p] != ':') {
			scan_fail(s, p, path, "expected ':'", err);
			goto out;
		}
		p = skip_ws(s, n, p + 1);
		if (is_model && p < n && s[p] == '{') {
			p = skip_ws(s, n, p + 1);
			while (p < n && s[p] != '}') {
				struct tok_jspan *sp = NULL;
				if (read_string(s, n, &p, &tmp, &key, &klen, path, err))
					goto out;
				if (klen == 5 && !memcmp(key, "vocab", 5))
					sp = vocab;
				else if (klen == 6 && !memcmp(key, "merges", 6))
					sp = merges;
				p = skip_ws(s, n, p);
				if (p >= n || s[p] != ':') {
					scan_fail(s, p, path, "expected ':'", err);
					goto out;
				}
				p = skip_ws(s, n, p + 1);
				if (sp) {
					sp->start = p;
					sp->found = 1;
				}
				if (skip_value(s, n, &p, &count, path, err))
					goto out;
				if (sp) {
					sp->end = p;
					sp->count = count;
				}
				if (p < n && s[p] == ',')
					p = skip_ws(s, n, p + 1);
				else if (p >= n || s[p] != '}') {
					scan_fail(s, p, path, "expected ',' or '}'", err);
					goto out;
				}
			}
			p = skip_ws(s, n, p + 1);
		} else if (skip_value(s, n, &p, &count, path, err)) {
			goto out;
		}
		if (p < n && s[p] == ',')
			p = skip_ws(s, n, p + 1);
		else if (p >= n || s[p] != '}') {
			scan_fail(s, p, path, "expected ',' or '}'", err);
			goto out;
		}
	}
	rc = 0;
out:
	free(tmp.p);
	return rc;
}

void hi3i_tok_json_blank(char *s, const struct tok_jspan *sp)
{
	char open = s[sp->start];

	if (!sp->found || (open != '{' && open != '[') || sp->end < sp->start + 2)
		return;
	/* keep newlines so that jansson's line numbers stay right */
	for (size_t i = sp->start; i < sp->end; i++)
		if (s[i] != '\n')
			s[i] = ' ';
	s[sp->start] = open;
	s[sp->start + 1] = open == '{' ? '}' : ']';
}

int hi3i_tok_json_iter(struct tok_jiter *it, const char *s, const struct tok_jspan *sp, char open, const char *path,
                       hi3_error *err)
{
	memset(it, 0, sizeof(*it));
	it->s = s;
	it->end = sp->end;
	it->path = path;
	if (!sp->found || s[sp->start] != open)
		return -1;
	it->i = skip_ws(s, sp->end, sp->start + 1);
	(void)err;
	return 0;
}

void hi3i_tok_json_iter_release(struct tok_jiter *it)
{
	free(it->a.p);
	free(it->b.p);
}

/* After an element: ',' (then more) or the closing bracket. 1 more, 0 end. */
static int after_item(struct tok_jiter *it, char close, hi3_error *err)
{
	it->i = skip_ws(it->s, it->end, it->i);
	if (it->i < it->end && it->s[it->i] == ',') {
		it->i = skip_ws(it->s, it->end, it->i + 1);
		return 1;
	}
	if (it->i < it->end && it->s[it->i] == close) {
		it->done = 1;
		return 0;
	}
	return scan_fail(it->s, it->i, it->path, close == '}' ? "expected ',' or '}'" : "expected ',' or ']'", err);
}

int hi3i_tok_json_next_entry(struct tok_jiter *it, const char **key, size_t *klen, int64_t *val, hi3_error *err)
{
	const char *s = it->s;
	size_t p;
	int64_t v = 0;
	int neg = 0, digits = 0;

	if (it->done || (it->n == 0 && it->i < it->end && s[it->i] == '}'))
		return 0;
	it->n++;
	p = it->i;
	if (read_string(s, it->end, &it->i, &it->a, key, klen, it->path, err))
		return -1;
	if (memchr(*key, '\0', *klen))   /* tokens are named as C strings (hi3_tok_id) */
		return scan_fail(s, p, it->path, "a token holds a NUL character (\\u0000)", err);
	p = skip_ws(s, it->end, it->i);
	if (p >= it->end || s[p] != ':')
		return scan_fail(s, p, it->path, "expected ':'", err);
	p = skip_ws(s, it->end, p + 1);
	if (p < it->end && s[p] == '-')
		neg = 1, p++;
	while (p < it->end && s[p] >= '0' && s[p] <= '9') {
		if (v > (INT64_MAX - 9) / 10)
			return scan_fail(s, p, it->path, "number out of range", err);
		v = v * 10 + (s[p++] - '0');
		digits++;
	}
	if (!digits || (p < it->end && strchr(".eE", s[p]) && s[p]))
		*val = -1;   /* not an integer: the caller names the entry */
	else
		*val = neg ? -v : v;
	if (!digits) {   /* skip whatever value it is */
		size_t count;
		if (skip_value(s, it->end, &p, &count, it->path, err))
			return -1;
	} else {
		while (p < it->end && strchr("0123456789.eE+-", s[p]) && s[p])
			p++;
	}
	it->i = p;
	if (after_item(it, '}', err) < 0)
		return -1;
	return 1;
}

int hi3i_tok_json_next_merge(struct tok_jiter *it, const char **a, size_t *na, const char **b, size_t *nb,
                             hi3_error *err)
{
	const char *s = it->s;

	if (it->done || (it->n == 0 && it->i < it->end && s[it->i] == ']'))
		return 0;
	it->n++;
	*b = NULL;
	*nb = 0;
	if (s[it->i] == '"') {
		if (read_string(s, it->end, &it->i, &it->a, a, na, it->path, err))
			return -1;
	} else if (s[it->i] == '[') {
		it->i = skip_ws(s, it->end, it->i + 1);
		if (it->i >= it->end || s[it->i] != '"')
			return 2;   /* not a pair of strings */
		if (read_string(s, it->end, &it->i, &it->a, a, na, it->path, err))
			return -1;
		it->i = skip_ws(s, it->end, it->i);
		if (it->i >= it->end || s[it->i] != ',')
			return 2;
		it->i = skip_ws(s, it->end, it->i + 1);
		if (it->i >= it->end || s[it->i] != '"')
			return 2;
		if (read_string(s, it->end, &it->i, &it->b, b, nb, it->path, err))
			return -1;
		it->i = skip_ws(s, it->end, it->i);
		if (it->i >= it->end || s[it->i] != ']')
			return 2;
		it->i++;
	} else {
		return 2;
	}
	if (after_item(it, ']', err) < 0)
		return -1;
	return 1;
}
