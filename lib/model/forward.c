/*
 * forward.c -- the HunyuanImage-3.0 decoder, top to bottom as hi3-batching(7), MODEL
 * reads, written against the backend ops table (backend.h).
 *
 * Per token:  x = wte[id]
 *   per layer: x += o_proj(attn(rope_qknorm(qkv_proj(rmsnorm_in(x)))))
 *              x += mlp(rmsnorm_post(x))        (dense SwiGLU or MoE)
 *   logits = lm_head(rmsnorm_f(x))
 * A diffusion call replaces the input rows of its image and timestep
 * tokens (b->embed_rows) and reads the last layer's output at the image
 * tokens (b->hidden), before ln_f, which image generation never applies.
 *
 * Shapes: M = B*T tokens of this call, H hidden, W = (n_h + 2 n_kv) d.
 *
 * Tracing: with a trace in the batch, each named point (hi3_trace_kind)
 * hands the recorder (trace.c) the buffer that holds it; without one a
 * point is one test of a NULL pointer.
 */
#include <math.h>
#include <string.h>
#include "model/model.h"

void hi3i_model_work_free(hi3_model *m)
{
	struct hi3_work *w = &m->w;
	void *bufs[] = {w->x, w->h, w->qkv, w->att, w->y, w->ab, w->mid, w->ye, w->xe, w->ys, w->rl, w->sab, w->smid, w->lx,
	                w->logits, w->ids, w->pos, w->rows, w->idx, w->slots, w->plan, w->scale, w->cidx, w->cscale};

	for (size_t i = 0; i < HI3_ARRAY_SIZE(bufs); i++)
		if (bufs[i])
			m->be->ops->free(m->be, bufs[i]);
	memset(w, 0, sizeof(*w));
}

/* Make sure the scratch buffers hold M tokens and n_logit logit rows. */
static int work_reserve(hi3_model *m, size_t M, size_t n_logit, hi3_error *err)
{
	struct hi3_work *w = &m->w;
	const hi3_config *c = &m->cfg;
	size_t H = (size_t)c->hidden_size, d = (size_t)c->attention_head_dim;
	size_t W = (size_t)(c->num_attention_heads + 2 * c->num_key_value_heads) * d;
	size_t I = (size_t)m->max_I, E = 1, V = (size_t)c->vocab_size, Kx = (size_t)HI3_MAX(m->max_k, 1);
	hi3_backend *be = m->be;

	for (int l = 0; l < c->num_hidden_layers; l++)
		if ((size_t)c->num_experts[l] > E)
			E = (size_t)c->num_experts[l];
	if (M > w->M) {
		size_t oldn = w->n_logit;
		hi3i_model_work_free(m);
		w->n_logit = oldn;
		M = M < 16 ? 16 : M;
#define A(p, n) ((p) = be->ops->alloc(be, (n))) == NULL
		/* expert buffers hold every (token, chosen expert) pair: M k rows */
		if (A(w->x, M * H * 4) || A(w->h, M * H * 4) || A(w->qkv, M * W * 4) ||
		    A(w->att, M * (size_t)c->num_attention_heads * d * 4) || A(w->y, M * H * 4) ||
		    A(w->ab, M * Kx * 2 * I * 4) || A(w->mid, M * Kx * I * 4) || A(w->ye, M * Kx * H * 4) ||
		    A(w->xe, M * Kx * H * 4) || A(w->ys, M * H * 4) || A(w->sab, M * 2 * I * 4) ||
		    A(w->smid, M * I * 4) || A(w->rl, M * E * 4) || A(w->ids, M * 8) || A(w->pos, M * 8) ||
		    A(w->rows, M * 4) || A(w->idx, M * Kx * 4) || A(w->slots, M * 8) ||
		    A(w->plan, M * sizeof(hi3_attn_q)) || A(w->scale, M * Kx * 4) || A(w->cidx, M * Kx * 4) ||
		    A(w->cscale, M * Kx * 4))
			goto oom;
		w->M = M;
		w->lx = NULL;
		w->logits = NULL;
		w->n_logit = 0;
	}
	if (n_logit > w->n_logit || !w->logits) {
		if (w->lx)
			be->ops->free(be, w->lx);
		if (w->logits)
			be->ops->free(be, w->logits);
		w->lx = w->logits = NULL;
		n_logit = n_logit < 1 ? 1 : n_logit;
		if (A(w->lx, n_logit * H * 4) || A(w->logits, n_logit * V * 4))
			goto oom;
		w->n_logit = n_logit;
	}
#undef A
	return 0;
oom:
	hi3i_model_work_free(m);
	return hi3_error_set(err, HI3_ERR_RUNTIME,
	                     "out of %s memory for %zu tokens of activations (%zu MiB free)", be->name, M,
	                     be->ops->mem_free(be) >> 20);
}

/* A named point: buf (M, w) on the device, or on the host. */
static void point(hi3_trace *tr, int kind, int layer, const float *buf, int w)
{
	if (tr)
		hi3i_trace_point(tr, kind, layer, buf, w);
}

static void host_point(hi3_trace *tr, int kind, int layer, const void *buf, int w)
{
	if (tr)
		hi3i_trace_host(tr, kind, layer, buf, w);
}

/* Name the product the backend runs next (its optional prefetch op), so
 * it may start reading its weights during the small ops before it. */
static void hint(hi3_model *m, const hi3_wt *w, int M)
{
	if (m->be->ops->prefetch && w)
		m->be->ops->prefetch(m->be, 1, &w, &M);
}

/* y (M, H) = SwiGLU MLP of h (M, H), into ab (M, 2I) and mid (M, I)
 * (split on the output rows of both products under tensor parallelism). */
static int mlp_forward(hi3_model *m, const struct hi3_mlp_w *mw, float *y, const float *h, float *ab, float *mid,
                       int M, hi3_error *err)
{
	hi3_backend *be = m->be;

	if (hi3i_shard_matmul(m, ab, h, mw->gate_up, 2 * mw->I, M, err) != 0)
		return -1;
	hint(m, mw->down, M);
	be->ops->swiglu(be, mid, ab, M, mw->I);
	return hi3i_shard_matmul(m, y, mid, mw->down, m->cfg.hidden_size, M, err);
}

/* Grouped products through the backend, or one by one when it has none. */
static void matmul_group(hi3_model *m, int n, float *const *y, const float *const *x, const hi3_wt *const *w,
                         const int *M)
{
	if (m->be->ops->matmul_group) {
		m->be->ops->matmul_group(m->be, n, y, x, w, M);
		return;
	}
	for (int i = 0; i < n; i++)
		m->be->ops->matmul(m->be, y[i], x[i], w[i], M[i]);
}

struct route {
	int16_t *ids;             /* (M, k) host */
	float *w;                 /* (M, k) host */
};

