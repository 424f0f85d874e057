/*
 * size.c -- checked arithmetic for sizes that come from a file: shapes,
 * counts and lengths read from a header, a config or a request. Every
 * product or sum of such numbers goes through these, so that a hostile
 * file gets an error instead of a wrapped size (internal.h).
 */
#include "core/internal.h"

int hi3i_mul_size(int64_t a, int64_t b, int64_t limit, int64_t *out)
{
	int64_t r;

	if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r) || r > limit)
		return -1;
	*out = r;
	return 0;
}

int hi3i_add_size(int64_t a, int64_t b, int64_t limit, int64_t *out)
{
	int64_t r;

	if (a < 0 || b < 0 || __builtin_add_overflow(a, b, &r) || r > limit)
		return -1;
	*out = r;
	return 0;
}

int hi3i_shape_bytes(int ndim, const int64_t *shape, int64_t elem, int64_t *nbytes)
{
	int64_t n = elem;
	int empty = 0;

	for (int i = 0; i < ndim; i++) {
		if (shape[i] == 0)
			empty = 1;
		else if (hi3i_mul_size(n, shape[i], INT64_MAX, &n) != 0)
			return -1;
	}
	*nbytes = empty ? 0 : n;
	return 0;
}
