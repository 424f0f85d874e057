/*
 * quant.c -- the values of weight-only quantized matrices (quant.h): the
 * e4m3 and e2m1 decoders, the e4m3 encoder `hi3 quantize` uses, and the
 * dequantization of a tile of rows that the GEMM multiplies. The value of
 * one code is core/qvalue.h's formula, the one the CUDA kernel uses.
 *
 * Stored bytes are read with memcpy (or unaligned loads): a tensor of a
 * safetensors file need not be aligned for its dtype. With AVX2 the fp8
 * and int8 rows are dequantized eight at a time by the same operations
 * (the e4m3 bits rebuilt in lanes, or an integer convert; then the same
 * multiplies and the same rounding), so the values are the scalar loops' bit for bit
 * (test-gemm compares them).
 */
#include <math.h>
#include <string.h>
#include "backend/quant.h"
#include "core/qvalue.h"

_Static_assert(HI3Q_F32 == (int)HI3_F32 && HI3Q_F16 == (int)HI3_F16 && HI3Q_BF16 == (int)HI3_BF16 &&
               HI3Q_E4M3 == (int)HI3_F8_E4M3, "qvalue.h dtype codes");

const char *hi3i_qformat_name(int format)
{
	static const char *const names[] = {"none", "fp8", "int8", "nf4", "nvfp4"};

	return format >= 0 && format < (int)HI3_ARRAY_SIZE(names) ? names[format] : "unknown";
}

float hi3i_e4m3_to_f32(uint8_t b)
{
	return hi3q_e4m3(b);
}

uint8_t hi3i_f32_to_e4m3(float f)
{
	const uint8_t s = signbit(f) ? 0x80 : 0;
	double a = fabs((double)f), q;
	int e;

	if (isnan(f))
		return 0x7F;
	if (a >= 448.0)
		return s | 0x7E;
	if (a < 0x1p-6) {                  /* subnormal: steps of 2^-9 */
		q = nearbyint(a * 512.0);
		return s | (uint8_t)q;      /* q = 8 is the least normal, 0x08 */
	}
	e = ilogb(a);
	q = nearbyint((a / ldexp(1.0, e) - 1.0) * 8.0);
	if (q == 8) {
		q = 0;
		e++;
	}
	if (e > 8 || (e == 8 && q > 6))
		return s | 0x7E;
	return s | (uint8_t)((e + 7) << 3) | (uint8_t)q;
}

float hi3i_e2m1_to_f32(unsigned c)
{
	return hi3q_e2m1(c);
}

static float e4m3_lut[256];
static int lut_ready;

static void lut_init(void)
{
	/* idempotent: threads racing here write the same values */
	if (__atomic_load_n(&lut_ready, __ATOMIC_ACQUIRE))
		return;
	for (int i = 0; i < 256; i++)
		e4m3_lut[i] = hi3i_e4m3_to_f32((uint8_t)i);
	__atomic_store_n(&lut_ready, 1, __ATOMIC_RELEASE);
}

static float scale_at(const void *p, hi3_dtype dt, size_t i)
{
	uint16_t h;
	float f;

	switch (dt) {
	case HI3_BF16:
		memcpy(&h, (const uint16_t *)p + i, 2);
		return hi3_bf16_to_f32(h);
	case HI3_F16:
		memcpy(&h, (const uint16_t *)p + i, 2);
		return hi3_f16_to_f32(h);
	case HI3_F8_E4M3:
		return hi3i_e4m3_to_f32(((const uint8_t *)p)[i]);
	default:
		memcpy(&f, (const float *)p + i, 4);
		return f;
	}
}

/* NF4: the scale of absmax block b. */
static float nf4_absmax(const hi3_qweight *q, size_t b)
{
	float a;

	if (!q->nested)
		return scale_at(q->scale, HI3_F32, b);
	memcpy(&a, (const float *)q->nested_absmax + b / (size_t)q->nested_block, 4);
	return hi3q_nested_absmax(q->nested_map[((const uint8_t *)q->scale)[b]], a, q->offset);
}

