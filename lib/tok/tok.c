/*
 * tok.c -- Hugging Face tokenizer.json: loading, added tokens, the BPE
 * model, encode and decode, identical to the `tokenizers` library.
 *
 * Encoding runs the library's pipeline:
 *   1. added tokens that are not `normalized` are cut out of the raw text
 *      (leftmost-longest, with their lstrip/rstrip/single_word rules);
 *   2. each remaining segment is normalized, and `normalized` added tokens
 *      are cut out of the result the same way;
 *   3. the pre-tokenizer splits each segment into pieces (pretok.c);
 *   4. the BPE model encodes each piece: its characters are merged pair by
 *      pair, lowest merge rank first (leftmost on ties), with a cache of
 *      piece -> ids.
 * Supported: model BPE (no dropout, no byte_fallback), normalizers and
 * pre-tokenizers listed in pretok.c, decoders ByteLevel and none. Anything
 * else is refused at load time with status 3, naming the component.
 */
#include <pthread.h>
#include <string.h>
#include <utf8proc.h>
#include "tok/tok.h"

/* ------------------------------------------------------------ hashing */

static uint64_t hash_bytes(const char *s, size_t n)
{
	return hi3i_hash(HI3_HASH_INIT, s, n);
}

static uint64_t hash_u64(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdULL;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ULL;
	x ^= x >> 33;
	return x;
}

static size_t table_size(size_t n)
{
	size_t cap = 16;
	while (cap < 2 * n + 2)
		cap *= 2;
	return cap;
}

/* A string -> int32 map over strings kept NUL-terminated in one arena.
 * A slot holds the upper 32 bits of the key's hash and entry index + 1, so
 * most probes are settled without touching the entry. */
struct strmap {
	struct tok_buf text;
	struct smentry {
		uint32_t off, len;
		int32_t val;
	} *ent;
	size_t n, cap_ent;
	uint64_t *slot;                 /* hash >> 32 << 32 | (index + 1); 0 = empty */
	size_t mask;
};

static void strmap_release(struct strmap *m)
{
	free(m->text.p);
	free(m->ent);
	free(m->slot);
	memset(m, 0, sizeof(*m));
}

static const char *strmap_key(const struct strmap *m, size_t i)
{
	return m->text.p + m->ent[i].off;
}

static ptrdiff_t strmap_find_h(const struct strmap *m, const char *s, size_t n, uint64_t h)
{
	uint64_t tag = h >> 32 << 32;

	if (!m->slot)
		return -1;
	for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
		uint64_t e = m->slot[i];
		if (!e)
			return -1;
		if ((e >> 32 << 32) == tag) {
			uint32_t k = (uint32_t)e - 1;
			if (m->ent[k].len == n && !memcmp(m->text.p + m->ent[k].off, s, n))
				return k;
		}
	}
}

/* Index of the entry for s, or -1. */
static ptrdiff_t strmap_find(const struct strmap *m, const char *s, size_t n)
{
	return strmap_find_h(m, s, n, hash_bytes(s, n));
}

/* Make room for count entries with text_bytes of keys in all. */
static int strmap_reserve(struct strmap *m, size_t count, size_t text_bytes, hi3_error *err)
{
	size_t cap = table_size(count);

	if (count > m->cap_ent) {
		struct smentry *v = realloc(m->ent, count * sizeof(*v));
		if (!v)
			return hi3_error_set(err, HI3_ERR_RUNTIME, "tokenizer: out of memory");
		m->ent = v;
		m->cap_ent = count;
	}
	if (hi3i_tok_buf_reserve(&m->text, text_bytes, err))
		return -1;
	if (m->slot && cap <= m->mask + 1)
		return 0;
	free(m->slot);
	m->slot = calloc(cap, sizeof(*m->slot));
	if (!m->slot)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "tokenizer: out of memory");
	m->mask = cap - 1;
	for (size_t k = 0; k < m->n; k++) {
		uint64_t h = hash_bytes(strmap_key(m, k), m->ent[k].len);
		size_t i = h & m->mask;
		while (m->slot[i])
			i = (i + 1) & m->mask;
		m->slot[i] = (h >> 32 << 32) | (k + 1);
	}
	return 0;
}

/* Set s -> val (a later value replaces an earlier one, as in a JSON object). */
static int strmap_put(struct strmap *m, const char *s, size_t n, int32_t val, hi3_error *err)
{
	uint64_t h = hash_bytes(s, n);
	ptrdiff_t e = strmap_find_h(m, s, n, h);
	size_t i;

	if (e >= 0) {
		m->ent[e].val = val;
		return 0;
	}
	if (n >= UINT32_MAX / 2 || m->text.n + n + 1 >= UINT32_MAX || m->n + 1 >= UINT32_MAX / 2)
		return hi3_error_set(err, HI3_ERR_INPUT, "tokenizer: vocabulary too large");
	if ((m->n + 1 > m->cap_ent || table_size(m->n + 1) > (m->slot ? m->mask + 1 : 0)) &&
	    strmap_reserve(m, HI3_MAX(2 * m->n, 256), 0, err))
		return -1;
	m->ent[m->n].off = (uint32_t)m->text.n;
	m->ent[m->n].len = (uint32_t)n;
	m->ent[m->n].val = val;
	if (hi3i_tok_buf_add(&m->text, s, n, err) || hi3i_tok_buf_add(&m->text, "", 1, err))
		return -1;
	for (i = h & m->mask; m->slot[i]; i = (i + 1) & m->mask)
		;
	m->slot[i] = (h >> 32 << 32) | (m->n + 1);
	m->n++;
	return 0;
}

/* The merges: (left id, right id) -> (rank, merged id). */
struct pairmap {
	uint64_t *key;                  /* left << 32 | right; UINT64_MAX = empty */
	uint64_t *val;                  /* rank << 32 | merged id */
	size_t mask;
};

static int pairmap_init(struct pairmap *m, size_t n, hi3_error *err)
{
	size_t cap = table_size(n);

	m->key = malloc(cap * sizeof(*m->key));
	m->val = malloc(cap * sizeof(*m->val));
	if (!m->key || !m->val)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "tokenizer: out of memory");
	memset(m->key, 0xff, cap * sizeof(*m->key));
	m->mask = cap - 1;
	return 0;
}

