/*
 * weights.c -- opening a model: config.json, the checkpoint, its
 * fingerprint, and every weight handed to the backend (backend.h), which
 * prepares it for its ops. The forward pass is forward.c's.
 *
 * Opening touches only the safetensors headers (and, on the CPU, the norm
 * vectors): the checkpoint stays mapped and the CPU backend reads a weight
 * where it lies when an op first needs it. That first read is reported
 * here (on_first_use): the bytes are checked for NaN/Inf then, once, with
 * a warning naming the file and tensor, and counted, so that -v can say
 * how much of the mapped checkpoint a stage touched. The CUDA backend
 * reads every weight at open, to upload it, and so checks them all then;
 * weights_done waits for those uploads (and -v says how fast they went).
 */
#include "config.h"
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "model/model.h"
#include "model/quant.h"

#define NAME(...) (snprintf(nm, sizeof(nm), __VA_ARGS__), nm)

/* The weight `name`, or (n > 0) its rows [r0, r0 + n): a rank's slice. */
static hi3_wt *load_w_rows(hi3_model *m, const char *name, int kind, int64_t r0, int64_t n, hi3_error *err)
{
	const hi3_tensor *t = hi3_ckpt_find(m->ck, name);
	hi3_qweight qw;
	hi3_wt *w;
	int qr;

	if (!t) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor '%s' is missing", m->dir, name);
		return NULL;
	}
	if (kind == HI3_WT_MATRIX && (qr = hi3i_quant_weight(m->quant, m->ck, name, &qw, err)) != 0) {
		if (qr < 0)
			return NULL;
		if (n > 0 && n != qw.N) {
			hi3_error_set(err, HI3_ERR_USAGE, "%s: tensor '%s': a quantized weight (%s) is not split over tensor-"
			              "parallel ranks yet; run it with tp=1 (ep splits experts and works)", m->dir, name,
			              hi3i_qformat_name(qw.format));
			return NULL;
		}
		if (!m->be->ops->qweight) {
			hi3_error_set(err, HI3_ERR_USAGE, "%s: tensor '%s' is quantized (%s, %s) and the %s backend has no "
			              "kernels for quantized weights yet; run it with --backend cpu", m->dir, name,
			              hi3i_qformat_name(qw.format), hi3i_quant_describe(m->quant), m->be->name);
			return NULL;
		}
		if (!(w = m->be->ops->qweight(m->be, t, &qw, err)))
			hi3_error_prefix(err, "%s: tensor '%s'", m->dir, name);
		return w;
	}
	if (n > 0 && !(t = hi3i_shard_rows(m, t, r0, n, err))) {
		hi3_error_prefix(err, "%s", m->dir);
		return NULL;
	}
	w = m->be->ops->weight(m->be, t, kind, err);
	if (!w)
		hi3_error_prefix(err, "%s: tensor '%s'", m->dir, name);
	return w;
}

static hi3_wt *load_w(hi3_model *m, const char *name, int kind, hi3_error *err)
{
	return load_w_rows(m, name, kind, 0, 0, err);
}

/* This rank's output rows split(N, tp, t) of the (N, K) matrix `name`. */
static hi3_wt *load_w_split(hi3_model *m, const char *name, int N, hi3_error *err)
{
	int lo, n;

	hi3i_split(N, m->sh.tp, m->sh.t, &lo, &n);
	return load_w_rows(m, name, HI3_WT_MATRIX, lo, m->sh.tp > 1 ? n : 0, err);
}

static int load_mlp(hi3_model *m, struct hi3_mlp_w *mw, const char *prefix, int I, hi3_error *err)
{
	char nm[256];

	mw->I = I;
	if (!(mw->gate_up = load_w_split(m, NAME("%s.gate_and_up_proj.weight", prefix), 2 * I, err)) ||
	    !(mw->down = load_w_split(m, NAME("%s.down_proj.weight", prefix), m->cfg.hidden_size, err)))
		return -1;
	if (I > m->max_I)
		m->max_I = I;
	return 0;
}

static void free_mlp(hi3_model *m, struct hi3_mlp_w *mw)
{
	m->be->ops->weight_free(m->be, mw->gate_up);
	m->be->ops->weight_free(m->be, mw->down);
}

