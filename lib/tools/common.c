/*
 * common.c -- what the inspection tools share: natural name order,
 * numpy-style slices, tensor statistics, JSON numbers.
 */
#include <ctype.h>
#include <math.h>
#include <omp.h>
#include <string.h>
#include "tools/tools.h"

int hi3i_natcmp(const char *a, const char *b)
{
	while (*a && *b) {
		if (isdigit((unsigned char)*a) && isdigit((unsigned char)*b)) {
			const char *ea = a, *eb = b;
			size_t la, lb;

			while (*a == '0' && isdigit((unsigned char)a[1]))
				a++;
			while (*b == '0' && isdigit((unsigned char)b[1]))
				b++;
			for (ea = a; isdigit((unsigned char)*ea); ea++)
				;
			for (eb = b; isdigit((unsigned char)*eb); eb++)
				;
			la = (size_t)(ea - a);
			lb = (size_t)(eb - b);
			if (la != lb)
				return la < lb ? -1 : 1;
			int c = strncmp(a, b, la);
			if (c)
				return c;
			a = ea;
			b = eb;
			continue;
		}
		if (*a != *b)
			return (unsigned char)*a < (unsigned char)*b ? -1 : 1;
		a++;
		b++;
	}
	return *a ? 1 : *b ? -1 : 0;
}

/* ------------------------------------------------------------------ slices */

static char *trim(char *s)
{
	char *e;

	while (isspace((unsigned char)*s))
		s++;
	e = s + strlen(s);
	while (e > s && isspace((unsigned char)e[-1]))
		*--e = '\0';
	return s;
}

/* One bound of a range: empty gives dflt; negative counts from the end;
 * the result must lie in [0, n]. */
static int parse_bound(const char *spec, int dim, int64_t n, const char *what, const char *txt,
                       int64_t dflt, int64_t *out, hi3_error *err)
{
	int64_t v;

	if (!*txt) {
		*out = dflt;
		return 0;
	}
	if (hi3i_parse_i64(txt, INT64_MIN / 2, INT64_MAX / 2, &v) != 0)
		return hi3_error_set(err, HI3_ERR_USAGE, "slice '%s': dimension %d: %s '%s' is not an integer", spec,
		                     dim, what, txt);
	if (v < 0)
		v += n;
	if (v < 0 || v > n)
		return hi3_error_set(err, HI3_ERR_USAGE,
		                     "slice '%s': dimension %d (size %lld): %s %s is out of range [%lld, %lld]", spec,
		                     dim, (long long)n, what, txt, (long long)-n, (long long)n);
	*out = v;
	return 0;
}