static void pairmap_put(struct pairmap *m, uint64_t k, uint64_t v)
{
	size_t h = hash_u64(k) & m->mask;

	while (m->key[h] != UINT64_MAX && m->key[h] != k)
		h = (h + 1) & m->mask;
	m->key[h] = k;
	m->val[h] = v;
}

static int pairmap_get(const struct pairmap *m, uint32_t a, uint32_t b, uint32_t *rank, uint32_t *id)
{
	uint64_t k = (uint64_t)a << 32 | b;

	if (!m->key)
		return 0;
	for (size_t h = hash_u64(k) & m->mask;; h = (h + 1) & m->mask) {
		if (m->key[h] == k) {
			*rank = (uint32_t)(m->val[h] >> 32);
			*id = (uint32_t)m->val[h];
			return 1;
		}
		if (m->key[h] == UINT64_MAX)
			return 0;
	}
}

/* ------------------------------------------------------------ the type */

struct added {
	const char *content;            /* as in the file (in t->added_map's arena) */
	size_t len;
	char *match;                    /* what is searched for: content, normalized when `normalized` */
	size_t match_len;
	int64_t id;
	int special, single_word, lstrip, rstrip, normalized;
};

/* Added tokens searched in one pass: candidates by first byte, longest first. */
struct added_set {
	int *idx;                       /* indices into t->added */
	size_t start[257];
};

enum { DEC_NONE, DEC_BYTELEVEL };

/* Piece -> ids cache (the encoder's hot path; guarded by lock). */
#define CACHE_SLOTS (1u << 17)
#define CACHE_MAX_ENTRIES (CACHE_SLOTS / 2)
#define CACHE_MAX_KEY 256
struct cache {
	pthread_mutex_t lock;
	struct centry {
		uint64_t hash;
		uint32_t koff, klen;        /* klen 0: empty slot */
		uint32_t ioff, nid;
	} *slot;
	size_t count;
	struct tok_buf keys;
	int32_t *ids;
	size_t n_ids, cap_ids;
};

struct hi3_tok {
	char *path;
	char hash[17];
	/* model */
	struct strmap vocab;            /* token -> id */
	struct pairmap merges;
	int32_t *vocab_r;               /* (n_ids) id -> vocab entry, -1 when none */
	int64_t n_ids;                  /* largest id + 1, added tokens included */
	int64_t unk_id;                 /* -1 when no unk_token */
	int fuse_unk, ignore_merges;
	char *prefix, *suffix;          /* continuing_subword_prefix, end_of_word_suffix */
	size_t prefix_len, suffix_len;
	/* added tokens */
	struct added *added;
	size_t n_added;
	struct strmap added_map;        /* content -> index into added */
	int32_t *added_r;               /* (n_ids) id -> index into added, -1 when none */
	struct added_set raw_set, norm_set;
	/* pipeline */
	struct tok_norm *norm;
	struct tok_pre *pre;
	int decoder;
	struct cache cache;
};

/* ------------------------------------------------------------- loading */

static int bad(hi3_error *err, const char *path, const char *what)
{
	return hi3_error_set(err, HI3_ERR_INPUT, "%s: %s", path, what);
}

static int load_vocab(hi3_tok *t, const char *text, const struct tok_jspan *sp, const char *path, hi3_error *err)
{
	struct tok_jiter it;
	const char *key;
	size_t klen;
	int64_t id, max_id = -1;
	int r;

	if (!sp->found)
		return bad(err, path, "model 'BPE': no \"vocab\"");
	if (hi3i_tok_json_iter(&it, text, sp, '{', path, err))
		return bad(err, path, "model 'BPE': \"vocab\" is not an object");
	if (strmap_reserve(&t->vocab, sp->count + 1, sp->end - sp->start, err))
		goto fail;
	while ((r = hi3i_tok_json_next_entry(&it, &key, &klen, &id, err)) == 1) {
		if (id < 0 || id > INT32_MAX - 1) {
			hi3_error_set(err, HI3_ERR_INPUT, "%s: model 'BPE': vocab entry '%.*s' has no valid id", path,
			              (int)HI3_MIN(klen, 200), key);
			goto fail;
		}
		if (strmap_put(&t->vocab, key, klen, (int32_t)id, err))
			goto fail;
		max_id = HI3_MAX(max_id, id);
	}
	if (r < 0)
		goto fail;
	hi3i_tok_json_iter_release(&it);
	t->n_ids = max_id + 1;
	return 0;
fail:
	hi3i_tok_json_iter_release(&it);
	return -1;
}

/* Make the id -> string tables once all ids are known. */
static int build_reverse(hi3_tok *t, hi3_error *err)
{
	if (t->n_ids > (int64_t)1 << 28)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: token ids up to %lld are too large", t->path,
		                     (long long)t->n_ids - 1);
	t->vocab_r = malloc((size_t)(t->n_ids + 1) * sizeof(*t->vocab_r));
	t->added_r = malloc((size_t)(t->n_ids + 1) * sizeof(*t->added_r));
	if (!t->vocab_r || !t->added_r)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "tokenizer: out of memory");
	memset(t->vocab_r, 0xff, (size_t)(t->n_ids + 1) * sizeof(*t->vocab_r));
	memset(t->added_r, 0xff, (size_t)(t->n_ids + 1) * sizeof(*t->added_r));
	for (size_t i = 0; i < t->vocab.n; i++)
		if (t->vocab_r[t->vocab.ent[i].val] < 0)
			t->vocab_r[t->vocab.ent[i].val] = (int32_t)i;
	for (size_t i = 0; i < t->n_added; i++)
		t->added_r[t->added[i].id] = (int32_t)i;
	return 0;
}

static int vocab_id(const hi3_tok *t, const char *s, size_t n)
{
	ptrdiff_t e = strmap_find(&t->vocab, s, n);
	return e < 0 ? -1 : t->vocab.ent[e].val;
}

