/* test-forward.c -- the CPU forward pass against the PyTorch reference
 * fixtures (tests/ref/make_fixtures.py, tests/fixtures/forward-*.safetensors),
 * and batch invariance of hi3_forward.
 *
 * For each fixture: make the model with hi3_init_model (the fixture's preset,
 * seed and dtype), run hi3_forward over the fixture's batch (B = 3 rows of T
 * tokens, HI3_ATTN_SELF, a KV cache of C = T slots with slot[b,t] = t,
 * logits at every position, hidden states, routing) and compare.
 *
 * Tolerances. err(x) = max_i |x_i - ref_i| / max_i |ref_i| per tensor (per
 * layer for hidden states and K/V):
 *  - logits, K, V, hidden states, routing weights: err <= 1e-5, for f32 and
 *    for bf16 weights alike. Both sides widen the same bf16 weights to f32
 *    exactly and compute in fp32, so bf16 weights add no error of their own;
 *    the remaining difference is fp32 summation order (~1e-7 per op).
 *  - routed expert ids: equal. The fixture generator asserts that every
 *    routing decision has a probability margin >= 1e-4 (metadata
 *    route_margin), far above fp32 noise, so a difference is a bug.
 *
 * Batch invariance (hi3-batching(7), rule 8): each row run alone (B = 1, T = its real length,
 * no padding) gives bitwise the logits, K/V, hidden states and routing of
 * that row in the padded batch at its valid positions.
 *
 * Decode: the same batch as a prefill (HI3_ATTN_SELF) of the columns before
 * the last tokens, then one HI3_ATTN_CACHE call per remaining column, gives
 * the reference logits and K/V within the same 1e-5.
 */
#include <math.h>
#include <string.h>
#include <unistd.h>
#include "hi3.h"
#include "core/internal.h"
#include "tap.h"
#include "testdir.h"

#define TOL 1e-5

static const char *const fixtures[] = {"forward-tiny", "forward-tiny-moe", "forward-tiny-moe-bf16"};

static char *tmpdir;

/* max |a - ref| / max |ref| over n values; infinite if a holds NaN/Inf. */
static double rel_err(const float *a, const float *ref, size_t n)
{
	double md = 0.0, mr = 0.0;

	for (size_t i = 0; i < n; i++) {
		if (!isfinite(a[i]))
			return INFINITY;
		md = fmax(md, fabs((double)a[i] - (double)ref[i]));
		mr = fmax(mr, fabs((double)ref[i]));
	}
	return mr > 0.0 ? md / mr : md;
}

/* The fixture's tensors (pointers into its mapping). */
struct fix {
	hi3_st *st;
	int B, T, S, NL, H, n_kv, d, V, n_moe, topk;
	const int64_t *ids, *lengths;
	const int32_t *rope, *hi, *blocks, *route_ids;
	const float *hidden, *logits, *route_w;
	const float **k, **v;          /* [NL] (B, n_kv, T, d) */
};

/* What hi3_forward produced for a batch. */
struct run {
	int B, T;
	float *logits;                 /* (B, T, V) */
	float *hidden;                 /* (NL + 1, B, T, H) */
	int16_t *route_ids;            /* (B, T, n_moe, k) */
	float *route_w;
	hi3_kvcache *kv;               /* NL layers of (B, n_kv, T, d) */
	float **k, **v;                /* kv's layers */
};

static void run_free(struct run *r, int NL)
{
	free(r->logits);
	free(r->hidden);
	free(r->route_ids);
	free(r->route_w);
	(void)NL;
	hi3_kvcache_free(r->kv);   /* the model has dropped it: see run_rows */
	memset(r, 0, sizeof(*r));
}

static int get(const hi3_st *st, const char *name, hi3_dtype dt, int ndim, const int64_t *shape,
               const void **data)
{
	const hi3_tensor *t;
	hi3_error err = {0};

	if (hi3_st_get(st, name, (int)dt, ndim, shape, &t, &err) != 0) {
		ok(0, "fixture tensor %s: %s", name, err.msg);
		return -1;
	}
	*data = t->data;
	return 0;
}