#if defined(__x86_64__)
#include <immintrin.h>
#define T_AVX2 __attribute__((target("avx2")))

static int have_avx2(void)
{
	static int v = -1;

	if (v < 0) {
		__builtin_cpu_init();
		v = __builtin_cpu_supports("avx2") != 0;
	}
	return v;
}

/* RNE of f32 lanes to bf16 and back, NaN kept quiet: hi3_f32_to_bf16's bits. */
T_AVX2 static inline __m256 round_bf16_8(__m256 v)
{
	const __m256i u = _mm256_castps_si256(v);
	const __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
	                                                        _mm256_and_si256(_mm256_srli_epi32(u, 16),
	                                                                         _mm256_set1_epi32(1))));
	const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
	                                       _mm256_set1_epi32(0x7f800000));
	const __m256i q = _mm256_or_si256(u, _mm256_set1_epi32(0x400000));
	return _mm256_castsi256_ps(_mm256_and_si256(_mm256_blendv_epi8(r, q, nan), _mm256_set1_epi32((int)0xffff0000u)));
}

/* Eight e4m3 codes as f32, the table's bits (a gather is slow on some
 * cores): normal codes by moving the exponent and mantissa bits (bias 7 to
 * 127), subnormal ones (exponent 0) as mantissa * 2^-9, 0x7f and 0xff as
 * the table's NaN (positive); the sign bit put back last. */
T_AVX2 static inline __m256 e4m3_8(const uint8_t *c)
{
	const __m256i u = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)c));
	const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x80)), 24);
	const __m256i em = _mm256_and_si256(u, _mm256_set1_epi32(0x7f));
	const __m256i norm = _mm256_add_epi32(_mm256_slli_epi32(em, 20), _mm256_set1_epi32(120 << 23));
	const __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(em), _mm256_set1_ps(0x1p-9f));
	__m256i mag = _mm256_blendv_epi8(norm, _mm256_castps_si256(sub), _mm256_cmpgt_epi32(_mm256_set1_epi32(8), em));

	const __m256i nan = _mm256_cmpeq_epi32(em, _mm256_set1_epi32(0x7f));

	mag = _mm256_blendv_epi8(mag, _mm256_set1_epi32(0x7fc00000), nan);
	return _mm256_castsi256_ps(_mm256_or_si256(mag, _mm256_andnot_si256(nan, sign)));
}

/* d[k] = e4m3(c[k]) * s (rounded to bf16 when bf), eight at a time; returns how many. */
T_AVX2 static int fp8_run_avx2(float *d, const uint8_t *c, int nk, float s, int bf)
{
	const __m256 vs = _mm256_set1_ps(s);
	int k = 0;

	for (; k + 8 <= nk; k += 8) {
		__m256 v = _mm256_mul_ps(e4m3_8(c + k), vs);
		_mm256_storeu_ps(d + k, bf ? round_bf16_8(v) : v);
	}
	return k;
}

/* d[k] = (c[k] * s) * inv127, eight at a time; returns how many. */
T_AVX2 static int int8_run_avx2(float *d, const int8_t *c, int nk, float s, float inv127)
{
	const __m256 vs = _mm256_set1_ps(s), vi = _mm256_set1_ps(inv127);
	int k = 0;

	for (; k + 8 <= nk; k += 8) {
		__m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(c + k))));
		_mm256_storeu_ps(d + k, _mm256_mul_ps(_mm256_mul_ps(f, vs), vi));
	}
	return k;
}
#else
static int have_avx2(void) { return 0; }
static int fp8_run_avx2(float *d, const uint8_t *c, int nk, float s, int bf) { return 0; }
static int int8_run_avx2(float *d, const int8_t *c, int nk, float s, float inv127) { return 0; }
#endif