static int load_merges(hi3_tok *t, const char *text, const struct tok_jspan *sp, const char *path,
                       hi3_error *err)
{
	struct tok_buf joined = {0};
	struct tok_jiter it;
	const char *a, *b;
	size_t na, nb;
	int r, rc = -1;

	if (!sp->found)
		return bad(err, path, "model 'BPE': no \"merges\"");
	if (hi3i_tok_json_iter(&it, text, sp, '[', path, err))
		return bad(err, path, "model 'BPE': \"merges\" is not a list");
	if (pairmap_init(&t->merges, sp->count, err))
		goto out;
	for (size_t i = 0; (r = hi3i_tok_json_next_merge(&it, &a, &na, &b, &nb, err)) != 0; i++) {
		int ia, ib, im;

		if (r < 0)
			goto out;
		if (r == 2) {
			hi3_error_set(err, HI3_ERR_INPUT, "%s: model 'BPE': merge %zu is neither \"a b\" nor [a, b]", path,
			              i + 1);
			goto out;
		}
		if (!b) {   /* "a b" */
			const char *sp1 = memchr(a, ' ', na);
			if (!sp1 || memchr(sp1 + 1, ' ', na - (size_t)(sp1 + 1 - a))) {
				hi3_error_set(err, HI3_ERR_INPUT, "%s: model 'BPE': merge %zu ('%.*s') is not two tokens "
				              "separated by one space", path, i + 1, (int)HI3_MIN(na, 200), a);
				goto out;
			}
			b = sp1 + 1;
			nb = na - (size_t)(b - a);
			na = (size_t)(sp1 - a);
		}
		if (nb < t->prefix_len) {
			hi3_error_set(err, HI3_ERR_INPUT, "%s: model 'BPE': merge %zu: '%.*s' is shorter than the "
			              "continuing_subword_prefix", path, i + 1, (int)nb, b);
			goto out;
		}
		joined.n = 0;
		if (hi3i_tok_buf_add(&joined, a, na, err) ||
		    hi3i_tok_buf_add(&joined, b + t->prefix_len, nb - t->prefix_len, err))
			goto out;
		ia = vocab_id(t, a, na);
		ib = vocab_id(t, b, nb);
		im = vocab_id(t, joined.p, joined.n);
		if (ia < 0 || ib < 0 || im < 0) {
			const char *which = ia < 0 ? a : ib < 0 ? b : joined.p;
			int wn = (int)(ia < 0 ? na : ib < 0 ? nb : joined.n);
			hi3_error_set(err, HI3_ERR_INPUT, "%s: model 'BPE': merge %zu: token '%.*s' is not in the vocab",
			              path, i + 1, wn, which);
			goto out;
		}
		pairmap_put(&t->merges, (uint64_t)ia << 32 | (uint32_t)ib, (uint64_t)i << 32 | (uint32_t)im);
	}
	rc = 0;
out:
	hi3i_tok_json_iter_release(&it);
	free(joined.p);
	return rc;
}

static int opt_string(json_t *model, const char *key, char **out, size_t *len, const char *path, hi3_error *err)
{
	json_t *v = json_object_get(model, key);

	*out = NULL;
	*len = 0;
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_string(v))
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: model 'BPE': \"%s\" is not a string", path, key);
	*len = json_string_length(v);
	*out = malloc(*len + 1);
	if (!*out)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "tokenizer: out of memory");
	memcpy(*out, json_string_value(v), *len + 1);
	return 0;
}

static int load_model(hi3_tok *t, json_t *model, const char *text, const struct tok_jspan *vocab,
                      const struct tok_jspan *merges, const char *path, hi3_error *err)
{
	const char *type;
	json_t *v;
	char *unk = NULL;
	size_t unk_len;
	int rc = -1;

	if (!json_is_object(model))
		return bad(err, path, "no \"model\" object");
	type = json_string_value(json_object_get(model, "type"));
	if (type && strcmp(type, "BPE"))
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: model '%s' is not supported (only BPE)", path, type);
	if (!type && !json_object_get(model, "merges"))
		return bad(err, path, "model without a \"type\" and without \"merges\" is not supported");
	v = json_object_get(model, "dropout");
	if (v && !json_is_null(v) && !(json_is_number(v) && json_number_value(v) == 0.0))
		return bad(err, path, "model 'BPE': dropout is not supported (encoding would be random)");
	if (hi3i_tok_json_bool(model, "byte_fallback", 0) != 0)
		return bad(err, path, "model 'BPE': byte_fallback is not supported");
	t->fuse_unk = hi3i_tok_json_bool(model, "fuse_unk", 0);
	t->ignore_merges = hi3i_tok_json_bool(model, "ignore_merges", 0);
	if (t->fuse_unk < 0 || t->ignore_merges < 0)
		return bad(err, path, "model 'BPE': fuse_unk and ignore_merges must be booleans");
	if (opt_string(model, "continuing_subword_prefix", &t->prefix, &t->prefix_len, path, err) ||
	    opt_string(model, "end_of_word_suffix", &t->suffix, &t->suffix_len, path, err) ||
	    opt_string(model, "unk_token", &unk, &unk_len, path, err))
		goto out;
	if (load_vocab(t, text, vocab, path, err) || load_merges(t, text, merges, path, err))
		goto out;
	t->unk_id = -1;
	if (unk) {
		t->unk_id = vocab_id(t, unk, unk_len);
		if (t->unk_id < 0) {
			hi3_error_set(err, HI3_ERR_INPUT, "%s: model 'BPE': unk_token '%s' is not in the vocab", path, unk);
			goto out;
		}
	}
	rc = 0;
out:
	free(unk);
	return rc;
}

static int load_decoder(hi3_tok *t, json_t *js, const char *path, hi3_error *err)
{
	const char *type;

	t->decoder = DEC_NONE;
	if (!js || json_is_null(js))
		return 0;
	type = json_string_value(json_object_get(js, "type"));
	if (type && !strcmp(type, "ByteLevel")) {
		t->decoder = DEC_BYTELEVEL;
		return 0;
	}
	return hi3_error_set(err, HI3_ERR_INPUT, "%s: decoder '%s' is not supported (only ByteLevel)", path,
	                     type ? type : "(no type)");
}

static int cmp_len_desc(const void *pa, const void *pb, void *ctx)
{
	const struct added *added = ctx;
	size_t la = added[*(const int *)pa].match_len, lb = added[*(const int *)pb].match_len;

	if (la != lb)
		return la < lb ? 1 : -1;
	return *(const int *)pa - *(const int *)pb;
}