/* Top-k of softmax(logits) like upstream topkgating: fp32 softmax, ties to
 * the lower expert id, weights renormalised over the chosen k. p and used
 * are (E) scratch. */
static void route_token(const float *logit, int E, int k, int norm, float scale, const int16_t *force,
                        const float *force_w, int16_t *ids, float *w, float *p, uint8_t *used)
{
	float mx = -INFINITY, sum = 0.0f;

	memset(used, 0, (size_t)E);
	for (int e = 0; e < E; e++)
		mx = logit[e] > mx ? logit[e] : mx;
	for (int e = 0; e < E; e++) {
		p[e] = expf(logit[e] - mx);
		sum += p[e];
	}
	for (int e = 0; e < E; e++)
		p[e] /= sum;
	for (int j = 0; j < k; j++) {
		int best = -1;
		if (force) {
			best = force[j];
		} else {
			for (int e = 0; e < E; e++)
				if (!used[e] && (best < 0 || p[e] > p[best]))
					best = e;
		}
		used[best] = 1;
		ids[j] = (int16_t)best;
		w[j] = p[best];
	}
	if (force_w) {
		memcpy(w, force_w, sizeof(float) * (size_t)k);
		return;
	}
	if (norm && k > 1) {
		float s = 0.0f;
		for (int j = 0; j < k; j++)
			s += w[j];
		if (s < 1.1920928955078125e-07f)
			s = 1.1920928955078125e-07f;
		for (int j = 0; j < k; j++)
			w[j] /= s;
	} else {
		for (int j = 0; j < k; j++)
			w[j] *= scale;
	}
}

/*
 * The routed experts and the shared MLP on a rank of a layout: expert
 * group e computes its experts' (token, expert) rows, rows
 * [first[e0], first[e0 + ne]) of the packed buffers, on its tensor slot's
 * output columns; the gathers give every rank all rows of ab (rows, 2I)
 * and ye (rows, H), the same bits as one process (each element one dot
 * product in the GEMM's order), and the caller adds them up as one
 * process does. first/count (E) as moe_forward's.
 */
static int moe_experts_sharded(hi3_model *m, const struct hi3_layer_w *L, const float *h, int M, int rows,
                               const int *first, const int *count, hi3_error *err)
{
	const struct hi3_shard *sh = &m->sh;
	const int E = L->E, H = m->cfg.hidden_size, inter = L->experts[L->e0].I;
	const int g_lo = first[L->e0], g_rows = (L->e0 + L->ne < E ? first[L->e0 + L->ne] : rows) - g_lo;
	struct hi3_block *blk = NULL;
	float **ys = NULL, *part;
	const float **xs = NULL;
	const hi3_wt **ws = NULL;
	int *ms = NULL, rc = -1;

	if (rows > 0) {
		int lo1, n1, lo2, n2;
		hi3i_split(2 * inter, sh->tp, sh->t, &lo1, &n1);
		hi3i_split(H, sh->tp, sh->t, &lo2, &n2);
		blk = hi3i_malloc(sizeof(*blk) * (size_t)sh->size, err);
		ys = hi3i_calloc((size_t)L->ne, sizeof(*ys), err);
		xs = hi3i_calloc((size_t)L->ne, sizeof(*xs), err);
		ws = hi3i_calloc((size_t)L->ne, sizeof(*ws), err);
		ms = hi3i_calloc((size_t)L->ne, sizeof(*ms), err);
		if (!blk || !ys || !xs || !ws || !ms ||
		    !(part = hi3i_shard_scratch(m, (size_t)(g_rows ? g_rows : 1) * HI3_MAX(n1, n2), err)))
			goto out;
		for (int stage = 0; stage < 2; stage++) {
			const int N = stage ? H : 2 * inter, nc = stage ? n2 : n1;
			int n_jobs = 0;
			for (int e = L->e0; e < L->e0 + L->ne; e++)
				if (count[e]) {
					xs[n_jobs] = stage ? m->w.mid + (size_t)first[e] * inter : m->w.xe + (size_t)first[e] * H;
					ys[n_jobs] = part + (size_t)(first[e] - g_lo) * nc;
					ws[n_jobs] = stage ? L->experts[e].down : L->experts[e].gate_up;
					ms[n_jobs++] = count[e];
				}
			matmul_group(m, n_jobs, ys, xs, ws, ms);
			if (hi3i_backend_failed(m->be, err))
				goto out;
			for (int r = 0; r < sh->size; r++) {
				int e0, ne, c0, ncr, r0, r1;
				hi3i_split(E, sh->ep, r / sh->tp, &e0, &ne);
				hi3i_split(N, sh->tp, r % sh->tp, &c0, &ncr);
				r0 = first[e0];
				r1 = e0 + ne < E ? first[e0 + ne] : rows;
				blk[r] = (struct hi3_block){r0, r1 - r0, c0, ncr};
			}
			if (hi3i_shard_gather(m, stage ? m->w.ye : m->w.ab, rows, N, part, blk, err) != 0)
				goto out;
			if (!stage)
				m->be->ops->swiglu(m->be, m->w.mid, m->w.ab, rows, inter);
		}
	}
	if (L->has_shared && mlp_forward(m, &L->shared, m->w.ys, h, m->w.sab, m->w.smid, M, err) != 0)
		goto out;
	rc = 0;
out:
	free(blk);
	free(ys);
	free(xs);
	free(ws);
	free(ms);
	return rc;
}

/*
 * The routed experts and the shared MLP with the all-to-all dispatch
 * (tp = 1, rank = expert group g of G): the M tokens are split over the
 * groups, tokens [t0[g], t0[g] + mt[g]) are group g's. Every rank holds
 * every token's input, so nothing moves on the way in: group g computes
 * its experts' (token, expert) rows, as with the gather, and sends each
 * row to its token's group. A group adds its tokens' rows in the packed
 * order (expert ascending, as one process does), then its tokens' shared
 * MLP, and the groups' sums y (mt, H) are all-gathered. Each element is
 * the same sum in the same order as in one process: bitwise the same y.
 * idx, sc (rows) host: each packed row's token and weight.
 */