static void rows_fp8(const hi3_qweight *q, float *dst, size_t ld, int n0, int rows, int k0, int nk)
{
	const int simd = have_avx2() && (q->round_to == HI3_F32 || q->round_to == HI3_BF16);

	for (int r = 0; r < rows; r++) {
		const int n = n0 + r;
		const float s = scale_at(q->scale, q->scale_dtype, q->per_row ? (size_t)n : 0);
		const uint8_t *c = q->codes + (size_t)n * q->K + k0;
		float *d = dst + (size_t)r * ld;
		const int k8 = simd ? fp8_run_avx2(d, c, nk, s, q->round_to == HI3_BF16) : 0;

		if (q->round_to == HI3_F32)
			for (int k = k8; k < nk; k++)
				d[k] = e4m3_lut[c[k]] * s;
		else
			for (int k = k8; k < nk; k++)
				d[k] = hi3q_round(e4m3_lut[c[k]] * s, (int)q->round_to);
	}
}

static void rows_int8(const hi3_qweight *q, float *dst, size_t ld, int n0, int rows, int k0, int nk)
{
	for (int r = 0; r < rows; r++) {
		const int n = n0 + r;
		const float s = scale_at(q->scale, HI3_F32, (size_t)n);
		const int8_t *c = (const int8_t *)q->codes + (size_t)n * q->K + k0;
		float *d = dst + (size_t)r * ld;
		const int k8 = have_avx2() ? int8_run_avx2(d, c, nk, s, HI3Q_INV127) : 0;

		for (int k = k8; k < nk; k++)
			d[k] = hi3q_int8(c[k], s);
	}
}

static void rows_nf4(const hi3_qweight *q, float *dst, size_t ld, int n0, int rows, int k0, int nk)
{
	for (int r = 0; r < rows; r++) {
		const size_t i0 = (size_t)(n0 + r) * q->K + k0;
		float *d = dst + (size_t)r * ld;
		size_t b = (size_t)-1;
		float a = 0;

		for (int k = 0; k < nk; k++) {
			const size_t i = i0 + k;
			const unsigned c = hi3q_nf4_code(q->codes, i);
			if (i / (size_t)q->block != b) {
				b = i / (size_t)q->block;
				a = nf4_absmax(q, b);
			}
			d[k] = hi3q_round(q->map[c] * a, (int)q->round_to);
		}
	}
}

static void rows_nvfp4(const hi3_qweight *q, float *dst, size_t ld, int n0, int rows, int k0, int nk)
{
	const size_t nb = (size_t)q->K / (size_t)q->block;

	for (int r = 0; r < rows; r++) {
		const int n = n0 + r;
		const uint8_t *c = q->codes + (size_t)n * (size_t)(q->K / 2);
		const uint8_t *sc = (const uint8_t *)q->scale + (size_t)n * nb;
		float *d = dst + (size_t)r * ld;
		int b = -1;
		float s = 0;

		for (int k = k0; k < k0 + nk; k++) {
			const unsigned v = hi3q_nvfp4_code(c, k);
			if (k / q->block != b) {
				b = k / q->block;
				s = e4m3_lut[sc[b]] * q->scale2;
			}
			d[k - k0] = hi3q_e2m1(v) * s;
		}
	}
}

void hi3i_qweight_rows(const hi3_qweight *q, float *dst, size_t ld, int n0, int rows, int k0, int nk)
{
	lut_init();
	switch (q->format) {
	case HI3_Q_FP8:
		rows_fp8(q, dst, ld, n0, rows, k0, nk);
		break;
	case HI3_Q_INT8:
		rows_int8(q, dst, ld, n0, rows, k0, nk);
		break;
	case HI3_Q_NF4:
		rows_nf4(q, dst, ld, n0, rows, k0, nk);
		break;
	case HI3_Q_NVFP4:
		rows_nvfp4(q, dst, ld, n0, rows, k0, nk);
		break;
	default:
		HI3_ASSERT(0 && "unknown quantized format");
	}
}

float hi3i_qweight_at(const hi3_qweight *q, int n, int k)
{
	float v;

	hi3i_qweight_rows(q, &v, 1, n, 1, k, 1);
	return v;
}