static int build_set(hi3_tok *t, struct added_set *set, int normalized, hi3_error *err)
{
	size_t count[256] = {0}, k = 0;

	set->idx = malloc((t->n_added + 1) * sizeof(*set->idx));
	if (!set->idx)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "tokenizer: out of memory");
	for (size_t i = 0; i < t->n_added; i++)
		if (t->added[i].normalized == normalized && t->added[i].match_len)
			count[(unsigned char)t->added[i].match[0]]++;
	for (int b = 0; b < 256; b++) {
		set->start[b] = k;
		k += count[b];
		count[b] = set->start[b];
	}
	set->start[256] = k;
	for (size_t i = 0; i < t->n_added; i++)
		if (t->added[i].normalized == normalized && t->added[i].match_len)
			set->idx[count[(unsigned char)t->added[i].match[0]]++] = (int)i;
	for (int b = 0; b < 256; b++)
		qsort_r(set->idx + set->start[b], set->start[b + 1] - set->start[b], sizeof(int), cmp_len_desc,
		        t->added);
	return 0;
}

static int load_added(hi3_tok *t, json_t *list, const char *path, hi3_error *err)
{
	struct tok_work w = {0};
	size_t n = json_is_array(list) ? json_array_size(list) : 0;
	int rc = -1;

	if (list && !json_is_null(list) && !json_is_array(list))
		return bad(err, path, "\"added_tokens\" is not a list");
	t->added = calloc(n + 1, sizeof(*t->added));
	if (!t->added)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "tokenizer: out of memory");
	for (size_t i = 0; i < n; i++) {
		json_t *o = json_array_get(list, i), *content = json_object_get(o, "content");
		json_t *id = json_object_get(o, "id");
		struct added a = {0};
		ptrdiff_t prev;
		int model_id;

		if (!json_is_string(content) || !json_is_integer(id) || json_integer_value(id) < 0 ||
		    json_integer_value(id) > INT32_MAX - 1) {
			hi3_error_set(err, HI3_ERR_INPUT, "%s: added_tokens[%zu]: expected \"content\" and a valid \"id\"",
			              path, i);
			goto out;
		}
		a.len = json_string_length(content);
		if (a.len == 0)
			continue;   /* the library ignores empty added tokens */
		if (memchr(json_string_value(content), '\0', a.len)) {   /* named as C strings (hi3_tok_id) */
			hi3_error_set(err, HI3_ERR_INPUT, "%s: added_tokens[%zu]: \"content\" holds a NUL character "
			              "(\\u0000)", path, i);
			goto out;
		}
		a.id = json_integer_value(id);
		a.single_word = hi3i_tok_json_bool(o, "single_word", 0);
		a.lstrip = hi3i_tok_json_bool(o, "lstrip", 0);
		a.rstrip = hi3i_tok_json_bool(o, "rstrip", 0);
		a.normalized = hi3i_tok_json_bool(o, "normalized", 1);
		a.special = hi3i_tok_json_bool(o, "special", 0);
		if (a.single_word < 0 || a.lstrip < 0 || a.rstrip < 0 || a.normalized < 0 || a.special < 0) {
			hi3_error_set(err, HI3_ERR_INPUT, "%s: added_tokens[%zu]: flags must be booleans", path, i);
			goto out;
		}
		/* a token the model already knows keeps the model's id */
		model_id = vocab_id(t, json_string_value(content), a.len);
		if (model_id >= 0)
			a.id = model_id;
		prev = strmap_find(&t->added_map, json_string_value(content), a.len);
		if (prev >= 0) {
			struct added *p = &t->added[t->added_map.ent[prev].val];
			free(p->match);
			a.content = p->content;
			*p = a;
		} else {
			if (strmap_put(&t->added_map, json_string_value(content), a.len, (int32_t)t->n_added, err))
				goto out;
			t->added[t->n_added++] = a;
		}
	}
	/* contents point into the map's arena, which is final now */
	for (size_t i = 0; i < t->added_map.n; i++) {
		struct added *a = &t->added[t->added_map.ent[i].val];
		struct tok_span in, outs;
		a->content = strmap_key(&t->added_map, i);
		in.off = 0;
		in.len = a->len;
		w.buf.n = 0;
		if (hi3i_tok_buf_add(&w.buf, a->content, a->len, err))
			goto out;
		outs = in;
		if (a->normalized && t->norm && hi3i_tok_norm_apply(t->norm, &w, in, &outs, err))
			goto out;
		a->match = malloc(outs.len + 1);
		if (!a->match) {
			hi3_error_set(err, HI3_ERR_RUNTIME, "tokenizer: out of memory");
			goto out;
		}
		memcpy(a->match, w.buf.p + outs.off, outs.len);
		a->match[outs.len] = '\0';
		a->match_len = outs.len;
		t->n_ids = HI3_MAX(t->n_ids, a->id + 1);
	}
	rc = 0;
out:
	hi3i_tok_work_release(&w);
	return rc;
}

int hi3_tok_load(hi3_tok **out, const char *path, hi3_error *err)
{
	hi3_tok *t = NULL;
	char *text = NULL, *rest = NULL;
	size_t len = 0;
	json_t *root = NULL;
	json_error_t jerr;
	struct tok_jspan vocab, merges;
	int rc = -1;

	*out = NULL;
	if (hi3i_read_file(path, &text, &len, err))
		return -1;
	t = calloc(1, sizeof(*t));
	if (!t || !(t->path = hi3i_strdup(path))) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "tokenizer: out of memory");
		goto out;
	}
	pthread_mutex_init(&t->cache.lock, NULL);
	snprintf(t->hash, sizeof(t->hash), "%016llx", (unsigned long long)hi3i_hash(HI3_HASH_INIT, text, len));
	/* vocab and merges are read from the text; jansson gets the rest */
	if (hi3i_tok_json_find_model(text, len, &vocab, &merges, path, err)) {
		root = json_loadb(text, len, JSON_ALLOW_NUL, &jerr);   /* for its error message */
		if (!root)
			hi3_error_set(err, HI3_ERR_INPUT, "%s: line %d column %d: %s", path, jerr.line, jerr.column,
			              jerr.text);
		goto out;
	}
	rest = malloc(len + 1);
	if (!rest) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "tokenizer: out of memory");
		goto out;
	}
	memcpy(rest, text, len + 1);
	hi3i_tok_json_blank(rest, &vocab);
	hi3i_tok_json_blank(rest, &merges);
	root = json_loadb(rest, len, JSON_ALLOW_NUL, &jerr);
	if (!root) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: line %d column %d: %s", path, jerr.line, jerr.column, jerr.text);
		goto out;
	}
	if (!json_is_object(root)) {
		bad(err, path, "not a JSON object");
		goto out;
	}
	if (load_model(t, json_object_get(root, "model"), text, &vocab, &merges, path, err) ||
	    hi3i_tok_norm_parse(&t->norm, json_object_get(root, "normalizer"), path, err) ||
	    hi3i_tok_pre_parse(&t->pre, json_object_get(root, "pre_tokenizer"), path, err) ||
	    load_decoder(t, json_object_get(root, "decoder"), path, err) ||
	    load_added(t, json_object_get(root, "added_tokens"), path, err) || build_reverse(t, err) ||
	    build_set(t, &t->raw_set, 0, err) || build_set(t, &t->norm_set, 1, err))
		goto out;
	rc = 0;
	*out = t;
	t = NULL;
