/*
 * test-image.c -- image reading and preprocessing against Pillow,
 * torchvision and upstream's own HunyuanImage3ImageProcessor
 * (tests/ref/imageprep_ref.py wrote tests/fixtures/image/).
 *
 * What must be equal, byte for byte:
 *  - every resize output: Pillow's Image.resize (LANCZOS, BICUBIC, BILINEAR)
 *    and torchvision's antialiased bilinear resize under each of its three
 *    kernels, on synthetic sources of many sizes and aspect ratios
 *    (upscaling, one-axis, 1-pixel, 50x4000 and 4000x50 included);
 *  - the normalisations of all 256 values (VAE and ViT, fp32 bits);
 *  - the 37 buckets, the bucket index and ViT grid of many sizes;
 *  - the decoded pixels of every file (PNG of every colour type, 16-bit,
 *    interlaced, GIF, BMP, JPEG: baseline, progressive, gray, CMYK) after
 *    the EXIF/XMP orientation, all 8 orientations included (the larger
 *    corpus of every format: test-pictures.c);
 *  - the VAE view (bucket, resize, crop, uint8 image, float tensor) and the
 *    ViT view (grid, resized image, pixel_values, mask) of upstream's
 *    get_image_with_size on PNGs, for every torchvision kernel.
 * TGA and PPM are refused, naming the formats hi3 reads. Bad inputs fail
 * with status 3 and the file's name.
 */
#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <string.h>
#include <unistd.h>
#include "cond/image-internal.h"
#include "core/resize.h"
#include "tap.h"

static const char *fixdir;
static hi3_st *want;
static json_t *cases;

/* ------------------------------------------- shared with imageprep_ref.py */

static void pattern(uint8_t *out, int w, int h, int c, uint32_t seed)
{
	for (uint32_t y = 0; y < (uint32_t)h; y++)
		for (uint32_t x = 0; x < (uint32_t)w; x++)
			for (uint32_t ch = 0; ch < (uint32_t)c; ch++) {
				uint32_t hs = (x * 0x9E3779B1u) ^ (y * 0x85EBCA77u) ^ (ch * 0xC2B2AE3Du) ^ (seed * 0x27D4EB2Fu);
				uint32_t q = (x / 7 + 2 * (y / 5) + seed) % 3, v;
				hs ^= hs >> 15;
				hs *= 0x2C1B3C6Du;
				hs ^= hs >> 12;
				v = q == 0 ? hs & 255 : q == 1 ? (x * 3 + y * 5 + ch * 85) & 255 : ((x + y + ch) & 1) ? 255 : 0;
				out[((size_t)y * w + x) * c + ch] = (uint8_t)v;
			}
}

static uint64_t checksum(const void *data, size_t n)
{
	const uint8_t *p = data;
	uint64_t sum = n;

	for (size_t i = 0; i * 8 < n; i++) {
		uint64_t w = 0, z;
		for (size_t k = 0; k < 8 && i * 8 + k < n; k++)
			w |= (uint64_t)p[i * 8 + k] << (8 * k);
		z = w ^ (i * 0x9E3779B97F4A7C15ull);
		z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
		z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
		sum += z ^ (z >> 31);
	}
	return sum;
}

/* ------------------------------------------------------------ helpers */

static uint64_t hexval(json_t *j)
{
	return json_is_string(j) ? strtoull(json_string_value(j), NULL, 16) : 0;
}

static int jint(json_t *o, const char *k)
{
	return (int)json_integer_value(json_object_get(o, k));
}

static char *fixture(const char *name)
{
	return hi3i_asprintf("%s/%s", fixdir, name);
}

/* got (h, w, c) against the fixture: the whole tensor `name`, or the
 * checksum in meta and, to say where, the band checksums `name.bands`. */
static int same_image(const char *what, const uint8_t *got, int h, int w, int c, json_t *meta, const char *name)
{
	json_t *shape = json_object_get(meta, "shape");
	size_t n = (size_t)h * w * c;

	if ((int)json_integer_value(json_array_get(shape, 0)) != h ||
	    (int)json_integer_value(json_array_get(shape, 1)) != w ||
	    (json_array_size(shape) > 2 && (int)json_integer_value(json_array_get(shape, 2)) != c)) {
		diag("%s: made %dx%dx%d, expected %dx%dx%d", what, h, w, c,
		     (int)json_integer_value(json_array_get(shape, 0)), (int)json_integer_value(json_array_get(shape, 1)),
		     (int)json_integer_value(json_array_get(shape, 2)));
		return 0;
	}
	if (json_is_true(json_object_get(meta, "whole"))) {
		const hi3_tensor *t = hi3_st_find(want, name);
		if (!t || t->nbytes != n) {
			diag("%s: fixture tensor '%s' missing or of another size", what, name);
			return 0;
		}
		for (size_t i = 0; i < n; i++)
			if (got[i] != ((const uint8_t *)t->data)[i]) {
				size_t px = i / c;
				diag("%s: first difference at y %zu x %zu c %zu: %u, expected %u", what, px / w, px % w, i % c,
				     got[i], ((const uint8_t *)t->data)[i]);
				return 0;
			}
		return 1;
	}
	if (checksum(got, n) != hexval(json_object_get(meta, "checksum"))) {
		char *bn = hi3i_asprintf("%s.bands", name);
		const hi3_tensor *t = hi3_st_find(want, bn);
		int nb = t ? (int)t->shape[0] : 0;
		for (int b = 0; b < nb; b++) {
			size_t r0 = (size_t)b * h / nb, r1 = (size_t)(b + 1) * h / nb, rb = (size_t)w * c;
			if (checksum(got + r0 * rb, (r1 - r0) * rb) != ((const uint64_t *)t->data)[b]) {
				diag("%s: rows %zu-%zu differ (the first band of %d that does)", what, r0, r1 - 1, nb);
				break;
			}
		}
		free(bn);
		return 0;
	}
	return 1;
}

