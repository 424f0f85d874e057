/* kv.c -- the KV file: create, open and check, commit (see kv.h). */
#include <stdatomic.h>
#include <string.h>
#include "format/kv.h"

int hi3i_kv_create(const char *path, const struct hi3i_model_facts *m, const hi3_cond *c, const char *cond_path,
                   int max_new, hi3_dtype dt, int prompt_routing, hi3_error *err)
{
	int64_t B = c->B, C = (int64_t)c->L + max_new, G = max_new, V = m->vocab;
	int64_t n_moe = m->n_moe, k = m->k;
	hi3_st_writer *w = hi3_stw_new();
	char hash[17], buf[64], name[32];
	int64_t *commit = NULL;
	int rc = -1;

	if (!w)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	commit = hi3i_calloc((size_t)B, sizeof(int64_t), err);
	if (!commit)
		goto out;
	for (int i = 0; i < B; i++)
		commit[i] = max_new == 0;        /* nothing to generate: finished at once */
	hi3i_cond_hash(c, hash);
	hi3_stw_meta(w, "format", HI3_FORMAT_KV);
	hi3_stw_meta(w, "format_version", HI3_FORMAT_VERSION);
	hi3_stw_meta(w, "model_fingerprint", m->fingerprint);
	hi3_stw_meta(w, "conditions_hash", hash);
	hi3_stw_meta(w, "cond_file", cond_path ? cond_path : "");
#define META_INT(key, v) (snprintf(buf, sizeof(buf), "%lld", (long long)(v)), hi3_stw_meta(w, key, buf))
	META_INT("B", B);
	META_INT("L", c->L);
	META_INT("C", C);
	META_INT("max_new", max_new);
#undef META_INT
	hi3_stw_meta(w, "kv_dtype", hi3_dtype_name(dt));
	for (int l = 0; l < m->n_layers; l++) {
		int64_t sh[4] = {B, m->n_kv, C, m->d};
		snprintf(name, sizeof(name), "k.%d", l);
		if (hi3_stw_add(w, name, dt, 4, sh, NULL))
			goto oom;
		snprintf(name, sizeof(name), "v.%d", l);
		if (hi3_stw_add(w, name, dt, 4, sh, NULL))
			goto oom;
	}
	{
		int64_t sB[1] = {B}, sBV[2] = {B, V}, sBG[2] = {B, G}, sR[4] = {B, G, n_moe, k};
		if (hi3_stw_add(w, "kv_len", HI3_I64, 1, sB, c->real_pos) ||
		    hi3_stw_add(w, "prompt_len", HI3_I64, 1, sB, c->real_pos) ||
		    hi3_stw_add(w, "next_logits", HI3_F32, 2, sBV, NULL) ||
		    hi3_stw_add(w, "next_logits_alt", HI3_F32, 2, sBV, NULL) ||
		    hi3_stw_add(w, "finished", HI3_U8, 1, sB, NULL) ||
		    hi3_stw_add(w, "gen_tokens", HI3_I64, 2, sBG, NULL) ||
		    hi3_stw_add(w, "gen_logprobs", HI3_F32, 2, sBG, NULL) ||
		    hi3_stw_add(w, "gen_len", HI3_I64, 1, sB, NULL) ||
		    hi3_stw_add(w, "commit", HI3_I64, 1, sB, commit))
			goto oom;
		int64_t sP[4] = {B, c->L, n_moe, k};
		if (n_moe > 0 && (hi3_stw_add(w, "gen_route_ids", HI3_I16, 4, sR, NULL) ||
		                  hi3_stw_add(w, "gen_route_w", HI3_F32, 4, sR, NULL)))
			goto oom;
		if (n_moe > 0 && prompt_routing && (hi3_stw_add(w, "prompt_route_ids", HI3_I16, 4, sP, NULL) ||
		                                    hi3_stw_add(w, "prompt_route_w", HI3_F32, 4, sP, NULL)))
			goto oom;
	}
	rc = hi3_stw_write(w, path, err);
	goto out;
oom:
	hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
out:
	free(commit);
	hi3_stw_free(w);
	return rc;
}

