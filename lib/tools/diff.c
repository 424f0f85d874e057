/*
 * diff.c -- hi3 diff: two safetensors files compared tensor by tensor.
 *
 * For each tensor: max |a - b| and the first element where it occurs, the
 * first element over tolerance (|a - b| > atol + rtol * |b|), and how many
 * are over. NaN equals NaN; NaN against a number differs (|a - b| = +Inf).
 * Where the format is known, an element is named by what its dimensions
 * mean (kv: row, head, slot, col; segment: row and position via cu_seqlens;
 * trace: the token's row and position, then col, or slot and col;
 * trajectory and a capture's checkpoint: row, step, channel, y, x).
 *
 * Shapes: B rows, n_kv heads, C cache slots, d head dim, L prompt columns,
 * V vocabulary, T packed tokens.
 */
#include <math.h>
#include <omp.h>
#include <string.h>
#include "tools/tools.h"

enum kind { K_OTHER, K_KV, K_COND, K_SEG, K_TRACE, K_TRAJ };

/* One input file and what its format tells about rows. */
struct side {
	const char *path;
	hi3_st *st;
	const char *format;          /* "" when none */
	enum kind kind;
	int64_t B;                   /* rows; -1 unknown */
	const int64_t *kv_len;       /* (B) kv: valid slots per row, or NULL */
	const int64_t *gen_len;      /* (B) kv: generated steps per row, or NULL */
	const int64_t *cu;           /* (B + 1) cu_seqlens, or NULL */
	int64_t T;                   /* cu[B] */
	const int32_t *trows;        /* (tn) trace: each token's row and position, or NULL */
	const int64_t *tpos;
	int64_t tn;
};

static void side_close(struct side *s)
{
	hi3_st_close(s->st);
	s->st = NULL;
}

/* A (rows) I64 tensor whose values lie in [0, hi[row]] (hi NULL: [0, max]). */
static int row_counts(struct side *s, const char *name, int64_t rows, int64_t max, const int64_t *hi,
                      const int64_t **out, hi3_error *err)
{
	const hi3_tensor *t;
	const int64_t *v;

	if (hi3_st_get(s->st, name, HI3_I64, 1, (const int64_t[]){rows}, &t, err) != 0)
		return -1;
	v = t->data;
	for (int64_t r = 0; r < rows; r++) {
		int64_t top = hi ? hi[r] : max;
		if (v[r] < 0 || v[r] > top)
			return hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor '%s': row %lld: %lld is outside [0, %lld]",
			                     s->path, name, (long long)r, (long long)v[r], (long long)top);
	}
	*out = v;
	return 0;
}

static int side_open(struct side *s, const char *path, int need_rows, hi3_error *err)
{
	const hi3_tensor *t;
	const char *f;

	memset(s, 0, sizeof(*s));
	s->path = path;
	s->B = -1;
	if (hi3_st_open(&s->st, path, HI3_ST_READ, err) != 0)
		return -1;
	f = hi3_st_meta(s->st, "format");
	s->format = f ? f : "";
	if (!strcmp(s->format, HI3_FORMAT_KV)) {
		const hi3_tensor *k0 = hi3_st_find(s->st, "k.0"), *gt = hi3_st_find(s->st, "gen_tokens");
		int64_t C = k0 && k0->ndim == 4 ? k0->shape[2] : INT64_MAX;

		s->kind = K_KV;
		if ((t = hi3_st_find(s->st, "kv_len")) || need_rows) {
			if (!t)
				return hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor 'kv_len' is missing", path);
			s->B = t->shape[0];
			if (row_counts(s, "kv_len", t->ndim == 1 ? t->shape[0] : -1, C, NULL, &s->kv_len, err) != 0)
				return -1;
		}
		if (s->kv_len && hi3_st_find(s->st, "gen_len") &&
		    row_counts(s, "gen_len", s->B, gt && gt->ndim == 2 ? gt->shape[1] : INT64_MAX, NULL, &s->gen_len,
		               err) != 0)
			return -1;
	} else if (!strcmp(s->format, HI3_FORMAT_CONDITIONS)) {
		s->kind = K_COND;
		if ((t = hi3_st_find(s->st, "real_pos")) && t->ndim == 1)
			s->B = t->shape[0];
		else if ((t = hi3_st_find(s->st, "input_ids")) && t->ndim == 2)
			s->B = t->shape[0];
	} else if (!strcmp(s->format, HI3_FORMAT_SEGMENT)) {
		s->kind = K_SEG;
	} else if (!strcmp(s->format, HI3_FORMAT_TRACE)) {
		const hi3_tensor *r = hi3_st_find(s->st, "rows"), *p = hi3_st_find(s->st, "positions");
		s->kind = K_TRACE;
		if (r && p && r->dtype == HI3_I32 && p->dtype == HI3_I64 && r->ndim == 1 && p->ndim == 1 &&
		    r->shape[0] == p->shape[0]) {
			s->trows = r->data;
			s->tpos = p->data;
			s->tn = r->shape[0];
		}
	} else if (!strcmp(s->format, HI3_FORMAT_TRAJECTORY) || !strcmp(s->format, HI3_FORMAT_DIFFUSION_CHECKPOINT)) {
		s->kind = K_TRAJ;
		if ((t = hi3_st_find(s->st, "latents")) && t->ndim == 5)
			s->B = t->shape[0];
	}
	t = hi3_st_find(s->st, "cu_seqlens");
	if (t || (s->kind == K_SEG && need_rows)) {
		const int64_t *cu;

		if (hi3_st_get(s->st, "cu_seqlens", HI3_I64, 1, (const int64_t[]){-1}, &t, err) != 0)
			return -1;
		if (t->shape[0] < 1)
			return hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor 'cu_seqlens' is empty (expected B + 1 entries)",
			                     path);
		cu = t->data;
		if (cu[0] != 0)
			return hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor 'cu_seqlens': entry 0 is %lld, expected 0", path,
			                     (long long)cu[0]);
		for (int64_t i = 1; i < t->shape[0]; i++)
			if (cu[i] < cu[i - 1])
				return hi3_error_set(err, HI3_ERR_INPUT,
				                     "%s: tensor 'cu_seqlens': entry %lld (%lld) is below entry %lld (%lld)", path,
				                     (long long)i, (long long)cu[i], (long long)i - 1, (long long)cu[i - 1]);
		s->cu = cu;
		s->T = cu[t->shape[0] - 1];
		if (s->kind == K_SEG || s->B < 0)
			s->B = t->shape[0] - 1;
	}
	return 0;
}

