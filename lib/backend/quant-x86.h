/*
 * quant-x86.h -- the values of quant.h eight at a time in AVX2 registers,
 * for the GEMM's kernels (gemm.c) and the tile dequantization (quant.c).
 * Every lane is the value hi3i_qweight_rows gives for that element, bit for
 * bit: the same operations in the same order (the e4m3 bits rebuilt in the
 * lanes, an integer convert, a 16-entry table by permutes; then the same
 * multiplies and the same rounding to BF16). test-gemm checks every format
 * through every kernel against the scalar definitions.
 *
 * A kernel reads a quantized W row through a hi3i_qrow cursor: set up once
 * per tile and row (hi3i_qrow_init), then asked for the eight values at
 * k, k + 1, .. k + 7, k a multiple of 8, in increasing k (hi3i_qrow_load8).
 * Which formats can be read so is hi3i_qrow_kind's answer; the others
 * (F16 rounding, NF4 rows or blocks not a multiple of 8) are dequantized
 * into a buffer by hi3i_qweight_rows.
 */
#ifndef HI3_QUANT_X86_H
#define HI3_QUANT_X86_H

#include <string.h>
#include "backend/quant.h"
#include "core/qvalue.h"


/* How a kernel reads a quantized matrix in registers (hi3i_qrow_kind). */
enum { HI3I_QR_NONE, HI3I_QR_INT8, HI3I_QR_FP8, HI3I_QR_NF4, HI3I_QR_NVFP4 };

static inline int hi3i_qrow_kind(const hi3_qweight *q)
{
	int rnd = q->round_to == HI3_F32 || q->round_to == HI3_BF16;

	switch (q->format) {
	case HI3_Q_INT8:
		return HI3I_QR_INT8;
	case HI3_Q_FP8:
		/* codes read as F16 times s * 256: exact while that is finite; a
		 * NaN scale's payload would meet the plain BF16 rounding */
		for (int n = 0; rnd && n < (q->per_row ? q->N : 1); n++) {
			const float s = hi3i_qweight_scale(q, n);
			rnd = s == s && !(__builtin_isinf(s * 256.0f) && !__builtin_isinf(s));
		}
		return rnd ? HI3I_QR_FP8 : HI3I_QR_NONE;
	case HI3_Q_NF4:
		/* a NaN in quant_map (whose payload the plain BF16 rounding would
		 * meet): the buffer (a NaN absmax: the careful rounding, per block) */
		for (int i = 0; i < 16; i++)
			rnd &= q->map[i] == q->map[i];
		return rnd && q->K % 8 == 0 && q->block % 8 == 0 ? HI3I_QR_NF4 : HI3I_QR_NONE;
	case HI3_Q_NVFP4:
		return q->K % 16 == 0 && q->block == 16 ? HI3I_QR_NVFP4 : HI3I_QR_NONE;
	default:
		return HI3I_QR_NONE;
	}
}

#if defined(__x86_64__)
#include <immintrin.h>

#define HI3I_TQ __attribute__((target("avx2,fma,f16c"), always_inline))

/* One W row n of a quantized matrix as a kernel reads it. */
typedef struct hi3i_qrow {
	const uint8_t *c;         /* INT8, FP8: code k at c[k]; NF4, NVFP4: codes k, k + 1 in byte c[k / 2] */
	const uint8_t *bs;        /* NVFP4: the row's block scales (e4m3) */
	const float *lut;         /* NVFP4: the e4m3 table */
	const hi3_qweight *q;
	float s;                  /* INT8 SCB[n], FP8 the scale; NF4 the current block's absmax */
	float s256;               /* FP8: s * 256 (exact), for codes read as F16 */
	int slow;                 /* NF4: the block's products may be NaNs of any payload: BF16
	                           * rounding with NaNs handled */
	size_t i0;                /* NF4: flat index of element (n, 0) */
	int next;                 /* NF4: the k where the next absmax block starts */
} hi3i_qrow;

static inline void hi3i_qrow_init(hi3i_qrow *r, const hi3_qweight *q, int n)
{
	memset(r, 0, sizeof(*r));
	r->q = q;
	switch (q->format) {
	case HI3_Q_INT8:
	case HI3_Q_FP8:
		r->c = q->codes + (size_t)n * (size_t)q->K;
		r->s = hi3i_qweight_scale(q, n);
		r->s256 = r->s * 256.0f;
		break;
	case HI3_Q_NF4:
		r->i0 = (size_t)n * (size_t)q->K;
		r->c = q->codes + r->i0 / 2;     /* i0 is even: K % 8 == 0 */
		r->next = -1;
		break;
	case HI3_Q_NVFP4:
		r->c = q->codes + (size_t)n * (size_t)(q->K / 2);
		r->bs = (const uint8_t *)q->scale + (size_t)n * (size_t)(q->K / 16);
		r->lut = hi3i_e4m3_lut();
		break;
	}
}

/* NF4: the absmax of the block of element k (k a multiple of 8), when k
 * enters a new one; a NaN absmax makes the rounding the careful one. */