static int get(hi3_kvfile *kv, const char *name, hi3_dtype dt, int ndim, const int64_t *shape, void **out,
               hi3_error *err)
{
	const hi3_tensor *t;

	if (hi3_st_get(kv->st, name, dt, ndim, shape, &t, err) != 0)
		return -1;
	*out = t->data;
	return 0;
}

static int meta_int(const hi3_st *st, const char *key, int64_t *out, hi3_error *err)
{
	const char *v = hi3_st_meta(st, key);

	if (!v || hi3i_parse_i64(v, 0, INT32_MAX, out) != 0)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: __metadata__ '%s' is missing or not a count",
		                     hi3_st_path(st), key);
	return 0;
}

/* Derive kv_len, gen_len and finished of a row from its commit word. */
static void derive(hi3_kvfile *kv, int i)
{
	int64_t c = kv->commit[i], g = c / 2;
	int fin = (int)(c & 1);

	kv->gen_len[i] = g;
	kv->finished[i] = (uint8_t)fin;
	kv->kv_len[i] = kv->prompt_len[i] + (fin && g > 0 ? g - 1 : g);
}

int hi3i_kv_open(hi3_kvfile *kv, const char *path, const struct hi3i_model_facts *m, const hi3_cond *c, int lock,
                 hi3_error *err)
{
	int64_t B, L, C, C_want, G, V = m->vocab;
	char name[32];
	int nl = m->n_layers;

	memset(kv, 0, sizeof(*kv));
	if (hi3_st_open(&kv->st, path, HI3_ST_RDWR, err) != 0)
		return -1;
	if (hi3_st_expect_format(kv->st, HI3_FORMAT_KV, err) != 0 || (lock && hi3i_st_lock(kv->st, err) != 0))
		goto fail;
	if (hi3i_check_made_by(path, hi3_st_meta(kv->st, "model_fingerprint"), m, err) != 0)
		goto fail;
	if (meta_int(kv->st, "B", &B, err) || meta_int(kv->st, "L", &L, err) || meta_int(kv->st, "C", &C, err) ||
	    meta_int(kv->st, "max_new", &G, err))
		goto fail;
	/* C slots of at most INT32_MAX / 2, as prefill makes them */
	if (hi3i_add_size(L, G, INT32_MAX / 2, &C_want) != 0 || C != C_want || B < 1) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: inconsistent B %lld, L %lld, C %lld, max_new %lld", path,
		              (long long)B, (long long)L, (long long)C, (long long)G);
		goto fail;
	}
	if (c) {
		if (c->B != B) {
			hi3_error_set(err, HI3_ERR_INPUT, "%s: has B = %lld rows, the conditions file has %d", path,
			              (long long)B, c->B);
			goto fail;
		}
		if (hi3i_check_made_from(path, hi3_st_meta(kv->st, "conditions_hash"), c, err) != 0)
			goto fail;
	}
	kv->B = (int)B;
	kv->L = (int)L;
	kv->C = (int)C;
	kv->G = (int)G;
	kv->V = (int)V;
	kv->v0 = 0;
	kv->nv = (int)V;
	kv->cache.n_layers = nl;
	kv->cache.B = (int)B;
	kv->cache.n_kv = m->n_kv;
	kv->cache.C = (int)C;
	kv->cache.d = m->d;
	kv->cache.k = calloc((size_t)nl, sizeof(void *));
	kv->cache.v = calloc((size_t)nl, sizeof(void *));
	if (!kv->cache.k || !kv->cache.v) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		goto fail;
	}
	{
		const hi3_tensor *t0 = hi3_st_find(kv->st, "k.0");
		int64_t sh[4] = {B, m->n_kv, C, m->d};
		if (!t0) {
			hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor 'k.0' is missing", path);
			goto fail;
		}
		kv->cache.dtype = t0->dtype;
		if (t0->dtype != HI3_F32 && t0->dtype != HI3_BF16) {
			hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor 'k.0': dtype %s, expected F32 or BF16", path,
			              hi3_dtype_name(t0->dtype));
			goto fail;
		}
		for (int l = 0; l < nl; l++) {
			snprintf(name, sizeof(name), "k.%d", l);
			if (get(kv, name, t0->dtype, 4, sh, &kv->cache.k[l], err))
				goto fail;
			snprintf(name, sizeof(name), "v.%d", l);
			if (get(kv, name, t0->dtype, 4, sh, &kv->cache.v[l], err))
				goto fail;
		}
	}
	{
		int64_t sB[1] = {B}, sBV[2] = {B, V}, sBG[2] = {B, G};
		if (get(kv, "kv_len", HI3_I64, 1, sB, (void **)&kv->kv_len, err) ||
		    get(kv, "prompt_len", HI3_I64, 1, sB, (void **)&kv->prompt_len, err) ||
		    get(kv, "next_logits", HI3_F32, 2, sBV, (void **)&kv->next_logits, err) ||
		    get(kv, "next_logits_alt", HI3_F32, 2, sBV, (void **)&kv->next_logits_alt, err) ||
		    get(kv, "finished", HI3_U8, 1, sB, (void **)&kv->finished, err) ||
		    get(kv, "gen_tokens", HI3_I64, 2, sBG, (void **)&kv->gen_tokens, err) ||
		    get(kv, "gen_logprobs", HI3_F32, 2, sBG, (void **)&kv->gen_logprobs, err) ||
		    get(kv, "gen_len", HI3_I64, 1, sB, (void **)&kv->gen_len, err) ||
		    get(kv, "commit", HI3_I64, 1, sB, (void **)&kv->commit, err))
			goto fail;
	}
	kv->n_moe = m->n_moe;
	kv->k_route = m->k;
	if (kv->n_moe > 0) {
		int64_t sR[4] = {B, G, kv->n_moe, kv->k_route};
		int64_t sP[4] = {B, L, kv->n_moe, kv->k_route};
		if (get(kv, "gen_route_ids", HI3_I16, 4, sR, (void **)&kv->gen_route_ids, err) ||
		    get(kv, "gen_route_w", HI3_F32, 4, sR, (void **)&kv->gen_route_w, err))
			goto fail;
		if (hi3_st_find(kv->st, "prompt_route_ids") &&
		    (get(kv, "prompt_route_ids", HI3_I16, 4, sP, (void **)&kv->prompt_route_ids, err) ||
		     get(kv, "prompt_route_w", HI3_F32, 4, sP, (void **)&kv->prompt_route_w, err)))
			goto fail;
	}
	for (int i = 0; i < B; i++) {
		int64_t g = kv->commit[i] / 2;
		if (kv->commit[i] < 0 || g > G || kv->prompt_len[i] < 1 || kv->prompt_len[i] > L ||
		    (c && kv->prompt_len[i] != c->real_pos[i])) {
			hi3_error_set(err, HI3_ERR_INPUT, "%s: row %d: inconsistent commit %lld / prompt_len %lld (L %lld, "
			              "max_new %lld)", path, i, (long long)kv->commit[i], (long long)kv->prompt_len[i],
			              (long long)L, (long long)G);
			goto fail;
		}
		for (int64_t j = 0; j < g; j++)
			if (kv->gen_tokens[(size_t)i * G + j] < 0 || kv->gen_tokens[(size_t)i * G + j] >= V) {
				hi3_error_set(err, HI3_ERR_INPUT, "%s: row %d: generated token %lld is %lld, outside the "
				              "vocabulary", path, i, (long long)j, (long long)kv->gen_tokens[(size_t)i * G + j]);
				goto fail;
			}
		derive(kv, i);
	}
	return 0;