static int fix_load(struct fix *f, const char *path, const hi3_config *c, int n_moe, int max_k)
{
	hi3_error err = {0};
	const hi3_tensor *t;
	char nm[32];

	memset(f, 0, sizeof(*f));
	if (hi3_st_open(&f->st, path, HI3_ST_READ, &err) != 0)
		return ok(0, "open %s: %s", path, err.msg), -1;
	if (!(t = hi3_st_find(f->st, "ids")) || t->ndim != 2)
		return ok(0, "%s: no (B, T) tensor 'ids'", path), -1;
	f->B = (int)t->shape[0];
	f->T = (int)t->shape[1];
	if (!(t = hi3_st_find(f->st, "blocks")) || t->ndim != 3)
		return ok(0, "%s: no (B, S, 2) tensor 'blocks'", path), -1;
	f->S = (int)t->shape[1];
	f->NL = c->num_hidden_layers;
	f->H = c->hidden_size;
	f->n_kv = c->num_key_value_heads;
	f->d = c->attention_head_dim;
	f->V = c->vocab_size;
	f->n_moe = n_moe;
	f->topk = max_k;
	{
		const int64_t B = f->B, T = f->T;
		const int64_t s_bt[] = {B, T}, s_bt2[] = {B, T, 2}, s_bs2[] = {B, f->S, 2}, s_b[] = {B};
		const int64_t s_hid[] = {f->NL + 1, B, T, f->H}, s_kv[] = {B, f->n_kv, T, f->d};
		const int64_t s_log[] = {B, T, f->V}, s_rt[] = {B, T, n_moe, max_k};

		if (get(f->st, "ids", HI3_I64, 2, s_bt, (const void **)&f->ids) ||
		    get(f->st, "rope", HI3_I32, 3, s_bt2, (const void **)&f->rope) ||
		    get(f->st, "hi", HI3_I32, 2, s_bt, (const void **)&f->hi) ||
		    get(f->st, "blocks", HI3_I32, 3, s_bs2, (const void **)&f->blocks) ||
		    get(f->st, "lengths", HI3_I64, 1, s_b, (const void **)&f->lengths) ||
		    get(f->st, "hidden", HI3_F32, 4, s_hid, (const void **)&f->hidden) ||
		    get(f->st, "logits", HI3_F32, 3, s_log, (const void **)&f->logits))
			return -1;
		f->k = calloc((size_t)f->NL, sizeof(*f->k));
		f->v = calloc((size_t)f->NL, sizeof(*f->v));
		if (!f->k || !f->v)
			return ok(0, "out of memory"), -1;
		for (int l = 0; l < f->NL; l++) {
			snprintf(nm, sizeof(nm), "k.%d", l);
			if (get(f->st, nm, HI3_F32, 4, s_kv, (const void **)&f->k[l]))
				return -1;
			snprintf(nm, sizeof(nm), "v.%d", l);
			if (get(f->st, nm, HI3_F32, 4, s_kv, (const void **)&f->v[l]))
				return -1;
		}
		if (n_moe > 0 && (get(f->st, "route_ids", HI3_I32, 4, s_rt, (const void **)&f->route_ids) ||
		                  get(f->st, "route_w", HI3_F32, 4, s_rt, (const void **)&f->route_w)))
			return -1;
	}
	return 0;
}

static void fix_close(struct fix *f)
{
	free(f->k);
	free(f->v);
	hi3_st_close(f->st);
}

/* Run rows [r0, r0 + B) of the fixture, tokens [0, T) of each, with a KV
 * cache of T slots (slot[b,t] = t). */