static int load_layer(hi3_model *m, int l, hi3_error *err)
{
	const hi3_config *c = &m->cfg;
	struct hi3_layer_w *L = &m->layers[l];
	char nm[256], pre[64];
	const int64_t blk = (int64_t)(c->num_attention_heads / c->num_key_value_heads + 2) * c->attention_head_dim;
	int e0 = 0, ne;

	snprintf(pre, sizeof(pre), "model.layers.%d", l);
	if (!(L->ln_in = load_w(m, NAME("%s.input_layernorm.weight", pre), HI3_WT_VECTOR, err)) ||
	    !(L->ln_post = load_w(m, NAME("%s.post_attention_layernorm.weight", pre), HI3_WT_VECTOR, err)) ||
	    /* qkv_proj: whole (g + 2)-head blocks of this rank's kv heads */
	    !(L->qkv = load_w_rows(m, NAME("%s.self_attn.qkv_proj.weight", pre), HI3_WT_MATRIX,
	                           (int64_t)m->sh.kv0 * blk, m->sh.tp > 1 ? (int64_t)m->sh.n_kv * blk : 0, err)) ||
	    !(L->o = load_w_split(m, NAME("%s.self_attn.o_proj.weight", pre), c->hidden_size, err)))
		return -1;
	if (c->use_qk_norm &&
	    (!(L->qn = load_w(m, NAME("%s.self_attn.query_layernorm.weight", pre), HI3_WT_VECTOR, err)) ||
	     !(L->kn = load_w(m, NAME("%s.self_attn.key_layernorm.weight", pre), HI3_WT_VECTOR, err))))
		return -1;
	L->moe = hi3_config_is_moe_layer(c, l);
	if (!L->moe)
		return load_mlp(m, &L->mlp, NAME("%s.mlp", pre), c->intermediate_size, err);
	L->moe_index = m->n_moe++;
	L->E = c->num_experts[l];
	L->k = c->moe_topk[l];
	if (L->k > m->max_k)
		m->max_k = L->k;
	if (!(L->router = load_w(m, NAME("%s.mlp.gate.wg.weight", pre), HI3_WT_MATRIX, err)))
		return -1;
	L->experts = hi3i_calloc((size_t)L->E, sizeof(*L->experts), err);
	if (!L->experts)
		return -1;
	/* experts: this rank's group's, E / ep of them */
	hi3i_split(L->E, m->sh.ep, m->sh.e, &e0, &ne);
	L->e0 = e0;
	L->ne = ne;
	for (int e = e0; e < e0 + ne; e++) {
		char ep[128];
		snprintf(ep, sizeof(ep), "%s.mlp.experts.%d", pre, e);
		if (load_mlp(m, &L->experts[e], ep, c->moe_intermediate_size[l], err))
			return -1;
	}
	if (c->use_mixed_mlp_moe && c->num_shared_expert[l] > 0) {
		L->has_shared = 1;
		if (load_mlp(m, &L->shared, NAME("%s.mlp.shared_mlp", pre),
		             hi3i_config_shared_width(c, l), err))
			return -1;
	}
	return 0;
}

/* be->first_use: the backend reads these bytes of t for the first time. */
static void on_first_use(hi3_backend *be, const hi3_tensor *t, const void *data, size_t bytes)
{
	hi3_model *m = be->first_use_ctx;
	size_t es = hi3_dtype_size(t->dtype), n = es ? bytes / es : 0;
	int64_t bad = hi3i_count_nonfinite(data, t->dtype, n);

	m->touched += bytes;
	if (!bad)
		return;
	if (bytes == t->nbytes)
		hi3_log(HI3_LOG_WARN, "%s: tensor '%s' holds %lld NaN/Inf values of %lld", hi3_ckpt_file_of(m->ck, t->name),
		        t->name, (long long)bad, (long long)n);
	else
		hi3_log(HI3_LOG_WARN, "%s: tensor '%s': row %lld holds %lld NaN/Inf values of %lld",
		        hi3_ckpt_file_of(m->ck, t->name), t->name,
		        (long long)(((const unsigned char *)data - (const unsigned char *)t->data) / (ptrdiff_t)bytes),
		        (long long)bad, (long long)n);
}

void hi3i_model_forward_done(hi3_model *m)
{
	if (m->forwards++)
		return;
	hi3_log(HI3_LOG_DEBUG, "%s: first forward done %.3f s after the model opened (open %.3f s); weights read so "
	        "far: %.1f MB of the %.1f MB mapped", m->dir, hi3i_now() - m->t_open, m->open_s, m->touched / 1e6,
	        m->mapped / 1e6);
}

