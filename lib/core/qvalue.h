/*
 * qvalue.h -- the value formulas of weight-only quantized matrices
 * (backend/quant.h, hi3-quant(7)) and the f16/bf16 roundings they use,
 * written once for the C library (tensor.c's conversions, backend/quant.c
 * and the CPU GEMM's tiles) and the CUDA kernels (kernels/qgemv.cu, built
 * by nvcc and, for make check, against tests/cuda-emu), so that a weight
 * dequantized on the GPU is the CPU's value bit for bit.
 *
 * Only <stdint.h> and plain arithmetic: every function is exact (bit
 * moves, products of a code by a scale that the callers round as the
 * formats define) and has no table, so nothing here needs device memory.
 */
#ifndef HI3_QVALUE_H
#define HI3_QVALUE_H

#include <stdint.h>

#ifdef __CUDACC__
#define HI3Q_FN static __host__ __device__ __forceinline__
#else
#define HI3Q_FN static inline
#endif

/* The dtypes a scale or a rounding can have: the values of enum hi3_dtype
 * (quant.c checks them); E4M3 is HI3_F8_E4M3. */
enum { HI3Q_F32 = 0, HI3Q_F16 = 1, HI3Q_BF16 = 2, HI3Q_E4M3 = 13 };

/* f32(1/127): bitsandbytes' int8 rows are (q * SCB) * (1/127) */
#define HI3Q_INV127 7.874015718698502e-3f

HI3Q_FN float hi3q_from_bits(uint32_t u)
{
	union { uint32_t u; float f; } v;

	v.u = u;
	return v.f;
}

HI3Q_FN uint32_t hi3q_to_bits(float f)
{
	union { uint32_t u; float f; } v;

	v.f = f;
	return v.u;
}

/* Round to nearest even; NaN stays a quiet NaN. */
HI3Q_FN uint16_t hi3q_f32_to_bf16(float f)
{
	uint32_t u = hi3q_to_bits(f);

	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40);
	u += 0x7fffu + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}

/* IEEE half to float, subnormals included. */
HI3Q_FN float hi3q_f16_to_f32(uint16_t h)
{
	const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;

	if (exp == 0) {
		const float f = (float)man * 0x1p-24f;   /* exact: man < 2^10 */
		return sign ? -f : f;
	}
	if (exp == 31)
		return hi3q_from_bits(sign | 0x7f800000u | (man << 13));
	return hi3q_from_bits(sign | ((exp + 112) << 23) | (man << 13));
}

/* Round to nearest even, overflow to infinity, NaN kept quiet. */
HI3Q_FN uint16_t hi3q_f32_to_f16(float f)
{
	const uint32_t u = hi3q_to_bits(f), sign = (u >> 16) & 0x8000;
	const int exp = (int)((u >> 23) & 0xff) - 127 + 15;
	uint32_t man = u & 0x7fffff, r, rest;

	if (((u >> 23) & 0xff) == 0xff)
		return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
	if (exp >= 31)
		return (uint16_t)(sign | 0x7c00);
	if (exp <= 0) {
		if (exp < -10)
			return (uint16_t)sign;
		man |= 0x800000;
		const int shift = 14 - exp;
		const uint32_t half = 1u << (shift - 1);
		rest = man & ((1u << shift) - 1);
		r = man >> shift;
		if (rest > half || (rest == half && (r & 1)))
			r++;
		return (uint16_t)(sign | r);
	}
	r = ((uint32_t)exp << 10) | (man >> 13);
	rest = man & 0x1fff;
	if (rest > 0x1000 || (rest == 0x1000 && (r & 1)))
		r++;                  /* may carry into the exponent: correct */
	return (uint16_t)(sign | r);
}

/* v rounded to dtype dt (HI3Q_BF16, HI3Q_F16; others: v). */
HI3Q_FN float hi3q_round(float v, int dt)
{
	if (dt == HI3Q_BF16)
		return hi3q_from_bits((uint32_t)hi3q_f32_to_bf16(v) << 16);
	if (dt == HI3Q_F16)
		return hi3q_f16_to_f32(hi3q_f32_to_f16(v));
	return v;
}

/* An e4m3 code (OCP FP8, bias 7, no infinity): normal codes by moving the
 * exponent and mantissa bits, subnormal ones m 2^-9; 0x7f and 0xff are NaN
 * (positive, quiet). */
HI3Q_FN float hi3q_e4m3(uint8_t b)
{
	const uint32_t em = b & 0x7fu;
	float v;

	if (em == 0x7f)
		return hi3q_from_bits(0x7fc00000u);
	v = em < 8 ? (float)em * 0x1p-9f : hi3q_from_bits((em << 20) + (120u << 23));
	return b & 0x80 ? -v : v;
}

/* An e2m1 code (the low 4 bits of c): 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives. */
HI3Q_FN float hi3q_e2m1(unsigned c)
{
	const unsigned m = c & 7;
	const float v = m < 2 ? 0.5f * (float)m : (1.0f + 0.5f * (float)(m & 1)) * (float)(1u << ((m >> 1) - 1));

	return c & 8 ? -v : v;
}

/* bitsandbytes int8 row n: code c, s = SCB[n] */
HI3Q_FN float hi3q_int8(int8_t c, float s)
{
	return ((float)c * s) * HI3Q_INV127;
}

/* NF4 code of flat element i: the high nibble of byte i/2 for even i. */
HI3Q_FN unsigned hi3q_nf4_code(const uint8_t *codes, uint64_t i)
{
	const uint8_t b = codes[i / 2];

	return i & 1 ? b & 15u : (unsigned)b >> 4;
}

/* NVFP4 code of element k of a row: the low nibble of byte k/2 for even k. */
HI3Q_FN unsigned hi3q_nvfp4_code(const uint8_t *row, int k)
{
	const uint8_t b = row[k / 2];

	return k & 1 ? (unsigned)b >> 4 : b & 15u;
}

/* NF4 double quantization: an absmax is nested_map[code] * nested_absmax +
 * offset, two roundings (bitsandbytes has no fused multiply-add there). */
HI3Q_FN float hi3q_nested_absmax(float mapped, float nested_absmax, float offset)
{
#ifdef __CUDA_ARCH__
	return __fadd_rn(__fmul_rn(mapped, nested_absmax), offset);
#else
	volatile float p = mapped * nested_absmax;
	return p + offset;
#endif
}

#endif