static int run_rows(hi3_model *m, const struct fix *f, int r0, int B, int T, struct run *out)
{
	const int NL = f->NL, H = f->H, kvn = f->n_kv * T * f->d, K = f->topk > 0 ? f->topk : 1;
	int64_t *ids = malloc(sizeof(int64_t) * (size_t)B * T), *slot = malloc(sizeof(int64_t) * (size_t)B * T);
	int32_t *rope = malloc(sizeof(int32_t) * 2 * (size_t)B * T), *hi = malloc(sizeof(int32_t) * (size_t)B * T);
	int32_t *at = malloc(sizeof(int32_t) * 2 * (size_t)B * T);
	const int32_t *blocks = f->blocks + (size_t)r0 * f->S * 2;
	hi3_batch b = {0};
	hi3_error err = {0};
	int rc = -1;

	memset(out, 0, sizeof(*out));
	out->B = B;
	out->T = T;
	out->logits = malloc(sizeof(float) * (size_t)B * T * f->V);
	out->hidden = malloc(sizeof(float) * (size_t)(NL + 1) * B * T * H);
	out->route_ids = malloc(sizeof(int16_t) * (size_t)B * T * (f->n_moe ? f->n_moe : 1) * K);
	out->route_w = malloc(sizeof(float) * (size_t)B * T * (f->n_moe ? f->n_moe : 1) * K);
	out->kv = hi3_kvcache_alloc(NL, B, f->n_kv, T, f->d, HI3_F32, &err);
	if (!ids || !slot || !rope || !hi || !at || !out->logits || !out->hidden || !out->route_ids ||
	    !out->route_w || !out->kv)
		goto out;
	out->k = (float **)out->kv->k;
	out->v = (float **)out->kv->v;
	for (int l = 0; l < NL; l++)        /* NaN where nothing is written, so a slot left unwritten shows */
		for (size_t i = 0; i < (size_t)B * kvn; i++)
			out->k[l][i] = out->v[l][i] = NAN;
	for (int r = 0; r < B; r++)
		for (int t = 0; t < T; t++) {
			size_t i = (size_t)r * T + t, src = (size_t)(r0 + r) * f->T + t;
			ids[i] = f->ids[src];
			rope[2 * i] = f->rope[2 * src];
			rope[2 * i + 1] = f->rope[2 * src + 1];
			hi[i] = f->hi[src];
			slot[i] = t;
			at[2 * i] = r;
			at[2 * i + 1] = t;
		}
	b.B = B;
	b.T = T;
	b.mode = HI3_ATTN_SELF;
	b.ids = ids;
	b.rope = rope;
	b.hi = hi;
	b.blocks = blocks;
	b.S = f->S;
	b.slot = slot;
	b.n_logits = B * T;
	b.logit_at = at;
	b.logits = out->logits;
	b.hidden_out = out->hidden;
	if (f->n_moe) {
		b.route_ids = out->route_ids;
		b.route_w = out->route_w;
	}
	if (hi3_forward(m, out->kv, &b, &err) != 0) {
		ok(0, "hi3_forward (rows %d..%d, T = %d): %s", r0, r0 + B - 1, T, err.msg);
		goto out;
	}
	rc = 0;
out:
	hi3_model_drop_cache(m, out->kv);
	if (rc) {
		if (!err.msg[0])
			ok(0, "out of memory");
		run_free(out, NL);
	}
	free(ids);
	free(slot);
	free(rope);
	free(hi);
	free(at);
	return rc;
}