/* ---------------------------------------------------------- dimension names */

static int is_layer_kv(const char *name)
{
	if ((name[0] != 'k' && name[0] != 'v') || name[1] != '.' || !name[2])
		return 0;
	return strspn(name + 2, "0123456789") == strlen(name + 2);
}

static int is_gen_step(const char *name)
{
	return !strcmp(name, "gen_tokens") || !strcmp(name, "gen_logprobs");
}

/* What the dimensions of a tensor mean, for known formats. */
static const char *const kv_dims[] = {"row", "head", "slot", "col"};
static const char *const step_dims[] = {"row", "step"};
static const char *const logit_dims[] = {"row", "token"};
static const char *const rope_dims[] = {"row", "column", "axis"};
static const char *const block_dims[] = {"row", "block", "end"};
static const char *const index_dims[] = {"row", "index"};
static const char *const row_dims[] = {"row", "column"};
static const char *const traj_lat_dims[] = {"row", "step", "channel", "y", "x"};
static const char *const traj_x_dims[] = {"row", "channel", "y", "x"};
static const char *const traj_noise_dims[] = {"row", "sde step", "channel", "y", "x"};
static const char *const traj_logp_dims[] = {"row", "sde step"};
static const char *const traj_vel_dims[] = {"step", "cfg row", "channel", "y", "x"};
static const char *const traj_step_dims[] = {"step"};

/* A trajectory's tensors with a request axis first (the others: the
 * schedule, shared by every row, and velocity, by cfg row). */
static int traj_rowed(const char *name)
{
	return !strcmp(name, "latents") || !strcmp(name, "x_T") || !strcmp(name, "sde_noise") ||
	       !strcmp(name, "sde_logp");
}

static const char *const *traj_dims(const hi3_tensor *t)
{
	if (!strcmp(t->name, "latents") && t->ndim == 5)
		return traj_lat_dims;
	if (!strcmp(t->name, "x_T") && t->ndim == 4)
		return traj_x_dims;
	if (!strcmp(t->name, "sde_noise") && t->ndim == 5)
		return traj_noise_dims;
	if (!strcmp(t->name, "sde_logp") && t->ndim == 2)
		return traj_logp_dims;
	if (!strcmp(t->name, "velocity") && t->ndim == 5)
		return traj_vel_dims;
	if (t->ndim == 1)
		return traj_step_dims;
	return NULL;
}

static const char *const *dim_names(const struct side *a, const hi3_tensor *t, int *n)
{
	const char *name = t->name;

	*n = t->ndim;
	if (a->kind == K_TRAJ)
		return traj_dims(t);
	if (a->B < 0 || t->ndim < 1 || t->shape[0] != a->B)
		return NULL;
	if (a->kind == K_KV && is_layer_kv(name) && t->ndim == 4)
		return kv_dims;
	if (a->kind == K_KV && is_gen_step(name) && t->ndim == 2)
		return step_dims;
	if (a->kind == K_KV && !strcmp(name, "next_logits") && t->ndim == 2)
		return logit_dims;
	if (a->kind == K_COND && !strcmp(name, "rope_pos") && t->ndim == 3)
		return rope_dims;
	if (a->kind == K_COND && !strcmp(name, "image_blocks") && t->ndim == 3)
		return block_dims;
	if (a->kind == K_COND && (!strcmp(name, "stop_tokens") || !strcmp(name, "timestep_index")) && t->ndim == 2)
		return index_dims;
	if (t->ndim <= 2)
		return row_dims;
	return NULL;
}