/* ------------------------------------------------------------- resizes */

/* One resize case of the fixtures: tensor `name`, with Pillow's filter
 * (pil) or torchvision's kernel. */
static void resize_case(json_t *m, const char *name, const char *label, int pil, int how)
{
	int sw = jint(m, "sw"), sh = jint(m, "sh"), c = jint(m, "c"), dw = jint(m, "dw"), dh = jint(m, "dh"), rc;
	uint8_t *src = malloc((size_t)sw * sh * c), *dst = malloc((size_t)dw * dh * c);
	char *what = hi3i_asprintf("%s %dx%d -> %dx%d, %d channel%s", label, sw, sh, dw, dh, c, c > 1 ? "s" : "");
	hi3_error err = {0};

	pattern(src, sw, sh, c, (uint32_t)jint(m, "seed"));
	memset(dst, 0xAA, (size_t)dw * dh * c);
	rc = pil ? hi3_resize_pil(src, sw, sh, c, dst, dw, dh, how, &err) : hi3_resize_tv(src, sw, sh, c, dst, dw, dh, how, &err);
	if (rc)
		ok(0, "%s: %s", what, err.msg);
	else
		ok(same_image(what, dst, dh, dw, c, m, name), "%s: every byte equal", what);
	free(src);
	free(dst);
	free(what);
}

static void test_resizes(void)
{
	static const char *const kname[] = {"u8", "f32"};
	static const char *const klabel[] = {"torchvision uint8 (AVX2)", "torchvision float32"};
	size_t i;
	json_t *m;

	json_array_foreach(json_object_get(cases, "pil"), i, m) {
		int f = jint(m, "filter");
		char *name = hi3i_asprintf("pil.%zu", i);
		resize_case(m, name, f == HI3_RESAMPLE_LANCZOS ? "Pillow LANCZOS" : f == HI3_RESAMPLE_BICUBIC ?
		            "Pillow BICUBIC" : "Pillow BILINEAR", 1, f);
		free(name);
	}
	for (int k = 0; k < 2; k++)
		json_array_foreach(json_object_get(json_object_get(json_object_get(cases, "tv"), kname[k]), "resize"), i, m) {
			char *name = hi3i_asprintf("tv.%s.%zu", kname[k], i);
			resize_case(m, name, klabel[k], 0, k);
			free(name);
		}
}

/* torch's AVX-512 build takes the float path too, but sums a little
 * differently: how far HI3_TV_FLOAT is from it (a stated difference, not
 * a match). */
static void test_resize_avx512(void)
{
	json_t *tv = json_object_get(json_object_get(cases, "tv"), "avx512"), *list = json_object_get(tv, "resize"), *m;
	int64_t values = 0, differ = 0, worst = 0, direct = 1;
	const char *key;
	size_t i;

	json_array_foreach(list, i, m) {
		json_t *vs = json_object_get(m, "vs_f32");
		int sw = jint(m, "sw"), sh = jint(m, "sh"), c = jint(m, "c"), dw = jint(m, "dw"), dh = jint(m, "dh");
		char *name = hi3i_asprintf("tv.avx512.%zu", i);
		const hi3_tensor *t = hi3_st_find(want, name);

		values += (int64_t)dw * dh * c;
		differ += json_integer_value(json_array_get(vs, 0));
		worst = HI3_MAX(worst, json_integer_value(json_array_get(vs, 1)));
		if (t) {   /* stored whole: check the statement on hi3's own output */
			uint8_t *src = malloc((size_t)sw * sh * c), *dst = malloc((size_t)dw * dh * c);
			hi3_error err = {0};
			int64_t nd = 0, md = 0;
			pattern(src, sw, sh, c, (uint32_t)jint(m, "seed"));
			hi3_resize_tv(src, sw, sh, c, dst, dw, dh, HI3_TV_FLOAT, &err);
			for (size_t j = 0; j < t->nbytes; j++) {
				int d = abs((int)dst[j] - ((const uint8_t *)t->data)[j]);
				nd += d != 0;
				md = HI3_MAX(md, d);
			}
			direct &= nd == json_integer_value(json_array_get(vs, 0)) && md == json_integer_value(json_array_get(vs, 1));
			free(src);
			free(dst);
		}
		free(name);
	}
	json_object_foreach(json_object_get(tv, "views"), key, m) {
		json_t *vs = json_object_get(m, "vs_f32"), *shape = json_object_get(m, "shape");
		values += json_integer_value(json_array_get(shape, 0)) * json_integer_value(json_array_get(shape, 1)) * 3;
		differ += json_integer_value(json_array_get(vs, 0));
		worst = HI3_MAX(worst, json_integer_value(json_array_get(vs, 1)));
	}
	ok(direct && worst <= 1, "torchvision under torch's AVX-512 build: %lld of %lld values (%.4f%%) one level from "
	   "HI3_TV_FLOAT, none further", (long long)differ, (long long)values, 100.0 * (double)differ / (double)values);
}

