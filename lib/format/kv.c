/* kv.c -- the KV file: create, open and check, commit (see kv.h; the table below). */
#include <stdatomic.h>
#include <stddef.h>
#include <string.h>
#include "format/kv.h"

enum { B_, L_, C_, G_, V_, N_KV, D_, N_MOE, K_, LAYERS, N_DIMS };

#define F(x) (int)offsetof(hi3_kvfile, x)
static const struct hi3i_ftensor tensors[] = {
	{"k.l", "F32 BF16", "B,n_kv,C,d", 0, F(cache.k), F(cache.dtype)},
	{"v.l", "F32 BF16", "B,n_kv,C,d", 0, F(cache.v), F(cache.dtype)},
	{"kv_len", "I64", "B", 0, F(kv_len), -1},
	{"prompt_len", "I64", "B", 0, F(prompt_len), -1},
	{"next_logits", "F32", "B,V", 0, F(next_logits), -1},
	{"next_logits_alt", "F32", "B,V", 0, F(next_logits_alt), -1},
	{"finished", "U8", "B", 0, F(finished), -1},
	{"gen_tokens", "I64", "B,G", 0, F(gen_tokens), -1},
	{"gen_logprobs", "F32", "B,G", 0, F(gen_logprobs), -1},
	{"gen_len", "I64", "B", 0, F(gen_len), -1},
	{"commit", "I64", "B", 0, F(commit), -1},
	{"gen_route_ids", "I16", "B,G,n_moe,k", 1, F(gen_route_ids), -1},      /* MoE models */
	{"gen_route_w", "F32", "B,G,n_moe,k", 1, F(gen_route_w), -1},
	{"prompt_route_ids", "I16", "B,L,n_moe,k", 2, F(prompt_route_ids), -1}, /* prefill --record-routing */
	{"prompt_route_w", "F32", "B,L,n_moe,k", 2, F(prompt_route_w), -1},
	{0},
};
#undef F
static const struct hi3i_fmeta meta[] = {
	{"model_fingerprint", "text", 0, -1}, {"conditions_hash", "text", 0, -1}, {"cond_file", "text", 0, -1},
	{"B", "int", 0, -1}, {"L", "int", 0, -1}, {"C", "int", 0, -1}, {"max_new", "int", 0, -1},
	{"kv_dtype", "text", 0, -1},
	{0},
};
const struct hi3i_format hi3i_format_kv = {
	HI3_FORMAT_KV, "KV", (const char *const[]){"B", "L", "C", "G", "V", "n_kv", "d", "n_moe", "k", "layers", NULL},
	tensors, meta, 0, 1,
};

int hi3i_kv_create(const char *path, const struct hi3i_model_facts *m, const hi3_cond *c, const char *cond_path,
                   int max_new, hi3_dtype dt, int prompt_routing, hi3_error *err)
{
	const int64_t B = c->B, C = (int64_t)c->L + max_new;
	const int64_t dims[N_DIMS] = {B, c->L, C, max_new, m->vocab, m->n_kv, m->d, m->n_moe, m->k, m->n_layers};
	hi3_kvfile kv = {.cache.dtype = dt};
	char hash[17], sB[24], sL[24], sC[24], sG[24];
	const char *mt[][2] = {
		{"model_fingerprint", m->fingerprint}, {"conditions_hash", hash}, {"cond_file", cond_path ? cond_path : ""},
		{"B", sB}, {"L", sL}, {"C", sC}, {"max_new", sG}, {"kv_dtype", hi3_dtype_name(dt)},
	};
	int rc;

	/* the cache, the record and the logits start as zeros; kv_len and
	 * prompt_len are the prompts' lengths */
	if (!(kv.commit = hi3i_calloc((size_t)B, sizeof(int64_t), err)))
		return -1;
	for (int i = 0; i < B; i++)
		kv.commit[i] = max_new == 0;        /* nothing to generate: finished at once */
	kv.kv_len = kv.prompt_len = (int64_t *)c->real_pos;
	if (m->n_moe > 0) {
		kv.gen_route_ids = (int16_t *)HI3I_ZEROS;
		kv.gen_route_w = (float *)HI3I_ZEROS;
		if (prompt_routing) {
			kv.prompt_route_ids = (int16_t *)HI3I_ZEROS;
			kv.prompt_route_w = (float *)HI3I_ZEROS;
		}
	}
	hi3i_cond_hash(c, hash);
	snprintf(sB, sizeof(sB), "%lld", (long long)B);
	snprintf(sL, sizeof(sL), "%d", c->L);
	snprintf(sC, sizeof(sC), "%lld", (long long)C);
	snprintf(sG, sizeof(sG), "%d", max_new);
	rc = hi3i_codec_write(&hi3i_format_kv, &kv, dims, mt, HI3_ARRAY_SIZE(mt), path, err);
	free(kv.commit);
	return rc;
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
	kv->n_moe = m->n_moe;
	kv->k_route = m->k;
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
		/* the routing records only for an MoE model, then both */
		int64_t dims[N_DIMS] = {B, L, C, G, V, m->n_kv, m->d, kv->n_moe, kv->k_route, nl};
		if (hi3i_codec_read(&hi3i_format_kv, kv->st, kv, dims, err) != 0)
			goto fail;
		if (kv->n_moe > 0 && !kv->gen_route_ids) {
			hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor 'gen_route_ids' is missing", path);
			goto fail;
		}
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
