/* tensor.c -- dtypes, element access and half-precision conversion. */
#include <math.h>
#include <string.h>
#include "core/internal.h"
#include "core/qvalue.h"

static const struct {
	const char *name;
	size_t size;
	int is_float;
} dtypes[HI3_DTYPE_COUNT] = {
	[HI3_F32] = {"F32", 4, 1},      [HI3_F16] = {"F16", 2, 1},
	[HI3_BF16] = {"BF16", 2, 1},    [HI3_F64] = {"F64", 8, 1},
	[HI3_I64] = {"I64", 8, 0},      [HI3_I32] = {"I32", 4, 0},
	[HI3_I16] = {"I16", 2, 0},      [HI3_I8] = {"I8", 1, 0},
	[HI3_U64] = {"U64", 8, 0},      [HI3_U32] = {"U32", 4, 0},
	[HI3_U16] = {"U16", 2, 0},      [HI3_U8] = {"U8", 1, 0},
	[HI3_BOOL] = {"BOOL", 1, 0},    [HI3_F8_E4M3] = {"F8_E4M3", 1, 1},
	[HI3_F8_E5M2] = {"F8_E5M2", 1, 1},
};

const char *hi3_dtype_name(hi3_dtype dt)
{
	return (unsigned)dt < HI3_DTYPE_COUNT ? dtypes[dt].name : "?";
}

int hi3_dtype_parse(const char *name, hi3_dtype *out)
{
	for (int i = 0; i < HI3_DTYPE_COUNT; i++) {
		if (!strcmp(name, dtypes[i].name)) {
			*out = (hi3_dtype)i;
			return 0;
		}
	}
	return -1;
}

size_t hi3_dtype_size(hi3_dtype dt)
{
	return (unsigned)dt < HI3_DTYPE_COUNT ? dtypes[dt].size : 0;
}

int hi3_dtype_is_float(hi3_dtype dt)
{
	return (unsigned)dt < HI3_DTYPE_COUNT && dtypes[dt].is_float;
}

float hi3_bf16_to_f32(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;

	memcpy(&f, &u, 4);
	return f;
}

/* one definition for C and CUDA (core/qvalue.h) */
uint16_t hi3_f32_to_bf16(float f)
{
	return hi3q_f32_to_bf16(f);
}

float hi3_f16_to_f32(uint16_t h)
{
	return hi3q_f16_to_f32(h);
}

uint16_t hi3_f32_to_f16(float f)
{
	return hi3q_f32_to_f16(f);
}

static double f8_to_f64(uint8_t v, int e4m3)
{
	int sign = v >> 7, exp, man;
	double x;

	if (e4m3) {
		exp = (v >> 3) & 0xf;
		man = v & 7;
		if (exp == 15 && man == 7)
			return NAN;
		x = exp ? ldexp(1.0 + man / 8.0, exp - 7) : ldexp(man / 8.0, -6);
	} else {
		exp = (v >> 2) & 0x1f;
		man = v & 3;
		if (exp == 31)
			return man ? NAN : (sign ? -INFINITY : INFINITY);
		x = exp ? ldexp(1.0 + man / 4.0, exp - 15) : ldexp(man / 4.0, -14);
	}
	return sign ? -x : x;
}

double hi3_elem_f64(const void *data, hi3_dtype dt, size_t i)
{
	const unsigned char *p = (const unsigned char *)data + i * hi3_dtype_size(dt);
	union { float f; double d; int64_t i64; int32_t i32; int16_t i16; int8_t i8;
	        uint64_t u64; uint32_t u32; uint16_t u16; uint8_t u8; } v;

	memcpy(&v, p, hi3_dtype_size(dt));
	switch (dt) {
	case HI3_F32: return v.f;
	case HI3_F64: return v.d;
	case HI3_F16: return hi3_f16_to_f32(v.u16);
	case HI3_BF16: return hi3_bf16_to_f32(v.u16);
	case HI3_I64: return (double)v.i64;
	case HI3_I32: return v.i32;
	case HI3_I16: return v.i16;
	case HI3_I8: return v.i8;
	case HI3_U64: return (double)v.u64;
	case HI3_U32: return v.u32;
	case HI3_U16: return v.u16;
	case HI3_U8: return v.u8;
	case HI3_BOOL: return v.u8 != 0;
	case HI3_F8_E4M3: return f8_to_f64(v.u8, 1);
	case HI3_F8_E5M2: return f8_to_f64(v.u8, 0);
	default: return NAN;
	}
}

