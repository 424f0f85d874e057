/*
 * philox.c -- the counter-based generator every random draw of hi3 comes
 * from (hi3-batching(7), SAMPLING and DIFFUSION): Philox-4x32-10, the
 * sampler's uniform draw for (seed, step) and the standard normal draw for
 * (seed, stream, i). A draw depends only on its key and counter, never on
 * a shared stream, so a row draws the same numbers alone or in any batch,
 * on any backend (kernels/sample.cu computes hi3_uniform's draw on the
 * GPU). Compiled with -ffp-contract=off (Makefile.am) with the other
 * files whose float arithmetic must run as written.
 */
#include <math.h>
#include "core/internal.h"

/* counter word 3 of the normal draws, "norm": apart from the sampler's */
#define NORMAL_TAG 0x6e6f726du

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void hi3_philox4x32(uint32_t ctr[4], const uint32_t key_in[2])
{
	uint32_t k0 = key_in[0], k1 = key_in[1];

	for (int r = 0; r < 10; r++) {
		uint64_t p0 = (uint64_t)PHILOX_M0 * ctr[0], p1 = (uint64_t)PHILOX_M1 * ctr[2];
		uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
		uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
		uint32_t n0 = hi1 ^ ctr[1] ^ k0, n2 = hi0 ^ ctr[3] ^ k1;

		ctr[0] = n0;
		ctr[1] = lo1;
		ctr[2] = n2;
		ctr[3] = lo0;
		k0 += PHILOX_W0;
		k1 += PHILOX_W1;
	}
}

double hi3_uniform(uint64_t seed, uint64_t step)
{
	uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
	uint32_t c[4] = {(uint32_t)step, (uint32_t)(step >> 32), 0, 0};

	hi3_philox4x32(c, key);
	/* 53 random bits: u in [0, 1) */
	return (double)(((uint64_t)c[0] << 21) ^ (c[1] >> 11)) * (1.0 / 9007199254740992.0);
}

float hi3_normal(uint64_t seed, uint64_t stream, uint64_t i)
{
	uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
	uint32_t c[4] = {(uint32_t)i, (uint32_t)(i >> 32), (uint32_t)stream, NORMAL_TAG};
	double u1, u2;

	hi3_philox4x32(c, key);
	/* two 53-bit uniforms: u1 in (0, 1], u2 in [0, 1); Box-Muller */
	u1 = ((double)((((uint64_t)c[0] << 32) | c[1]) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
	u2 = (double)((((uint64_t)c[2] << 32) | c[3]) >> 11) * (1.0 / 9007199254740992.0);
	return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

void hi3i_normals(uint64_t seed, uint64_t stream, size_t n, float *out)
{
#pragma omp parallel for schedule(static) if (n > 65536)
	for (size_t i = 0; i < n; i++)
		out[i] = hi3_normal(seed, stream, i);
}