static void compare_reference(const char *name, const struct fix *f, const struct run *r)
{
	const size_t BT = (size_t)f->B * f->T, kvn = BT * f->n_kv * f->d;
	double e, ek = 0.0, ev = 0.0, eh = 0.0;
	int worst_h = 0, same = 1, first_bad = -1;

	e = rel_err(r->logits, f->logits, BT * f->V);
	diag("%s: logits max rel err %.3g", name, e);
	ok(e <= TOL, "%s: logits (B, T, V) within %g of the reference (max rel err %.3g)", name, TOL, e);
	for (int l = 0; l < f->NL; l++) {
		ek = fmax(ek, rel_err(r->k[l], f->k[l], kvn));
		ev = fmax(ev, rel_err(r->v[l], f->v[l], kvn));
	}
	diag("%s: K max rel err %.3g, V max rel err %.3g (worst layer)", name, ek, ev);
	ok(ek <= TOL && ev <= TOL, "%s: K and V of every layer within %g (max rel err K %.3g, V %.3g)", name, TOL,
	   ek, ev);
	for (int l = 0; l <= f->NL; l++) {
		double x = rel_err(r->hidden + (size_t)l * BT * f->H, f->hidden + (size_t)l * BT * f->H, BT * f->H);
		if (x > eh) {
			eh = x;
			worst_h = l;
		}
	}
	diag("%s: hidden states max rel err %.3g (at layer input %d of %d)", name, eh, worst_h, f->NL);
	ok(eh <= TOL, "%s: hidden states (layer inputs and ln_f input) within %g (max rel err %.3g)", name, TOL, eh);
	if (!f->n_moe)
		return;
	for (size_t i = 0; i < BT * f->n_moe * f->topk; i++)
		if (r->route_ids[i] != f->route_ids[i]) {
			same = 0;
			if (first_bad < 0)
				first_bad = (int)i;
		}
	if (first_bad >= 0) {
		int per_tok = f->n_moe * f->topk, tok = first_bad / per_tok;
		diag("%s: first routing difference at row %d, column %d, MoE layer %d, rank %d: %d, reference %d", name,
		     tok / f->T, tok % f->T, (first_bad % per_tok) / f->topk, first_bad % f->topk, r->route_ids[first_bad],
		     f->route_ids[first_bad]);
	}
	ok(same, "%s: routed expert ids equal the reference for every token and MoE layer (margin %s)", name,
	   hi3_st_meta(f->st, "route_margin") ? hi3_st_meta(f->st, "route_margin") : "?");
	e = rel_err(r->route_w, f->route_w, BT * f->n_moe * f->topk);
	diag("%s: routing weights max rel err %.3g", name, e);
	ok(e <= TOL, "%s: routing weights within %g (max rel err %.3g)", name, TOL, e);
}

/* Row b alone must equal row b of the batch at its valid positions, bit for bit. */
static void check_row_alone(hi3_model *m, const char *name, const struct fix *f, const struct run *all, int b)
{
	const int n = (int)f->lengths[b], T = f->T, H = f->H, d = f->d, V = f->V;
	struct run one;
	int lg = 1, kv = 1, hid = 1, rt = 1;

	if (n < 1 || n > T) {
		ok(0, "%s: row %d has length %d of %d", name, b, n, T);
		return;
	}
	if (run_rows(m, f, b, 1, n, &one) != 0)
		return;
	if (memcmp(one.logits, all->logits + (size_t)b * T * V, sizeof(float) * (size_t)n * V))
		lg = 0;
	for (int l = 0; l < f->NL; l++)
		for (int j = 0; j < f->n_kv; j++) {
			size_t o1 = (size_t)j * n * d, ob = ((size_t)b * f->n_kv + j) * T * d;
			if (memcmp(one.k[l] + o1, all->k[l] + ob, sizeof(float) * (size_t)n * d) ||
			    memcmp(one.v[l] + o1, all->v[l] + ob, sizeof(float) * (size_t)n * d))
				kv = 0;
		}
	for (int l = 0; l <= f->NL; l++)
		if (memcmp(one.hidden + (size_t)l * n * H, all->hidden + ((size_t)l * f->B + b) * T * H,
		           sizeof(float) * (size_t)n * H))
			hid = 0;
	if (f->n_moe) {
		size_t per = (size_t)f->n_moe * f->topk;
		if (memcmp(one.route_ids, all->route_ids + (size_t)b * T * per, sizeof(int16_t) * n * per) ||
		    memcmp(one.route_w, all->route_w + (size_t)b * T * per, sizeof(float) * n * per))
			rt = 0;
	}
	ok(lg && kv, "%s: row %d alone (T = %d) gives bitwise the batch's logits and K/V at its valid positions%s%s",
	   name, b, n, lg ? "" : " [logits differ]", kv ? "" : " [K/V differ]");
	ok(hid && rt, "%s: row %d alone gives bitwise the batch's hidden states and routing%s%s", name, b,
	   hid ? "" : " [hidden states differ]", rt ? "" : " [routing differs]");
	run_free(&one, f->NL);
}