void hi3_to_f32(float *dst, const void *src, hi3_dtype dt, size_t n)
{
	const unsigned char *p = src;

	switch (dt) {
	case HI3_F32:
		memcpy(dst, src, n * 4);
		break;
	case HI3_BF16:
		for (size_t i = 0; i < n; i++) {
			uint16_t h;
			memcpy(&h, p + 2 * i, 2);
			dst[i] = hi3_bf16_to_f32(h);
		}
		break;
	case HI3_F16:
		for (size_t i = 0; i < n; i++) {
			uint16_t h;
			memcpy(&h, p + 2 * i, 2);
			dst[i] = hi3_f16_to_f32(h);
		}
		break;
	default:
		for (size_t i = 0; i < n; i++)
			dst[i] = (float)hi3_elem_f64(src, dt, i);
		break;
	}
}

int64_t hi3_tensor_numel(const hi3_tensor *t)
{
	int64_t n;

	return hi3i_shape_bytes(t->ndim, t->shape, 1, &n) == 0 ? n : -1;
}

const char *hi3_shape_str(char *buf, size_t n, int ndim, const int64_t *shape)
{
	size_t off = 0;

	off += (size_t)snprintf(buf, n, "(");
	for (int i = 0; i < ndim && off < n; i++)
		off += (size_t)snprintf(buf + off, n - off, "%s%lld", i ? ", " : "", (long long)shape[i]);
	if (ndim == 1 && off < n)
		off += (size_t)snprintf(buf + off, n - off, ",");
	if (off < n)
		snprintf(buf + off, n - off, ")");
	return buf;
}

/* NaN and Inf among n elements of 32, 16 or 8 bits: those whose bits
 * under mask are all set. A block of NF elements is counted in a counter of
 * the element's width (NF fits in 8 bits), a fixed trip count the compiler
 * vectorises at -O2; the rest one at a time. */
#define NF 128
#define NONFINITE_BITS(name, T)                                                              \
	static int64_t name(const unsigned char *p, T mask, size_t n)                            \
	{                                                                                        \
		int64_t bad = 0;                                                                 \
		size_t i = 0;                                                                    \
                                                                                                 \
		for (; i + NF <= n; i += NF) {                                                   \
			T c = 0;                                                                 \
			for (int j = 0; j < NF; j++) {                                           \
				T u;                                                             \
				memcpy(&u, p + (i + (size_t)j) * sizeof(T), sizeof(T));        \
				c = (T)(c + ((u & mask) == mask));                               \
			}                                                                        \
			bad += c;                                                                \
		}                                                                                \
		for (; i < n; i++) {                                                             \
			T u;                                                                     \
			memcpy(&u, p + i * sizeof(T), sizeof(T));                              \
			bad += (u & mask) == mask;                                               \
		}                                                                                \
		return bad;                                                                      \
	}
NONFINITE_BITS(nonfinite32, uint32_t)
NONFINITE_BITS(nonfinite16, uint16_t)
NONFINITE_BITS(nonfinite8, uint8_t)

/* NaN and Inf among the elements [i0, i1) of data. */
static int64_t nonfinite_range(const unsigned char *p, hi3_dtype dt, size_t i0, size_t i1)
{
	int64_t bad = 0;

	switch (dt) {
	case HI3_F32:
		return nonfinite32(p + 4 * i0, 0x7f800000u, i1 - i0);
	case HI3_BF16:
	case HI3_F16:
		return nonfinite16(p + 2 * i0, dt == HI3_BF16 ? 0x7f80 : 0x7c00, i1 - i0);
	case HI3_F8_E4M3:
	case HI3_F8_E5M2:
		/* e4m3: NaN is S.1111.111 (no infinities); e5m2: exponent 11111 */
		return nonfinite8(p + i0, dt == HI3_F8_E4M3 ? 0x7f : 0x7c, i1 - i0);
	default:
		if (!hi3_dtype_is_float(dt))
			return 0;
		for (size_t i = i0; i < i1; i++)
			bad += !isfinite(hi3_elem_f64(p, dt, i));
		return bad;
	}
}

int64_t hi3i_count_nonfinite(const void *data, hi3_dtype dt, size_t n)
{
	const size_t chunk = (size_t)1 << 16;
	const int64_t parts = (int64_t)((n + chunk - 1) / chunk);
	int64_t bad = 0;

	if (n < ((size_t)1 << 20))      /* a row the first time it is gathered: no parallel region (HI3_PAR_FOR) */
		return nonfinite_range(data, dt, 0, n);
#pragma omp parallel for reduction(+ : bad) schedule(static)
	for (int64_t c = 0; c < parts; c++)
		bad += nonfinite_range(data, dt, (size_t)c * chunk, HI3_MIN(n, (size_t)(c + 1) * chunk));
	return bad;
}