/* Properties that need no fixture: a window of the resize is the window
 * of the full resize; channels are resampled independently. */
static void test_resize_properties(void)
{
	const int sw = 91, sh = 67, rw = 130, rh = 45;
	uint8_t *src = malloc((size_t)sw * sh * 3), *full = malloc((size_t)rw * rh * 3), *win = malloc((size_t)rw * rh * 3);
	uint8_t *two = malloc((size_t)sw * sh * 2), *one = malloc((size_t)sw * sh), *o2 = malloc((size_t)rw * rh * 2);
	uint8_t *o1 = malloc((size_t)rw * rh);
	hi3_error err = {0};
	int good = 1;

	pattern(src, sw, sh, 3, 7);
	for (int f = 1; f <= 3; f++) {
		hi3_resize_pil(src, sw, sh, 3, full, rw, rh, f, &err);
		for (int t = 0; t < 6; t++) {
			int x0 = (t * 37) % 60, y0 = (t * 11) % 20, cw = rw - x0 - t * 3, ch = rh - y0 - t;
			hi3i_resize_pil_crop(src, sw, sh, 3, win, rw, rh, x0, y0, cw, ch, f, &err);
			for (int y = 0; y < ch && good; y++)
				good = !memcmp(win + (size_t)y * cw * 3, full + ((size_t)(y0 + y) * rw + x0) * 3, (size_t)cw * 3);
		}
	}
	ok(good, "a window of a Pillow resize equals the same window of the full resize");
	good = 1;
	for (size_t i = 0; i < (size_t)sw * sh; i++) {
		two[2 * i] = src[3 * i];
		two[2 * i + 1] = src[3 * i + 2];
	}
	for (int k = 0; k < 2 && good; k++) {
		for (int band = 0; band < 2 && good; band++) {
			for (size_t i = 0; i < (size_t)sw * sh; i++)
				one[i] = two[2 * i + band];
			if (k == 0) {
				hi3_resize_pil(two, sw, sh, 2, o2, rw, rh, HI3_RESAMPLE_LANCZOS, &err);
				hi3_resize_pil(one, sw, sh, 1, o1, rw, rh, HI3_RESAMPLE_LANCZOS, &err);
			} else {
				hi3_resize_tv(two, sw, sh, 2, o2, rw, rh, HI3_TV_UINT8, &err);
				hi3_resize_tv(one, sw, sh, 1, o1, rw, rh, HI3_TV_UINT8, &err);
			}
			for (size_t i = 0; i < (size_t)rw * rh && good; i++)
				good = o2[2 * i + band] == o1[i];
		}
	}
	ok(good, "2-channel resizes equal each channel resized alone (Pillow, torchvision)");
	ok(hi3_resize_pil(src, 0, sh, 3, full, rw, rh, 1, &err) == -1 && err.status == HI3_ERR_USAGE &&
	   hi3_resize_pil(src, sw, sh, 3, full, rw, rh, 4, &err) == -1 && hi3_resize_tv(src, sw, sh, 5, full, rw, rh, 0, &err) == -1 &&
	   hi3_resize_tv(src, sw, sh, 3, full, rw, rh, 2, &err) == -1,
	   "bad sizes, channel counts, filters and kernels are usage errors");
	free(src);
	free(full);
	free(win);
	free(two);
	free(one);
	free(o2);
	free(o1);
}

/* ----------------------------------------------- tables and formulas */

static void test_tables(void)
{
	const hi3_tensor *b = hi3_st_find(want, "buckets"), *sz = hi3_st_find(want, "grid.sizes"),
	                 *ex = hi3_st_find(want, "grid.expected"), *lv = hi3_st_find(want, "lut.vae"),
	                 *lt = hi3_st_find(want, "lut.vit");
	int hw[64][2], n = hi3_image_buckets(1024, hw, 64), good;

	good = b && n == (int)b->shape[0];
	for (int i = 0; good && i < n; i++)
		good = hw[i][0] == ((const int32_t *)b->data)[2 * i] && hw[i][1] == ((const int32_t *)b->data)[2 * i + 1];
	ok(good, "the %d buckets at base 1024 are upstream's, in its order (33 + 4 appended)", n);
	ok(hi3_image_buckets(1024, hw, 36) == -1 && hi3_image_buckets(100, hw, 64) == -1 && hi3_image_buckets(1000, hw, 64) == -1,
	   "bucket tables that do not fit, or bases upstream refuses, give -1");
	good = sz && ex;
	for (int64_t i = 0; good && i < sz->shape[0]; i++) {
		int64_t h = ((const int64_t *)sz->data)[2 * i], w = ((const int64_t *)sz->data)[2 * i + 1];
		const int32_t *e = (const int32_t *)ex->data + 3 * i;
		int k = hi3_image_bucket_of((const int (*)[2])hw, n, h, w), gh, gw;
		hi3_image_vit_grid(h, w, 16, 1024, &gh, &gw);
		if (k != e[0] || gh != e[1] || gw != e[2]) {
			diag("%lldx%lld (h x w): bucket %d, grid %dx%d; expected %d, %dx%d", (long long)h, (long long)w, k, gh,
			     gw, e[0], e[1], e[2]);
			good = 0;
		}
	}
	ok(good, "bucket index and ViT patch grid of %lld sizes equal upstream's", sz ? (long long)sz->shape[0] : 0LL);
	good = lv && lt;
	for (int u = 0; good && u < 256; u++) {
		float a = hi3i_vae_value((uint8_t)u), c = hi3i_vit_value((uint8_t)u);
		good = !memcmp(&a, (const float *)lv->data + u, 4) && !memcmp(&c, (const float *)lt->data + u, 4);
		if (!good)
			diag("value %d: VAE %.9g (expected %.9g), ViT %.9g (expected %.9g)", u, a, ((const float *)lv->data)[u], c,
			     ((const float *)lt->data)[u]);
	}
	ok(good, "both normalisations of all 256 values equal torch's fp32 bits");
}