static int parse_item(hi3i_slice *s, const char *spec, int dim, int64_t n, char *item, hi3_error *err)
{
	char *c1 = strchr(item, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
	int64_t start, stop, step = 1, v;

	item = trim(item);
	if (!*item)
		return hi3_error_set(err, HI3_ERR_USAGE, "slice '%s': dimension %d: empty item (use ':' for all)",
		                     spec, dim);
	if (!c1) {
		if (hi3i_parse_i64(item, INT64_MIN / 2, INT64_MAX / 2, &v) != 0)
			return hi3_error_set(err, HI3_ERR_USAGE,
			                     "slice '%s': dimension %d: '%s' is not an index or a range START:STOP:STEP",
			                     spec, dim, item);
		if (v < -n || v >= n)
			return hi3_error_set(err, HI3_ERR_USAGE,
			                     "slice '%s': dimension %d (size %lld): index %lld is out of range [%lld, %lld)",
			                     spec, dim, (long long)n, (long long)v, (long long)-n, (long long)n);
		s->keep[dim] = 0;
		s->start[dim] = v < 0 ? v + n : v;
		s->step[dim] = 1;
		s->count[dim] = 1;
		return 0;
	}
	*c1 = '\0';
	if (c2) {
		*c2 = '\0';
		if (strchr(c2 + 1, ':'))
			return hi3_error_set(err, HI3_ERR_USAGE, "slice '%s': dimension %d: more than two ':' in an item",
			                     spec, dim);
		char *st = trim(c2 + 1);
		if (*st && (hi3i_parse_i64(st, 1, INT64_MAX, &step) != 0))
			return hi3_error_set(err, HI3_ERR_USAGE,
			                     "slice '%s': dimension %d: step '%s' is not a positive integer", spec, dim, st);
	}
	if (parse_bound(spec, dim, n, "start", trim(item), 0, &start, err) != 0 ||
	    parse_bound(spec, dim, n, "stop", trim(c1 + 1), n, &stop, err) != 0)
		return -1;
	if (start > stop)
		return hi3_error_set(err, HI3_ERR_USAGE, "slice '%s': dimension %d: start %lld is after stop %lld",
		                     spec, dim, (long long)start, (long long)stop);
	s->keep[dim] = 1;
	s->start[dim] = start;
	s->step[dim] = step;
	s->count[dim] = (stop - start + step - 1) / step;
	return 0;
}

int hi3i_slice_parse(hi3i_slice *s, const char *spec, int ndim, const int64_t *shape, hi3_error *err)
{
	char *copy, *p;
	int dim = 0, rc = -1;

	memset(s, 0, sizeof(*s));
	s->ndim = ndim;
	for (int i = 0; i < ndim; i++) {
		s->keep[i] = 1;
		s->step[i] = 1;
		s->count[i] = shape[i];
	}
	if (!spec || !spec[strspn(spec, " \t")])
		return 0;
	copy = hi3i_strdup(spec);
	if (!copy)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	/* strtok_r would merge empty items: walk the commas by hand */
	p = copy;
	for (;;) {
		char *comma = strchr(p, ',');

		if (comma)
			*comma = '\0';
		if (dim >= ndim) {
			hi3_error_set(err, HI3_ERR_USAGE, "slice '%s': more items than the tensor's %d dimensions", spec,
			              ndim);
			goto out;
		}
		if (parse_item(s, spec, dim, shape[dim], p, err) != 0)
			goto out;
		dim++;
		if (!comma)
			break;
		p = comma + 1;
	}
	rc = 0;
out:
	free(copy);
	return rc;
}

int hi3i_slice_shape(const hi3i_slice *s, int64_t *shape)
{
	int k = 0;

	for (int i = 0; i < s->ndim; i++)
		if (s->keep[i])
			shape[k++] = s->count[i];
	return k;
}

int64_t hi3i_slice_numel(const hi3i_slice *s)
{
	int64_t n = 1;

	for (int i = 0; i < s->ndim; i++)
		n *= s->count[i];
	return n;
}

void hi3i_slice_src(const hi3i_slice *s, int64_t i, int64_t *src)
{
	for (int d = s->ndim - 1; d >= 0; d--) {
		int64_t c = s->count[d] ? i % s->count[d] : 0;

		src[d] = s->start[d] + c * s->step[d];
		if (s->count[d])
			i /= s->count[d];
	}
}

int64_t hi3i_flat(int ndim, const int64_t *shape, const int64_t *idx)
{
	int64_t off = 0;

	for (int d = 0; d < ndim; d++)
		off = off * shape[d] + idx[d];
	return off;
}

json_t *hi3i_json_num(double v, int as_int)
{
	if (isnan(v))
		return json_string("NaN");
	if (isinf(v))
		return json_string(v > 0 ? "Infinity" : "-Infinity");
	if (as_int && v == trunc(v) && fabs(v) < 9007199254740992.0)
		return json_integer((json_int_t)v);
	return json_real(v);
}

int hi3i_json_emit(FILE *f, json_t *root, size_t flags, hi3_error *err)
{
	char *text = root ? json_dumps(root, flags | JSON_PRESERVE_ORDER) : NULL;

	json_decref(root);
	if (!text)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	fprintf(f, "%s\n", text);
	free(text);
	return 0;
}

/* -------------------------------------------------------------- statistics */

struct acc {
	double sum, mn, mx;
	int64_t fin, nan, inf;
};

#define STATS_BLOCK 65536

static inline void acc_d(struct acc *a, double v)
{
	if (isnan(v)) {
		a->nan++;
	} else if (isinf(v)) {
		a->inf++;
	} else {
		a->sum += v;
		a->mn = v < a->mn ? v : a->mn;
		a->mx = v > a->mx ? v : a->mx;
		a->fin++;
	}
}

/* n (at most 1024) floats into a. The common case, every element finite,
 * runs loops the compiler vectorises; a chunk with NaN or Inf goes
 * element by element. */
static void acc_floats(struct acc *a, const float *x, int n)
{
	float mn = x[0], mx = x[0];
	double sum = 0;

	if (hi3i_count_nonfinite(x, HI3_F32, (size_t)n)) {
		for (int i = 0; i < n; i++)
			acc_d(a, x[i]);
		return;
	}
#pragma omp simd reduction(min : mn) reduction(max : mx) reduction(+ : sum)
	for (int i = 0; i < n; i++) {
		mn = x[i] < mn ? x[i] : mn;
		mx = x[i] > mx ? x[i] : mx;
		sum += (double)x[i];
	}
	a->sum += sum;
	a->mn = fmin(a->mn, mn);
	a->mx = fmax(a->mx, mx);
	a->fin += n;
}

/* One block of elements [i0, i1), with loops specialised for the dtypes
 * a model is stored in (F32, BF16, F16); others go through hi3_elem_f64. */
static void stats_block(const hi3_tensor *t, int64_t i0, int64_t i1, struct acc *a)
{
	const unsigned char *p = t->data;
	float buf[1024];

	a->sum = 0;
	a->mn = INFINITY;
	a->mx = -INFINITY;
	a->fin = a->nan = a->inf = 0;
	for (int64_t c = i0; c < i1; c += 1024) {
		int n = (int)HI3_MIN(1024, i1 - c);

		if (t->dtype != HI3_F32 && t->dtype != HI3_BF16 && t->dtype != HI3_F16) {
			for (int i = 0; i < n; i++)
				acc_d(a, hi3_elem_f64(t->data, t->dtype, (size_t)(c + i)));
			continue;
		}
		hi3_to_f32(buf, p + (size_t)c * hi3_dtype_size(t->dtype), t->dtype, (size_t)n);
		acc_floats(a, buf, n);
	}
}

int hi3_tensor_stats(const hi3_tensor *t, int threads, hi3_stats *s, hi3_error *err)
{
	int64_t n = hi3_tensor_numel(t), nb = (n + STATS_BLOCK - 1) / STATS_BLOCK;
	struct acc *part = NULL, tot = {0, INFINITY, -INFINITY, 0, 0, 0};

	memset(s, 0, sizeof(*s));
	s->n = n;
	if (nb > 0) {
		part = hi3i_calloc((size_t)nb, sizeof(*part), err);
		if (!part)
			return -1;
	}
	/* blocks are merged in order, so the result does not depend on threads */
#pragma omp parallel for schedule(dynamic, 4) num_threads(threads > 0 ? threads : omp_get_max_threads()) \
	if (nb > 1)
	for (int64_t b = 0; b < nb; b++)
		stats_block(t, b * STATS_BLOCK, HI3_MIN(n, (b + 1) * STATS_BLOCK), &part[b]);
	for (int64_t b = 0; b < nb; b++) {
		tot.sum += part[b].sum;
		tot.mn = fmin(tot.mn, part[b].mn);
		tot.mx = fmax(tot.mx, part[b].mx);
		tot.fin += part[b].fin;
		tot.nan += part[b].nan;
		tot.inf += part[b].inf;
	}
	free(part);
	s->n_nan = tot.nan;
	s->n_inf = tot.inf;
	if (tot.fin) {
		s->min = tot.mn;
		s->max = tot.mx;
		s->mean = tot.sum / (double)tot.fin;
	} else {
		s->min = s->max = s->mean = NAN;
	}
	return 0;
}