out:
	json_decref(root);
	free(text);
	free(rest);
	hi3_tok_free(t);
	return rc;
}

static void cache_clear(struct cache *c)
{
	if (c->slot)
		memset(c->slot, 0, CACHE_SLOTS * sizeof(*c->slot));
	c->count = 0;
	c->keys.n = 0;
	c->n_ids = 0;
}

void hi3_tok_free(hi3_tok *t)
{
	if (!t)
		return;
	strmap_release(&t->vocab);
	free(t->merges.key);
	free(t->merges.val);
	free(t->vocab_r);
	free(t->added_r);
	free(t->prefix);
	free(t->suffix);
	for (size_t i = 0; i < t->n_added; i++)
		free(t->added[i].match);
	free(t->added);
	strmap_release(&t->added_map);
	free(t->raw_set.idx);
	free(t->norm_set.idx);
	hi3i_tok_norm_free(t->norm);
	hi3i_tok_pre_free(t->pre);
	if (t->path)
		pthread_mutex_destroy(&t->cache.lock);
	free(t->cache.slot);
	free(t->cache.keys.p);
	free(t->cache.ids);
	free(t->path);
	free(t);
}

/* ----------------------------------------------------------- id vector */

struct ids {
	int64_t *v;
	size_t n, cap;
};

static int ids_add(struct ids *o, int64_t id, hi3_error *err)
{
	TOK_GROW(o->v, o->n, o->cap, err, return -1);
	o->v[o->n++] = id;
	return 0;
}

/* ------------------------------------------------------------ BPE model */

struct sym {
	int32_t id;
	int32_t prev, next;
	uint32_t len;                   /* bytes; 0 once merged into its left neighbour */
};

struct merge {
	uint32_t rank, pos, id;
};