/* The TIFF reader on crafted blocks: byte orders, types, counts stored
 * out of line, truncation, offsets past the end. */
static size_t tiff(uint8_t *b, int le, const uint16_t (*e)[2], const uint32_t *cnt, const uint32_t *val, int n,
                   int declared)
{
	size_t k = 0;
#define P16(v) (le ? (b[k] = (uint8_t)(v), b[k + 1] = (uint8_t)((v) >> 8)) : (b[k] = (uint8_t)((v) >> 8), b[k + 1] = (uint8_t)(v)), k += 2)
#define P32(v) (le ? (P16((v) & 0xFFFF), P16((v) >> 16)) : (P16((v) >> 16), P16((v) & 0xFFFF)))
	memcpy(b, le ? "II*\0" : "MM\0*", 4);
	k = 4;
	P32(8u);
	P16((uint32_t)declared);
	for (int i = 0; i < n; i++) {
		P16(e[i][0]);
		P16(e[i][1]);
		P32(cnt[i]);
		if ((e[i][1] == 3 || e[i][1] == 8) && cnt[i] <= 2) {
			P16(val[i]);
			P16(0u);
		} else {
			P32(val[i]);
		}
	}
#undef P16
#undef P32
	return k;
}

static void test_exif_parser(void)
{
	uint8_t b[256], ex[300];
	const uint16_t sh6[1][2] = {{0x0112, 3}}, lg[1][2] = {{0x0112, 4}}, by[1][2] = {{0x0112, 1}},
	               two[2][2] = {{0x0112, 3}, {0x0112, 3}}, other[2][2] = {{0x0100, 3}, {0x0112, 8}};
	const uint32_t one[2] = {1, 1}, v6[1] = {6}, v8[2] = {3, 8};
	size_t n;
	int good = 1;

	for (int le = 0; le < 2; le++) {
		n = tiff(b, le, sh6, one, v6, 1, 1);
		good &= hi3i_exif_orientation(b, n) == 6;
		memcpy(ex, "Exif\0\0Exif\0\0", 12);
		memcpy(ex + 12, b, n);
		good &= hi3i_exif_orientation(ex, n + 12) == 6;           /* any number of Exif prefixes */
		good &= hi3i_exif_orientation(b, n - 1) == 0;             /* the entry cut short */
		n = tiff(b, le, lg, one, v6, 1, 1);
		good &= hi3i_exif_orientation(b, n) == 6;
		n = tiff(b, le, by, one, v6, 1, 1);
		good &= hi3i_exif_orientation(b, n) == -1;                /* BYTE: present, not an integer */
		n = tiff(b, le, two, one, v8, 2, 2);
		good &= hi3i_exif_orientation(b, n) == 8;                 /* the last entry wins */
		n = tiff(b, le, other, one, v8, 2, 2);
		good &= hi3i_exif_orientation(b, n) == 8;                 /* SSHORT */
		n = tiff(b, le, sh6, one, v6, 1, 60000);
		good &= hi3i_exif_orientation(b, n) == 6;                 /* more entries declared than present */
		{
			const uint32_t c3[1] = {3}, off[1] = {200};
			n = tiff(b, le, sh6, c3, off, 1, 1);                   /* 3 SHORTs stored at offset 200 */
			good &= hi3i_exif_orientation(b, n) == 0;             /* ... past the end: the rest is lost */
			memset(b + n, 0, sizeof(b) - n);
			b[200 + !le] = 5;
			good &= hi3i_exif_orientation(b, 206) == 5;           /* the first of the three */
		}
	}
	good &= hi3i_exif_orientation((const uint8_t *)"MM\0*\xff\xff\xff\xff", 8) == 0;   /* IFD offset past the end */
	good &= hi3i_exif_orientation((const uint8_t *)"garbage!", 8) == 0 && hi3i_exif_orientation(b, 3) == 0;
	ok(good, "the EXIF reader: both byte orders, SHORT/LONG/SSHORT, BYTE kept but not applied, the last entry, "
	   "values stored out of line, truncated and out-of-range blocks");
}

/* --------------------------------------------------------------- loading */

static char last_warning[512];

static void capture_log(int level, const char *msg, void *ctx)
{
	(void)ctx;
	if (level <= HI3_LOG_WARN)
		snprintf(last_warning, sizeof(last_warning), "%s", msg);
}