/* Name the element at loc->idx (A's coordinates) of tensor t in side a. */
static void name_loc(const struct side *a, const hi3_tensor *t, hi3_diff_loc *loc)
{
	const char *const *lab;
	int n;

	loc->n_named = 0;
	if (a->trows && t->ndim >= 1 && t->ndim <= 3 && t->shape[0] == a->tn && loc->idx[0] < a->tn) {
		static const char *const tail[2][2] = {{"col", NULL}, {"slot", "col"}};
		loc->label[0] = "row";
		loc->val[0] = a->trows[loc->idx[0]];
		loc->label[1] = "pos";
		loc->val[1] = a->tpos[loc->idx[0]];
		for (int d = 1; d < t->ndim; d++) {
			loc->label[1 + d] = tail[t->ndim - 2][d - 1];
			loc->val[1 + d] = loc->idx[d];
		}
		loc->n_named = 1 + t->ndim;
		return;
	}
	if (a->cu && t->ndim == 1 && t->shape[0] == a->T && strcmp(t->name, "cu_seqlens")) {
		int64_t lo = 0, hi = a->B, p = loc->idx[0];

		while (hi - lo > 1) {          /* the last row r with cu[r] <= p */
			int64_t mid = (lo + hi) / 2;
			if (a->cu[mid] <= p)
				lo = mid;
			else
				hi = mid;
		}
		loc->n_named = 2;
		loc->label[0] = "row";
		loc->val[0] = lo;
		loc->label[1] = "pos";
		loc->val[1] = p - a->cu[lo];
		return;
	}
	lab = dim_names(a, t, &n);
	if (!lab)
		return;
	for (int i = 0; i < n; i++) {
		loc->label[i] = lab[i];
		loc->val[i] = loc->idx[i];
	}
	loc->n_named = n;
}

/* ------------------------------------------------------------------ plans */

/* How one tensor is walked: an iteration box over A's dimensions, with the
 * element strides of A and B, and an optional per-row limit on one axis. */
struct plan {
	int nd;
	int64_t shape[HI3_MAX_DIMS];
	int64_t sa[HI3_MAX_DIMS], sb[HI3_MAX_DIMS];
	int64_t oa, ob;                  /* element offsets of the box's origin */
	int64_t origin[HI3_MAX_DIMS];    /* A index of the box's origin */
	int lim_axis;                    /* -1: none */
	const int64_t *la, *lb;          /* per-row limits of A and B (row = box axis 0 + origin) */
	int64_t rb0;                     /* B row of box row 0 */
};

static void strides(const hi3_tensor *t, int64_t *s)
{
	int64_t acc = 1;

	for (int d = t->ndim - 1; d >= 0; d--) {
		s[d] = acc;
		acc *= t->shape[d];
	}
}

/* The limit along lim_axis for box row r. */
static int64_t lim_of(const struct plan *p, int64_t r)
{
	int64_t a = p->la[p->origin[0] + r], b = p->lb[p->rb0 + r];

	return HI3_MIN(a, b);
}

/* ------------------------------------------------------------- comparing */

struct acc {
	double max;
	int64_t worst;                 /* box key of the first element at max; -1 */
	double wa, wb;
	int64_t first;                 /* box key of the first element over tolerance; -1 */
	double fa, fb;
	int64_t n, over;
};

#define CHUNK 1024

static void load(double *dst, const hi3_tensor *t, int64_t off, int64_t n)
{
	float f[CHUNK];

	if (t->dtype == HI3_F32 || t->dtype == HI3_BF16 || t->dtype == HI3_F16) {
		hi3_to_f32(f, (const unsigned char *)t->data + (size_t)off * hi3_dtype_size(t->dtype), t->dtype,
		           (size_t)n);
		for (int64_t i = 0; i < n; i++)
			dst[i] = f[i];
	} else {
		for (int64_t i = 0; i < n; i++)
			dst[i] = hi3_elem_f64(t->data, t->dtype, (size_t)(off + i));
	}
}

static inline double delta(double a, double b)
{
	if (a == b || (isnan(a) && isnan(b)))
		return 0;
	if (isnan(a) || isnan(b))
		return INFINITY;
	return fabs(a - b);
}

static void acc_merge(struct acc *dst, const struct acc *s)
{
	if (s->worst >= 0 && (s->max > dst->max || (s->max == dst->max && (dst->worst < 0 || s->worst < dst->worst)))) {
		dst->max = s->max;
		dst->worst = s->worst;
		dst->wa = s->wa;
		dst->wb = s->wb;
	}
	if (s->first >= 0 && (dst->first < 0 || s->first < dst->first)) {
		dst->first = s->first;
		dst->fa = s->fa;
		dst->fb = s->fb;
	}
	dst->n += s->n;
	dst->over += s->over;
}