static int merge_less(const struct merge *a, const struct merge *b)
{
	return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

struct heap {
	struct merge *v;
	size_t n, cap;
};

static int heap_push(struct heap *h, uint32_t rank, uint32_t pos, uint32_t id, hi3_error *err)
{
	size_t i;

	TOK_GROW(h->v, h->n, h->cap, err, return -1);
	i = h->n++;
	h->v[i] = (struct merge){rank, pos, id};
	while (i > 0 && merge_less(&h->v[i], &h->v[(i - 1) / 2])) {
		struct merge tmp = h->v[i];
		h->v[i] = h->v[(i - 1) / 2];
		h->v[(i - 1) / 2] = tmp;
		i = (i - 1) / 2;
	}
	return 0;
}

static struct merge heap_pop(struct heap *h)
{
	struct merge top = h->v[0];
	size_t i = 0;

	h->v[0] = h->v[--h->n];
	for (;;) {
		size_t l = 2 * i + 1, r = l + 1, m = i;
		if (l < h->n && merge_less(&h->v[l], &h->v[m]))
			m = l;
		if (r < h->n && merge_less(&h->v[r], &h->v[m]))
			m = r;
		if (m == i)
			break;
		struct merge tmp = h->v[i];
		h->v[i] = h->v[m];
		h->v[m] = tmp;
		i = m;
	}
	return top;
}

/* Scratch of one encode call for the BPE. */
struct bpe_work {
	struct sym *sym;
	size_t cap_sym;
	struct heap heap;
	struct tok_buf key;             /* a character with prefix/suffix */
};

static int sym_add(struct bpe_work *bw, size_t *n, int32_t id, size_t len, hi3_error *err)
{
	TOK_GROW(bw->sym, *n, bw->cap_sym, err, return -1);
	bw->sym[*n] = (struct sym){id, (int32_t)*n - 1, (int32_t)*n + 1, (uint32_t)len};
	(*n)++;
	return 0;
}

static void push_pair(const hi3_tok *t, struct bpe_work *bw, size_t pos, size_t next, hi3_error *err, int *rc)
{
	uint32_t rank, id;

	if (pairmap_get(&t->merges, (uint32_t)bw->sym[pos].id, (uint32_t)bw->sym[next].id, &rank, &id) &&
	    heap_push(&bw->heap, rank, (uint32_t)pos, id, err))
		*rc = -1;
}

/* Encode one piece with the model, appending ids to out. */
static int bpe_piece(const hi3_tok *t, struct bpe_work *bw, const char *s, size_t n, struct ids *out,
                     hi3_error *err)
{
	size_t ns = 0, i = 0, unk_len = 0;
	int have_unk = 0, rc = 0;

	if (t->ignore_merges) {
		int id = vocab_id(t, s, n);
		if (id >= 0)
			return ids_add(out, id, err);
	}
	while (i < n) {
		size_t len;
		int id;
		hi3i_utf8_get(s + i, n - i, &len);
		if (t->prefix_len || t->suffix_len) {
			bw->key.n = 0;
			if ((i > 0 && hi3i_tok_buf_add(&bw->key, t->prefix, t->prefix_len, err)) ||
			    hi3i_tok_buf_add(&bw->key, s + i, len, err) ||
			    (i + len == n && hi3i_tok_buf_add(&bw->key, t->suffix, t->suffix_len, err)))
				return -1;
			id = vocab_id(t, bw->key.p, bw->key.n);
		} else {
			id = vocab_id(t, s + i, len);
		}
		if (id >= 0) {
			if (have_unk && sym_add(bw, &ns, (int32_t)t->unk_id, unk_len, err))
				return -1;
			have_unk = 0;
			if (sym_add(bw, &ns, id, len, err))
				return -1;
		} else if (t->unk_id >= 0) {
			if (have_unk && t->fuse_unk) {
				unk_len += len;
			} else {
				if (have_unk && sym_add(bw, &ns, (int32_t)t->unk_id, unk_len, err))
					return -1;
				have_unk = 1;
				unk_len = len;
			}
		}
		/* with no unk_token an unknown character is dropped, as the library does */
		i += len;
	}
	if (have_unk && sym_add(bw, &ns, (int32_t)t->unk_id, unk_len, err))
		return -1;
	if (ns == 0)
		return 0;
	bw->sym[ns - 1].next = -1;
	bw->heap.n = 0;
	for (size_t k = 0; k + 1 < ns; k++)
		push_pair(t, bw, k, k + 1, err, &rc);
	while (rc == 0 && bw->heap.n) {
		struct merge top = heap_pop(&bw->heap);
		struct sym *cur = &bw->sym[top.pos], *right;
		uint32_t rank, id;

		if (cur->len == 0 || cur->next < 0)
			continue;
		right = &bw->sym[cur->next];
		if (!pairmap_get(&t->merges, (uint32_t)cur->id, (uint32_t)right->id, &rank, &id) || id != top.id)
			continue;   /* stale entry */
		cur->id = (int32_t)top.id;
		cur->len += right->len;
		cur->next = right->next;
		right->len = 0;
		if (cur->next >= 0)
			bw->sym[cur->next].prev = (int32_t)top.pos;
		if (cur->prev >= 0)
			push_pair(t, bw, (size_t)cur->prev, top.pos, err, &rc);
		if (cur->next >= 0)
			push_pair(t, bw, top.pos, (size_t)cur->next, err, &rc);
	}
	for (size_t k = 0; rc == 0 && k < ns; k++)
		if (bw->sym[k].len && ids_add(out, bw->sym[k].id, err))
			rc = -1;
	return rc;
}

/* Cached lookup; on a miss runs bpe_piece and stores the result. */
static int bpe_cached(const hi3_tok *t, struct bpe_work *bw, const char *s, size_t n, struct ids *out,
                      hi3_error *err)
{
	struct cache *c = (struct cache *)&t->cache;
	uint64_t h;
	size_t at, first;
	int found = 0;

	if (n >= CACHE_MAX_KEY)
		return bpe_piece(t, bw, s, n, out, err);
	h = hash_bytes(s, n);
	pthread_mutex_lock(&c->lock);
	if (!c->slot)
		c->slot = calloc(CACHE_SLOTS, sizeof(*c->slot));
	if (c->slot) {
		for (at = h & (CACHE_SLOTS - 1); c->slot[at].klen; at = (at + 1) & (CACHE_SLOTS - 1)) {
			const struct centry *e = &c->slot[at];
			if (e->hash == h && e->klen == n && !memcmp(c->keys.p + e->koff, s, n)) {
				found = 1;
				for (uint32_t k = 0; k < e->nid; k++)
					if (ids_add(out, c->ids[e->ioff + k], err)) {
						pthread_mutex_unlock(&c->lock);
						return -1;
					}
				break;
			}
		}
	}
	pthread_mutex_unlock(&c->lock);
	if (found)
		return 0;
	first = out->n;
	if (bpe_piece(t, bw, s, n, out, err))
		return -1;
	pthread_mutex_lock(&c->lock);
	if (c->slot) {
		size_t nid = out->n - first;
		hi3_error ignore;
		if (c->count >= CACHE_MAX_ENTRIES || c->n_ids + nid >= UINT32_MAX / 2 || c->keys.n + n >= UINT32_MAX / 2)
			cache_clear(c);
		if (c->n_ids + nid > c->cap_ids) {
			size_t cap = HI3_MAX(c->cap_ids * 2, c->n_ids + nid + 1024);
			int32_t *v = realloc(c->ids, cap * sizeof(*v));
			if (v) {
				c->ids = v;
				c->cap_ids = cap;
			}
		}
		if (c->n_ids + nid <= c->cap_ids && hi3i_tok_buf_add(&c->keys, s, n, &ignore) == 0) {
			for (at = h & (CACHE_SLOTS - 1); c->slot[at].klen; at = (at + 1) & (CACHE_SLOTS - 1))
				;
			c->slot[at] = (struct centry){h, (uint32_t)(c->keys.n - n), (uint32_t)n, (uint32_t)c->n_ids,
			                              (uint32_t)nid};
			for (size_t k = 0; k < nid; k++)
				c->ids[c->n_ids++] = (int32_t)out->v[first + k];
			c->count++;
		}
	}
	pthread_mutex_unlock(&c->lock);
	return 0;
}

/* ------------------------------------------------------- added tokens */

/* Word characters as the Rust regex crate's \w: alphabetic, marks, decimal
 * digits, connector punctuation, joiners. */
static int is_word(uint32_t cp)
{
	utf8proc_category_t c;

	if (cp < 0x80)
		return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
	if (cp == 0x200c || cp == 0x200d || (cp >= 0x24b6 && cp <= 0x24e9) || (cp >= 0x1f130 && cp <= 0x1f189))
		return 1;
	c = utf8proc_category((utf8proc_int32_t)cp);
	return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_ME) || c == UTF8PROC_CATEGORY_ND ||
	       c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_PC;
}

/* The code point that ends s[0..n) (n > 0). */
static uint32_t last_cp(const char *s, size_t n)
{
	size_t p = n - 1, len;

	while (p > 0 && ((unsigned char)s[p] & 0xc0) == 0x80)
		p--;
	return hi3i_utf8_get(s + p, n - p, &len);
}

/* Leftmost-longest added token in s[from..n): index into t->added, or -1. */
static int find_added(const hi3_tok *t, const struct added_set *set, const char *s, size_t n, size_t from,
                      size_t *at)
{
	if (set->start[256] == 0)
		return -1;
	for (size_t i = from; i < n; i++) {
		unsigned char b = (unsigned char)s[i];
		for (size_t k = set->start[b]; k < set->start[b + 1]; k++) {
			const struct added *a = &t->added[set->idx[k]];
			if (a->match_len <= n - i && !memcmp(s + i, a->match, a->match_len)) {
				*at = i;
				return set->idx[k];
			}
		}
	}
	return -1;
}

