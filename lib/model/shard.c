/*
 * shard.c -- a rank's part of a tensor/expert-parallel layout (model.h,
 * hi3-parallel(7)): the checks at open, the row views of the checkpoint
 * tensors this rank multiplies, and the gathers that put a split product
 * together on every rank.
 *
 * Shapes: M tokens, N output columns of a product, R rows of a gathered
 * matrix; tp tensor slots, ep expert groups, rank = e tp + t.
 *
 * The gathers run on device buffers where the layout has a communicator
 * for them (hi3_par.dev: NCCL on GPUs, MPI on the CUDA emulator): the
 * rank's block is all-gathered into device scratch and each rank's block
 * copied into place (copy2d). Otherwise they go through host buffers (the
 * MPI communicator's): the rank's block is downloaded, all-gathered,
 * placed, and the whole matrix uploaded; with the CPU backend these are
 * copies in memory.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "model/model.h"
#include "format/provenance.h"

int hi3i_shard_init(hi3_model *m, const hi3_par *par, hi3_error *err)
{
	struct hi3_shard *s = &m->sh;
	const hi3_config *c = &m->cfg;
	hi3_comm *comm;
	int n_moe = 0, max_e = 1;

	memset(s, 0, sizeof(*s));
	s->tp = s->ep = s->size = 1;
	s->n_kv = c->num_key_value_heads;
	if (!par || !par->comm)
		return 0;
	comm = par->comm;
	if (par->tp < 1 || par->ep < 1 || par->tp * par->ep != comm->size)
		return hi3_error_set(err, HI3_ERR_USAGE, "--parallel tp=%d,ep=%d needs %d ranks, there are %d", par->tp,
		                     par->ep, par->tp * par->ep, comm->size);
	if (c->num_key_value_heads % par->tp)
		return hi3_error_set(err, HI3_ERR_USAGE, "--parallel tp=%d: num_key_value_heads %d is not divisible by %d "
		                     "(%s/config.json; attention splits by whole kv heads)", par->tp,
		                     c->num_key_value_heads, par->tp, m->dir);
	for (int l = 0; l < c->num_hidden_layers; l++)
		if (hi3_config_is_moe_layer(c, l) && c->num_experts[l] % par->ep)
			return hi3_error_set(err, HI3_ERR_USAGE, "--parallel ep=%d: num_experts %d of layer %d is not "
			                     "divisible by %d (%s/config.json)", par->ep, c->num_experts[l], l, par->ep,
			                     m->dir);
	for (int l = 0; l < c->num_hidden_layers; l++) {
		n_moe += hi3_config_is_moe_layer(c, l);
		max_e = HI3_MAX(max_e, c->num_experts[l]);
	}
	if (par->ep > 1 && n_moe == 0)
		return hi3_error_set(err, HI3_ERR_USAGE, "--parallel ep=%d: %s has no MoE layer to split by expert",
		                     par->ep, m->dir);
	if (par->dispatch == HI3_DISPATCH_ALLTOALL && (par->ep < 2 || par->tp > 1))
		return hi3_error_set(err, HI3_ERR_USAGE, "--parallel tp=%d,ep=%d,dispatch=alltoall: the all-to-all "
		                     "dispatch needs ep > 1 and tp = 1 (with tp > 1 use dispatch=gather)", par->tp,
		                     par->ep);
	if (par->dev && (par->dev->size != comm->size || par->dev->rank != comm->rank || !m->be->ops->copy2d ||
	                 !m->be->ops->sync))
		return hi3_error_set(err, HI3_ERR_USAGE, "--parallel: the %s communicator on device buffers does not "
		                     "fit (rank %d of %d, the %s backend)", par->dev->name, par->dev->rank, par->dev->size,
		                     m->be->name);
	s->par = par;
	s->rank = comm->rank;
	s->size = comm->size;
	s->tp = par->tp;
	s->ep = par->ep;
	s->alltoall = par->dispatch == HI3_DISPATCH_ALLTOALL;
	s->t = comm->rank % par->tp;
	s->e = comm->rank / par->tp;
	s->n_kv = c->num_key_value_heads / par->tp;
	s->kv0 = s->t * s->n_kv;
	s->counts = hi3i_calloc((size_t)comm->size * 2, sizeof(size_t), err);
	if (!s->counts)
		return -1;
	s->displs = s->counts + comm->size;
	/* per layer qkv, o and two per MLP (dense, each expert, shared); lm_head */
	s->cap_views = c->num_hidden_layers * (4 + 2 * max_e) + 4;
	if (!(s->views = hi3i_calloc((size_t)s->cap_views, sizeof(*s->views), err)))
		return -1;
	/* the same model on every rank, or stop before anything is computed:
	 * the fingerprint (config, tensor names, shapes, dtypes), then a hash
	 * of the first bytes of every tensor, which tells two checkpoints of
	 * one shape apart (another seed, another fine-tune) for a few pages read */
	if (hi3_comm_check_same(comm, "model fingerprint", m->fingerprint, err) != 0)
		return -1;
	{
		uint64_t h = HI3_HASH_INIT;
		char hex[17];
		for (int i = 0; i < hi3_ckpt_count(m->ck); i++) {
			const hi3_tensor *t = hi3_ckpt_at(m->ck, i);
			h = hi3i_hash(h, t->data, t->nbytes < 256 ? t->nbytes : 256);
		}
		snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)h);
		return hi3_comm_check_same(comm, "weights sample hash", hex, err);
	}
}