/* Compare one line of the box: n contiguous elements from box key k0. */
static void cmp_line(const hi3_tensor *ta, const hi3_tensor *tb, int64_t offa, int64_t offb, int64_t n,
                     int64_t k0, double atol, double rtol, struct acc *r)
{
	double a[CHUNK], b[CHUNK];

	for (int64_t c = 0; c < n; c += CHUNK) {
		int64_t m = HI3_MIN(CHUNK, n - c);

		load(a, ta, offa + c, m);
		load(b, tb, offb + c, m);
		for (int64_t i = 0; i < m; i++) {
			double d = delta(a[i], b[i]);

			if (d > 0 && (d > r->max || r->worst < 0)) {
				r->max = d;
				r->worst = k0 + c + i;
				r->wa = a[i];
				r->wb = b[i];
			}
			if (d == INFINITY || d > atol + rtol * fabs(b[i])) {
				if (r->first < 0) {
					r->first = k0 + c + i;
					r->fa = a[i];
					r->fb = b[i];
				}
				r->over++;
			}
		}
		r->n += m;
	}
}

static void run_plan(const struct plan *p, const hi3_tensor *ta, const hi3_tensor *tb, const hi3_diff_opts *o,
                     struct acc *res)
{
	int64_t len = p->shape[p->nd - 1], lines = 1;
	int nt = o->threads > 0 ? o->threads : omp_get_max_threads();

	for (int d = 0; d < p->nd - 1; d++)
		lines *= p->shape[d];
	*res = (struct acc){0, -1, 0, 0, -1, 0, 0, 0, 0};
#pragma omp parallel num_threads(nt) if (lines * len > 65536)
	{
		struct acc r = {0, -1, 0, 0, -1, 0, 0, 0, 0};

#pragma omp for schedule(dynamic, 16)
		for (int64_t line = 0; line < lines; line++) {
			int64_t idx[HI3_MAX_DIMS], rest = line, offa = p->oa, offb = p->ob, n = len;

			for (int d = p->nd - 2; d >= 0; d--) {
				idx[d] = rest % p->shape[d];
				rest /= p->shape[d];
				offa += idx[d] * p->sa[d];
				offb += idx[d] * p->sb[d];
			}
			if (p->lim_axis >= 0) {
				int64_t lim = lim_of(p, p->nd > 1 ? idx[0] : 0);

				if (p->lim_axis == p->nd - 1)
					n = HI3_MIN(n, lim);
				else if (idx[p->lim_axis] >= lim)
					continue;
			}
			cmp_line(ta, tb, offa, offb, n, line * len, o->atol, o->rtol, &r);
		}
#pragma omp critical
		acc_merge(res, &r);
	}
}

/* Box key -> the element's index in A, named. */
static void key_to_loc(const struct plan *p, const struct side *a, const hi3_tensor *ta, int64_t key, double va,
                       double vb, hi3_diff_loc *loc)
{
	memset(loc, 0, sizeof(*loc));
	loc->ndim = ta->ndim;
	for (int d = p->nd - 1; d >= 0; d--) {
		int64_t i = key % p->shape[d];

		key /= p->shape[d];
		if (d < ta->ndim)
			loc->idx[d] = p->origin[d] + i;
	}
	loc->a = va;
	loc->b = vb;
	name_loc(a, ta, loc);
}

/* ----------------------------------------------------------- one tensor */

static int same_dims_from(const hi3_tensor *a, const hi3_tensor *b, int from, int except)
{
	if (a->ndim != b->ndim)
		return 0;
	for (int d = from; d < a->ndim; d++)
		if (d != except && a->shape[d] != b->shape[d])
			return 0;
	return 1;
}

/* The axis limited per row under valid-only: kv slots or generated steps. */
static int limited_axis(const struct side *a, const struct side *b, const hi3_tensor *t, const int64_t **la,
                        const int64_t **lb)
{
	if (a->kind != K_KV || b->kind != K_KV)
		return -1;
	if (is_layer_kv(t->name) && t->ndim == 4 && a->kv_len && b->kv_len) {
		*la = a->kv_len;
		*lb = b->kv_len;
		return 2;
	}
	if (is_gen_step(t->name) && t->ndim == 2 && a->gen_len && b->gen_len) {
		*la = a->gen_len;
		*lb = b->gen_len;
		return 1;
	}
	return -1;
}

