/* test-sample.c -- hi3_argmax (greedy decoding) answers what its definition
 * says, whichever code path runs: the first id of the largest logit, a
 * NaN never larger than anything, a NaN at id 0 larger than nothing (the
 * answer is then 0), -0 and +0 equal. Rows of every length up to 70 and a
 * vocabulary's, with ties, NaNs, infinities and the largest value at the
 * start, in the middle and in the last, partial block. */
#include <math.h>
#include <stdint.h>
#include "hi3.h"
#include "tap.h"

/* The definition: a left-to-right scan that moves on a strictly larger value. */
static int64_t scan(const float *x, int V)
{
	int64_t best = 0;

	for (int v = 1; v < V; v++)
		if (x[v] > x[best])
			best = v;
	return best;
}

static uint32_t rnd(uint32_t *s)
{
	*s = *s * 1664525u + 1013904223u;
	return *s >> 8;
}

/* Row kind k of length V: multiples of 1/4 in a small range (ties), some
 * NaN or infinite, signed zeros only, or all NaN past id 0. */
static void fill(float *x, int V, int k, uint32_t *s)
{
	for (int v = 0; v < V; v++) {
		const uint32_t r = rnd(s);
		switch (k) {
		case 0: x[v] = (float)((int)(r % 17) - 8) * 0.25f; break;
		case 1: x[v] = r % 7 == 0 ? NAN : (float)((int)(r % 9) - 4); break;
		case 2: x[v] = r % 2 ? 0.0f : -0.0f; break;
		case 3: x[v] = r % 5 == 0 ? INFINITY : r % 5 == 1 ? -INFINITY : r % 5 == 2 ? NAN : -1.0f; break;
		case 4: x[v] = v ? NAN : -INFINITY; break;
		default: x[v] = -INFINITY; break;
		}
	}
}

int main(void)
{
	static float x[32000 + 8];
	uint32_t s = 12345;
	int good = 1, nan0 = 1, big = 1, placed = 1;

	for (int V = 1; V <= 70; V++)
		for (int k = 0; k < 6; k++)
			for (int rep = 0; rep < 8; rep++) {
				fill(x, V, k, &s);
				good &= hi3_argmax(x, V) == scan(x, V);
			}
	ok(good, "rows of 1-70 logits (ties, NaN, +-inf, signed zeros): the scan's id");
	for (int V = 2; V <= 40; V++) {
		fill(x, V, 0, &s);
		x[0] = NAN;
		x[V - 1] = 100.0f;
		nan0 &= hi3_argmax(x, V) == 0;
	}
	ok(nan0, "a NaN at id 0: 0, whatever follows");
	for (int k = 0; k < 4; k++) {
		fill(x, 32000, k, &s);
		big &= hi3_argmax(x, 32000) == scan(x, 32000);
	}
	ok(big, "rows of 32000 logits: the scan's id");
	for (int at = 0; at < 67; at += 3) {
		fill(x, 67, 0, &s);
		x[at] = 9.0f;
		x[(at + 5) % 67] = 9.0f;                        /* a tie, later or earlier */
		x[(at + 11) % 67] = -0.0f;
		placed &= hi3_argmax(x, 67) == (at < (at + 5) % 67 ? at : (at + 5) % 67);
	}
	ok(placed, "the largest at every place of a row of 67: the lower id of a tie");
	return done_testing();
}