/* The same batch as prefill + decode: HI3_ATTN_SELF over columns [0, P)
 * (P past every full-attention block) writing slots [0, P), then one
 * HI3_ATTN_CACHE call per column p >= P (slot p, the fixture's hi). The
 * logits of every call and the final cache must match the reference. */
static void check_decode(hi3_model *m, const char *name, const struct fix *f)
{
	const int B = f->B, T = f->T, V = f->V, NL = f->NL;
	const size_t kvn = (size_t)B * f->n_kv * T * f->d;
	int P = 1, failed = 0;
	int64_t *ids = malloc(sizeof(int64_t) * (size_t)B * T), *slot = malloc(sizeof(int64_t) * (size_t)B * T);
	int32_t *rope = malloc(sizeof(int32_t) * 2 * (size_t)B * T), *hi = malloc(sizeof(int32_t) * (size_t)B * T);
	int32_t *at = malloc(sizeof(int32_t) * 2 * (size_t)B * T);
	float *logits = malloc(sizeof(float) * (size_t)B * T * V), *ref = malloc(sizeof(float) * (size_t)B * T * V);
	float **k = NULL, **v = NULL;
	hi3_kvcache *kv = NULL;
	hi3_error err = {0};
	double el, worst = 0.0, ek = 0.0, ev = 0.0;

	for (int i = 0; i < B * f->S; i++)
		P = f->blocks[2 * i + 1] > P ? f->blocks[2 * i + 1] : P;
	if (!ids || !slot || !rope || !hi || !at || !logits || !ref || P >= T) {
		ok(0, "%s: decode check: out of memory, or no column after the image blocks", name);
		goto out;
	}
	if (!(kv = hi3_kvcache_alloc(NL, B, f->n_kv, T, f->d, HI3_F32, &err))) {
		ok(0, "%s", err.msg);
		goto out;
	}
	k = (float **)kv->k;
	v = (float **)kv->v;
	for (int l = 0; l < NL; l++)
		for (size_t i = 0; i < kvn; i++)
			k[l][i] = v[l][i] = NAN;
	for (int c0 = 0; c0 < T && !failed; c0 = c0 ? c0 + 1 : P) {
		const int n = c0 ? 1 : P;         /* columns [c0, c0 + n) */
		hi3_batch b = {.B = B, .T = n, .mode = c0 ? HI3_ATTN_CACHE : HI3_ATTN_SELF, .ids = ids, .rope = rope,
		               .hi = hi, .blocks = f->blocks, .S = f->S, .slot = slot, .n_logits = B * n,
		               .logit_at = at, .logits = logits};
		for (int r = 0; r < B; r++)
			for (int t = 0; t < n; t++) {
				size_t i = (size_t)r * n + t, src = (size_t)r * T + c0 + t;
				ids[i] = f->ids[src];
				rope[2 * i] = f->rope[2 * src];
				rope[2 * i + 1] = f->rope[2 * src + 1];
				hi[i] = f->hi[src];
				slot[i] = c0 + t;
				at[2 * i] = r;
				at[2 * i + 1] = t;
				memcpy(ref + i * V, f->logits + src * V, sizeof(float) * (size_t)V);
			}
		if (hi3_forward(m, kv, &b, &err) != 0) {
			ok(0, "%s: %s over columns [%d, %d): %s", name, c0 ? "decode" : "prefill", c0, c0 + n, err.msg);
			goto out;
		}
		el = rel_err(logits, ref, (size_t)B * n * V);
		worst = fmax(worst, el);
		if (el > TOL) {
			diag("%s: logits of columns [%d, %d): max rel err %.3g", name, c0, c0 + n, el);
			failed = 1;
		}
	}
	diag("%s: prefill + decode logits max rel err %.3g", name, worst);
	ok(!failed, "%s: prefill of columns [0, %d) then one HI3_ATTN_CACHE step per column gives the reference "
	   "logits within %g (max rel err %.3g)", name, P, TOL, worst);
	for (int l = 0; l < NL; l++) {
		ek = fmax(ek, rel_err(k[l], f->k[l], kvn));
		ev = fmax(ev, rel_err(v[l], f->v[l], kvn));
	}
	diag("%s: cache after prefill + decode: K max rel err %.3g, V %.3g", name, ek, ev);
	ok(ek <= TOL && ev <= TOL, "%s: the cache after prefill + decode holds the reference K/V within %g", name, TOL);
out:
	hi3_model_drop_cache(m, kv);
	hi3_kvcache_free(kv);
	free(ids);
	free(slot);
	free(rope);
	free(hi);
	free(at);
	free(logits);
	free(ref);
}