static int moe_experts_alltoall(hi3_model *m, const struct hi3_layer_w *L, float *y, const float *h, int M,
                                int rows, const int *first, const int *count, const int32_t *idx, const float *sc,
                                hi3_error *err)
{
	const struct hi3_shard *sh = &m->sh;
	hi3_backend *be = m->be;
	const int E = L->E, H = m->cfg.hidden_size, inter = L->experts[L->e0].I, G = sh->size, me = sh->rank;
	const int g_lo = first[L->e0], g_rows = (L->e0 + L->ne < E ? first[L->e0 + L->ne] : rows) - g_lo;
	int *owner = NULL, *t0 = NULL, *nsend = NULL, *nrecv = NULL, *ecnt = NULL, *ms = NULL;
	int32_t *perm = NULL, *idx2 = NULL;     /* (g_rows): packed rows in sending order; (rows): tokens received */
	float *sc2 = NULL, **ys = NULL;
	const float **xs = NULL;
	const hi3_wt **ws = NULL;
	int rc = -1, n_mine = 0;

	owner = hi3i_malloc(sizeof(int) * (size_t)M, err);
	t0 = hi3i_malloc(sizeof(int) * (size_t)(G + 1), err);
	nsend = hi3i_calloc((size_t)G, sizeof(int), err);
	nrecv = hi3i_calloc((size_t)G, sizeof(int), err);
	ecnt = hi3i_calloc((size_t)E, sizeof(int), err);
	perm = hi3i_malloc(sizeof(int32_t) * (size_t)(g_rows + 1), err);
	idx2 = hi3i_malloc(sizeof(int32_t) * (size_t)(rows + 1), err);
	sc2 = hi3i_malloc(sizeof(float) * (size_t)(rows + 1), err);
	ys = hi3i_calloc((size_t)L->ne, sizeof(*ys), err);
	xs = hi3i_calloc((size_t)L->ne, sizeof(*xs), err);
	ws = hi3i_calloc((size_t)L->ne, sizeof(*ws), err);
	ms = hi3i_calloc((size_t)L->ne, sizeof(*ms), err);
	if (!owner || !t0 || !nsend || !nrecv || !ecnt || !perm || !idx2 || !sc2 || !ys || !xs || !ws || !ms)
		goto out;
	for (int g = 0; g <= G; g++)
		t0[g] = (int)((int64_t)M * g / G);
	for (int g = 0; g < G; g++)
		for (int t = t0[g]; t < t0[g + 1]; t++)
			owner[t] = g;
	/* this group's experts, both stages, in place in the packed buffers */
	for (int stage = 0; stage < 2; stage++) {
		int n_jobs = 0;
		for (int e = L->e0; e < L->e0 + L->ne; e++)
			if (count[e]) {
				xs[n_jobs] = stage ? m->w.mid + (size_t)first[e] * inter : m->w.xe + (size_t)first[e] * H;
				ys[n_jobs] = stage ? m->w.ye + (size_t)first[e] * H : m->w.ab + (size_t)first[e] * 2 * inter;
				ws[n_jobs] = stage ? L->experts[e].down : L->experts[e].gate_up;
				ms[n_jobs++] = count[e];
			}
		matmul_group(m, n_jobs, ys, xs, ws, ms);
		if (!stage && g_rows)
			be->ops->swiglu(be, m->w.mid + (size_t)g_lo * inter, m->w.ab + (size_t)g_lo * 2 * inter, g_rows,
			                inter);
		if (hi3i_backend_failed(be, err))
			goto out;
	}
	/* the rows in the order they are sent: by their token's group, packed order within */
	for (int g = 0, n = 0; g < G; g++)
		for (int r = g_lo; r < g_lo + g_rows; r++)
			if (owner[idx[r]] == g) {
				perm[n++] = r;
				nsend[g]++;
			}
	/* what each group sends this one: its rows of this group's tokens; their
	 * tokens, weights and experts in the order they arrive (the packed order) */
	for (int e = 0, g = 0; e < E; e++) {
		while (g + 1 < G && e >= (int)((int64_t)E * (g + 1) / G))
			g++;
		for (int r = first[e]; r < first[e] + count[e]; r++)
			if (owner[idx[r]] == me) {
				idx2[n_mine] = idx[r];
				sc2[n_mine++] = sc[r];
				nrecv[g]++;
				ecnt[e]++;
			}
	}
	if (g_rows) {
		if (be->ops->upload(be, m->w.idx, perm, sizeof(int32_t) * (size_t)g_rows) != 0) {
			hi3i_backend_failed(be, err);
			goto out;
		}
		be->ops->gather(be, m->w.xe, m->w.ye, m->w.idx, g_rows, H);
	}
	if (hi3i_shard_alltoall_rows(m, m->w.ye, m->w.xe, H, nsend, nrecv, err) != 0)
		goto out;
	if (n_mine && (be->ops->upload(be, m->w.idx, idx2, sizeof(int32_t) * (size_t)n_mine) != 0 ||
	               be->ops->upload(be, m->w.scale, sc2, sizeof(float) * (size_t)n_mine) != 0)) {
		hi3i_backend_failed(be, err);
		goto out;
	}
	/* this group's tokens: experts in ascending id, then the shared MLP */
	{
		const int a = t0[me], mt = t0[me + 1] - t0[me];
		be->ops->zero(be, y + (size_t)a * H, (size_t)mt * H);
		for (int e = 0, off = 0; e < E; off += ecnt[e++])
			if (ecnt[e])
				be->ops->scatter_add(be, y, m->w.ye + (size_t)off * H, m->w.idx + off, m->w.scale + off, ecnt[e],
				                     H);
		if (L->has_shared && mt > 0) {
			/* a backend that is not batch invariant (CUDA: cuBLAS or the
			 * gemv kernel by the number of rows) computes this group's
			 * rows of the shared MLP as a product of all M rows, the one
			 * product of one process, so that they keep its bits */
			const int all = !be->batch_invariant;
			if (mlp_forward(m, &L->shared, m->w.ys + (all ? 0 : (size_t)a * H), h + (all ? 0 : (size_t)a * H),
			                m->w.sab, m->w.smid, all ? M : mt, err) != 0)
				goto out;
			be->ops->add(be, y + (size_t)a * H, m->w.ys + (size_t)a * H, (size_t)mt * H);
		}
	}
	if (hi3i_backend_failed(be, err))
		goto out;
	{
		struct hi3_block *blk = hi3i_malloc(sizeof(*blk) * (size_t)G, err);
		if (!blk)
			goto out;
		for (int g = 0; g < G; g++)
			blk[g] = (struct hi3_block){t0[g], t0[g + 1] - t0[g], 0, H};
		rc = hi3i_shard_gather(m, y, M, H, y + (size_t)t0[me] * H, blk, err);
		free(blk);
	}
out:
	free(owner);
	free(t0);
	free(nsend);
	free(nrecv);
	free(ecnt);
	free(perm);
	free(idx2);
	free(sc2);
	free(ys);
	free(xs);
	free(ws);
	free(ms);
	return rc;
}

/* next, next_M: the product after the layer, named to the backend once
 * the experts' last products are done (hint). */
