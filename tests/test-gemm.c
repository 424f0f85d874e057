/* test-gemm.c -- the in-place GEMM against plain loops in its reduction
 * order (gemm.h), and batch invariance: a row's output is bitwise the same
 * alone, in any batch, at any position; for F32, BF16 and F16 weights. */
#include <math.h>
#include <string.h>
#include "backend/gemm.h"
#include "tap.h"

static float frand(uint64_t *s)
{
	*s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
	return (float)((*s >> 40) & 0xffffff) / (float)0x1000000 * 2.0f - 1.0f;
}

static void check_shape(int N, int K, int M, hi3_dtype dt)
{
	uint64_t s = (uint64_t)(N * 131 + K * 7 + M);
	float *w = malloc(sizeof(float) * (size_t)N * K), *x = malloc(sizeof(float) * (size_t)M * K);
	uint16_t *wb = malloc(2 * (size_t)N * K + 2);
	float *y = malloc(sizeof(float) * (size_t)M * N), *yr = malloc(sizeof(float) * (size_t)M * N);
	float *y1 = malloc(sizeof(float) * (size_t)N);
	hi3_wmat p;
	hi3_error err = {0};
	double maxd = 0, maxref = 0;
	int same = 1, bitwise = 1;

	/* narrow weights start one element in: in place, a tensor need not be aligned */
	for (int i = 0; i < N * K; i++) {
		w[i] = frand(&s);
		wb[i + 1] = dt == HI3_F16 ? hi3_f32_to_f16(w[i]) : hi3_f32_to_bf16(w[i]);
	}
	for (int i = 0; i < M * K; i++)
		x[i] = frand(&s);
	ok(hi3i_wmat_init(&p, dt == HI3_F32 ? (void *)w : (void *)(wb + 1), dt, N, K, &err) == 0, "view %dx%d %s", N,
	   K, hi3_dtype_name(dt));
	hi3i_gemm(y, x, &p, M);
	hi3i_gemm_ref(yr, x, &p, M);
	for (int m = 0; m < M; m++)
		for (int n = 0; n < N; n++) {
			/* against a double-precision dot product */
			double acc = 0;
			for (int k = 0; k < K; k++)
				acc += (double)x[(size_t)m * K + k] *
				       (dt == HI3_BF16 ? hi3_bf16_to_f32(wb[(size_t)n * K + k + 1])
				        : dt == HI3_F16 ? hi3_f16_to_f32(wb[(size_t)n * K + k + 1]) : w[(size_t)n * K + k]);
			maxd = fmax(maxd, fabs(acc - y[(size_t)m * N + n]));
			maxref = fmax(maxref, fabs(acc));
			if (y[(size_t)m * N + n] != yr[(size_t)m * N + n])
				same = 0;
		}
	ok(maxd <= 1e-5 * fmax(1.0, maxref) * sqrt((double)K), "M=%d N=%d K=%d %s: max |y - y_f64| = %.3g",
	   M, N, K, hi3_dtype_name(dt), maxd);
	ok(same, "M=%d N=%d K=%d %s: kernel equals the reference loop order bit for bit", M, N, K,
	   hi3_dtype_name(dt));
	/* every kernel the CPU has (portable, AVX2, AVX-512) on the whole batch */
	for (int level = 0; level < hi3i_gemm_isa(-1); level++) {
		float *yl = malloc(sizeof(float) * (size_t)M * N);
		hi3i_gemm_isa(level);
		hi3i_gemm(yl, x, &p, M);
		ok(!memcmp(yl, yr, sizeof(float) * (size_t)M * N), "M=%d N=%d K=%d %s: the %s kernel too", M, N, K,
		   hi3_dtype_name(dt), level ? "AVX2" : "portable");
		free(yl);
	}
	hi3i_gemm_isa(-1);
	for (int m = 0; m < M; m++) {
		hi3i_gemm(y1, x + (size_t)m * K, &p, 1);
		if (memcmp(y1, y + (size_t)m * N, sizeof(float) * (size_t)N))
			bitwise = 0;
	}
	ok(bitwise, "M=%d N=%d K=%d %s: every row alone equals that row in the batch", M, N, K,
	   hi3_dtype_name(dt));
	free(w);
	free(wb);
	free(x);
	free(y);
	free(yr);
	free(y1);
}

/* A grouped call gives the bits of separate calls. */
static void check_group(void)
{
	enum { NJ = 4 };
	static const int NK[NJ][3] = {{48, 64, 1}, {17, 33, 7}, {128, 96, 2}, {5, 64, 13}};
	hi3_wmat p[NJ];
	const hi3_wmat *pp[NJ];
	uint16_t *wn[NJ];
	float *x[NJ], *y[NJ], *y1[NJ];
	const float *cx[NJ];
	int M[NJ], same = 1;
	uint64_t s = 99;

	for (int j = 0; j < NJ; j++) {
		int N = NK[j][0], K = NK[j][1];
		float *w = malloc(sizeof(float) * (size_t)N * K);
		M[j] = NK[j][2];
		x[j] = malloc(sizeof(float) * (size_t)M[j] * K);
		y[j] = malloc(sizeof(float) * (size_t)M[j] * N);
		y1[j] = malloc(sizeof(float) * (size_t)M[j] * N);
		wn[j] = malloc(2 * (size_t)N * K);
		for (int i = 0; i < N * K; i++) {
			w[i] = frand(&s);
			wn[j][i] = hi3_f32_to_bf16(w[i]);
		}
		for (int i = 0; i < M[j] * K; i++)
			x[j][i] = frand(&s);
		if (j % 2) {
			hi3i_wmat_init(&p[j], wn[j], HI3_BF16, N, K, NULL);
			free(w);
		} else {
			hi3i_wmat_init(&p[j], w, HI3_F32, N, K, NULL);
			free(wn[j]);
			wn[j] = (uint16_t *)w;
		}
		pp[j] = &p[j];
		cx[j] = x[j];
		hi3i_gemm(y1[j], x[j], &p[j], M[j]);
	}
	hi3i_gemm_group(NJ, y, cx, pp, M);
	for (int j = 0; j < NJ; j++) {
		same &= !memcmp(y[j], y1[j], sizeof(float) * (size_t)M[j] * NK[j][0]);
		free(wn[j]);
		free(x[j]);
		free(y[j]);
		free(y1[j]);
	}
	ok(same, "a grouped call of %d products equals the separate calls bit for bit", NJ);
}

int main(void)
{
	check_group();
	/* K = 2100 and 2051 take several k slices (lanes carried between them) */
	/* (N, K, M): with AVX-512, M >= 8 takes the packed kernel: rows past a
	 * tile of 8, N past a tile of 6, K % 8, and K = 4700 (several k slices,
	 * lanes carried) are its edges; N = 72, M = 300: threads split rows */
	static const int shapes[][3] = {{16, 8, 1}, {17, 33, 7}, {128, 128, 13}, {200, 300, 100},
	                                {384, 256, 6}, {5, 1, 3}, {96, 520, 97}, {40, 2100, 9}, {7, 2051, 4}, {50, 2100, 40},
	                                {6, 8, 8}, {37, 589, 19}, {13, 4700, 9}, {3, 5, 16}, {72, 100, 300}};

	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
		check_shape(shapes[i][0], shapes[i][1], shapes[i][2], HI3_F32);
		check_shape(shapes[i][0], shapes[i][1], shapes[i][2], HI3_BF16);
		check_shape(shapes[i][0], shapes[i][1], shapes[i][2], HI3_F16);
	}
	return done_testing();
}