static void compare_tensor(const struct side *a, const struct side *b, const hi3_tensor *ta, const hi3_tensor *tb,
                           const hi3_diff_opts *o, int valid_only, hi3_diff_tensor *r)
{
	struct plan p;
	struct acc res;
	int64_t sa[HI3_MAX_DIMS], sb[HI3_MAX_DIMS];
	const int64_t *la = NULL, *lb = NULL;
	int rows = o->row_a >= 0, lax = valid_only ? limited_axis(a, b, ta, &la, &lb) : -1;

	/* a trajectory's schedule is every row's: compared whole under --row */
	if (rows && a->kind == K_TRAJ && b->kind == K_TRAJ && !traj_rowed(ta->name) && strcmp(ta->name, "velocity"))
		rows = 0;

	if (ta->dtype != tb->dtype) {
		r->status = HI3_DIFF_DTYPE;
		return;
	}
	memset(&p, 0, sizeof(p));
	p.lim_axis = -1;
	strides(ta, sa);
	strides(tb, sb);
	if (rows && a->cu && b->cu && ta->ndim == 1 && tb->ndim == 1 && ta->shape[0] == a->T && tb->shape[0] == b->T &&
	    strcmp(ta->name, "cu_seqlens")) {
		/* a packed [T] tensor: the rows' spans */
		int64_t a0 = a->cu[o->row_a], b0 = b->cu[o->row_b];

		r->len_a = a->cu[o->row_a + 1] - a0;
		r->len_b = b->cu[o->row_b + 1] - b0;
		p.nd = 1;
		p.shape[0] = HI3_MIN(r->len_a, r->len_b);
		p.sa[0] = p.sb[0] = 1;
		p.oa = a0;
		p.ob = b0;
		p.origin[0] = a0;
	} else {
		int known = a->B >= 0 && b->B >= 0;

		if (rows && (ta->ndim < 1 || (known && (ta->shape[0] != a->B || tb->shape[0] != b->B)) ||
		             (!known && (o->row_a >= ta->shape[0] || o->row_b >= tb->shape[0])))) {
			r->status = HI3_DIFF_SKIPPED;
			return;
		}
		if (!same_dims_from(ta, tb, rows ? 1 : 0, lax)) {
			r->status = HI3_DIFF_SHAPE;
			return;
		}
		p.nd = ta->ndim;
		for (int d = 0; d < p.nd; d++) {
			p.shape[d] = HI3_MIN(ta->shape[d], tb->shape[d]);
			p.sa[d] = sa[d];
			p.sb[d] = sb[d];
		}
		if (rows) {                        /* one row of each: A's row_a, B's row_b */
			p.shape[0] = 1;
			p.oa = o->row_a * sa[0];
			p.ob = o->row_b * sb[0];
			p.origin[0] = o->row_a;
			p.rb0 = o->row_b;
		}
	}
	if (p.nd == 0) {                           /* a scalar */
		p.nd = 1;
		p.shape[0] = 1;
	}
	if (lax >= 0) {
		p.lim_axis = lax;
		p.la = la;
		p.lb = lb;
	}
	for (int d = 0; d < p.nd; d++)
		if (p.shape[d] == 0) {
			r->status = r->len_a != r->len_b ? HI3_DIFF_LENGTH : HI3_DIFF_OK;
			return;
		}
	run_plan(&p, ta, tb, o, &res);
	r->n_compared = res.n;
	r->n_over = res.over;
	r->max_abs = res.max;
	if (res.worst >= 0)
		key_to_loc(&p, a, ta, res.worst, res.wa, res.wb, &r->worst);
	if (res.first >= 0)
		key_to_loc(&p, a, ta, res.first, res.fa, res.fb, &r->first);
	if (r->len_a != r->len_b)
		r->status = HI3_DIFF_LENGTH;
	else
		r->status = res.over ? HI3_DIFF_OVER : HI3_DIFF_OK;
}

/* ------------------------------------------------------------------ main */

/* Natural name order; in kv files the layers come first, in pipeline
 * order (k.0, v.0, k.1, ...), so the first differing tensor is the
 * earliest place a difference shows. */
static int name_cmp_kv(const void *x, const void *y, void *kv)
{
	const char *a = *(const char *const *)x, *b = *(const char *const *)y;
	int la = *(int *)kv && is_layer_kv(a), lb = *(int *)kv && is_layer_kv(b);

	if (la && lb) {
		long na = strtol(a + 2, NULL, 10), nb = strtol(b + 2, NULL, 10);
		if (na != nb)
			return na < nb ? -1 : 1;
		return a[0] == b[0] ? 0 : a[0] == 'k' ? -1 : 1;
	}
	if (la != lb)
		return la ? -1 : 1;
	return hi3i_natcmp(a, b);
}

static int wanted(const hi3_diff_opts *o, const char *name)
{
	if (!o->n_tensors)
		return 1;
	for (int i = 0; i < o->n_tensors; i++)
		if (!strcmp(o->tensors[i], name))
			return 1;
	return 0;
}