void hi3i_shard_release(hi3_model *m)
{
	struct hi3_shard *s = &m->sh;

	if (s->dev)
		m->be->ops->free(m->be, s->dev);
	if (s->drecv)
		m->be->ops->free(m->be, s->drecv);
	free(s->send);
	free(s->recv);
	free(s->full);
	free(s->counts);
	free(s->views);
	memset(s, 0, sizeof(*s));
}

const hi3_tensor *hi3i_shard_rows(hi3_model *m, const hi3_tensor *t, int64_t r0, int64_t n, hi3_error *err)
{
	struct hi3_shard *s = &m->sh;
	size_t row;
	hi3_tensor *v;

	if (r0 == 0 && n == t->shape[0])
		return t;
	if (t->ndim < 1 || r0 < 0 || n < 1 || r0 + n > t->shape[0]) {
		hi3_error_set(err, HI3_ERR_INPUT, "tensor '%s': rows [%lld, %lld) of %lld", t->name, (long long)r0,
		              (long long)(r0 + n), (long long)(t->ndim ? t->shape[0] : 0));
		return NULL;
	}
	if (s->n_views == s->cap_views) {
		/* views are handed out by pointer: grow in fixed chunks that never move */
		hi3_error_set(err, HI3_ERR_RUNTIME, "internal: more tensor views than reserved (%d)", s->cap_views);
		return NULL;
	}
	row = t->nbytes / (size_t)t->shape[0];
	v = &s->views[s->n_views++];
	*v = *t;
	v->shape[0] = n;
	v->nbytes = row * (size_t)n;
	v->data = (char *)t->data + row * (size_t)r0;
	return v;
}

static int grow_host(float **p, size_t *cap, size_t n, hi3_error *err)
{
	float *q;

	if (n <= *cap)
		return 0;
	if (!(q = realloc(*p, sizeof(float) * n)))
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory for %zu MiB of gather buffers",
		                     sizeof(float) * n >> 20);
	*p = q;
	*cap = n;
	return 0;
}

/* Device scratch *p of at least n floats (what: for the message). */
static float *grow_dev(hi3_model *m, float **p, size_t *cap, size_t n, const char *what, hi3_error *err)
{
	if (n > *cap) {
		if (*p)
			m->be->ops->free(m->be, *p);
		*cap = 0;
		if (!(*p = m->be->ops->alloc(m->be, sizeof(float) * n))) {
			hi3_error_set(err, HI3_ERR_RUNTIME, "out of %s memory for %zu MiB of %s", m->be->name,
			              sizeof(float) * n >> 20, what);
			return NULL;
		}
		*cap = n;
	}
	return *p;
}

float *hi3i_shard_scratch(hi3_model *m, size_t n, hi3_error *err)
{
	return grow_dev(m, &m->sh.dev, &m->sh.dev_cap, n, "a split product", err);
}

/* The gather on device buffers: every rank's block into drecv, in rank
 * order, then each block copied to its place in y. */