static void test_load(void)
{
	json_t *list = json_object_get(cases, "load"), *m;
	const char *name;

	hi3_set_log(capture_log, NULL, HI3_LOG_WARN);
	json_object_foreach(list, name, m) {
		const char *how = json_string_value(json_object_get(m, "how"));
		char *path = fixture(name), *tname = hi3i_asprintf("load.%s", name);
		hi3_image *im = NULL;
		hi3_error err = {0};

		last_warning[0] = 0;
		if (!strcmp(how, "unaccepted") || strstr(name, ".tga") || strstr(name, ".ppm")) {
			int rc = hi3_image_load(&im, path, NULL, &err);
			ok(rc == -1 && err.status == HI3_ERR_INPUT && strstr(err.msg, name) &&
			   strstr(err.msg, "JPEG, PNG, WebP, GIF or BMP"), "load %s: refused, naming the formats hi3 reads "
			   "('%s')", name, err.msg);
		} else if (hi3_image_load(&im, path, NULL, &err)) {
			ok(0, "load %s: %s", name, err.msg);
		} else if (!strcmp(how, "exact") || !strcmp(how, "jpeg") || !strcmp(how, "jpeg-cmyk")) {
			/* "jpeg": the fixtures made while hi3 decoded JPEG with stb_image; exact since libjpeg-turbo */
			ok(same_image(name, im->rgb, im->height, im->width, 3, m, tname),
			   "load %s (%s %s, %d channel%s, %d-bit, orientation %d): the pixels of load_image", name, im->format,
			   im->mode, im->channels, im->channels > 1 ? "s" : "", im->bits, im->orientation);
		} else {
			hi3_image *plain = NULL;
			char *p1 = fixture("exif1.png");
			int same = !hi3_image_load(&plain, p1, NULL, &err) && plain->width == im->width &&
			           !memcmp(plain->rgb, im->rgb, (size_t)im->width * im->height * 3);
			ok(!strcmp(how, "refused") && same && strstr(last_warning, name) && strstr(last_warning, "EXIF"),
			   "load %s: Pillow raises on its EXIF block (%s); hi3 warns, ignores it ('%s')", name,
			   json_string_value(json_object_get(m, "error")), last_warning);
			hi3_image_free(plain);
			free(p1);
		}
		hi3_image_free(im);
		free(path);
		free(tname);
	}
	hi3_set_log(NULL, NULL, HI3_LOG_INFO);
}

/* ----------------------------------------------------------------- views */

static void test_views(void)
{
	json_t *vae = json_object_get(cases, "vae"), *m;
	const char *key;
	static const char *const kname[] = {"u8", "f32"};

	json_object_foreach(vae, key, m) {
		char *file = hi3i_strdup(key), *dot = strrchr(file, '.'), *path, *tname;
		int resize = !strcmp(dot + 1, "resize");
		hi3_image_vae_opts vo = {.resize = resize};
		hi3_image_vae *v = NULL;
		hi3_image *im = NULL;
		hi3_error err = {0};
		json_t *rs = json_object_get(m, "resize"), *cr = json_object_get(m, "crop");

		*dot = 0;
		path = fixture(file);
		tname = hi3i_asprintf("vae.%s", key);
		if (hi3_image_load(&im, path, NULL, &err) || hi3_image_vae_view(&v, im, &vo, &err)) {
			ok(0, "VAE view of %s: %s", key, err.msg);
		} else {
			int geom = v->bucket == jint(m, "bucket") &&
			           v->height == (int)json_integer_value(json_array_get(json_object_get(m, "size"), 0)) &&
			           v->width == (int)json_integer_value(json_array_get(json_object_get(m, "size"), 1)) &&
			           v->resized_w == (int)json_integer_value(json_array_get(rs, 0)) &&
			           v->resized_h == (int)json_integer_value(json_array_get(rs, 1)) &&
			           (resize ? json_is_null(cr) && !v->crop_left && !v->crop_top :
			            v->crop_left == (int)json_integer_value(json_array_get(cr, 0)) &&
			            v->crop_top == (int)json_integer_value(json_array_get(cr, 1)));
			if (!geom)
				diag("%s: bucket %d %dx%d, resize %dx%d, crop at (%d, %d)", key, v->bucket, v->width, v->height,
				     v->resized_w, v->resized_h, v->crop_left, v->crop_top);
			ok(geom && same_image(key, v->rgb, v->height, v->width, 3, m, tname) &&
			   checksum(v->pixels, (size_t)3 * v->height * v->width * 4) == hexval(json_object_get(m, "pixels")),
			   "VAE view of %s (%s): bucket %d (%dx%d), resize %dx%d, crop (%d, %d), uint8 and float tensor equal "
			   "upstream's", file, resize ? "crop_type resize" : "centre crop", v->bucket, v->width, v->height,
			   v->resized_w, v->resized_h, v->crop_left, v->crop_top);
		}
		for (int k = 0; k < 2 && im && !resize; k++) {
			json_t *vm = json_object_get(json_object_get(json_object_get(json_object_get(cases, "tv"), kname[k]),
			                                             "views"), file);
			hi3_image_vit_opts to = {.kernel = k};
			hi3_image_vit *t = NULL;
			char *vname;
			if (!vm)
				break;
			vname = hi3i_asprintf("vit.%s.%s", file, kname[k]);
			if (hi3_image_vit_view(&t, im, &to, &err)) {
				ok(0, "ViT view of %s: %s", file, err.msg);
			} else {
				json_t *g = json_object_get(vm, "grid");
				int geom = t->grid_h == (int)json_integer_value(json_array_get(g, 0)) &&
				           t->grid_w == (int)json_integer_value(json_array_get(g, 1)) &&
				           t->n_patches == jint(vm, "image_token_length") && t->dim == 768;
				ok(geom && same_image(vname, t->rgb, t->height, t->width, 3, vm, vname) &&
				   checksum(t->pixel_values, (size_t)t->n_patches * t->dim * 4) ==
				   hexval(json_object_get(vm, "pixel_values")) &&
				   checksum(t->mask, (size_t)t->n_patches * 4) == hexval(json_object_get(vm, "mask")),
				   "ViT view of %s, %s kernel: grid %dx%d, resized image, pixel_values (%d, %d) and mask equal upstream's",
				   file, kname[k], t->grid_h, t->grid_w, t->n_patches, t->dim);
			}
			hi3_image_vit_free(t);
			free(vname);
		}
		hi3_image_vae_free(v);
		hi3_image_free(im);
		free(file);
		free(path);
		free(tname);
	}
}