static int check_options(const struct side *a, const struct side *b, const hi3_diff_opts *o, hi3_error *err)
{
	const struct side *s[2] = {a, b};
	const int64_t row[2] = {o->row_a, o->row_b};

	if (o->valid_only) {
		for (int i = 0; i < 2; i++)
			if (s[i]->kind != K_KV)
				return hi3_error_set(err, HI3_ERR_USAGE,
				                     "--valid-only compares two kv files: %s has format '%s', not 'hi3.kv'",
				                     s[i]->path, s[i]->format);
	}
	if (o->row_a >= 0) {
		for (int i = 0; i < 2; i++)
			if (s[i]->B >= 0 && row[i] >= s[i]->B)
				return hi3_error_set(err, HI3_ERR_USAGE, "--row %lld:%lld: %s has rows 0 to %lld",
				                     (long long)o->row_a, (long long)o->row_b, s[i]->path,
				                     (long long)s[i]->B - 1);
	}
	for (int i = 0; i < o->n_tensors; i++)
		if (!hi3_st_find(a->st, o->tensors[i]) && !hi3_st_find(b->st, o->tensors[i]))
			return hi3_error_set(err, HI3_ERR_USAGE, "--tensor '%s': in neither %s nor %s", o->tensors[i],
			                     a->path, b->path);
	return 0;
}

int hi3_diff(const char *path_a, const char *path_b, const hi3_diff_opts *o, hi3_diff_result **out,
             hi3_error *err)
{
	struct side a, b;
	hi3_diff_result *r = NULL;
	const char **names = NULL;
	int need_rows = o->valid_only || o->row_a >= 0, n = 0, rc = -1, valid_only;

	*out = NULL;
	memset(&b, 0, sizeof(b));
	if ((o->row_a >= 0) != (o->row_b >= 0) || !(o->atol >= 0) || !(o->rtol >= 0))
		return hi3_error_set(err, HI3_ERR_USAGE, "hi3_diff: bad options (rows %lld:%lld, atol %g, rtol %g)",
		                     (long long)o->row_a, (long long)o->row_b, o->atol, o->rtol);
	if (side_open(&a, path_a, need_rows, err) != 0 || side_open(&b, path_b, need_rows, err) != 0)
		goto out;
	if (check_options(&a, &b, o, err) != 0)
		goto out;
	/* --row on two kv files compares the overlapping valid slots */
	valid_only = o->valid_only || (o->row_a >= 0 && a.kind == K_KV && b.kind == K_KV);
	if (valid_only && (a.kind != K_KV || b.kind != K_KV || !a.kv_len || !b.kv_len)) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor 'kv_len' is missing", a.kv_len ? path_b : path_a);
		goto out;
	}
	names = hi3i_calloc((size_t)(hi3_st_count(a.st) + hi3_st_count(b.st)) + 1, sizeof(*names), err);
	r = hi3i_calloc(1, sizeof(*r), err);
	if (!names || !r)
		goto out;
	for (int i = 0; i < hi3_st_count(a.st); i++)
		if (wanted(o, hi3_st_at(a.st, i)->name))
			names[n++] = hi3_st_at(a.st, i)->name;
	for (int i = 0; i < hi3_st_count(b.st); i++)
		if (wanted(o, hi3_st_at(b.st, i)->name) && !hi3_st_find(a.st, hi3_st_at(b.st, i)->name))
			names[n++] = hi3_st_at(b.st, i)->name;
	{
		int kv = a.kind == K_KV && b.kind == K_KV;
		qsort_r(names, (size_t)n, sizeof(*names), name_cmp_kv, &kv);
	}
	r->t = hi3i_calloc((size_t)n + 1, sizeof(*r->t), err);
	r->path_a = hi3i_strdup(path_a);
	r->path_b = hi3i_strdup(path_b);
	r->format_a = hi3i_strdup(a.format);
	r->format_b = hi3i_strdup(b.format);
	if (!r->t || !r->path_a || !r->path_b || !r->format_a || !r->format_b) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		goto out;
	}
	r->opts = *o;
	r->opts.tensors = NULL;
	r->opts.n_tensors = 0;
	r->valid_only = valid_only;
	r->first = r->worst = -1;
	r->format_differs = strcmp(a.format, b.format) != 0;
	for (int i = 0; i < n; i++) {
		const hi3_tensor *ta = hi3_st_find(a.st, names[i]), *tb = hi3_st_find(b.st, names[i]);
		hi3_diff_tensor *t = &r->t[i];

		t->name = hi3i_strdup(names[i]);
		r->n++;
		if (!t->name) {
			hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
			goto out;
		}
		if (ta) {
			t->dtype_a = ta->dtype;
			t->ndim_a = ta->ndim;
			memcpy(t->shape_a, ta->shape, sizeof(t->shape_a));
		}
		if (tb) {
			t->dtype_b = tb->dtype;
			t->ndim_b = tb->ndim;
			memcpy(t->shape_b, tb->shape, sizeof(t->shape_b));
		}
		if (!tb)
			t->status = HI3_DIFF_ONLY_A;
		else if (!ta)
			t->status = HI3_DIFF_ONLY_B;
		else
			compare_tensor(&a, &b, ta, tb, o, valid_only, t);
		if (t->status != HI3_DIFF_OK && t->status != HI3_DIFF_SKIPPED) {
			r->n_differ++;
			if (r->first < 0)
				r->first = i;
		}
		if (t->n_compared && t->max_abs > 0 && (r->worst < 0 || t->max_abs > r->t[r->worst].max_abs))
			r->worst = i;
	}
	/* with named tensors the user chose what to compare: a segment's
	 * logprobs against a replay's, say; the format difference is shown */
	r->equal = !r->n_differ && (!r->format_differs || o->n_tensors > 0);
	*out = r;
	r = NULL;
	rc = 0;