struct seg {
	size_t off, len;
	int64_t id;                     /* added token, or -1 for text */
};

struct segs {
	struct seg *v;
	size_t n, cap;
};

static int seg_add(struct segs *s, size_t off, size_t len, int64_t id, hi3_error *err)
{
	TOK_GROW(s->v, s->n, s->cap, err, return -1);
	s->v[s->n++] = (struct seg){off, len, id};
	return 0;
}

/* Cut the added tokens of set out of buf[in], as the library's
 * AddedVocabulary::find_matches does, appending segments to out. */
static int split_added(const hi3_tok *t, const struct added_set *set, const char *buf, struct tok_span in,
                       int flags, struct segs *out, hi3_error *err)
{
	const char *s = buf + in.off;
	size_t n = in.len, from = 0, done = 0, at;
	int k;

	while ((k = find_added(t, set, s, n, from, &at)) >= 0) {
		const struct added *a = &t->added[k];
		size_t start = at, stop = at + a->match_len, len;

		from = stop;
		if (a->special && !(flags & HI3_TOK_SPECIAL))
			continue;
		if (a->single_word) {
			int start_space = start == 0 || !is_word(last_cp(s, start));
			int stop_space = stop == n || !is_word(hi3i_utf8_get(s + stop, n - stop, &len));
			if (!start_space || !stop_space)
				continue;
		}
		if (a->lstrip) {
			size_t p = start;
			while (p > 0) {
				size_t q = p - 1;
				while (q > 0 && ((unsigned char)s[q] & 0xc0) == 0x80)
					q--;
				if (!hi3i_tok_is_space(hi3i_utf8_get(s + q, n - q, &len)))
					break;
				p = q;
			}
			start = HI3_MAX(p, done);
		}
		if (a->rstrip)
			while (stop < n && hi3i_tok_is_space(hi3i_utf8_get(s + stop, n - stop, &len)))
				stop += len;
		if (done < start && seg_add(out, in.off + done, start - done, -1, err))
			return -1;
		if (seg_add(out, in.off + start, stop - start, a->id, err))
			return -1;
		done = stop;
	}
	if (done < n && seg_add(out, in.off + done, n - done, -1, err))
		return -1;
	return 0;
}

/* ------------------------------------------------------------- encode */

/* Pre-tokenize one text segment and encode its pieces. */
static int encode_segment(const hi3_tok *t, struct tok_work *w, struct bpe_work *bw, struct tok_span seg,
                          struct ids *out, hi3_error *err)
{
	w->a.n = 0;
	if (hi3i_tok_spans_add(&w->a, seg.off, seg.len, err))
		return -1;
	if (t->pre && hi3i_tok_pre_apply(t->pre, w, err))
		return -1;
	for (size_t i = 0; i < w->a.n; i++)
		if (w->a.v[i].len && bpe_cached(t, bw, w->buf.p + w->a.v[i].off, w->a.v[i].len, out, err))
			return -1;
	return 0;
}

int hi3_tok_encode(const hi3_tok *t, const char *text, size_t len, int flags, int64_t **ids, size_t *n,
                   hi3_error *err)
{
	struct tok_work w = {0};
	struct bpe_work bw = {0};
	struct segs raw = {0}, normd = {0};
	struct ids out = {0};
	size_t valid = hi3i_utf8_valid_prefix(text, len);
	int rc = -1;

	*ids = NULL;
	*n = 0;
	if (valid != len)
		return hi3_error_set(err, HI3_ERR_INPUT, "text is not valid UTF-8 (byte %zu)", valid);
	if (hi3i_tok_buf_reserve(&w.buf, len + 1, err) || hi3i_tok_buf_add(&w.buf, text, len, err) ||
	    split_added(t, &t->raw_set, w.buf.p, (struct tok_span){0, len}, flags, &raw, err))
		goto out;
	for (size_t i = 0; i < raw.n; i++) {
		struct tok_span seg = {raw.v[i].off, raw.v[i].len};
		if (raw.v[i].id >= 0) {
			if (ids_add(&out, raw.v[i].id, err))
				goto out;
			continue;
		}
		if (t->norm && hi3i_tok_norm_apply(t->norm, &w, seg, &seg, err))
			goto out;
		normd.n = 0;
		if (split_added(t, &t->norm_set, w.buf.p, seg, flags, &normd, err))
			goto out;
		for (size_t j = 0; j < normd.n; j++) {
			if (normd.v[j].id >= 0) {
				if (ids_add(&out, normd.v[j].id, err))
					goto out;
			} else if (encode_segment(t, &w, &bw, (struct tok_span){normd.v[j].off, normd.v[j].len}, &out,
			                          err)) {
				goto out;
			}
		}
	}
	if (!out.v && !(out.v = malloc(sizeof(*out.v)))) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "tokenizer: out of memory");
		goto out;
	}
	*ids = out.v;
	*n = out.n;
	out.v = NULL;
	rc = 0;
out:
	free(out.v);
	free(raw.v);
	free(normd.v);
	free(bw.sym);
	free(bw.heap.v);
	free(bw.key.p);
	hi3i_tok_work_release(&w);
	return rc;
}

/* ------------------------------------------------------------- decode */

/* Append s as String::from_utf8_lossy would: each maximal invalid
 * subsequence becomes one U+FFFD. A byte gives at most 3 bytes of output
 * (a lone byte becomes U+FFFD), so 3n + 1 are reserved and the ASCII
 * stores below stay inside them. */