static int moe_forward(hi3_model *m, const struct hi3_layer_w *L, float *y, const float *h, int M,
                       const hi3_batch *b, const hi3_wt *next, int next_M, hi3_error *err)
{
	hi3_backend *be = m->be;
	const int H = m->cfg.hidden_size, E = L->E, k = L->k, K = m->max_k, NM = m->n_moe;
	float *rl = NULL, *wts = NULL, *sc = NULL, *prob = NULL;
	uint8_t *used = NULL;
	int16_t *ids = NULL;
	int32_t *idx = NULL, *where = NULL;   /* where (M, k): the row of ye of each (token, chosen expert) */
	int rc = -1, l = (int)(L - m->layers), trace_out = hi3i_trace_wants(b->trace, HI3_TRACE_EXPERT_OUT);

	rl = hi3i_malloc(sizeof(float) * (size_t)M * (size_t)E, err);
	ids = hi3i_malloc(sizeof(int16_t) * (size_t)M * (size_t)k, err);
	wts = hi3i_malloc(sizeof(float) * (size_t)M * (size_t)k, err);
	idx = hi3i_malloc(sizeof(int32_t) * (size_t)M * (size_t)k, err);
	sc = hi3i_malloc(sizeof(float) * (size_t)M * (size_t)k, err);
	prob = hi3i_malloc(sizeof(float) * (size_t)E, err);
	used = hi3i_malloc((size_t)E, err);
	if (trace_out)
		where = hi3i_malloc(sizeof(int32_t) * (size_t)M * (size_t)k, err);
	if (!rl || !ids || !wts || !idx || !sc || !prob || !used || (trace_out && !where))
		goto out;
	be->ops->matmul(be, m->w.rl, h, L->router, M);
	if (be->ops->download(be, rl, m->w.rl, sizeof(float) * (size_t)M * (size_t)E) != 0)
		goto be_failed;
	host_point(b->trace, HI3_TRACE_ROUTER_LOGITS, l, rl, E);
	for (int t = 0; t < M; t++) {
		size_t rec = ((size_t)t * NM + (size_t)L->moe_index) * (size_t)K;
		/* a token whose record starts with -1 routes freely */
		const int16_t *force = b->force_route && b->force_route[rec] >= 0 ? b->force_route + rec : NULL;
		if (force)
			for (int j = 0; j < k; j++)
				if (force[j] < 0 || force[j] >= E) {
					hi3_error_set(err, HI3_ERR_INPUT, "forced routing for token %d, MoE layer %d names "
					              "expert %d of %d", t, L->moe_index, force[j], E);
					goto out;
				}
		route_token(rl + (size_t)t * E, E, k, m->cfg.norm_topk_prob, (float)m->cfg.routed_scaling_factor,
		            force, force && b->force_route_w ? b->force_route_w + rec : NULL, ids + (size_t)t * k,
		            wts + (size_t)t * k, prob, used);
		if (b->route_ids) {
			for (int j = 0; j < K; j++) {
				b->route_ids[rec + j] = j < k ? ids[(size_t)t * k + j] : -1;
				b->route_w[rec + j] = j < k ? wts[(size_t)t * k + j] : 0.0f;
			}
		}
	}
	host_point(b->trace, HI3_TRACE_EXPERTS, l, ids, k);
	host_point(b->trace, HI3_TRACE_EXPERT_WEIGHTS, l, wts, k);
	/* Routed experts: each expert's tokens gathered into one packed
	 * buffer, both GEMM stages of every expert (and the shared MLP) run
	 * as one grouped call each, then the outputs are added to y expert by
	 * expert in ascending id, so a token sums its experts in one order
	 * whatever else is in the batch. A backend with the combine op (CUDA)
	 * gets every expert as a job, 0 rows included, and the sums in one
	 * call: the same launches whatever the routing (decode steps from
	 * graphs), the same bits. */
	{
		const int inter = L->experts[0].I, n_jobs_max = E + 1, every = be->ops->combine != NULL;
		float **ys = NULL;
		const float **xs = NULL;
		const hi3_wt **ws = NULL;
		int *ms = NULL, *first = NULL, *count = NULL, n_jobs = 0, rows = 0;

		ys = hi3i_calloc((size_t)n_jobs_max, sizeof(*ys), err);
		xs = hi3i_calloc((size_t)n_jobs_max, sizeof(*xs), err);
		ws = hi3i_calloc((size_t)n_jobs_max, sizeof(*ws), err);
		ms = hi3i_calloc((size_t)n_jobs_max, sizeof(*ms), err);
		first = hi3i_calloc((size_t)E, sizeof(*first), err);
		count = hi3i_calloc((size_t)E, sizeof(*count), err);
		if (!ys || !xs || !ws || !ms || !first || !count)
			goto moe_out;
		for (int e = 0; e < E; e++) {
			first[e] = rows;
			for (int t = 0; t < M; t++)
				for (int j = 0; j < k; j++)
					if (ids[(size_t)t * k + j] == e) {
						if (where)
							where[(size_t)t * k + j] = rows;
						idx[rows] = t;
						sc[rows] = wts[(size_t)t * k + j];
						rows++;
					}
			count[e] = rows - first[e];
		}
		if (rows) {
			if (be->ops->upload(be, m->w.idx, idx, sizeof(int32_t) * (size_t)rows) != 0 ||
			    be->ops->upload(be, m->w.scale, sc, sizeof(float) * (size_t)rows) != 0) {
				hi3i_backend_failed(be, err);
				goto moe_out;
			}
			be->ops->gather(be, m->w.xe, h, m->w.idx, rows, H);
		}
		if (m->sh.size > 1 && m->sh.alltoall && !b->trace) {
			/* (a traced call takes the gather, whose buffers hold every row) */
			if (moe_experts_alltoall(m, L, y, h, M, rows, first, count, idx, sc, err) != 0)
				goto moe_out;
			rc = 0;
			goto moe_out;
		}
		if (m->sh.size > 1) {
			if (moe_experts_sharded(m, L, h, M, rows, first, count, err) != 0)
				goto moe_out;
			goto combine;
		}
		/* stage 1: gate_up of the shared MLP (first: the product named to
		 * the backend before routing) and of every expert with tokens */
		if (L->has_shared) {
			xs[n_jobs] = h;
			ys[n_jobs] = m->w.sab;
			ws[n_jobs] = L->shared.gate_up;
			ms[n_jobs++] = M;
		}
		for (int e = 0; e < E; e++)
			if (count[e] || every) {
				xs[n_jobs] = m->w.xe + (size_t)first[e] * H;
				ys[n_jobs] = m->w.ab + (size_t)first[e] * 2 * inter;
				ws[n_jobs] = L->experts[e].gate_up;
				ms[n_jobs++] = count[e];
			}
		matmul_group(m, n_jobs, ys, xs, ws, ms);
		if (L->has_shared)
			hint(m, L->shared.down, M);
		if (rows)
			be->ops->swiglu(be, m->w.mid, m->w.ab, rows, inter);
		if (L->has_shared)
			be->ops->swiglu(be, m->w.smid, m->w.sab, M, L->shared.I);
		/* stage 2: down, in the same order */
		n_jobs = 0;
		if (L->has_shared) {
			xs[n_jobs] = m->w.smid;
			ys[n_jobs] = m->w.ys;
			ws[n_jobs] = L->shared.down;
			ms[n_jobs++] = M;
		}
		for (int e = 0; e < E; e++)
			if (count[e] || every) {
				xs[n_jobs] = m->w.mid + (size_t)first[e] * inter;
				ys[n_jobs] = m->w.ye + (size_t)first[e] * H;
				ws[n_jobs] = L->experts[e].down;
				ms[n_jobs++] = count[e];
			}
		matmul_group(m, n_jobs, ys, xs, ws, ms);
		hint(m, next, next_M);
combine:
		if (where)
			hi3i_trace_rows(b->trace, HI3_TRACE_EXPERT_OUT, l, m->w.ye, H, where, k);
		if (L->has_shared)
			point(b->trace, HI3_TRACE_SHARED_OUT, l, m->w.ys, H);
		if (every && rows == M * k) {
			/* each token's rows (M, k) in ascending expert id, which is
			 * the packed order, and their weights */
			int32_t *cw = hi3i_malloc(sizeof(int32_t) * (size_t)rows, err);
			float *cs = hi3i_malloc(sizeof(float) * (size_t)rows, err);
			int *got = hi3i_calloc((size_t)M, sizeof(int), err);
			int up = -1;
			if (cw && cs && got) {
				for (int r = 0; r < rows; r++) {
					const size_t at = (size_t)idx[r] * k + (size_t)got[idx[r]]++;
					cw[at] = r;
					cs[at] = sc[r];
				}
				up = be->ops->upload(be, m->w.cidx, cw, sizeof(int32_t) * (size_t)rows) ||
				     be->ops->upload(be, m->w.cscale, cs, sizeof(float) * (size_t)rows) ? -1 : 0;
				if (up)
					hi3i_backend_failed(be, err);
			}
			free(cw);
			free(cs);
			free(got);
			if (up)
				goto moe_out;
			be->ops->combine(be, y, m->w.ye, m->w.cidx, m->w.cscale, M, k, H);
		} else {
			be->ops->zero(be, y, (size_t)M * (size_t)H);
			for (int e = 0; e < E; e++)
				if (count[e])
					be->ops->scatter_add(be, y, m->w.ye + (size_t)first[e] * H, m->w.idx + first[e],
					                     m->w.scale + first[e], count[e], H);
		}
		if (L->has_shared)
			be->ops->add(be, y, m->w.ys, (size_t)M * (size_t)H);
		rc = 0;
moe_out:
		free(ys);
		free(xs);
		free(ws);
		free(ms);
		free(first);
		free(count);
		if (rc)
			goto out;
		rc = -1;
	}
	rc = 0;
	goto out;
be_failed:
	if (!hi3i_backend_failed(be, err))
		hi3_error_set(err, HI3_ERR_RUNTIME, "the %s backend could not copy the router logits", be->name);
out:
	free(rl);
	free(ids);
	free(wts);
	free(idx);
	free(sc);
	free(prob);
	free(used);
	free(where);
	return rc;
}