/*
 * Refuse, before a weight is read, a layout whose weights cannot fit in a
 * rank's memory: HI3_MEM_LIMIT (bytes, or 141G ...) when set, else the
 * device's free memory (cuda) or the host's physical memory (cpu: the
 * checkpoint is mapped, so memory in use by the page cache counts as free).
 * The counts are hi3_plan_compute's (hi3 plan shows the whole plan).
 */
static int check_fits(hi3_model *m, hi3_error *err)
{
	hi3_plan_opts po = {.tp = m->sh.tp, .ep = m->sh.ep, .batch = 1, .max_len = 1,
	                    .dtype = hi3_model_weight_dtype(m), .kv_dtype = HI3_F32};
	hi3_plan p;
	uint64_t limit = 0;
	const char *env = getenv("HI3_MEM_LIMIT");
	const char *what;

	if (m->quant) {
		/* the layout of the quantized checkpoint (hi3-quant(7)) */
		const hi3_tensor *wte = hi3_ckpt_find(m->ck, "model.wte.weight");
		const char *d = hi3i_quant_describe(m->quant);
		po.dtype = wte ? wte->dtype : HI3_BF16;
		po.quant = strstr(d, "int8") ? HI3_PLAN_Q_INT8 : strstr(d, "nf4") ? HI3_PLAN_Q_NF4 :
		           strstr(d, "NVFP4") || strstr(d, "MIXED") ? HI3_PLAN_Q_NVFP4_MIXED : HI3_PLAN_Q_FP8;
	}
	if (po.dtype != HI3_F32 && po.dtype != HI3_BF16 && po.dtype != HI3_F16)
		return 0;
	if (hi3_plan_compute(&m->cfg, &po, &p, err) != 0)
		return -1;
	if (env && *env) {
		if (hi3_parse_bytes(env, &limit) != 0)
			return hi3_error_set(err, HI3_ERR_USAGE, "HI3_MEM_LIMIT: '%s' is not a size (e.g. 141G)", env);
		what = "HI3_MEM_LIMIT";
	} else if (!strcmp(m->be->name, "cpu")) {
		limit = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
		what = "the host's memory";
	} else {
		limit = m->be->ops->mem_free(m->be);
		what = "the device's free memory";
	}
	if (limit && p.weights > limit) {
		char a[32], b[32];
		return hi3_error_set(err, HI3_ERR_RUNTIME, "%s: a rank of tp=%d,ep=%d holds %s of weights, more than %s "
		                     "(%s); choose a layout that fits with 'hi3 plan' (hi3-parallel(7))", m->dir, m->sh.tp,
		                     m->sh.ep, hi3_format_bytes(p.weights, a), what, hi3_format_bytes(limit, b));
	}
	return 0;
}

int hi3i_backend_open(hi3_backend **out, const hi3_model_opts *opts, hi3_error *err)
{
	const char *name = opts && opts->backend ? opts->backend : "cpu";
	const int threads = opts ? opts->threads : 0, inv = opts ? opts->batch_invariant : 1;
	const int ranks = opts && opts->par && opts->par->comm ? opts->par->comm->size : 1;
	int graphs = opts ? opts->cuda_graphs : 0;

	*out = NULL;
	if (!strcmp(name, "cpu") && graphs == 1)
		return hi3_error_set(err, HI3_ERR_USAGE, "--cuda-graphs on: the cpu backend has no CUDA graphs (use "
		                     "--backend cuda)");
	/* The decode steps of a model split over ranks run op by op, never
	 * from CUDA graphs: on the first GPU run (an H200, driver 580, two
	 * ranks on one GPU, the activations through host buffers) every
	 * layout's decode faulted inside cudaGraphLaunch on both ranks, and
	 * gave one process's bits with the graphs off (docs/PERFORMANCE.md,
	 * "The first GPU run"). --cuda-graphs on is refused there rather than
	 * left to fault. */
	if (ranks > 1) {
		if (graphs == 1)
			return hi3_error_set(err, HI3_ERR_USAGE, "--cuda-graphs on: not with --parallel over %d ranks: "
			                     "their decode steps from CUDA graphs faulted on a GPU; they run op by op "
			                     "(hi3-parallel(7))", ranks);
		graphs = 2;
	}
	if (!strcmp(name, "cpu"))
		return hi3i_backend_cpu(out, threads, inv, err);
	if (!strcmp(name, "cuda")) {
		if (hi3i_backend_cuda(out, threads, inv, err) != 0)
			return -1;
		if ((*out)->ops->set_graphs && (*out)->ops->set_graphs(*out, graphs, err) != 0) {
			(*out)->ops->destroy(*out);
			*out = NULL;
			return -1;
		}
		return 0;
	}
	return hi3_error_set(err, HI3_ERR_USAGE, "unknown backend '%s' (expected cpu or cuda)", name);
}