static int gather_device(hi3_model *m, float *y, int N, const float *mine, size_t n_mine, const struct hi3_block *blk,
                         size_t tot, hi3_error *err)
{
	struct hi3_shard *s = &m->sh;
	hi3_backend *be = m->be;
	float *recv;

	if (!(recv = grow_dev(m, &s->drecv, &s->drecv_cap, tot / sizeof(float) + 1, "the gathers", err)))
		return -1;
	/* the collective reads mine outside the backend's stream */
	if (be->ops->sync(be) != 0)
		return hi3i_backend_failed(be, err);
	if (hi3_comm_allgatherv(s->par->dev, mine, sizeof(float) * n_mine, recv, s->counts, s->displs, err))
		return hi3_error_prefix(err, "rank %d of %d", s->rank, s->size);
	for (int r = 0; r < s->size; r++)
		if (blk[r].nr && blk[r].nc)
			be->ops->copy2d(be, y + (size_t)blk[r].r0 * N + blk[r].c0, (size_t)N, recv + s->displs[r] / sizeof(float),
			                (size_t)blk[r].nc, blk[r].nr, blk[r].nc);
	return hi3i_backend_failed(be, err);
}

int hi3i_shard_gather(hi3_model *m, float *y, int R, int N, const float *mine, const struct hi3_block *blk,
                      hi3_error *err)
{
	struct hi3_shard *s = &m->sh;
	hi3_backend *be = m->be;
	const struct hi3_block *b = &blk[s->rank];
	size_t tot = 0, n_mine = (size_t)b->nr * (size_t)b->nc;

	for (int r = 0; r < s->size; r++) {
		s->counts[r] = sizeof(float) * (size_t)blk[r].nr * (size_t)blk[r].nc;
		s->displs[r] = tot;
		tot += s->counts[r];
	}
	if (s->par->dev)
		return gather_device(m, y, N, mine, n_mine, blk, tot, err);
	if (grow_host(&s->send, &s->send_cap, n_mine + 1, err) || grow_host(&s->recv, &s->recv_cap, tot / 4 + 1, err) ||
	    grow_host(&s->full, &s->full_cap, (size_t)R * N + 1, err))
		return -1;
	if (n_mine && be->ops->download(be, s->send, mine, sizeof(float) * n_mine) != 0)
		return hi3i_backend_failed(be, err);
	if (hi3_comm_allgatherv(s->par->comm, s->send, sizeof(float) * n_mine, s->recv, s->counts, s->displs, err))
		return hi3_error_prefix(err, "rank %d of %d", s->rank, s->size);
	for (int r = 0; r < s->size; r++) {
		const float *src = s->recv + s->displs[r] / sizeof(float);
		for (int i = 0; i < blk[r].nr; i++)
			memcpy(s->full + (size_t)(blk[r].r0 + i) * N + blk[r].c0, src + (size_t)i * blk[r].nc,
			       sizeof(float) * (size_t)blk[r].nc);
	}
	if (R && N && be->ops->upload(be, y, s->full, sizeof(float) * (size_t)R * N) != 0)
		return hi3i_backend_failed(be, err);
	return 0;
}

int hi3i_shard_matmul(hi3_model *m, float *y, const float *x, const hi3_wt *w, int N, int M, hi3_error *err)
{
	struct hi3_shard *s = &m->sh;
	struct hi3_block blk[64], *bp = blk;
	float *part;
	int lo, n, rc;

	if (s->tp == 1) {
		m->be->ops->matmul(m->be, y, x, w, M);
		return 0;
	}
	hi3i_split(N, s->tp, s->t, &lo, &n);
	if (!(part = hi3i_shard_scratch(m, (size_t)M * n, err)))
		return -1;
	m->be->ops->matmul(m->be, part, x, w, M);
	if (hi3i_backend_failed(m->be, err))
		return -1;
	if (s->size > 64 && !(bp = hi3i_malloc(sizeof(*bp) * (size_t)s->size, err)))
		return -1;
	/* the tensor slots of expert group 0 send; the other groups hold copies */
	for (int r = 0; r < s->size; r++) {
		int l, k;
		hi3i_split(N, s->tp, r % s->tp, &l, &k);
		bp[r] = (struct hi3_block){0, r < s->tp ? M : 0, l, k};
	}
	rc = hi3i_shard_gather(m, y, M, N, part, bp, err);
	if (bp != blk)
		free(bp);
	return rc;
}

