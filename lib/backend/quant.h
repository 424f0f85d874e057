/*
 * quant.h -- weight-only quantized matrices as published checkpoints store
 * them, and the one definition of their values (hi3-quant(7)): the GEMM
 * dequantizes a tile of them in registers/L1 with these functions, the
 * checks and `hi3 quantize` use the same ones; the formulas themselves are
 * in core/qvalue.h, which the CUDA kernel (kernels/qgemv.cu) shares.
 *
 * A weight W (N, K) of a format is a code per element and its scales; the
 * value of element (n, k), in f32, is:
 *
 *   FP8    e4m3(q[n, k]) * s, s = scale[n] (per channel) or scale[0]
 *          (per tensor), the product rounded to the scale's dtype when it
 *          is BF16 or F16 (as compressed-tensors and ModelOpt compute it)
 *   INT8   (q[n, k] * SCB[n]) * f32(1/127)   (bitsandbytes LLM.int8 rows)
 *   NF4    map[c(i)] * absmax[i / block], i = n K + k the flat index,
 *          c(i) the high nibble of byte i/2 for even i, the low for odd;
 *          with double quantization absmax[b] = nested_map[a[b]] *
 *          nested_absmax[b / nested_block] + offset; the product rounded
 *          to the quant state's dtype (bitsandbytes dequantize_4bit)
 *   NVFP4  e2m1(c) * (e4m3(scale[n, k / 16]) * scale2), c the low nibble of
 *          byte (n, k/2) for even k, the high for odd (ModelOpt)
 *
 * Each value depends only on the stored bits, so a product over these
 * weights is as batch-invariant as one over f32 weights, and equals, bit
 * for bit, the product over a checkpoint holding these values in F32.
 */
#ifndef HI3_QUANT_H
#define HI3_QUANT_H

#include "core/internal.h"

enum hi3_qformat {
	HI3_Q_NONE,
	HI3_Q_FP8,
	HI3_Q_INT8,
	HI3_Q_NF4,
	HI3_Q_NVFP4,
};

typedef struct hi3_qweight {
	int format;               /* enum hi3_qformat */
	int N, K;
	const uint8_t *codes;     /* FP8, INT8 (N, K); NF4 ceil(N K / 2); NVFP4 (N, K / 2) */
	const void *scale;        /* FP8 (N) or (1); INT8 SCB (N) F32; NF4 absmax (ceil(N K / block)) F32,
	                           * or U8 when nested; NVFP4 (N, K / block) F8_E4M3 */
	hi3_dtype scale_dtype;
	int per_row;              /* FP8: scale per row (else one) */
	int block;                /* NF4: elements per absmax; NVFP4: 16 */
	float scale2;             /* NVFP4: weight_scale_2 */
	hi3_dtype round_to;       /* FP8 and NF4: the dtype a value is rounded to (F32: none) */
	float map[16];            /* NF4: quant_map */
	int nested;               /* NF4 double quantization: */
	const void *nested_absmax; /* (ceil(blocks / nested_block)) F32 */
	float nested_map[256];
	int nested_block;
	float offset;
} hi3_qweight;

const char *hi3i_qformat_name(int format);
float hi3i_e4m3_to_f32(uint8_t b);
/* f round to nearest even on the e4m3 grid, saturated to +-448 (NaN to NaN). */
uint8_t hi3i_f32_to_e4m3(float f);
float hi3i_e2m1_to_f32(unsigned c);
/* dst (rows, nk), row stride ld: the values of rows [n0, n0 + rows), columns [k0, k0 + nk). */
void hi3i_qweight_rows(const hi3_qweight *q, float *dst, size_t ld, int n0, int rows, int k0, int nk);
float hi3i_qweight_at(const hi3_qweight *q, int n, int k);
/* For the kernels that dequantize in registers (quant-x86.h), the parts of
 * the values above: FP8 and INT8 the scale s of row n; NF4 the absmax of
 * block b (nested: nested_map[a[b]] * nested_absmax[..] + offset); the 256
 * values of hi3i_e4m3_to_f32 (NaN codes: a positive quiet NaN). */
float hi3i_qweight_scale(const hi3_qweight *q, int n);
float hi3i_nf4_absmax(const hi3_qweight *q, size_t b);
const float *hi3i_e4m3_lut(void);

#endif