/* ------------------------------------------------------------ bad input */

static uint32_t crc32_png(const uint8_t *p, size_t n)
{
	uint32_t c = 0xFFFFFFFFu;

	for (size_t i = 0; i < n; i++) {
		c ^= p[i];
		for (int k = 0; k < 8; k++)
			c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
	}
	return ~c;
}

static size_t put_chunk(uint8_t *o, const char *type, const uint8_t *d, uint32_t n)
{
	uint32_t crc;

	o[0] = (uint8_t)(n >> 24);
	o[1] = (uint8_t)(n >> 16);
	o[2] = (uint8_t)(n >> 8);
	o[3] = (uint8_t)n;
	memcpy(o + 4, type, 4);
	if (n)
		memcpy(o + 8, d, n);
	crc = crc32_png(o + 4, n + 4);
	o[8 + n] = (uint8_t)(crc >> 24);
	o[9 + n] = (uint8_t)(crc >> 16);
	o[10 + n] = (uint8_t)(crc >> 8);
	o[11 + n] = (uint8_t)crc;
	return 12 + n;
}

/* A PNG with this IHDR size and an IDAT of one stored zlib block of the
 * given scanline bytes (8-bit gray): structurally complete. */
static size_t make_png(uint8_t *o, uint32_t w, uint32_t h, const uint8_t *raw, uint16_t rawn)
{
	uint8_t ihdr[13] = {(uint8_t)(w >> 24), (uint8_t)(w >> 16), (uint8_t)(w >> 8), (uint8_t)w, (uint8_t)(h >> 24),
	                    (uint8_t)(h >> 16), (uint8_t)(h >> 8), (uint8_t)h, 8, 0, 0, 0, 0};
	uint8_t z[600];
	uint32_t a = 1, b = 0;
	size_t n = 8;

	memcpy(o, "\x89PNG\r\n\x1a\n", 8);
	n += put_chunk(o + n, "IHDR", ihdr, 13);
	z[0] = 0x78;
	z[1] = 0x01;
	z[2] = 1;
	z[3] = (uint8_t)rawn;
	z[4] = (uint8_t)(rawn >> 8);
	z[5] = (uint8_t)~rawn;
	z[6] = (uint8_t)(~rawn >> 8);
	memcpy(z + 7, raw, rawn);
	for (int i = 0; i < rawn; i++) {
		a = (a + raw[i]) % 65521;
		b = (b + a) % 65521;
	}
	z[7 + rawn] = (uint8_t)(b >> 8);
	z[8 + rawn] = (uint8_t)b;
	z[9 + rawn] = (uint8_t)(a >> 8);
	z[10 + rawn] = (uint8_t)a;
	n += put_chunk(o + n, "IDAT", z, 11u + rawn);
	n += put_chunk(o + n, "IEND", NULL, 0);
	return n;
}

static char *slurp(const char *name, size_t *len)
{
	char *path = fixture(name), *buf = NULL;
	hi3_error err = {0};

	hi3i_read_file(path, &buf, len, &err);
	free(path);
	return buf;
}

/* Decoding data named `name` fails with status 3, and the message names
 * it and says `why`. */
static void must_refuse(const char *what, const void *data, size_t n, const char *name, const hi3_image_opts *o,
                        const char *why)
{
	hi3_image *im = NULL;
	hi3_error err = {0};
	int rc = hi3_image_decode(&im, data, n, name, o, &err);

	ok(rc == -1 && !im && err.status == HI3_ERR_INPUT && strstr(err.msg, name) && strstr(err.msg, why),
	   "%s is refused: '%s'", what, err.msg);
	hi3_image_free(im);
}