static int add_lossy(struct tok_buf *o, const unsigned char *s, size_t n, hi3_error *err)
{
	static const char fffd[] = "\xef\xbf\xbd";
	size_t i = 0;

	if (n > (SIZE_MAX - 1) / 3)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "tokenizer: out of memory");
	if (hi3i_tok_buf_reserve(o, 3 * n + 1, err))
		return -1;
	while (i < n) {
		unsigned c = s[i];
		size_t need, k;
		unsigned lo = 0x80, hi = 0xbf;

		if (c < 0x80) {
			o->p[o->n++] = (char)c;
			i++;
			continue;
		}
		if (c >= 0xc2 && c <= 0xdf)
			need = 1;
		else if (c >= 0xe0 && c <= 0xef)
			need = 2, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
		else if (c >= 0xf0 && c <= 0xf4)
			need = 3, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
		else
			need = 0;
		for (k = 1; k <= need && i + k < n; k++) {
			unsigned b = s[i + k];
			if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xbf))
				break;
		}
		if (need && k == need + 1) {
			if (hi3i_tok_buf_add(o, s + i, need + 1, err))
				return -1;
			i += need + 1;
		} else {
			if (hi3i_tok_buf_add(o, fffd, 3, err))
				return -1;
			i += need ? k : 1;
		}
	}
	return 0;
}

/* The string of id (added tokens first), or NULL. */
static const char *token_of(const hi3_tok *t, int64_t id, size_t *len, int *added)
{
	*added = -1;
	if (id < 0 || id >= t->n_ids)
		return NULL;
	if (t->added_r[id] >= 0) {
		const struct added *a = &t->added[t->added_r[id]];
		*added = t->added_r[id];
		*len = a->normalized ? a->match_len : a->len;
		return a->normalized ? a->match : a->content;
	}
	if (t->vocab_r[id] >= 0) {
		*len = t->vocab.ent[t->vocab_r[id]].len;
		return strmap_key(&t->vocab, (size_t)t->vocab_r[id]);
	}
	return NULL;
}

/* transformers' PreTrainedTokenizerBase.clean_up_tokenization: each
 * replacement over the whole text in turn, as Python's str.replace, in
 * place (every one shortens the text). */
static size_t clean_up(char *s, size_t n)
{
	static const char *const from[] = {" .", " ?", " !", " ,", " ' ", " n't", " 'm", " 's", " 've", " 're"};
	static const char *const to[] = {".", "?", "!", ",", "'", "n't", "'m", "'s", "'ve", "'re"};

	for (size_t k = 0; k < HI3_ARRAY_SIZE(from); k++) {
		size_t fl = strlen(from[k]), tl = strlen(to[k]), r = 0, w = 0;
		while (r < n) {
			if (n - r >= fl && !memcmp(s + r, from[k], fl)) {
				memmove(s + w, to[k], tl);
				w += tl;
				r += fl;
			} else {
				s[w++] = s[r++];
			}
		}
		n = w;
	}
	s[n] = 0;
	return n;
}

int hi3_tok_decode(const hi3_tok *t, const int64_t *ids, size_t n, int flags, char **text, size_t *len,
                   hi3_error *err)
{
	struct tok_buf raw = {0}, o = {0};
	int first = 1, rc = -1;

	*text = NULL;
	if (len)
		*len = 0;
	for (size_t i = 0; i < n; i++) {
		size_t tl, p = 0;
		int added;
		const char *tok = token_of(t, ids[i], &tl, &added);
		ptrdiff_t sp;

		if (!tok && (flags & HI3_TOK_SKIP_UNKNOWN))
			continue;
		if (!tok) {
			hi3_error_set(err, HI3_ERR_INPUT, "token id %lld (position %zu) is not in the vocabulary of %s",
			              (long long)ids[i], i, t->path);
			goto out;
		}
		if (!(flags & HI3_TOK_SPECIAL) && (sp = strmap_find(&t->added_map, tok, tl)) >= 0 &&
		    t->added[t->added_map.ent[sp].val].special)
			continue;
		if (t->decoder == DEC_NONE) {
			if ((!first && hi3i_tok_buf_add(&raw, " ", 1, err)) || hi3i_tok_buf_add(&raw, tok, tl, err))
				goto out;
			first = 0;
			continue;
		}
		/* ByteLevel: characters back to bytes, unless one stands for no byte */
		if (hi3i_tok_buf_reserve(&raw, tl, err))
			goto out;
		{
			size_t mark = raw.n;
			while (p < tl) {
				size_t cl;
				int b = hi3i_tok_cp_byte(hi3i_utf8_get(tok + p, tl - p, &cl));
				if (b < 0)
					break;
				raw.p[raw.n++] = (char)b;
				p += cl;
			}
			if (p < tl) {
				raw.n = mark;
				if (hi3i_tok_buf_add(&raw, tok, tl, err))
					goto out;
			}
		}
	}
	if (add_lossy(&o, (const unsigned char *)raw.p, raw.n, err) || hi3i_tok_buf_add(&o, "", 1, err))
		goto out;
	*text = o.p;
	o.n = flags & HI3_TOK_CLEAN_UP ? clean_up(o.p, o.n - 1) : o.n - 1;
	if (len)
		*len = o.n;
	o.p = NULL;
	rc = 0;
out:
	free(raw.p);
	free(o.p);
	return rc;
}

/* ------------------------------------------------------------ lookups */

int64_t hi3_tok_id(const hi3_tok *t, const char *token)
{
	size_t n = strlen(token);
	ptrdiff_t e = strmap_find(&t->added_map, token, n);

	if (e >= 0)
		return t->added[t->added_map.ent[e].val].id;
	return vocab_id(t, token, n);
}

const char *hi3_tok_token(const hi3_tok *t, int64_t id)
{
	size_t len;
	int added;
	const char *s = token_of(t, id, &len, &added);

	if (s && added >= 0)
		return t->added[added].content;
	return s;
}

int64_t hi3_tok_vocab_size(const hi3_tok *t)
{
	return t->n_ids;
}

const char *hi3_tok_hash(const hi3_tok *t)
{
	return t->hash;
}

int hi3_tok_config_id(const hi3_tok *t, const char *config_path, const char *key, int64_t *id, hi3_error *err)
{
	json_error_t jerr;
	json_t *root = json_load_file(config_path, 0, &jerr), *v;
	const char *name;
	int rc = -1;

	*id = -1;
	if (!root)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: %s", config_path, jerr.text);
	v = json_object_get(root, key);
	if (json_is_object(v))
		v = json_object_get(v, "content");
	name = json_string_value(v);
	if (!name) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: no \"%s\" token named", config_path, key);
		goto out;
	}
	*id = hi3_tok_id(t, name);
	if (*id < 0) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: %s '%s' is not a token of %s", config_path, key, name, t->path);
		goto out;
	}
	rc = 0;
out:
	json_decref(root);
	return rc;
}
