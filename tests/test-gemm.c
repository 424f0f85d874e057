/* test-gemm.c -- the in-place GEMM against plain loops in its reduction
 * order (gemm.h), and batch invariance: a row's output is bitwise the same
 * alone, in any batch, at any position; for F32, BF16 and F16 weights, and
 * for weight-only quantized ones (quant.h), which must also give the bits
 * of the F32 matrix of their values; the e4m3 codec on every code. */
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

/* Codes and scales of format fmt for a random (N, K) matrix, at odd
 * offsets of one buffer (a tensor need not be aligned); alt picks the
 * format's other forms: FP8 1 one F32 scale, no rounding, NaN codes in
 * row 0; 2 F16 scales and rounding (read through a buffer); NF4 1 F32
 * absmax in blocks of 32, block 1 NaN, rounded to BF16 when 3 divides K. */
static void check_quant(int fmt, int N, int K, int M, int alt)
{
	uint64_t s = (uint64_t)(fmt * 7919 + N * 131 + K);
	const size_t nk = (size_t)N * K, nb = (nk + 63) / 64;
	unsigned char *buf = calloc(nk + 4 * nk / 16 + 8 * nb + 4 * (size_t)N + 64, 1);
	float *x = malloc(sizeof(float) * (size_t)M * K), *wf = malloc(sizeof(float) * nk);
	float *y = malloc(sizeof(float) * (size_t)M * N), *yf = malloc(sizeof(float) * (size_t)M * N);
	float *y1 = malloc(sizeof(float) * (size_t)N);
	hi3_qweight q = {.format = fmt, .N = N, .K = K, .round_to = HI3_F32};
	hi3_wmat p, pf;
	hi3_error err = {0};
	int same = 1, rows = 1;

	q.codes = buf + 1;
	q.scale = buf + 1 + nk + 3;
	for (size_t i = 0; i < nk; i++)
		buf[1 + i] = (unsigned char)(frand(&s) * 127 + 128);
	switch (fmt) {
	case HI3_Q_FP8:              /* per-row BF16 scales, values rounded to BF16 */
		q.scale_dtype = alt == 1 ? HI3_F32 : alt == 2 ? HI3_F16 : HI3_BF16;
		q.round_to = alt == 1 ? HI3_F32 : q.scale_dtype;
		q.per_row = alt != 1;
		for (int n = 0; n < N; n++) {
			float f = 0.01f + fabsf(frand(&s)) * 0.1f;
			uint16_t h = alt == 2 ? hi3_f32_to_f16(f) : hi3_f32_to_bf16(f);
			if (alt == 1)
				memcpy((unsigned char *)q.scale + 4 * n, &f, 4);
			else
				memcpy((unsigned char *)q.scale + 2 * n, &h, 2);
		}
		for (size_t i = 0; i < nk; i++)     /* NaN codes (their bits too) in row 0 of the F32 form */
			if ((buf[1 + i] & 0x7f) == 0x7f && (alt != 1 || i >= (size_t)K))
				buf[1 + i] ^= 1;
		break;
	case HI3_Q_INT8:
		q.scale_dtype = HI3_F32;
		for (int n = 0; n < N; n++) {
			float f = 0.5f + fabsf(frand(&s));
			memcpy((unsigned char *)q.scale + 4 * n, &f, 4);
		}
		break;
	case HI3_Q_NF4:              /* double quantization, blocks across rows */
		if (alt == 1) {
			q.block = 32;
			q.scale_dtype = HI3_F32;
			q.round_to = K % 3 ? HI3_F32 : HI3_BF16;
			for (int i = 0; i < 16; i++)
				q.map[i] = -1.0f + (float)i / 7.5f;
			for (size_t b = 0; b < (nk + 31) / 32; b++) {
				float f = 0.5f + fabsf(frand(&s));
				memcpy((unsigned char *)q.scale + 4 * b, &f, 4);
			}
			{
				/* block 1 a NaN whose payload the plain BF16 rounding
				 * would carry into the exponent: its values' bits too */
				const uint32_t nan = 0x7fa1ffffu;
				memcpy((unsigned char *)q.scale + 4, &nan, 4);
			}
			break;
		}
		q.block = 64;
		q.nested = 1;
		q.nested_block = 4;
		q.offset = 0.03125f;
		q.round_to = HI3_BF16;
		q.scale_dtype = HI3_U8;
		q.nested_absmax = (unsigned char *)q.scale + nb + 1;
		for (int i = 0; i < 16; i++)
			q.map[i] = -1.0f + (float)i / 7.5f;
		for (int i = 0; i < 256; i++)
			q.nested_map[i] = -1.0f + (float)i / 127.5f;
		for (size_t b = 0; b < nb; b++)
			((unsigned char *)q.scale)[b] = (unsigned char)(frand(&s) * 127 + 128);
		for (size_t b = 0; b < (nb + 3) / 4; b++) {
			float f = 0.5f + fabsf(frand(&s));
			memcpy((unsigned char *)q.nested_absmax + 4 * b, &f, 4);
		}
		break;
	case HI3_Q_NVFP4:
		q.block = 16;
		q.scale2 = 0.0078125f * 1.3f;
		q.scale_dtype = HI3_F8_E4M3;
		for (size_t b = 0; b < nk / 16; b++)
			((unsigned char *)q.scale)[b] = (unsigned char)(frand(&s) * 50 + 60);
		break;
	}
	for (int n = 0; n < N; n++)
		for (int k = 0; k < K; k++)
			wf[(size_t)n * K + k] = hi3i_qweight_at(&q, n, k);
	for (int i = 0; i < M * K; i++)
		x[i] = frand(&s);
	hi3i_wmat_init_q(&p, &q);
	ok(hi3i_wmat_init(&pf, wf, HI3_F32, N, K, &err) == 0, "%s %dx%d", hi3i_qformat_name(fmt), N, K);
	hi3i_gemm(yf, x, &pf, M);
	for (int level = 0; level <= hi3i_gemm_isa(-1); level++) {
		hi3i_gemm_isa(level);
		hi3i_gemm(y, x, &p, M);
		same &= !memcmp(y, yf, sizeof(float) * (size_t)M * N);
	}
	hi3i_gemm_isa(-1);
	ok(same, "%s (%d) M=%d N=%d K=%d: every kernel gives the bits of the F32 matrix of its values",
	   hi3i_qformat_name(fmt), alt, M, N, K);
	hi3i_gemm_ref(y, x, &p, M);
	ok(!memcmp(y, yf, sizeof(float) * (size_t)M * N), "%s M=%d N=%d K=%d: the reference loops too",
	   hi3i_qformat_name(fmt), M, N, K);
	for (int m = 0; m < M; m++) {
		hi3i_gemm(y1, x + (size_t)m * K, &p, 1);
		rows &= !memcmp(y1, yf + (size_t)m * N, sizeof(float) * (size_t)N);
	}
	ok(rows, "%s M=%d N=%d K=%d: every row alone equals that row in the batch", hi3i_qformat_name(fmt), M, N, K);
	free(buf);
	free(x);
	free(wf);
	free(y);
	free(yf);
	free(y1);
}