static void check_fixture(const char *srcdir, const char *name)
{
	char path[1024], mdir[1024];
	hi3_st *st = NULL;
	hi3_error err = {0};
	hi3_init_opts io = {0};
	hi3_model *m = NULL;
	const char *preset, *seed, *dtype;
	int64_t seed_v;
	struct fix f;
	struct run all;

	snprintf(path, sizeof(path), "%s/tests/fixtures/%s.safetensors", srcdir, name);
	snprintf(mdir, sizeof(mdir), "%s/%s", tmpdir, name);
	if (hi3_st_open(&st, path, HI3_ST_READ, &err) != 0) {
		ok(0, "open fixture: %s", err.msg);
		return;
	}
	preset = hi3_st_meta(st, "preset");
	seed = hi3_st_meta(st, "seed");
	dtype = hi3_st_meta(st, "dtype");
	if (!ok(preset && seed && dtype && hi3_st_expect_format(st, "hi3.test.forward", &err) == 0 &&
	            hi3i_parse_i64(seed, 0, INT64_MAX, &seed_v) == 0 && (!strcmp(dtype, "f32") || !strcmp(dtype, "bf16")),
	        "%s: metadata names format, preset, seed and dtype%s%s", name, err.msg[0] ? ": " : "", err.msg)) {
		hi3_st_close(st);
		return;
	}
	io.preset = preset;
	io.seed = (uint64_t)seed_v;
	io.dtype = !strcmp(dtype, "bf16") ? HI3_BF16 : HI3_F32;
	ok(hi3_init_model(mdir, &io, &err) == 0, "%s: init-model --preset %s --seed %lld --dtype %s%s%s", name,
	   preset, (long long)seed_v, dtype, err.msg[0] ? ": " : "", err.msg);
	hi3_st_close(st);
	if (hi3_model_open(&m, mdir, NULL, &err) != 0) {
		ok(0, "%s: open model: %s", name, err.msg);
		return;
	}
	if (fix_load(&f, path, hi3_model_config(m), hi3_model_n_moe_layers(m), hi3_model_max_topk(m)) != 0) {
		fix_close(&f);
		hi3_model_close(m);
		return;
	}
	if (run_rows(m, &f, 0, f.B, f.T, &all) == 0) {
		compare_reference(name, &f, &all);
		for (int b = 0; b < f.B; b++)
			check_row_alone(m, name, &f, &all, b);
		run_free(&all, f.NL);
	}
	check_decode(m, name, &f);
	fix_close(&f);
	hi3_model_close(m);
}

int main(void)
{
	const char *srcdir = getenv("SRCDIR");

	if (!srcdir)
		srcdir = ".";
	if (!(tmpdir = testdir_new("test-forward")))
		return 1;
	hi3_set_log(NULL, NULL, HI3_LOG_WARN);
	for (size_t i = 0; i < sizeof(fixtures) / sizeof(fixtures[0]); i++)
		check_fixture(srcdir, fixtures[i]);
	testdir_done(tmpdir);
	return done_testing();
}