static int check_batch(const hi3_model *m, const hi3_kvcache *kv, const hi3_batch *b, hi3_error *err)
{
	const hi3_config *c = &m->cfg;
	const int M = b->B * b->T;

	if (b->B <= 0 || b->T <= 0 || !b->ids || !b->rope || !b->hi)
		return hi3_error_set(err, HI3_ERR_USAGE, "forward: empty batch or missing ids/rope/hi");
	if (b->mode != HI3_ATTN_SELF && b->mode != HI3_ATTN_CACHE)
		return hi3_error_set(err, HI3_ERR_USAGE, "forward: unknown attention mode %d", b->mode);
	if (b->mode == HI3_ATTN_CACHE && (!kv || !b->slot))
		return hi3_error_set(err, HI3_ERR_USAGE, "forward: cache attention needs a cache and slots");
	if (b->route_ids && !b->route_w)
		return hi3_error_set(err, HI3_ERR_USAGE, "forward: route_ids without route_w");
	if (kv && (kv->n_layers != c->num_hidden_layers || kv->n_kv != c->num_key_value_heads ||
	           kv->d != c->attention_head_dim || (kv->dtype != HI3_F32 && kv->dtype != HI3_BF16)))
		return hi3_error_set(err, HI3_ERR_INPUT,
		                     "KV cache shape (%d layers, %d kv heads, head dim %d, %s) does not fit the model "
		                     "(%d, %d, %d)", kv->n_layers, kv->n_kv, kv->d, hi3_dtype_name(kv->dtype),
		                     c->num_hidden_layers, c->num_key_value_heads, c->attention_head_dim);
	for (int r = 0; r < b->B; r++) {
		int row = b->cache_row ? b->cache_row[r] : r;
		if (kv && (row < 0 || row >= kv->B))
			return hi3_error_set(err, HI3_ERR_USAGE, "forward: row %d maps to cache row %d of %d", r, row,
			                     kv->B);
		for (int t = 0; t < b->T; t++) {
			size_t i = (size_t)r * b->T + t;
			if (b->ids[i] < 0 || b->ids[i] >= c->vocab_size)
				return hi3_error_set(err, HI3_ERR_INPUT, "row %d, column %d: token id %lld is outside the "
				                     "vocabulary [0, %d)", r, t, (long long)b->ids[i], c->vocab_size);
			if (b->slot && kv && b->slot[i] >= kv->C)
				return hi3_error_set(err, HI3_ERR_INPUT, "row %d, column %d: cache slot %lld is beyond "
				                     "the cache's %d slots", r, t, (long long)b->slot[i], kv->C);
			if (b->mode == HI3_ATTN_SELF && b->hi[i] >= b->T)
				return hi3_error_set(err, HI3_ERR_USAGE, "row %d, column %d: attends key %d of %d", r, t,
				                     b->hi[i], b->T);
			if (b->mode == HI3_ATTN_CACHE && b->hi[i] >= kv->C)
				return hi3_error_set(err, HI3_ERR_USAGE, "row %d, column %d: attends slot %d of %d", r, t,
				                     b->hi[i], kv->C);
		}
	}
	if (b->n_embed < 0 || b->n_embed > M || (b->n_embed && (!b->embed_at || !b->embed_rows)) || b->n_hidden < 0 ||
	    b->n_hidden > M || (b->n_hidden && (!b->hidden_at || !b->hidden)))
		return hi3_error_set(err, HI3_ERR_USAGE, "forward: bad embedding or hidden-state rows (%d, %d of %d tokens)",
		                     b->n_embed, b->n_hidden, M);
	for (int i = 0; i < b->n_embed; i++)
		if (b->embed_at[i] < 0 || b->embed_at[i] >= M)
			return hi3_error_set(err, HI3_ERR_USAGE, "forward: embedding row %d replaces token %d of %d", i,
			                     b->embed_at[i], M);
	for (int i = 0; i < b->n_hidden; i++)
		if (b->hidden_at[i] < 0 || b->hidden_at[i] >= M)
			return hi3_error_set(err, HI3_ERR_USAGE, "forward: hidden row %d asked at token %d of %d", i,
			                     b->hidden_at[i], M);
	if (b->n_host_embed < 0 || (b->n_host_embed && (!b->host_embed_at || !b->host_embed_rows)))
		return hi3_error_set(err, HI3_ERR_USAGE, "forward: %d embedding rows without their places or values",
		                     b->n_host_embed);
	for (int i = 0; i < b->n_host_embed; i++)
		if (b->host_embed_at[2 * i] < 0 || b->host_embed_at[2 * i] >= b->B || b->host_embed_at[2 * i + 1] < 0 ||
		    b->host_embed_at[2 * i + 1] >= b->T)
			return hi3_error_set(err, HI3_ERR_USAGE, "forward: embedding row %d at (%d, %d) of (%d, %d)", i,
			                     b->host_embed_at[2 * i], b->host_embed_at[2 * i + 1], b->B, b->T);
	for (int i = 0; i < b->n_logits; i++)
		if (b->logit_at[2 * i] < 0 || b->logit_at[2 * i] >= b->B || b->logit_at[2 * i + 1] < 0 ||
		    b->logit_at[2 * i + 1] >= b->T)
			return hi3_error_set(err, HI3_ERR_USAGE, "forward: logits requested at (%d, %d) outside (%d, %d)",
			                     b->logit_at[2 * i], b->logit_at[2 * i + 1], b->B, b->T);
	return 0;
}