/* e4m3: every code decodes and encodes back to itself (NaN to NaN); the
 * encoder rounds to nearest even and saturates at 448. */
static void check_e4m3(void)
{
	int round_trip = 1;

	for (int c = 0; c < 256; c++) {
		float f = hi3i_e4m3_to_f32((uint8_t)c);
		if ((c & 0x7f) == 0x7f)
			round_trip &= isnan(f) && (hi3i_f32_to_e4m3(f) & 0x7f) == 0x7f;
		else
			round_trip &= hi3i_f32_to_e4m3(f) == c || (f == 0 && (hi3i_f32_to_e4m3(f) & 0x7f) == 0);
	}
	ok(round_trip, "e4m3: the 256 codes round-trip");
	ok(hi3i_e4m3_to_f32(0x7e) == 448.0f && hi3i_f32_to_e4m3(1e6f) == 0x7e && hi3i_f32_to_e4m3(-500.0f) == 0xfe,
	   "e4m3: 448 is the largest, larger values saturate");
	ok(hi3i_f32_to_e4m3(1.0625f) == 0x38 && hi3i_f32_to_e4m3(1.1875f) == 0x3a &&
	   hi3i_f32_to_e4m3(0x1p-10f) == 0x00 && hi3i_f32_to_e4m3(0x1.8p-9f) == 0x02,
	   "e4m3: ties to even (normal and subnormal)");
	{
		/* the vector rows (eight at a time) give the scalar decoder's bits, NaN included */
		uint8_t codes[256];
		float one = 1.0f, vec[256], ref[256];
		hi3_qweight q = {.format = HI3_Q_FP8, .N = 1, .K = 256, .codes = codes, .scale = &one,
		                 .scale_dtype = HI3_F32, .round_to = HI3_F32};
		for (int c = 0; c < 256; c++) {
			codes[c] = (uint8_t)c;
			ref[c] = hi3i_e4m3_to_f32((uint8_t)c);
		}
		hi3i_qweight_rows(&q, vec, 256, 0, 1, 0, 256);
		ok(!memcmp(vec, ref, sizeof(vec)), "e4m3: a row of all 256 codes decodes to the scalar decoder's bits");
	}
	ok(hi3i_e2m1_to_f32(7) == 6.0f && hi3i_e2m1_to_f32(9) == -0.5f && hi3i_e2m1_to_f32(3) == 1.5f, "e2m1 values");
}