fail:
	hi3i_kv_close(kv);
	return -1;
}

void hi3i_kv_close(hi3_kvfile *kv)
{
	free(kv->priv);
	free(kv->cache.k);
	free(kv->cache.v);
	hi3_st_close(kv->st);
	memset(kv, 0, sizeof(*kv));
}

float *hi3i_kv_logits(hi3_kvfile *kv, int row)
{
	float *buf = (kv->gen_len[row] % 2) ? kv->next_logits_alt : kv->next_logits;

	return buf + (size_t)row * kv->V;
}

float *hi3i_kv_logits_next(hi3_kvfile *kv, int row)
{
	float *buf = (kv->gen_len[row] % 2) ? kv->next_logits : kv->next_logits_alt;

	return buf + (size_t)row * kv->V;
}

int hi3i_kv_flush(hi3_kvfile *kv, hi3_error *err)
{
	const hi3_tensor *first = hi3_st_at(kv->st, 0);

	if (!first)
		return 0;
	return hi3_st_sync(kv->st, first->data, hi3_st_file_size(kv->st) - 8 - hi3_st_header_size(kv->st), err);
}

void hi3i_kv_commit(hi3_kvfile *kv, int row, int64_t gen_len, int finished)
{
	atomic_thread_fence(memory_order_seq_cst);           /* payload before the commit word */
	__atomic_store_n(&kv->commit[row], 2 * gen_len + (finished ? 1 : 0), __ATOMIC_SEQ_CST);
	derive(kv, row);
}