static inline void hi3i_qrow_nf4_block(hi3i_qrow *r, int k)
{
	const hi3_qweight *q = r->q;

	if (k >= r->next) {
		const size_t b = (r->i0 + (size_t)k) / (size_t)q->block;
		r->s = hi3i_nf4_absmax(q, b);
		r->next = (int)((b + 1) * (size_t)q->block - r->i0);
		r->slow = r->s != r->s;
	}
}

/* RNE of f32 lanes to bf16 and back, NaN kept quiet: hi3_f32_to_bf16's bits. */
HI3I_TQ static inline __m256 hi3i_round_bf16_8(__m256 v)
{
	const __m256i u = _mm256_castps_si256(v);
	const __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
	                                                        _mm256_and_si256(_mm256_srli_epi32(u, 16),
	                                                                         _mm256_set1_epi32(1))));
	const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
	                                       _mm256_set1_epi32(0x7f800000));
	const __m256i qn = _mm256_or_si256(u, _mm256_set1_epi32(0x400000));
	return _mm256_castsi256_ps(_mm256_and_si256(_mm256_blendv_epi8(r, qn, nan), _mm256_set1_epi32((int)0xffff0000u)));
}

/* The same where the only NaN a lane can hold is 0x7fc00000 or 0xffc00000
 * (quiet, payload 0), which the plain rounding leaves as they are. */
HI3I_TQ static inline __m256 hi3i_round_bf16_8q(__m256 v)
{
	const __m256i u = _mm256_castps_si256(v);
	const __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
	                                                        _mm256_and_si256(_mm256_srli_epi32(u, 16),
	                                                                         _mm256_set1_epi32(1))));
	return _mm256_castsi256_ps(_mm256_and_si256(r, _mm256_set1_epi32((int)0xffff0000u)));
}

/* Codes (16-bit lanes) as the F16 numbers of e4m3(c) / 256: sign to bit
 * 15, exponent and mantissa to bits 14..7 (an e4m3 subnormal is an F16
 * one), 0x7f and 0xff as the quiet NaN 0x7e00 (F32 0x7fc00000, the
 * decoder's). Times 256 s this is e4m3(c) * s, bit for bit: the same real
 * product, rounded once. */
HI3I_TQ static inline __m128i hi3i_e4m3_f16_8(__m128i c)
{
	const __m128i h = _mm_slli_epi16(_mm_add_epi16(c, _mm_and_si128(c, _mm_set1_epi16(0x80))), 7);
	const __m128i nan = _mm_cmpeq_epi16(_mm_and_si128(c, _mm_set1_epi16(0x7f)), _mm_set1_epi16(0x7f));

	return _mm_blendv_epi8(h, _mm_set1_epi16(0x7e00), nan);
}

/* (c[k] * s) * (1 / 127), k < 8 */
HI3I_TQ static inline __m256 hi3i_int8_8(const uint8_t *c, float s)
{
	const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)c)));

	return _mm256_mul_ps(_mm256_mul_ps(f, _mm256_set1_ps(s)), _mm256_set1_ps(HI3Q_INV127));
}

/* The eight 4-bit codes of the 4 bytes at c, element e from bits shift[e]. */
HI3I_TQ static inline __m256i hi3i_nib8(const uint8_t *c, __m256i shift)
{
	uint32_t u;

	memcpy(&u, c, 4);
	return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)u), shift), _mm256_set1_epi32(15));
}

/* shifts of the 4-bit codes: NF4 puts element 2i in the high nibble, NVFP4 in the low one */
#define HI3I_NF4_SHIFTS 4, 0, 12, 8, 20, 16, 28, 24
#define HI3I_NVFP4_SHIFTS 0, 4, 8, 12, 16, 20, 24, 28

/* The eight values of row r at k .. k + 7 (k a multiple of 8, increasing
 * from one call to the next for NF4); bf: the format's values are rounded
 * to BF16 (FP8, NF4 round_to). */
HI3I_TQ static inline __m256 hi3i_qrow_load8(hi3i_qrow *r, const int kind, int k, const int bf)
{
	__m256 v;

	switch (kind) {
	case HI3I_QR_INT8:
		return hi3i_int8_8(r->c + k, r->s);
	case HI3I_QR_FP8:
		v = _mm256_mul_ps(_mm256_cvtph_ps(hi3i_e4m3_f16_8(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(r->c + k))))),
		                  _mm256_set1_ps(r->s256));
		return bf ? hi3i_round_bf16_8q(v) : v;
	case HI3I_QR_NF4: {
		const __m256i c = hi3i_nib8(r->c + k / 2, _mm256_setr_epi32(HI3I_NF4_SHIFTS));
		const float *map = r->q->map;
		__m256 lo, hi;

		hi3i_qrow_nf4_block(r, k);
		lo = _mm256_permutevar8x32_ps(_mm256_loadu_ps(map), c);
		hi = _mm256_permutevar8x32_ps(_mm256_loadu_ps(map + 8), c);
		v = _mm256_mul_ps(_mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32(c, 28))),
		                  _mm256_set1_ps(r->s));
		return !bf ? v : __builtin_expect(r->slow, 0) ? hi3i_round_bf16_8(v) : hi3i_round_bf16_8q(v);
	}
	default: {
		/* NVFP4: the e2m1 magnitude by the code's low 3 bits, its sign bit 3 */
		const __m256i c = hi3i_nib8(r->c + k / 2, _mm256_setr_epi32(HI3I_NVFP4_SHIFTS));
		const __m256 mag = _mm256_permutevar8x32_ps(_mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f), c);
		const __m256i sign = _mm256_and_si256(_mm256_slli_epi32(c, 28), _mm256_set1_epi32((int)0x80000000u));
		const float s = r->lut[r->bs[k / 16]] * r->q->scale2;

		return _mm256_mul_ps(_mm256_xor_ps(mag, _mm256_castsi256_ps(sign)), _mm256_set1_ps(s));
	}
	}
}