int main(void)
{
	check_group();
	check_e4m3();
	for (int fmt = HI3_Q_FP8; fmt <= HI3_Q_NVFP4; fmt++) {
		check_quant(fmt, 37, 96, 19, 0);
		check_quant(fmt, 13, 1040, 9, 0);   /* several k slices */
		check_quant(fmt, 6, 32, 1, 0);
		check_quant(fmt, 7, 4720, 12, 0);   /* several k slices of the AVX-512 kernel */
		check_quant(fmt, 7, 2608, 24, 0);   /* several k slices dequantized into its panel */
		check_quant(fmt, 8, 1056, 3, 1);
		check_quant(fmt, 19, 96, 40, 1);
	}
	/* K % 8 != 0: the tail k of INT8 and FP8 rows, NF4 rows and blocks
	 * off the 8-k steps (read through a buffer); FP8 rounded to F16 */
	for (int fmt = HI3_Q_FP8; fmt <= HI3_Q_NF4; fmt++) {
		check_quant(fmt, 11, 37, 10, 0);
		check_quant(fmt, 5, 1043, 2, 1);
		check_quant(fmt, 5, 2603, 20, 0);
	}
	check_quant(HI3_Q_NF4, 6, 1000, 4, 1);
	check_quant(HI3_Q_FP8, 9, 40, 12, 2);
	check_quant(HI3_Q_FP8, 9, 40, 1, 2);
	/* K = 2100 and 2051 take several k slices (lanes carried between them) */
	/* (N, K, M): with AVX-512, M >= 8 takes the packed kernel: rows past a
	 * tile of 8, N past a tile of 6, K % 8, and K = 4700 (several k slices,
	 * lanes carried) are its edges; N = 72, M = 300: threads split rows;
	 * M <= 4 takes the prefetching few-row tiles (four W rows a tile for
	 * M <= 2, two for 3-4, one from each equal part of a thread's range,
	 * the last rows, fewer than a tile's, by one plain tile; K past one
	 * slice in one pass; split by threads; N = 25 and 2 leave ranges of
	 * one and two columns) */
	static const int shapes[][3] = {{16, 8, 1}, {17, 33, 7}, {128, 128, 13}, {200, 300, 100},
	                                {384, 256, 6}, {5, 1, 3}, {96, 520, 97}, {40, 2100, 9}, {7, 2051, 4}, {50, 2100, 40},
	                                {6, 8, 8}, {37, 589, 19}, {13, 4700, 9}, {3, 5, 16}, {72, 100, 300},
	                                {1003, 300, 1}, {301, 1030, 2}, {45, 77, 3}, {100, 2100, 4}, {29, 4103, 1},
	                                {25, 10500, 1}, {25, 72, 3}, {2, 40, 1}, {2, 40, 4}};

	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
		check_shape(shapes[i][0], shapes[i][1], shapes[i][2], HI3_F32);
		check_shape(shapes[i][0], shapes[i][1], shapes[i][2], HI3_BF16);
		check_shape(shapes[i][0], shapes[i][1], shapes[i][2], HI3_F16);
	}
	return done_testing();
}