/* The traced tokens' final RMSNorm and logits: their own lm_head product,
 * in chunks of at most 256 tokens, whatever logits the batch asked for. */
static int trace_final(hi3_model *m, hi3_trace *tr, hi3_error *err)
{
	hi3_backend *be = m->be;
	const int H = m->cfg.hidden_size, V = m->cfg.vocab_size;
	int n;
	const int32_t *kept = hi3i_trace_kept(tr, &n);
	float *lx, *lg;                    /* (n, H), (256, V) */

	if (!kept || !(hi3i_trace_wants(tr, HI3_TRACE_FINAL_NORM) || hi3i_trace_wants(tr, HI3_TRACE_LOGITS)))
		return 0;
	if (!(lx = hi3i_trace_scratch(tr, 0, (size_t)n * H)) || !(lg = hi3i_trace_scratch(tr, 1, (size_t)256 * V)))
		return 0;
	be->ops->gather(be, lx, m->w.x, kept, n, H);
	be->ops->rmsnorm(be, lx, lx, m->ln_f, n, H, m->dims.eps);
	hi3i_trace_point_kept(tr, HI3_TRACE_FINAL_NORM, -1, lx, H);
	for (int i = 0; hi3i_trace_wants(tr, HI3_TRACE_LOGITS) && i < n; i += 256) {
		int c = HI3_MIN(256, n - i);
		/* under tensor parallelism the traced tokens' rows are gathered
		 * (a trace is a diagnosis; the stages' logits never are) */
		if (hi3i_shard_matmul(m, lg, lx + (size_t)i * H, m->lm_head, V, c, err) != 0)
			return -1;
		hi3i_trace_logits(tr, lg, V, c);
	}
	return 0;
}

/* The rope-pad ablation: the query and key heads of the tokens flagged in
 * rope_zero (B, T) become 0, as RoPE with a zero cos/sin table leaves them
 * (the QK norm of 0 is 0): their qkv rows are gathered, scaled by 0 on the
 * query and key channels and by 1 on the value channels (scale_shift with
 * scale -1 / 0, shift 0: exact), and scattered back. */
struct rope_zero {
	int n;
	int32_t *idx;             /* (n) device */
	float *tmp, *ss;          /* (n, W), (n, 2 W) device */
};

static int rope_zero_prepare(hi3_model *m, const hi3_batch *b, struct rope_zero *rz, hi3_error *err)
{
	hi3_backend *be = m->be;
	const int M = b->B * b->T, d = m->dims.d, g = m->dims.n_h / m->dims.n_kv;
	const int W = (m->dims.n_h + 2 * m->dims.n_kv) * d;
	int32_t *idx = NULL;
	float *ss = NULL;
	int rc = -1;

	memset(rz, 0, sizeof(*rz));
	for (int i = 0; i < M; i++)
		rz->n += b->rope_zero[i] != 0;
	if (!rz->n)
		return 0;
	if (!(idx = hi3i_malloc(sizeof(int32_t) * (size_t)rz->n, err)) ||
	    !(ss = hi3i_calloc((size_t)rz->n * 2 * W, sizeof(float), err)))
		goto out;
	for (int i = 0, k = 0; i < M; i++)
		if (b->rope_zero[i])
			idx[k++] = i;
	for (int r = 0; r < rz->n; r++)
		for (int c = 0; c < W; c++)
			ss[(size_t)r * 2 * W + c] = (c / d) % (g + 2) == g + 1 ? 0.0f : -1.0f;
	if (!(rz->idx = be->ops->alloc(be, sizeof(int32_t) * (size_t)rz->n)) ||
	    !(rz->tmp = be->ops->alloc(be, sizeof(float) * (size_t)rz->n * W)) ||
	    !(rz->ss = be->ops->alloc(be, sizeof(float) * (size_t)rz->n * 2 * W)) ||
	    be->ops->upload(be, rz->idx, idx, sizeof(int32_t) * (size_t)rz->n) ||
	    be->ops->upload(be, rz->ss, ss, sizeof(float) * (size_t)rz->n * 2 * W)) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "out of %s memory for the rope-pad rows", be->name);
		goto out;
	}
	rc = 0;
out:
	free(idx);
	free(ss);
	return rc;
}

static void rope_zero_apply(hi3_model *m, const struct rope_zero *rz, float *qkv)
{
	hi3_backend *be = m->be;
	const int W = (m->dims.n_h + 2 * m->dims.n_kv) * m->dims.d;

	if (!rz->n)
		return;
	be->ops->gather(be, rz->tmp, qkv, rz->idx, rz->n, W);
	be->ops->scale_shift(be, rz->tmp, rz->ss, rz->n, 1, W);
	be->ops->scatter(be, qkv, rz->tmp, rz->idx, rz->n, W);
}

static void rope_zero_release(hi3_model *m, struct rope_zero *rz)
{
	void *p[] = {rz->idx, rz->tmp, rz->ss};

	for (size_t i = 0; i < HI3_ARRAY_SIZE(p); i++)
		if (p[i])
			m->be->ops->free(m->be, p[i]);
	memset(rz, 0, sizeof(*rz));
}