static void test_bad_input(void)
{
	uint8_t png[1024], raw[512];
	char *dir = hi3i_asprintf("%s/hi3-test-image-%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
	char *missing = hi3i_asprintf("%s/no-such.png", dir), *text;
	size_t n, len;
	hi3_image *im = NULL;
	hi3_image_vae *v = NULL;
	hi3_error err = {0};
	hi3_image_opts small = {.max_pixels = 1000};
	int rc;

	rc = hi3_image_load(&im, missing, NULL, &err);
	ok(rc == -1 && err.status == HI3_ERR_INPUT && strstr(err.msg, missing) && strstr(err.msg, "No such file"),
	   "a missing file is refused: '%s'", err.msg);
	must_refuse("an empty file", "", 0, "empty.png", NULL, "empty file");
	must_refuse("a text file", "hello, world\n", 13, "notes.txt", NULL, "not an image");
	text = slurp("rgb.png", &len);
	must_refuse("a PNG cut in half", text, len / 2, "half.png", NULL, "truncated PNG");
	{
		hi3_image *a = NULL, *b = NULL;
		int same = !hi3_image_decode(&a, text, len, "rgb.png", NULL, &err) &&
		           !hi3_image_decode(&b, text, len - 12, "noend.png", NULL, &err) && a->width == b->width &&
		           a->height == b->height && !memcmp(a->rgb, b->rgb, (size_t)a->width * a->height * 3);
		ok(same, "a PNG without its IEND chunk but with all its image data decodes, as in Pillow");
		hi3_image_free(a);
		hi3_image_free(b);
	}
	free(text);
	text = slurp("photo.jpg", &len);
	must_refuse("a JPEG cut in half", text, len / 2, "half.jpg", NULL, "truncated JPEG");
	must_refuse("a JPEG without its last two bytes", text, len - 2, "noeoi.jpg", NULL, "truncated JPEG");
	free(text);
	text = slurp("photo-progressive.jpg", &len);
	must_refuse("a progressive JPEG cut short", text, len * 3 / 4, "prog.jpg", NULL, "truncated JPEG");
	free(text);
	text = slurp("palette.gif", &len);
	must_refuse("a GIF cut in half", text, len / 2, "half.gif", NULL, "truncated GIF");
	free(text);
	text = slurp("rgb.bmp", &len);
	must_refuse("a BMP cut in half", text, len / 2, "half.bmp", NULL, "truncated BMP");
	free(text);
	memset(raw, 0, sizeof(raw));
	n = make_png(png, 0, 0, raw, 1);
	must_refuse("a 0x0 PNG", png, n, "zero.png", NULL, "has no pixels");
	n = make_png(png, 7, 0, raw, 1);
	must_refuse("a 7x0 PNG", png, n, "flat.png", NULL, "has no pixels");
	n = make_png(png, 20000, 20000, raw, 100);
	must_refuse("a 20000x20000 PNG (a decompression bomb)", png, n, "bomb.png", NULL, "more than the limit of 89478485");
	{
		/* each format's header claiming more pixels than the limit: refused from the header */
		char *wp = hi3i_asprintf("%s/../pictures/webp-lossless.webp", fixdir), *wb = NULL;
		uint8_t gif[40] = "GIF89a\x60\xEA\x60\xEA\x00\x00\x00,\0\0\0\0\1\0\1\0\0\2\2\x4C\x01\0;";
		uint8_t bmp[54] = "BM";
		size_t wn = 0;
		text = slurp("photo.jpg", &len);
		for (size_t i = 2; i + 9 < len; i++)
			if ((uint8_t)text[i] == 0xFF && (uint8_t)text[i + 1] == 0xC0) {
				memcpy(text + i + 5, "\xFD\xE8\xFD\xE8", 4);    /* 65000 x 65000 */
				break;
			}
		must_refuse("a JPEG whose SOF says 65000x65000", text, len, "bomb.jpg", NULL, "more than the limit of 89478485");
		free(text);
		must_refuse("a GIF screen of 60000x60000", gif, 32, "bomb.gif", NULL, "more than the limit of 89478485");
		bmp[10] = 54;
		bmp[14] = 40;
		memcpy(bmp + 18, "\x60\xEA\0\0\x60\xEA\0\0\1\0\x18\0", 12);   /* 60000 x 60000, 24 bits */
		must_refuse("a BMP of 60000x60000", bmp, sizeof(bmp), "bomb.bmp", NULL, "more than the limit of 89478485");
		/* sides whose product overflows 64 bits (CI's fuzzing found the
		 * message computing it): refused by the side */
		memcpy(bmp + 18, "\x15\0\0\xFF\xC4\x08\0\xFA\1\0\x18\0", 12);
		must_refuse("a BMP of 4278190101x4194306244", bmp, sizeof(bmp), "huge.bmp", NULL,
		            "declares 4278190101x4194306244, a side of more than 536870911 pixels");
		if (!hi3i_read_file(wp, &wb, &wn, &err) && wn > 25 && !memcmp(wb + 12, "VP8L", 4)) {
			uint32_t bits = 0x3FFFu | 0x3FFFu << 14;           /* 16384 x 16384 */
			for (int k = 0; k < 4; k++)
				wb[21 + k] = (char)(((uint8_t)wb[21 + k] & (k == 3 ? 0xF0 : 0)) | (uint8_t)(bits >> (8 * k)));
			must_refuse("a lossless WebP of 16384x16384", wb, wn, "bomb.webp", NULL, "more than the limit of 89478485");
		} else {
			ok(0, "read %s as a lossless WebP", wp);
		}
		free(wb);
		free(wp);
	}
	n = make_png(png, 40, 40, raw, 100);
	must_refuse("a 40x40 PNG under a 1000-pixel limit", png, n, "small.png", &small, "more than the limit of 1000");
	n = make_png(png, 1, 100, raw, 200);
	rc = hi3_image_decode(&im, png, n, "tall1.png", NULL, &err);
	ok(rc == 0 && im->width == 1 && im->height == 100, "a 1x100 PNG loads (%s)", rc ? err.msg : "1x100");
	if (im) {
		/* a 1 x 100000 picture: covering the 512 x 2048 bucket would take a
		 * 512 x 51200000 resize; upstream runs out of memory */
		hi3_image tall = *im;
		tall.height = 100000;
		tall.rgb = calloc(100000, 3);
		rc = hi3_image_vae_view(&v, &tall, NULL, &err);
		ok(rc == -1 && !v && err.status == HI3_ERR_INPUT && strstr(err.msg, "tall1.png") && strstr(err.msg, "512x51200000"),
		   "the VAE view of a 1x100000 image is refused: '%s'", err.msg);
		free(tall.rgb);
	}
	hi3_image_free(im);
	free(dir);
	free(missing);
}

/* --------------------------------------------------- robustness, threads */

/* Every prefix and thousands of byte flips of the fixture files: decoding
 * and the orientation reader never read outside the buffer (run under
 * the sanitizers) and either fail cleanly or give an image. */
static void test_mutations(void)
{
	static const char *const files[] = {"exif6-mm.png", "xmp5z.png", "rawprofile7.png", "exif6.jpg", "palette.gif",
	                                    "rgb.bmp", "photo-progressive.jpg", "interlaced.png",
	                                    "../pictures/webp-lossy-alpha.webp", "../pictures/webp-animated.webp",
	                                    "../pictures/webp-xmp5.webp", "../pictures/gif-interlaced.gif",
	                                    "../pictures/gif-frame-offset-trns.gif", "../pictures/bmp-4.bmp",
	                                    "../pictures/bmp-16-565.bmp", "../pictures/jpeg-ycck.jpg",
	                                    "../pictures/jpeg-progressive-restart2.jpg",
	                                    "../pictures/png-palette-short.png", "../pictures/png-rgba16-adam7.png"};
	uint64_t s = 88172645463325252ull;
	int tried = 0, decoded = 0, clean = 1;

	hi3_set_log(capture_log, NULL, HI3_LOG_WARN);   /* corrupted metadata warns */
	for (size_t f = 0; f < HI3_ARRAY_SIZE(files); f++) {
		size_t len;
		char *orig = slurp(files[f], &len);
		uint8_t *buf = malloc(len);
		for (int t = 0; t < 300; t++) {
			hi3_image *im = NULL;
			hi3_error err = {0};
			size_t n = len;
			memcpy(buf, orig, len);
			if (t < 60) {
				n = len * (size_t)t / 60;
			} else {
				for (int k = 0; k < 1 + t % 4; k++) {
					s ^= s << 13;
					s ^= s >> 7;
					s ^= s << 17;
					buf[s % len] ^= (uint8_t)(1u << (s >> 40) % 8);
				}
			}
			/* a copy of exactly n bytes, so the sanitizer sees any overread */
			uint8_t *exact = malloc(n ? n : 1);
			memcpy(exact, buf, n);
			hi3_image_opts o = {.max_pixels = 1 << 22};
			int rc = hi3_image_decode(&im, exact, n, files[f], &o, &err);
			if (rc == 0) {
				decoded++;
				clean &= im->width > 0 && im->height > 0 && im->orientation >= 1 && im->orientation <= 8;
			} else {
				clean &= err.status == HI3_ERR_INPUT || err.status == HI3_ERR_RUNTIME;
			}
			(void)hi3i_image_orientation(exact, n);
			hi3_image_free(im);
			free(exact);
			tried++;
		}
		free(buf);
		free(orig);
	}
	hi3_set_log(NULL, NULL, HI3_LOG_INFO);
	ok(clean, "%d truncated or corrupted files: each decoded (%d) or refused cleanly", tried, decoded);
}

static void test_threads(void)
{
	char *path = fixture("text.png");
	hi3_image *im = NULL;
	hi3_image_vit *ref = NULL;
	hi3_error err = {0};
	int good = 1;

	if (hi3_image_load(&im, path, NULL, &err) || hi3_image_vit_view(&ref, im, NULL, &err)) {
		ok(0, "threads: %s", err.msg);
		goto out;
	}
#pragma omp parallel for num_threads(4) reduction(&& : good)
	for (int i = 0; i < 8; i++) {
		hi3_image *m = NULL;
		hi3_image_vit *t = NULL;
		hi3_error e = {0};
		good = good && !hi3_image_load(&m, path, NULL, &e) && !hi3_image_vit_view(&t, m, NULL, &e) &&
		       !memcmp(t->pixel_values, ref->pixel_values, (size_t)t->n_patches * t->dim * 4);
		hi3_image_vit_free(t);
		hi3_image_free(m);
	}
	ok(good, "loading and the ViT view from 4 threads at once give the same bytes");
	omp_set_num_threads(1);
	{
		hi3_image_vit *one = NULL;
		hi3_image_vit_view(&one, im, NULL, &err);
		ok(one && !memcmp(one->pixel_values, ref->pixel_values, (size_t)one->n_patches * one->dim * 4),
		   "one thread gives the same bytes as many");
		hi3_image_vit_free(one);
	}
out:
	hi3_image_vit_free(ref);
	hi3_image_free(im);
	free(path);
}

int main(void)
{
	const char *src = getenv("SRCDIR") ? getenv("SRCDIR") : ".";
	char *dir = hi3i_asprintf("%s/tests/fixtures/image", src), *exp = hi3i_asprintf("%s/expected.safetensors", dir);
	json_error_t je;
	hi3_error err = {0};
	const char *meta;

	fixdir = dir;
	if (hi3_st_open(&want, exp, HI3_ST_READ, &err) || !(meta = hi3_st_meta(want, "cases")) ||
	    !(cases = json_loads(meta, 0, &je))) {
		ok(0, "open the fixtures: %s", err.msg[0] ? err.msg : "no 'cases' metadata");
		return done_testing();
	}
	test_tables();
	test_resizes();
	test_resize_avx512();
	test_resize_properties();
	test_exif_parser();
	test_load();
	test_views();
	test_bad_input();
	test_mutations();
	test_threads();
	json_decref(cases);
	hi3_st_close(want);
	free(dir);
	free(exp);
	return done_testing();
}
