/* cuda-test.h -- what the CUDA tests share (include it from one test
 * program, like tap.h): a reproducible generator and the error measure the
 * kernel-vs-CPU tolerances are stated in. Scratch directories: testdir.h. */
#ifndef HI3_CUDA_TEST_H
#define HI3_CUDA_TEST_H
#include <math.h>
#include <stdint.h>
#include <stdio.h>

static uint64_t test_rng = 0x2545f4914f6cdd1dULL;

/* Uniform in [0, 1), xorshift64. */
static inline double urand(void)
{
	test_rng ^= test_rng << 13;
	test_rng ^= test_rng >> 7;
	test_rng ^= test_rng << 17;
	return (double)(test_rng >> 11) / 9007199254740992.0;
}

/* ||out - ref|| / ||ref|| (||out|| when ref is all zeros); NaN anywhere gives NaN. */
static inline double rel_err(const float *out, const float *ref, size_t n)
{
	double num = 0.0, den = 0.0;

	for (size_t i = 0; i < n; i++) {
		double e = (double)out[i] - (double)ref[i];
		num += e * e;
		den += (double)ref[i] * (double)ref[i];
	}
	return den > 0.0 ? sqrt(num / den) : sqrt(num);
}
#endif