out:
	hi3_diff_free(r);
	free(names);
	side_close(&a);
	side_close(&b);
	return rc;
}

void hi3_diff_free(hi3_diff_result *r)
{
	if (!r)
		return;
	for (int i = 0; i < r->n; i++)
		free(r->t[i].name);
	free(r->t);
	free(r->path_a);
	free(r->path_b);
	free(r->format_a);
	free(r->format_b);
	free(r);
}

/* ---------------------------------------------------------------- report */

static void fmt_loc(FILE *f, const hi3_diff_loc *l)
{
	if (l->n_named) {
		for (int i = 0; i < l->n_named; i++)
			fprintf(f, "%s%s %lld", i ? ", " : "", l->label[i], (long long)l->val[i]);
		return;
	}
	fputc('[', f);
	for (int i = 0; i < l->ndim; i++)
		fprintf(f, "%s%lld", i ? ", " : "", (long long)l->idx[i]);
	fputc(']', f);
}

static int loc_same(const hi3_diff_loc *x, const hi3_diff_loc *y)
{
	return x->ndim == y->ndim && !memcmp(x->idx, y->idx, sizeof(x->idx[0]) * (size_t)x->ndim);
}

static const char *status_name(int s)
{
	static const char *names[] = {"ok", "over", "only_a", "only_b", "dtype", "shape", "length", "skipped"};

	return s >= 0 && s < (int)HI3_ARRAY_SIZE(names) ? names[s] : "?";
}

static void text_line(FILE *f, const hi3_diff_result *r, const hi3_diff_tensor *t, int w)
{
	char sa[256], sb[256];

	fprintf(f, "%-*s  ", w, t->name);
	switch (t->status) {
	case HI3_DIFF_ONLY_A:
		fprintf(f, "only in A (%s)\n", r->path_a);
		return;
	case HI3_DIFF_ONLY_B:
		fprintf(f, "only in B (%s)\n", r->path_b);
		return;
	case HI3_DIFF_DTYPE:
		fprintf(f, "dtype differs: A %s, B %s\n", hi3_dtype_name(t->dtype_a), hi3_dtype_name(t->dtype_b));
		return;
	case HI3_DIFF_SHAPE:
		fprintf(f, "shape differs: A %s, B %s\n", hi3_shape_str(sa, sizeof(sa), t->ndim_a, t->shape_a),
		        hi3_shape_str(sb, sizeof(sb), t->ndim_b, t->shape_b));
		return;
	case HI3_DIFF_SKIPPED:
		fprintf(f, "skipped (no row axis for --row)\n");
		return;
	case HI3_DIFF_LENGTH:
		fprintf(f, "row length differs: A %lld, B %lld; over the first %lld: ", (long long)t->len_a,
		        (long long)t->len_b, (long long)HI3_MIN(t->len_a, t->len_b));
		break;
	}
	fprintf(f, "max|d|=%.2e", t->max_abs);
	if (t->max_abs > 0) {
		fprintf(f, " at ");
		fmt_loc(f, &t->worst);
		fprintf(f, " (a=%.6g b=%.6g)", t->worst.a, t->worst.b);
	}
	fprintf(f, "  (%lld/%lld over tol", (long long)t->n_over, (long long)t->n_compared);
	if (t->n_over && !loc_same(&t->first, &t->worst)) {
		fprintf(f, "; first at ");
		fmt_loc(f, &t->first);
	}
	fprintf(f, ")\n");
}

static json_t *loc_json(const hi3_diff_loc *l)
{
	json_t *o = json_object(), *idx = json_array(), *where = json_object();

	for (int i = 0; i < l->ndim; i++)
		json_array_append_new(idx, json_integer(l->idx[i]));
	for (int i = 0; i < l->n_named; i++)
		json_object_set_new(where, l->label[i], json_integer(l->val[i]));
	json_object_set_new(o, "index", idx);
	json_object_set_new(o, "where", where);
	json_object_set_new(o, "a", hi3i_json_num(l->a, 0));
	json_object_set_new(o, "b", hi3i_json_num(l->b, 0));
	return o;
}

static json_t *shape_json(int ndim, const int64_t *shape)
{
	json_t *a = json_array();

	for (int i = 0; i < ndim; i++)
		json_array_append_new(a, json_integer(shape[i]));
	return a;
}

