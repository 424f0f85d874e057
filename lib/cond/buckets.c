/*
 * buckets.c -- the geometry of images in the sequence template
 * (facts/image-input.md 1): the resolution buckets of a base size, the
 * bucket nearest an image's ratio, SigLIP2's patch grid.
 */
#include <math.h>
#include "cond/cond-internal.h"

/* The resolution buckets of base size B: from (B, B), heights up to 2B
 * while widths go down to B/2 in steps of B/16, and the mirror, each floored
 * to a multiple of align, sorted by H/W (stable); then the extras whose
 * ratio is not there yet. Returns the count, or -1. */
static int buckets(int B, int align, const int (*extra)[2], int n_extra, int (*r)[2], int max)
{
	int step = B / 16, n = 0, sorted;

	if (step < 1 || max < 1 || align > step || B % align)
		return -1;
	r[n][0] = B;
	r[n][1] = B;
	n++;
	for (int dir = 0; dir < 2; dir++) {
		int h = B, w = B;
		for (;;) {
			if (dir == 0 ? h >= 2 * B && w <= B / 2 : h <= B / 2 && w >= 2 * B)
				break;
			if (n == max)
				return -1;
			h = dir == 0 ? HI3_MIN(h + step, 2 * B) : HI3_MAX(h - step, B / 2);
			w = dir == 0 ? HI3_MAX(w - step, B / 2) : HI3_MIN(w + step, 2 * B);
			r[n][0] = h / align * align;
			r[n][1] = w / align * align;
			n++;
		}
	}
	for (int i = 1; i < n; i++)                 /* insertion sort: stable */
		for (int j = i; j > 0 && (double)r[j][0] / r[j][1] < (double)r[j - 1][0] / r[j - 1][1]; j--) {
			int th = r[j][0], tw = r[j][1];
			r[j][0] = r[j - 1][0];
			r[j][1] = r[j - 1][1];
			r[j - 1][0] = th;
			r[j - 1][1] = tw;
		}
	sorted = n;
	for (int e = 0; e < n_extra; e++) {
		double ratio = (double)extra[e][0] / extra[e][1];
		int dup = 0;
		for (int i = 0; i < sorted; i++)
			dup |= (double)r[i][0] / r[i][1] == ratio;
		if (dup)
			continue;
		if (n == max)
			return -1;
		r[n][0] = extra[e][0];
		r[n][1] = extra[e][1];
		n++;
	}
	return n;
}

int hi3i_buckets(int B, int (*r)[2], int max)
{
	return buckets(B, 1, NULL, 0, r, max);
}

int hi3i_buckets_variant(int variant, int B, int (*r)[2], int max)
{
	/* image_processor.py: ResolutionGroup(base, align=16, extra_resolutions) */
	static const int extra[4][2] = {{1024, 768}, {1280, 720}, {768, 1024}, {720, 1280}};

	if (variant == HI3_VARIANT_BASE)
		return hi3i_buckets(B, r, max);
	return buckets(B, 16, extra, 4, r, max);
}

int hi3i_bucket_of(const int (*r)[2], int n, int64_t h, int64_t w)
{
	double ratio = (double)h / (double)w, best = INFINITY;
	int idx = 0;

	for (int i = 0; i < n; i++) {
		double d = fabs((double)r[i][0] / r[i][1] - ratio);
		if (d < best) {
			best = d;
			idx = i;
		}
	}
	return idx;
}

void hi3i_vit_grid(int64_t h, int64_t w, int p, int max, int *gh, int *gw)
{
	double eps = 1e-5, lo = eps / 10, hi = 100.0;
	int64_t th, tw;

#define SIDE(s, n) HI3_MAX((int64_t)p, (int64_t)(ceil((double)(n) * (s) / p) * p))
	while (hi - lo >= eps) {
		double mid = (lo + hi) / 2;
		th = SIDE(mid, h);
		tw = SIDE(mid, w);
		if ((double)(th / p) * (double)(tw / p) <= max)
			lo = mid;
		else
			hi = mid;
	}
	th = SIDE(lo, h);
	tw = SIDE(lo, w);
#undef SIDE
	*gh = (int)(th / p);
	*gw = (int)(tw / p);
}
