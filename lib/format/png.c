/*
 * png.c -- PNG output: an atomic RGB writer (libpng into memory, then
 * temporary name + rename), with key/value text chunks for the generation
 * parameters of an image (as stable-diffusion.cpp writes them).
 */
#include <png.h>
#include <setjmp.h>
#include <string.h>
#include "format/format.h"

struct membuf {
	unsigned char *p;
	size_t len, cap;
	int oom;
};

static void mem_write(png_structp png, png_bytep data, png_size_t n)
{
	struct membuf *m = png_get_io_ptr(png);

	if (m->oom)
		return;
	if (m->len + n > m->cap) {
		size_t cap = m->cap ? m->cap : 65536;
		unsigned char *np;

		while (cap < m->len + n)
			cap *= 2;
		np = realloc(m->p, cap);
		if (!np) {
			m->oom = 1;
			return;
		}
		m->p = np;
		m->cap = cap;
	}
	memcpy(m->p + m->len, data, n);
	m->len += n;
}

static void mem_flush(png_structp png) { (void)png; }

/* Encode into m; returns 0 or -1 (libpng error or out of memory). The
 * state touched after setjmp lives in m and the caller's frame. */
static int ascii_text(const char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s > 126 || ((unsigned char)*s < 32 && *s != '\n'))
			return 0;
	return 1;
}

static int encode(struct membuf *m, int width, int height, const uint8_t *rgb, const hi3_png_text *text, int n_text)
{
	png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
	png_infop info = png ? png_create_info_struct(png) : NULL;

	if (!png || !info) {
		png_destroy_write_struct(&png, &info);
		return -1;
	}
	if (setjmp(png_jmpbuf(png))) {
		png_destroy_write_struct(&png, &info);
		return -1;
	}
	png_set_write_fn(png, m, mem_write, mem_flush);
	png_set_IHDR(png, info, (png_uint_32)width, (png_uint_32)height, 8, PNG_COLOR_TYPE_RGB,
	             PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
	if (n_text > 0) {
		/* before the image data; a value beyond printable ASCII goes as
		 * UTF-8 in an iTXt chunk (tEXt is Latin-1) */
		png_text *t = calloc((size_t)n_text, sizeof(*t));
		if (!t) {
			m->oom = 1;
			png_destroy_write_struct(&png, &info);
			return -1;
		}
		for (int i = 0; i < n_text; i++) {
			t[i].compression = ascii_text(text[i].value) ? PNG_TEXT_COMPRESSION_NONE : PNG_ITXT_COMPRESSION_NONE;
			t[i].key = (png_charp)text[i].key;
			t[i].text = (png_charp)text[i].value;
			t[i].text_length = strlen(text[i].value);
		}
		png_set_text(png, info, t, n_text);
		free(t);
	}
	png_write_info(png, info);
	for (int y = 0; y < height; y++)
		png_write_row(png, (png_const_bytep)(rgb + (size_t)y * (size_t)width * 3));
	png_write_end(png, NULL);
	png_destroy_write_struct(&png, &info);
	return m->oom ? -1 : 0;
}

/* PNG keywords: 1 to 79 printable Latin-1 characters, no leading,
 * trailing or doubled spaces (PNG 11.3.4.3); ASCII here. */
static int good_key(const char *k)
{
	size_t n = strlen(k);

	if (n < 1 || n > 79 || k[0] == ' ' || k[n - 1] == ' ' || strstr(k, "  "))
		return 0;
	for (; *k; k++)
		if ((unsigned char)*k < 32 || (unsigned char)*k > 126)
			return 0;
	return 1;
}

int hi3_png_write_rgb(const char *path, int width, int height, const uint8_t *rgb, hi3_error *err)
{
	return hi3_png_write_rgb_text(path, width, height, rgb, NULL, 0, err);
}

int hi3_png_write_rgb_text(const char *path, int width, int height, const uint8_t *rgb, const hi3_png_text *text,
                           int n_text, hi3_error *err)
{
	struct membuf m = {0};
	int rc;

	for (int i = 0; i < n_text; i++)
		if (!text[i].key || !text[i].value || !good_key(text[i].key))
			return hi3_error_set(err, HI3_ERR_USAGE, "%s: PNG text key '%s' is not a PNG keyword (1 to 79 "
			                     "printable ASCII characters, no leading, trailing or doubled spaces)%s", path,
			                     text[i].key ? text[i].key : "(null)", text[i].value ? "" : ", or has no value");
	if (width <= 0 || height <= 0 || width > (1 << 20) || height > (1 << 20))
		return hi3_error_set(err, HI3_ERR_USAGE, "%s: a %d x %d image cannot be written as PNG "
		                     "(each side must be 1 to %d pixels)", path, width, height, 1 << 20);
	if (encode(&m, width, height, rgb, text, n_text) != 0) {
		free(m.p);
		return hi3_error_set(err, HI3_ERR_RUNTIME, "%s: cannot encode the PNG (%d x %d): %s", path, width,
		                     height, m.oom ? "out of memory" : "libpng error");
	}
	rc = hi3i_write_file(path, m.p, m.len, err);
	free(m.p);
	return rc;
}
