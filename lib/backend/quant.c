/*
 * quant.c -- the values of weight-only quantized matrices (quant.h): the
 * e4m3 and e2m1 decoders, the e4m3 encoder `hi3 quantize` uses, and the
 * dequantization of a tile of rows that the GEMM multiplies. The value of
 * one code is core/qvalue.h's formula, the one the CUDA kernel uses.
 *
 * Stored bytes are read with memcpy (or unaligned loads): a tensor of a
 * safetensors file need not be aligned for its dtype. With AVX2 the rows
 * are dequantized eight at a time by the decoders the GEMM's kernels use
 * (quant-x86.h: the same operations in the same order), so the values are
 * the scalar loops' bit for bit (test-gemm compares them); the scalar
 * loops do the rest (k not a multiple of 8, F16 rounding, other CPUs).
 */
#include <math.h>
#include <string.h>
#include "backend/quant.h"
#include "backend/quant-x86.h"
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
float hi3i_nf4_absmax(const hi3_qweight *q, size_t b)
{
	float a;

	if (!q->nested)
		return scale_at(q->scale, HI3_F32, b);
	memcpy(&a, (const float *)q->nested_absmax + b / (size_t)q->nested_block, 4);
	return hi3q_nested_absmax(q->nested_map[((const uint8_t *)q->scale)[b]], a, q->offset);
}

#if defined(__x86_64__)
#define T_AVX2 __attribute__((target("avx2,fma,f16c")))

static int have_avx2(void)
{
	static int v = -1;

	if (v < 0) {
		__builtin_cpu_init();
		v = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
	}
	return v;
}

/* Columns [k0, k0 + nk & ~7) of rows [n0, n0 + rows) by the kernels'
 * decoders, k0 a multiple of 8; returns how many columns. */
T_AVX2 __attribute__((always_inline)) static inline int rows_simd(const hi3_qweight *q, const int kind, float *dst,
                                                                 size_t ld, int n0, int rows, int k0, int nk)
{
	const int bf = q->round_to == HI3_BF16, nk8 = nk & ~7;

	for (int r = 0; r < rows; r++) {
		hi3i_qrow cur;
		float *d = dst + (size_t)r * ld;

		hi3i_qrow_init(&cur, q, n0 + r);
		for (int k = 0; k < nk8; k += 8)
			_mm256_storeu_ps(d + k, hi3i_qrow_load8(&cur, kind, k0 + k, bf));
	}
	return nk8;
}

T_AVX2 static int rows_avx2(const hi3_qweight *q, float *dst, size_t ld, int n0, int rows, int k0, int nk)
{
	switch (hi3i_qrow_kind(q)) {
	case HI3I_QR_INT8:
		return rows_simd(q, HI3I_QR_INT8, dst, ld, n0, rows, k0, nk);
	case HI3I_QR_FP8:
		return rows_simd(q, HI3I_QR_FP8, dst, ld, n0, rows, k0, nk);
	case HI3I_QR_NF4:
		return rows_simd(q, HI3I_QR_NF4, dst, ld, n0, rows, k0, nk);
	case HI3I_QR_NVFP4:
		return rows_simd(q, HI3I_QR_NVFP4, dst, ld, n0, rows, k0, nk);
	default:
		return 0;
	}
}
#else
static int have_avx2(void)
{
	return 0;
}

static int rows_avx2(const hi3_qweight *q, float *dst, size_t ld, int n0, int rows, int k0, int nk)
{
	(void)q, (void)dst, (void)ld, (void)n0, (void)rows, (void)k0, (void)nk;
	return 0;
}
#endif

static void rows_fp8(const hi3_qweight *q, float *dst, size_t ld, int n0, int rows, int k0, int nk)
{
	for (int r = 0; r < rows; r++) {
		const float s = hi3i_qweight_scale(q, n0 + r);
		const uint8_t *c = q->codes + (size_t)(n0 + r) * q->K + k0;
		float *d = dst + (size_t)r * ld;

		if (q->round_to == HI3_F32)
			for (int k = 0; k < nk; k++)
				d[k] = e4m3_lut[c[k]] * s;
		else
			for (int k = 0; k < nk; k++)
				d[k] = hi3q_round(e4m3_lut[c[k]] * s, (int)q->round_to);
	}
}

static void rows_int8(const hi3_qweight *q, float *dst, size_t ld, int n0, int rows, int k0, int nk)
{
	for (int r = 0; r < rows; r++) {
		const float s = hi3i_qweight_scale(q, n0 + r);
		const int8_t *c = (const int8_t *)q->codes + (size_t)(n0 + r) * q->K + k0;
		float *d = dst + (size_t)r * ld;

		for (int k = 0; k < nk; k++)
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
				a = hi3i_nf4_absmax(q, b);
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
	int done;

	lut_init();
	done = have_avx2() && k0 % 8 == 0 ? rows_avx2(q, dst, ld, n0, rows, k0, nk) : 0;
	dst += done;
	k0 += done;
	nk -= done;
	if (nk == 0)
		return;
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

float hi3i_qweight_scale(const hi3_qweight *q, int n)
{
	if (q->format == HI3_Q_INT8)
		return scale_at(q->scale, HI3_F32, (size_t)n);
	return scale_at(q->scale, q->scale_dtype, q->per_row ? (size_t)n : 0);
}

const float *hi3i_e4m3_lut(void)
{
	lut_init();
	return e4m3_lut;
}

float hi3i_qweight_at(const hi3_qweight *q, int n, int k)
{
	float v;

	hi3i_qweight_rows(q, &v, 1, n, 1, k, 1);
	return v;
}