int hi3i_shard_alltoall_rows(hi3_model *m, float *dst, const float *src, int H, const int *send_rows,
                             const int *recv_rows, hi3_error *err)
{
	struct hi3_shard *s = &m->sh;
	hi3_backend *be = m->be;
	size_t *c = NULL, n_send = 0, n_recv = 0;
	int rc = -1;

	for (int r = 0; r < s->size; r++) {
		n_send += (size_t)send_rows[r];
		n_recv += (size_t)recv_rows[r];
	}
	if (!(c = hi3i_malloc(sizeof(*c) * 4 * (size_t)s->size, err)) ||
	    (!s->par->dev && (grow_host(&s->send, &s->send_cap, n_send * H + 1, err) ||
	                      grow_host(&s->recv, &s->recv_cap, n_recv * H + 1, err))))
		goto out;
	/* counts and displacements in bytes: sent, then received */
	for (int r = 0, so = 0, ro = 0; r < s->size; r++) {
		c[r] = sizeof(float) * (size_t)send_rows[r] * H;
		c[s->size + r] = sizeof(float) * (size_t)so * H;
		c[2 * s->size + r] = sizeof(float) * (size_t)recv_rows[r] * H;
		c[3 * s->size + r] = sizeof(float) * (size_t)ro * H;
		so += send_rows[r];
		ro += recv_rows[r];
	}
	if (s->par->dev) {
		/* straight between the device buffers, once the stream has written src */
		if (be->ops->sync(be) != 0) {
			hi3i_backend_failed(be, err);
			goto out;
		}
		if (hi3_comm_alltoallv(s->par->dev, src, c, c + s->size, dst, c + 2 * s->size, c + 3 * s->size, err) != 0) {
			hi3_error_prefix(err, "rank %d of %d", s->rank, s->size);
			goto out;
		}
		rc = 0;
		goto out;
	}
	if (n_send && be->ops->download(be, s->send, src, sizeof(float) * n_send * H) != 0) {
		hi3i_backend_failed(be, err);
		goto out;
	}
	if (hi3_comm_alltoallv(s->par->comm, s->send, c, c + s->size, s->recv, c + 2 * s->size, c + 3 * s->size,
	                       err) != 0) {
		hi3_error_prefix(err, "rank %d of %d", s->rank, s->size);
		goto out;
	}
	if (n_recv && be->ops->upload(be, dst, s->recv, sizeof(float) * n_recv * H) != 0) {
		hi3i_backend_failed(be, err);
		goto out;
	}
	rc = 0;
out:
	free(c);
	return rc;
}

int hi3i_shard_matmul_host(hi3_model *m, float *y, int ldy, const float *x, const hi3_wt *w, int N, int M,
                           hi3_error *err)
{
	struct hi3_shard *s = &m->sh;
	float *part;
	int lo, n;

	hi3i_split(N, s->tp, s->t, &lo, &n);
	if (!(part = hi3i_shard_scratch(m, (size_t)M * n + 1, err)) ||
	    grow_host(&s->send, &s->send_cap, (size_t)M * n + 1, err))
		return -1;
	if (M && n) {
		m->be->ops->matmul(m->be, part, x, w, M);
		if (hi3i_backend_failed(m->be, err) ||
		    m->be->ops->download(m->be, s->send, part, sizeof(float) * (size_t)M * n) != 0)
			return hi3i_backend_failed(m->be, err);
	}
	for (int i = 0; i < M; i++)
		memcpy(y + (size_t)i * ldy + lo, s->send + (size_t)i * n, sizeof(float) * (size_t)n);
	return 0;
}

hi3_comm *hi3i_model_comm(const hi3_model *m)
{
	return m->sh.par && m->sh.size > 1 ? m->sh.par->comm : NULL;
}

int hi3i_model_writes_files(const hi3_model *m)
{
	const hi3_comm *comm = hi3i_model_comm(m);

	return !comm || comm->rank == 0;
}

int hi3i_par_check_cond(const hi3_model *m, const hi3_cond *c, hi3_error *err)
{
	hi3_comm *comm = hi3i_model_comm(m);
	char hash[17];

	if (!comm)
		return 0;
	hi3i_cond_hash(c, hash);
	return hi3_comm_check_same(comm, "conditions hash", hash, err);
}
