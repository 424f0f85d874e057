/*
 * colormap.c -- the colour maps of the inspection tools' heatmaps (hi3
 * inspect --png), and the upscaling of a picture of cells to pixels.
 */
#include <math.h>
#include <string.h>
#include "tools/tools.h"

struct stop {
	double t;
	uint8_t r, g, b;
};

static void ramp(const struct stop *s, int n, double t, uint8_t *out)
{
	int i = 0;
	double f;

	if (t <= s[0].t) {
		out[0] = s[0].r, out[1] = s[0].g, out[2] = s[0].b;
		return;
	}
	while (i < n - 2 && t > s[i + 1].t)
		i++;
	if (t >= s[n - 1].t) {
		out[0] = s[n - 1].r, out[1] = s[n - 1].g, out[2] = s[n - 1].b;
		return;
	}
	f = (t - s[i].t) / (s[i + 1].t - s[i].t);
	out[0] = (uint8_t)lround(s[i].r + f * (s[i + 1].r - s[i].r));
	out[1] = (uint8_t)lround(s[i].g + f * (s[i + 1].g - s[i].g));
	out[2] = (uint8_t)lround(s[i].b + f * (s[i + 1].b - s[i].b));
}

/* Blue for negative, white at zero, red for positive (t in [-1, 1]). */
static const struct stop diverging[] = {
	{-1.0, 20, 40, 140}, {-0.5, 90, 140, 220}, {0.0, 247, 247, 247}, {0.5, 235, 120, 90}, {1.0, 140, 10, 30},
};
/* Dark blue through teal and green to yellow (t in [0, 1]). */
static const struct stop sequential[] = {
	{0.0, 30, 10, 70}, {0.25, 50, 80, 150}, {0.5, 30, 150, 140}, {0.75, 120, 200, 70}, {1.0, 250, 230, 40},
};

void hi3i_colormap(const double *v, int64_t n, double lo, double hi, int diverging_map, uint8_t *rgb)
{
	double m = fmax(fabs(lo), fabs(hi));

	for (int64_t i = 0; i < n; i++) {
		uint8_t *o = rgb + 3 * i;
		double x = v[i], t;

		if (isnan(x)) {
			o[0] = 255, o[1] = 0, o[2] = 255;
			continue;
		}
		if (diverging_map) {
			t = m > 0 ? x / m : 0;
			ramp(diverging, (int)HI3_ARRAY_SIZE(diverging), fmax(-1, fmin(1, t)), o);
		} else {
			t = hi > lo ? (x - lo) / (hi - lo) : 0.5;
			ramp(sequential, (int)HI3_ARRAY_SIZE(sequential), fmax(0, fmin(1, t)), o);
		}
	}
}

uint8_t *hi3i_upscale(const uint8_t *rgb, int rows, int cols, int scale, hi3_error *err)
{
	size_t w = (size_t)cols * (size_t)scale, h = (size_t)rows * (size_t)scale;
	uint8_t *out = hi3i_malloc(w * h * 3, err);

	if (!out)
		return NULL;
	for (size_t y = 0; y < h; y++) {
		const uint8_t *src = rgb + (y / (size_t)scale) * (size_t)cols * 3;
		uint8_t *dst = out + y * w * 3;

		for (size_t x = 0; x < w; x++)
			memcpy(dst + 3 * x, src + 3 * (x / (size_t)scale), 3);
	}
	return out;
}

int hi3i_auto_scale(int64_t rows, int64_t cols)
{
	int64_t m = HI3_MAX(rows, cols), s = m > 0 ? 1024 / m : 16;

	return (int)HI3_MAX(1, HI3_MIN(16, s));
}