int hi3_model_open(hi3_model **out, const char *dir, const hi3_model_opts *opts, hi3_error *err)
{
	hi3_model *m = hi3i_calloc(1, sizeof(*m), err);
	hi3_model_opts def = {.backend = "cpu", .batch_invariant = 1};
	char *cfg_path = NULL;
	int rc = -1, n_files = 0;

	*out = NULL;
	if (!m)
		return -1;
	m->t_open = hi3i_now();
	if (!opts)
		opts = &def;
	m->dir = hi3i_strdup(dir);
	cfg_path = hi3i_asprintf("%s/config.json", dir);
	if (!m->dir || !cfg_path) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		goto out;
	}
	if (hi3_config_load(&m->cfg, cfg_path, err) != 0 || hi3_gen_defaults_load(&m->gen, dir, err) != 0)
		goto out;
	for (int i = 0; i < m->cfg.n_warnings; i++)
		hi3_log(HI3_LOG_WARN, "%s: %s", cfg_path, m->cfg.warnings[i]);
	if (hi3_ckpt_open(&m->ck, dir, err) != 0)
		goto out;
	if (hi3i_quant_open(&m->quant, dir, m->cfg.json, err) != 0 || hi3_config_validate(&m->cfg, m->ck, err) != 0)
		goto out;
	if (m->quant && hi3i_quant_activations(m->quant)[0])
		hi3_log(HI3_LOG_INFO, "%s: %s; it asks for %s, which hi3 does not apply: weights are dequantized, "
		        "activations stay f32 (hi3-quant(7))", dir, hi3i_quant_describe(m->quant),
		        hi3i_quant_activations(m->quant));
	if (hi3_fingerprint(&m->cfg, m->ck, m->fingerprint) != 0) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		goto out;
	}
	if (hi3i_backend_open(&m->be, opts, err) != 0 || hi3i_backend_check(m->be, err) != 0)
		goto out;
	m->be->first_use = on_first_use;
	m->be->first_use_ctx = m;
	if (hi3i_shard_init(m, opts->par, err) != 0 || check_fits(m, err) != 0)
		goto out;
	m->dims.H = m->cfg.hidden_size;
	/* a rank's heads: its kv heads and their query heads */
	m->dims.n_kv = m->sh.n_kv;
	m->dims.n_h = m->sh.n_kv * (m->cfg.num_attention_heads / m->cfg.num_key_value_heads);
	m->dims.kv_all = m->cfg.num_key_value_heads;
	m->dims.d = m->cfg.attention_head_dim;
	m->dims.eps = (float)m->cfg.rms_norm_eps;
	m->layers = hi3i_calloc((size_t)m->cfg.num_hidden_layers, sizeof(*m->layers), err);
	if (!m->layers)
		goto out;
	if (!(m->wte = load_w(m, "model.wte.weight", HI3_WT_ROWS, err)) ||
	    !(m->ln_f = load_w(m, "model.ln_f.weight", HI3_WT_VECTOR, err)) ||
	    !(m->lm_head = load_w_split(m, hi3_ckpt_find(m->ck, "lm_head.weight") ? "lm_head.weight" : "model.wte.weight",
	                                m->cfg.vocab_size, err)))
		goto out;
	for (int l = 0; l < m->cfg.num_hidden_layers; l++)
		if (load_layer(m, l, err) != 0)
			goto out;
	if (m->be->ops->weights_done && m->be->ops->weights_done(m->be, err) != 0)
		goto out;
	{
		float theta[512];
		hi3i_rope_theta(theta, m->dims.d, m->cfg.rope_theta);
		m->theta = m->be->ops->alloc(m->be, sizeof(float) * (size_t)(m->dims.d / 2));
		if (!m->theta || m->be->ops->upload(m->be, m->theta, theta, sizeof(float) * (size_t)(m->dims.d / 2))) {
			hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
			goto out;
		}
	}
	memcpy(m->facts.fingerprint, m->fingerprint, sizeof(m->facts.fingerprint));
	m->facts.dir = m->dir;
	m->facts.vocab = m->cfg.vocab_size;
	m->facts.n_layers = m->cfg.num_hidden_layers;
	m->facts.n_kv = m->cfg.num_key_value_heads;
	m->facts.d = m->cfg.attention_head_dim;
	m->facts.n_moe = m->n_moe;
	m->facts.k = m->max_k;
	m->mapped = hi3_ckpt_file_bytes(m->ck, &n_files);
	m->open_s = hi3i_now() - m->t_open;
	hi3_log(HI3_LOG_DEBUG, "%s: opened in %.3f s on %s: %d tensors in %d file%s, %.1f MB mapped, %.1f MB read",
	        dir, m->open_s, m->be->name, hi3_ckpt_count(m->ck), n_files, n_files == 1 ? "" : "s", m->mapped / 1e6,
	        m->touched / 1e6);
	*out = m;
	rc = 0;