/* The target of the backend's AVX-512 code (hi3i_gemm_level 2), and its
 * inlined helpers here. */
#define HI3I_T512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c")))
#define HI3I_TQ512 HI3I_T512 __attribute__((always_inline))

/* vpshufb control that widens eight BF16 numbers, broadcast to every
 * 128-bit lane of a zmm, to f32 in both of its halves: float s takes
 * number s % 8 of its lane (gemm.c). */
extern const uint8_t hi3i_bf16_ctl[64];

/* Eight values at p, BF16 (bf) or F32, widened exactly, in both halves of
 * a zmm (ctl: hi3i_bf16_ctl): a W row's eight k for the AVX-512 GEMM
 * (gemm.c), a cache row's eight elements for attention's pair loops
 * (cpu.c). */
HI3I_TQ512 static inline __m512 hi3i_load8x2(const void *p, int bf, __m512i ctl)
{
	if (bf)
		return _mm512_castsi512_ps(_mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)p)), ctl));
	return _mm512_broadcast_f32x8(_mm256_loadu_ps((const float *)p));
}

/* hi3i_round_bf16_8q of 16 lanes */
HI3I_TQ512 static inline __m512 hi3i_round_bf16_16q(__m512 v)
{
	const __m512i u = _mm512_castps_si512(v);
	const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
	                                                        _mm512_and_si512(_mm512_srli_epi32(u, 16),
	                                                                         _mm512_set1_epi32(1))));
	return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32((int)0xffff0000u)));
}

/* hi3i_qrow_load8's values in both halves of a zmm (the AVX-512 kernel's
 * layout), computed 16 lanes at a time where that is cheaper. */
HI3I_TQ512 static inline __m512 hi3i_qrow_load16(hi3i_qrow *r, const int kind, int k, const int bf)
{
	int64_t u8;
	uint32_t u4;
	__m512 v;

	switch (kind) {
	case HI3I_QR_INT8:
		memcpy(&u8, r->c + k, 8);
		v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_set1_epi64x(u8)));
		return _mm512_mul_ps(_mm512_mul_ps(v, _mm512_set1_ps(r->s)), _mm512_set1_ps(HI3Q_INV127));
	case HI3I_QR_FP8: {
		__m256i c, h;

		memcpy(&u8, r->c + k, 8);
		c = _mm256_cvtepu8_epi16(_mm_set1_epi64x(u8));
		h = _mm256_slli_epi16(_mm256_add_epi16(c, _mm256_and_si256(c, _mm256_set1_epi16(0x80))), 7);
		h = _mm256_mask_blend_epi16(_mm256_cmpeq_epi16_mask(_mm256_and_si256(c, _mm256_set1_epi16(0x7f)),
		                                                    _mm256_set1_epi16(0x7f)),
		                            h, _mm256_set1_epi16(0x7e00));
		v = _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(r->s256));
		return bf ? hi3i_round_bf16_16q(v) : v;
	}
	case HI3I_QR_NF4: {
		__m512i c;

		hi3i_qrow_nf4_block(r, k);
		if (__builtin_expect(r->slow, 0))
			return _mm512_broadcast_f32x8(hi3i_qrow_load8(r, kind, k, bf));
		memcpy(&u4, r->c + k / 2, 4);
		c = _mm512_srlv_epi32(_mm512_set1_epi32((int)u4),
		                      _mm512_broadcast_i32x8(_mm256_setr_epi32(HI3I_NF4_SHIFTS)));
		v = _mm512_mul_ps(_mm512_permutexvar_ps(c, _mm512_loadu_ps(r->q->map)), _mm512_set1_ps(r->s));
		return bf ? hi3i_round_bf16_16q(v) : v;
	}
	default: {
		/* vpermps reads the low 4 bits of each index: the 16 e2m1 values, signed */
		const __m512 e2m1 = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
		                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f);
		const float s = r->lut[r->bs[k / 16]] * r->q->scale2;

		memcpy(&u4, r->c + k / 2, 4);
		v = _mm512_permutexvar_ps(_mm512_srlv_epi32(_mm512_set1_epi32((int)u4),
		                                            _mm512_broadcast_i32x8(_mm256_setr_epi32(HI3I_NVFP4_SHIFTS))),
		                          e2m1);
		return _mm512_mul_ps(v, _mm512_set1_ps(s));
	}
	}
}
#endif

#endif