/* Per-query attention plan and per-token cache rows/slots, on the host. */
static void build_plan(const hi3_batch *b, const hi3_kvcache *kv, hi3_attn_q *plan, int32_t *rows,
                       int64_t *slots)
{
	for (int r = 0; r < b->B; r++) {
		int crow = b->cache_row ? b->cache_row[r] : r;
		for (int t = 0; t < b->T; t++) {
			size_t i = (size_t)r * b->T + t;
			int64_t key = b->mode == HI3_ATTN_SELF ? t : b->slot[i];
			hi3_attn_q *q = &plan[i];

			q->row = b->mode == HI3_ATTN_SELF ? r : crow;
			q->hi = b->hi[i];
			q->blk_lo = q->blk_hi = 0;
			for (int s = 0; b->blocks && s < b->S; s++) {
				const int32_t *bl = b->blocks + ((size_t)r * b->S + s) * 2;
				if (bl[1] > bl[0] && key >= bl[0] && key < bl[1]) {
					q->blk_lo = bl[0];
					q->blk_hi = bl[1];
					if (b->mode == HI3_ATTN_SELF && q->blk_hi > b->T)
						q->blk_hi = b->T;
					if (b->mode == HI3_ATTN_CACHE && kv && q->blk_hi > kv->C)
						q->blk_hi = kv->C;
					break;
				}
			}
			rows[i] = crow;
			slots[i] = b->slot ? b->slot[i] : -1;
		}
	}
}

