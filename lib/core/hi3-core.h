/*
 * hi3-core.h -- the public interface of libhi3's core (lib/core/): errors
 * and the log hook, dtypes and tensors, a KV cache in memory, the
 * counter-based random draws, the resamplers, progress callbacks. It knows
 * nothing of the model or of any file format.
 * Part of hi3.h, the public interface: its conventions hold here.
 */
#ifndef HI3_LAYER_CORE_H
#define HI3_LAYER_CORE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- errors */

enum hi3_status {
	HI3_OK = 0,
	HI3_ERR_RUNTIME = 1, /* could not complete: I/O, memory, device */
	HI3_ERR_USAGE = 2,   /* the caller asked for something invalid */
	HI3_ERR_INPUT = 3,   /* input data is malformed or inconsistent */
};

typedef struct hi3_error {
	int status;       /* enum hi3_status; 0 when no error */
	char msg[2048];
} hi3_error;

/* Set *err (if not NULL) and return -1. */
int hi3_error_set(hi3_error *err, int status, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Prepend "prefix: " to an error already set; returns -1. */
int hi3_error_prefix(hi3_error *err, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* Log sink for warnings, notes and progress (default: stderr). */
enum hi3_log_level { HI3_LOG_ERROR, HI3_LOG_WARN, HI3_LOG_INFO, HI3_LOG_DEBUG };
typedef void (*hi3_log_fn)(int level, const char *msg, void *ctx);
void hi3_set_log(hi3_log_fn fn, void *ctx, int max_level);
void hi3_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---------------------------------------------------------------- dtypes */

typedef enum hi3_dtype {
	HI3_F32, HI3_F16, HI3_BF16, HI3_F64,
	HI3_I64, HI3_I32, HI3_I16, HI3_I8,
	HI3_U64, HI3_U32, HI3_U16, HI3_U8,
	HI3_BOOL, HI3_F8_E4M3, HI3_F8_E5M2,
	HI3_DTYPE_COUNT
} hi3_dtype;

const char *hi3_dtype_name(hi3_dtype dt);          /* "F32", "BF16", ... */
int hi3_dtype_parse(const char *name, hi3_dtype *out); /* 0 or -1 */
size_t hi3_dtype_size(hi3_dtype dt);
int hi3_dtype_is_float(hi3_dtype dt);

float hi3_bf16_to_f32(uint16_t h);
uint16_t hi3_f32_to_bf16(float f);                 /* round to nearest even */
float hi3_f16_to_f32(uint16_t h);
uint16_t hi3_f32_to_f16(float f);                  /* round to nearest even */
/* Element i of an array of dtype dt, as a double (any dtype). */
double hi3_elem_f64(const void *data, hi3_dtype dt, size_t i);
/* Convert n elements of a float dtype (F32/F16/BF16/F64) to f32. */
void hi3_to_f32(float *dst, const void *src, hi3_dtype dt, size_t n);

/* ------------------------------------------------------------- tensors */

#define HI3_MAX_DIMS 8

typedef struct hi3_tensor {
	const char *name;
	hi3_dtype dtype;
	int ndim;
	int64_t shape[HI3_MAX_DIMS];
	size_t nbytes;
	void *data;          /* inside the file mapping */
} hi3_tensor;

/* The element count; -1 for a shape whose dimensions are negative or
 * multiply past INT64_MAX (hi3_st_open refuses files with such shapes). */
int64_t hi3_tensor_numel(const hi3_tensor *t);
/* "(4, 8, 96, 128)" into buf. */
const char *hi3_shape_str(char *buf, size_t n, int ndim, const int64_t *shape);

/* ------------------------------------------------------------ KV cache */

/* A static KV cache: per layer K and V of shape (B, n_kv, C, d), F32 or
 * BF16, in memory the caller owns (typically a kv file's mapping). */
typedef struct hi3_kvcache {
	int n_layers, B, n_kv, C, d;
	hi3_dtype dtype;
	void **k;                 /* [n_layers] -> (B, n_kv, C, d) */
	void **v;                 /* [n_layers] -> (B, n_kv, C, d) */
	void *mem;                /* hi3_kvcache_alloc's: the one block k and v point into */
} hi3_kvcache;

/* A cache in host memory it owns, every layer zeroed, all of them in one
 * block of 2 MiB pages where the system gives them; NULL and err set
 * when out of memory. (A KV file's cache points into the file's mapping
 * instead, and is the file's to release.) */
hi3_kvcache *hi3_kvcache_alloc(int n_layers, int B, int n_kv, int C, int d, hi3_dtype dtype, hi3_error *err);
void hi3_kvcache_free(hi3_kvcache *kv);

/* -------------------------------------------------------- random draws */

/* Every random draw of hi3 is a function of a key and a counter
 * (core/philox.c), never of a shared stream, so that a row draws the same
 * numbers alone or in any batch. Philox-4x32-10 on a counter, in place. */
void hi3_philox4x32(uint32_t ctr[4], const uint32_t key[2]);
/* The uniform draw in [0, 1) for (seed, step). */
double hi3_uniform(uint64_t seed, uint64_t step);

/* A standard normal draw for (seed, stream, i), from Philox-4x32-10 keyed
 * by seed at counter (i, stream, "norm"), Box-Muller on two 53-bit
 * uniforms (hi3-batching(7), DIFFUSION): x_T of a request is stream 0 of its
 * seed, the noise of SDE step i stream i + 1, element i of (C, h, w). */
float hi3_normal(uint64_t seed, uint64_t stream, uint64_t i);

/* ---------------------------------------------------------- resampling */

/* Pillow's resampling filters, by Pillow's numbers (Image.Resampling). */
enum hi3_resample { HI3_RESAMPLE_LANCZOS = 1, HI3_RESAMPLE_BILINEAR = 2, HI3_RESAMPLE_BICUBIC = 3 };

/* Pillow's Image.resize((dw, dh), filter) of an image of c = 1..4 8-bit
 * channels, bit for bit (libImaging/Resample.c; no reducing_gap):
 * src (sh, sw, c) -> dst (dh, dw, c). */
int hi3_resize_pil(const uint8_t *src, int sw, int sh, int c, uint8_t *dst, int dw, int dh, int filter,
                   hi3_error *err);

/* torchvision's v2 resize(img, [dh, dw], BILINEAR, antialias=True) of a
 * uint8 image, with the kernel torch 2.8 picks from its CPU capability:
 * HI3_TV_UINT8 where it reports AVX2 (the native uint8 kernel: int16 taps,
 * uint8 between the passes; the default), HI3_TV_FLOAT where it reports
 * no AVX (float32, rounded half to even). Bit for bit, in portable C.
 * Where torch reports AVX-512 torchvision also takes the float path, but
 * that build's float sums differ in the last bit now and then: HI3_TV_FLOAT
 * then matches all but about 1 value in 10^4-10^5, those by one level
 * (docs/IMAGES.md). */
enum hi3_tv_kernel { HI3_TV_UINT8 = 0, HI3_TV_FLOAT = 1 };
int hi3_resize_tv(const uint8_t *src, int sw, int sh, int c, uint8_t *dst, int dw, int dh, int kernel,
                  hi3_error *err);

/* ------------------------------------------------------------ progress */

typedef void (*hi3_progress_fn)(void *ctx, int64_t done, int64_t total);

#ifdef __cplusplus
}
#endif
#endif /* HI3_LAYER_CORE_H */