out:
	free(cfg_path);
	if (rc)
		hi3_model_close(m);
	return rc;
}

void hi3_model_close(hi3_model *m)
{
	if (!m)
		return;
	if (m->image_memo_free)
		m->image_memo_free(m->image_memo);
	if (m->be) {
		hi3i_model_work_free(m);
		if (m->attached)
			m->be->ops->kv_detach(m->be, m->attached);
		if (m->theta)
			m->be->ops->free(m->be, m->theta);
		m->be->ops->weight_free(m->be, m->wte);
		m->be->ops->weight_free(m->be, m->ln_f);
		m->be->ops->weight_free(m->be, m->lm_head);
		for (int l = 0; m->layers && l < m->cfg.num_hidden_layers; l++) {
			struct hi3_layer_w *L = &m->layers[l];
			hi3_wt *ws[] = {L->ln_in, L->ln_post, L->qkv, L->o, L->qn, L->kn, L->router};
			for (size_t i = 0; i < HI3_ARRAY_SIZE(ws); i++)
				m->be->ops->weight_free(m->be, ws[i]);
			free_mlp(m, &L->mlp);
			for (int e = 0; L->experts && e < L->E; e++)
				free_mlp(m, &L->experts[e]);
			free(L->experts);
			if (L->has_shared)
				free_mlp(m, &L->shared);
		}
		hi3i_shard_release(m);
		m->be->ops->destroy(m->be);
	}
	free(m->layers);
	hi3_ckpt_close(m->ck);
	hi3i_quant_close(m->quant);
	hi3_config_release(&m->cfg);
	free(m->dir);
	free(m);
}

const hi3_config *hi3_model_config(const hi3_model *m) { return &m->cfg; }
const hi3_gen_defaults *hi3_model_gen_defaults(const hi3_model *m) { return &m->gen; }
const char *hi3_model_fingerprint(const hi3_model *m) { return m->fingerprint; }
const char *hi3_model_dir(const hi3_model *m) { return m->dir; }
const char *hi3_model_backend(const hi3_model *m) { return m->be->name; }

int hi3_model_pages(const hi3_model *m, double *resident, double *huge)
{
	char real[PATH_MAX], line[PATH_MAX + 256];
	size_t n;
	int in = 0, found = 0;
	FILE *f;

	*resident = *huge = 0.0;
	if (!realpath(m->dir, real) || !(f = fopen("/proc/self/smaps", "r")))
		return 0;
	n = strlen(real);
	while (fgets(line, sizeof line, f)) {
		unsigned long a, b;
		double kb;
		int at = -1;
		if (sscanf(line, "%lx-%lx %*s %*s %*s %*s %n", &a, &b, &at) == 2 && at > 0) {
			/* a map's first line: addresses, perms, offset, device, inode, path */
			const char *path = line + at;
			in = strncmp(path, real, n) == 0 && path[n] == '/';
			found |= in;
		} else if (in && sscanf(line, "Rss: %lf kB", &kb) == 1) {
			*resident += kb * 1024.0;
		} else if (in && sscanf(line, "FilePmdMapped: %lf kB", &kb) == 1) {
			*huge += kb * 1024.0;   /* mapped by 2 MiB entries */
		}
	}
	fclose(f);
	if (found && *resident > 0.0)
		return 1;
	*resident = *huge = 0.0;
	return 0;
}
int hi3_model_n_moe_layers(const hi3_model *m) { return m->n_moe; }
int hi3_model_max_topk(const hi3_model *m) { return m->max_k; }
const struct hi3i_model_facts *hi3i_model_facts(const hi3_model *m) { return &m->facts; }

int hi3_model_batch_invariant(const hi3_model *m)
{
	return m->be->batch_invariant;
}

hi3_dtype hi3_model_weight_dtype(const hi3_model *m)
{
	const hi3_tensor *t = hi3_ckpt_find(m->ck, "model.layers.0.self_attn.qkv_proj.weight");

	return t ? t->dtype : HI3_F32;
}