int hi3_forward(hi3_model *m, hi3_kvcache *kv, const hi3_batch *b, hi3_error *err)
{
	const hi3_config *c = &m->cfg;
	hi3_backend *be = m->be;
	const int M = b->B * b->T, H = c->hidden_size, d = c->attention_head_dim;
	const int g = c->num_attention_heads / c->num_key_value_heads;
	/* this rank's heads (all of them in one process) */
	const int64_t W = (int64_t)(m->dims.n_h + 2 * m->dims.n_kv) * d;
	const struct hi3_shard *sh = &m->sh;
	hi3_attn_q *plan = NULL;
	int32_t *rows = NULL, *lidx = NULL;
	int64_t *slots = NULL;
	struct rope_zero rz = {0};
	int rc = -1, in_step = 0;

	if (check_batch(m, kv, b, err) != 0 || hi3i_backend_failed(be, err) != 0)
		return -1;
	if (kv && kv != m->attached) {
		if (m->attached)
			be->ops->kv_detach(be, m->attached);
		m->attached = NULL;
		if (be->ops->kv_attach(be, kv, sh->kv0, sh->n_kv, err) != 0)
			return -1;
		m->attached = kv;
	}
	if (work_reserve(m, (size_t)M, (size_t)b->n_logits, err) != 0)
		return -1;
	plan = hi3i_malloc(sizeof(*plan) * (size_t)M, err);
	rows = hi3i_malloc(sizeof(*rows) * (size_t)M, err);
	slots = hi3i_malloc(sizeof(*slots) * (size_t)M, err);
	lidx = hi3i_malloc(sizeof(*lidx) * (size_t)(b->n_logits + 1), err);
	if (!plan || !rows || !slots || !lidx)
		goto out;
	build_plan(b, kv, plan, rows, slots);
	/* a decode step of a few tokens may run from the backend's graphs of
	 * the steps before (CUDA graphs): what changes per step reaches it
	 * through the fixed buffers the uploads below fill */
	in_step = b->mode == HI3_ATTN_CACHE && b->T == 1 && !b->trace && !b->hidden_out && !b->n_embed &&
	          !b->n_host_embed && !b->rope_zero && !b->n_hidden && be->ops->graph_begin &&
	          be->ops->graph_begin(be, M);
	if (be->ops->upload(be, m->w.ids, b->ids, sizeof(int64_t) * (size_t)M) ||
	    be->ops->upload(be, m->w.pos, b->rope, sizeof(int32_t) * 2 * (size_t)M) ||
	    be->ops->upload(be, m->w.plan, plan, sizeof(*plan) * (size_t)M) ||
	    be->ops->upload(be, m->w.rows, rows, sizeof(*rows) * (size_t)M) ||
	    be->ops->upload(be, m->w.slots, slots, sizeof(*slots) * (size_t)M))
		goto be_failed;
	if (b->trace)
		hi3i_trace_begin(b->trace, b);

	be->ops->embed(be, m->w.x, m->w.ids, m->wte, M);
	if (b->n_embed > 0) {
		if (be->ops->upload(be, m->w.idx, b->embed_at, sizeof(int32_t) * (size_t)b->n_embed))
			goto be_failed;
		be->ops->scatter(be, m->w.x, b->embed_rows, m->w.idx, b->n_embed, H);
	}
	if (b->rope_zero && rope_zero_prepare(m, b, &rz, err) != 0)
		goto out;
	/* rows given in place of their embeddings (cond images), copied by runs
	 * of consecutive places */
	for (int i = 0, j; i < b->n_host_embed; i = j) {
		const int32_t *e = b->host_embed_at;
		const size_t at = (size_t)e[2 * i] * b->T + (size_t)e[2 * i + 1];
		for (j = i + 1; j < b->n_host_embed && (size_t)e[2 * j] * b->T + (size_t)e[2 * j + 1] == at + (size_t)(j - i);
		     j++)
			;
		if (be->ops->upload(be, m->w.x + at * H, b->host_embed_rows + (size_t)i * H,
		                    sizeof(float) * (size_t)(j - i) * H))
			goto be_failed;
	}
	point(b->trace, HI3_TRACE_EMBED, -1, m->w.x, H);
	for (int l = 0; l < c->num_hidden_layers; l++) {
		const struct hi3_layer_w *L = &m->layers[l];
		const int last = l + 1 == c->num_hidden_layers;
		/* the product after this layer: the next one's qkv, or the logits' */
		const hi3_wt *next = !last ? m->layers[l + 1].qkv : b->n_logits > 0 ? m->lm_head : NULL;
		const int next_M = !last ? M : b->n_logits;
		hi3_kv_src ks, vs;
		hi3_kv_dst dst = {0};

		if (b->hidden_out &&
		    be->ops->download(be, b->hidden_out + (size_t)l * M * H, m->w.x, sizeof(float) * (size_t)M * H))
			goto be_failed;
		/* attention */
		point(b->trace, HI3_TRACE_IN, l, m->w.x, H);
		be->ops->rmsnorm(be, m->w.h, m->w.x, L->ln_in, M, H, m->dims.eps);
		point(b->trace, HI3_TRACE_IN_NORM, l, m->w.h, H);
		be->ops->matmul(be, m->w.qkv, m->w.h, L->qkv, M);
		hint(m, L->o, M);
		be->ops->rope_qk(be, m->w.qkv, m->w.pos, m->theta, L->qn, L->kn, &m->dims, M);
		rope_zero_apply(m, &rz, m->w.qkv);
		point(b->trace, HI3_TRACE_Q, l, m->w.qkv, (int)W);    /* q, k and v */
		if (kv)      /* this rank's kv heads of the cache */
			be->ops->kv_layer(be, kv, l, sh->kv0, sh->n_kv, &dst);
		if (b->mode == HI3_ATTN_CACHE) {
			be->ops->kv_store(be, &dst, m->w.qkv, m->w.rows, m->w.slots, &m->dims, M);
			ks = (hi3_kv_src){dst.k, kv->dtype, dst.row_stride, (int64_t)kv->C * d, d};
			vs = ks;
			vs.base = dst.v;
		} else {
			ks = (hi3_kv_src){m->w.qkv + (size_t)g * d, HI3_F32, b->T * W, (int64_t)(g + 2) * d, W};
			vs = ks;
			vs.base = m->w.qkv + (size_t)(g + 1) * d;
		}
		if (sh->tp == 1) {
			be->ops->attention(be, m->w.att, m->w.qkv, &ks, &vs, m->w.plan, &m->dims, M);
		} else {
			/* this rank's query heads, then all of them (M, n_h d) on every rank */
			const int hd = m->dims.n_h * d;
			float *part = hi3i_shard_scratch(m, (size_t)M * hd, err);
			struct hi3_block *blk = hi3i_malloc(sizeof(*blk) * (size_t)sh->size, err);
			int grc = -1;
			if (part && blk) {
				be->ops->attention(be, part, m->w.qkv, &ks, &vs, m->w.plan, &m->dims, M);
				for (int r = 0; r < sh->size; r++)
					blk[r] = (struct hi3_block){0, r < sh->tp ? M : 0, (r % sh->tp) * hd, hd};
				grc = hi3i_shard_gather(m, m->w.att, M, c->num_attention_heads * d, part, blk, err);
			}
			free(blk);
			if (grc)
				goto out;
		}
		point(b->trace, HI3_TRACE_ATTN, l, m->w.att, c->num_attention_heads * d);
		if (b->mode == HI3_ATTN_SELF && kv && b->slot)
			be->ops->kv_store(be, &dst, m->w.qkv, m->w.rows, m->w.slots, &m->dims, M);
		if (hi3i_shard_matmul(m, m->w.h, m->w.att, L->o, H, M, err) != 0)
			goto out;
		hint(m, !L->moe ? L->mlp.gate_up : L->has_shared ? L->shared.gate_up : NULL, M);
		point(b->trace, HI3_TRACE_ATTN_OUT, l, m->w.h, H);
		be->ops->add(be, m->w.x, m->w.h, (size_t)M * H);
		/* MLP */
		be->ops->rmsnorm(be, m->w.h, m->w.x, L->ln_post, M, H, m->dims.eps);
		point(b->trace, HI3_TRACE_MLP_IN, l, m->w.h, H);
		if (L->moe) {
			if (moe_forward(m, L, m->w.y, m->w.h, M, b, next, next_M, err) != 0)
				goto out;
		} else if (mlp_forward(m, &L->mlp, m->w.y, m->w.h, m->w.ab, m->w.mid, M, err) != 0) {
			goto out;
		} else {
			hint(m, next, next_M);
		}
		point(b->trace, HI3_TRACE_MLP_OUT, l, m->w.y, H);
		be->ops->add(be, m->w.x, m->w.y, (size_t)M * H);
		if (hi3i_backend_failed(be, err)) {
			hi3_error_prefix(err, "layer %d", l);
			goto out;
		}
	}
	if (b->hidden_out && be->ops->download(be, b->hidden_out + (size_t)c->num_hidden_layers * M * H, m->w.x,
	                                       sizeof(float) * (size_t)M * H))
		goto be_failed;
	if (b->n_hidden > 0) {
		if (be->ops->upload(be, m->w.idx, b->hidden_at, sizeof(int32_t) * (size_t)b->n_hidden))
			goto be_failed;
		be->ops->gather(be, b->hidden, m->w.x, m->w.idx, b->n_hidden, H);
	}
	if (b->trace) {
		point(b->trace, HI3_TRACE_FINAL, -1, m->w.x, H);
		if (trace_final(m, b->trace, err) != 0 || hi3i_trace_end(b->trace, err) != 0)
			goto out;
	}
	if (b->n_logits > 0) {
		for (int i = 0; i < b->n_logits; i++)
			lidx[i] = b->logit_at[2 * i] * b->T + b->logit_at[2 * i + 1];
		if (be->ops->upload(be, m->w.idx, lidx, sizeof(int32_t) * (size_t)b->n_logits))
			goto be_failed;
		be->ops->gather(be, m->w.lx, m->w.x, m->w.idx, b->n_logits, H);
		be->ops->rmsnorm(be, m->w.lx, m->w.lx, m->ln_f, b->n_logits, H, m->dims.eps);
		if (sh->tp > 1 && b->vocab_slice) {
			/* this rank's vocabulary columns only, into the caller's rows */
			if (hi3i_shard_matmul_host(m, b->logits, c->vocab_size, m->w.lx, m->lm_head, c->vocab_size,
			                           b->n_logits, err) != 0)
				goto out;
		} else {
			if (hi3i_shard_matmul(m, m->w.logits, m->w.lx, m->lm_head, c->vocab_size, b->n_logits, err) != 0)
				goto out;
			if (be->ops->download(be, b->logits, m->w.logits,
			                      sizeof(float) * (size_t)b->n_logits * c->vocab_size))
				goto be_failed;
		}
	}
	if (hi3i_backend_failed(be, err))
		goto out;
	hi3i_model_forward_done(m);
	rc = 0;
	goto out;
be_failed:
	if (!hi3i_backend_failed(be, err))
		hi3_error_set(err, HI3_ERR_RUNTIME, "the %s backend could not copy the batch", be->name);
out:
	if (in_step) {
		be->ops->graph_end(be);
		if (!rc && hi3i_backend_failed(be, err))
			rc = -1;
	}
	if (rc && b->trace)
		hi3i_trace_abort(b->trace, err);
	rope_zero_release(m, &rz);
	free(plan);
	free(rows);
	free(slots);
	free(lidx);
	return rc;
}

hi3_kvcache *hi3_kvcache_for_model(const hi3_model *m, int B, int C, hi3_dtype dtype, hi3_error *err)
{
	const hi3_config *c = hi3_model_config(m);

	return hi3_kvcache_alloc(c->num_hidden_layers, B, c->num_key_value_heads, C, c->attention_head_dim, dtype,
	                         err);
}

void hi3_model_drop_cache(hi3_model *m, const hi3_kvcache *kv)
{
	if (m && kv && m->attached == kv) {
		m->be->ops->kv_detach(m->be, m->attached);
		m->attached = NULL;
	}
}

int hi3_kv_sync_host(hi3_model *m, hi3_kvcache *kv, hi3_error *err)
{
	if (m->attached != kv)
		return 0;
	return m->be->ops->kv_sync_host(m->be, kv, err);
}