static json_t *report_json(const hi3_diff_result *r)
{
	json_t *root = json_object(), *ts = json_array();

	json_object_set_new(root, "a", json_string(r->path_a));
	json_object_set_new(root, "b", json_string(r->path_b));
	json_object_set_new(root, "format_a", json_string(r->format_a));
	json_object_set_new(root, "format_b", json_string(r->format_b));
	json_object_set_new(root, "atol", json_real(r->opts.atol));
	json_object_set_new(root, "rtol", json_real(r->opts.rtol));
	json_object_set_new(root, "valid_only", json_boolean(r->valid_only));
	json_object_set_new(root, "rows", r->opts.row_a >= 0 ? json_pack("[II]", (json_int_t)r->opts.row_a,
	                                                                (json_int_t)r->opts.row_b)
	                                                     : json_null());
	json_object_set_new(root, "equal", json_boolean(r->equal));
	json_object_set_new(root, "count", json_integer(r->n));
	json_object_set_new(root, "differ", json_integer(r->n_differ));
	json_object_set_new(root, "format_differs", json_boolean(r->format_differs));
	json_object_set_new(root, "first", r->first >= 0 ? json_string(r->t[r->first].name) : json_null());
	json_object_set_new(root, "worst", r->worst >= 0 ? json_string(r->t[r->worst].name) : json_null());
	for (int i = 0; i < r->n; i++) {
		const hi3_diff_tensor *t = &r->t[i];
		json_t *e = json_object();

		json_object_set_new(e, "name", json_string(t->name));
		json_object_set_new(e, "status", json_string(status_name(t->status)));
		if (t->status != HI3_DIFF_ONLY_B) {
			json_object_set_new(e, "dtype_a", json_string(hi3_dtype_name(t->dtype_a)));
			json_object_set_new(e, "shape_a", shape_json(t->ndim_a, t->shape_a));
		}
		if (t->status != HI3_DIFF_ONLY_A) {
			json_object_set_new(e, "dtype_b", json_string(hi3_dtype_name(t->dtype_b)));
			json_object_set_new(e, "shape_b", shape_json(t->ndim_b, t->shape_b));
		}
		if (t->status == HI3_DIFF_LENGTH) {
			json_object_set_new(e, "len_a", json_integer(t->len_a));
			json_object_set_new(e, "len_b", json_integer(t->len_b));
		}
		if (t->status == HI3_DIFF_OK || t->status == HI3_DIFF_OVER || t->status == HI3_DIFF_LENGTH) {
			json_object_set_new(e, "compared", json_integer(t->n_compared));
			json_object_set_new(e, "over", json_integer(t->n_over));
			json_object_set_new(e, "max_abs", hi3i_json_num(t->max_abs, 0));
			json_object_set_new(e, "worst", t->max_abs > 0 ? loc_json(&t->worst) : json_null());
			json_object_set_new(e, "first_over", t->n_over ? loc_json(&t->first) : json_null());
		}
		json_array_append_new(ts, e);
	}
	json_object_set_new(root, "tensors", ts);
	return root;
}

int hi3_diff_report(const hi3_diff_result *r, int json, char **text, size_t *len, hi3_error *err)
{
	char *buf = NULL;
	size_t blen = 0;
	FILE *f;
	int w = 4;

	*text = NULL;
	if (json)
		return hi3i_json_text(report_json(r), JSON_INDENT(1), text, len, err);
	f = open_memstream(&buf, &blen);
	if (!f)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	for (int i = 0; i < r->n; i++)
		w = HI3_MAX(w, (int)strlen(r->t[i].name));
	if (r->format_differs)
		fprintf(f, "format differs: A '%s', B '%s'\n", r->format_a, r->format_b);
	for (int i = 0; i < r->n; i++)
		text_line(f, r, &r->t[i], w);
	fprintf(f, "summary: ");
	if (r->equal)
		fprintf(f, "all %d tensors within tolerance", r->n);
	else if (r->n_differ)
		fprintf(f, "%d of %d tensors differ", r->n_differ, r->n);
	else
		fprintf(f, "the formats differ; all %d tensors within tolerance", r->n);
	fprintf(f, " (atol=%g rtol=%g%s", r->opts.atol, r->opts.rtol, r->valid_only ? ", valid slots only" : "");
	if (r->opts.row_a >= 0)
		fprintf(f, ", row %lld of A vs row %lld of B", (long long)r->opts.row_a, (long long)r->opts.row_b);
	fprintf(f, ")");
	if (r->first >= 0)
		fprintf(f, "; first: %s", r->t[r->first].name);
	if (r->worst >= 0) {
		const hi3_diff_tensor *t = &r->t[r->worst];

		fprintf(f, "; worst: %s max|d|=%.2e at ", t->name, t->max_abs);
		fmt_loc(f, &t->worst);
	}
	fputc('\n', f);
	if (fclose(f) != 0) {
		free(buf);
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	}
	*text = buf;
	if (len)
		*len = blen;
	return 0;
}