void hi3i_kv_settle(hi3_kvfile *kv)
{
	for (int i = 0; i < kv->B; i++)
		if (kv->gen_len[i] % 2)
			memcpy(kv->next_logits + (size_t)i * kv->V + kv->v0, kv->next_logits_alt + (size_t)i * kv->V + kv->v0,
			       sizeof(float) * (size_t)kv->nv);
}

int hi3i_kv_privatize(hi3_kvfile *kv, int logits_shared, hi3_error *err)
{
	const size_t B = (size_t)kv->B, G = (size_t)kv->G, V = (size_t)kv->V, R = (size_t)kv->n_moe * kv->k_route;
	struct {
		void **p;
		size_t n;
	} f[] = {
		{(void **)&kv->kv_len, B * 8}, {(void **)&kv->prompt_len, B * 8}, {(void **)&kv->gen_tokens, B * G * 8},
		{(void **)&kv->gen_len, B * 8}, {(void **)&kv->commit, B * 8}, {(void **)&kv->next_logits, B * V * 4},
		{(void **)&kv->next_logits_alt, B * V * 4}, {(void **)&kv->gen_logprobs, B * G * 4},
		{(void **)&kv->finished, B}, {(void **)&kv->gen_route_ids, B * G * R * 2},
		{(void **)&kv->gen_route_w, B * G * R * 4}, {(void **)&kv->prompt_route_ids, B * (size_t)kv->L * R * 2},
		{(void **)&kv->prompt_route_w, B * (size_t)kv->L * R * 4},
	};
	size_t tot = 0, off = 0;
	char *mem;

	if (logits_shared)
		f[5].n = f[6].n = 0;
	for (size_t i = 0; i < HI3_ARRAY_SIZE(f); i++)
		tot += *f[i].p ? (f[i].n + 63) / 64 * 64 : 0;
	if (!(mem = hi3i_aligned_alloc(tot + 64, err)))
		return -1;
	for (size_t i = 0; i < HI3_ARRAY_SIZE(f); i++) {
		if (!*f[i].p || !f[i].n)
			continue;
		memcpy(mem + off, *f[i].p, f[i].n);
		*f[i].p = mem + off;
		off += (f[i].n + 63) / 64 * 64;
	}
	kv->priv = mem;
	return 0;
}
