/*
 * image-gif.c -- a GIF's first frame as Pillow's GifImagePlugin and
 * GifDecode.c make it (no library: the LZW decoder below follows Pillow's
 * own, whose semantics a general decoder like stb_image's does not share):
 *  - the picture is the logical screen, grown to hold the first image when
 *    that reaches past it; pixels outside the image are the transparent
 *    colour index when a graphic control extension before the image sets
 *    one (the last one that sets it), else index 0;
 *  - colours: the image's local colour table, else the global one; a table
 *    that is the gray ramp (entry i = (i, i, i)) makes Pillow's mode L and
 *    the index is the gray level; otherwise mode P, and an index past the
 *    table is black (Pillow 12);
 *  - LZW as Pillow decodes it: codes of min-size + 1 bits growing to 12, a
 *    full table kept until the next clear code, the first code after a
 *    clear taken as is; a code past the next free entry, or a first code
 *    above the clear code, is a broken stream; interlaced rows in the four
 *    passes. Decoding stops when the last row is written.
 * An image whose data ends before its last pixel is refused (Pillow raises
 * "image file is truncated" then, or in rare cases reads on into the
 * following blocks).
 */
#include <string.h>
#include "cond/image-internal.h"

#define TABLE 4096

struct lzw {
	const uint8_t *d;
	size_t n, pos;          /* the sub-blocks */
	size_t block;           /* bytes left in the current sub-block */
	uint32_t bits;          /* bit buffer */
	int nbits;
};

/* The next code of `size` bits; -1 when the data ends (a block cut short,
 * or the terminator). */
static int next_code(struct lzw *z, int size)
{
	while (z->nbits < size) {
		if (z->block == 0) {
			if (z->pos >= z->n || z->d[z->pos] == 0 || z->n - z->pos - 1 < z->d[z->pos])
				return -1;  /* Pillow decodes only whole sub-blocks */
			z->block = z->d[z->pos++];
		}
		z->bits |= (uint32_t)z->d[z->pos++] << z->nbits;
		z->nbits += 8;
		z->block--;
	}
	{
		int c = (int)(z->bits & ((1u << size) - 1));
		z->bits >>= size;
		z->nbits -= size;
		return c;
	}
}

struct raster {
	uint8_t *idx;           /* the canvas of indices */
	int cw;                 /* its width */
	int x0, y0, w, h;       /* the image's rectangle */
	int x, y, pass, step;   /* the next pixel; interlace pass (0: none) */
};

/* Put one pixel; 1 when the image is complete. */
static int put(struct raster *r, uint8_t v)
{
	r->idx[(size_t)(r->y0 + r->y) * r->cw + r->x0 + r->x] = v;
	if (++r->x < r->w)
		return 0;
	r->x = 0;
	r->y += r->step;
	while (r->y >= r->h) {
		switch (r->pass) {
		case 1: r->y = 4; r->pass = 2; break;
		case 2: r->y = 2; r->step = 4; r->pass = 3; break;
		case 3: r->y = 1; r->step = 2; r->pass = 4; break;
		default: return 1;
		}
	}
	return 0;
}

/* 0: complete; 1: the data ended first; 2: broken stream. */
static int lzw_decode(struct lzw *z, int min, struct raster *r)
{
	uint16_t link[TABLE];
	uint8_t data[TABLE], stack[TABLE];
	const int clear = 1 << min, end = clear + 1;
	int size = min + 1, next = clear + 2, first = 1, last = 0, lastdata = 0;

	for (;;) {
		int c = next_code(z, size), code, sp = 0;

		if (c < 0 || c == end)
			return 1;
		if (c == clear) {
			size = min + 1;
			next = clear + 2;
			first = 1;
			continue;
		}
		if (first) {                /* the first code after a clear: as is */
			if (c > clear)
				return 2;
			lastdata = last = c;
			first = 0;
			if (put(r, (uint8_t)c))
				return 0;
			continue;
		}
		code = c;
		if (c > next)
			return 2;
		if (c == next) {            /* the string being defined: last's, then its first byte */
			stack[sp++] = (uint8_t)lastdata;
			c = last;
		}
		while (c >= clear) {
			if (c >= TABLE || sp >= TABLE)
				return 2;
			stack[sp++] = data[c];
			c = link[c];
		}
		lastdata = c;
		if (next < TABLE) {         /* a full table stays full until a clear */
			data[next] = (uint8_t)c;
			link[next] = (uint16_t)last;
			if (next == (1 << size) - 1 && size < 12)
				size++;
			next++;
		}
		last = code;
		if (put(r, (uint8_t)c))
			return 0;
		while (sp > 0)
			if (put(r, stack[--sp]))
				return 0;
	}
}

/* Pillow's _is_palette_needed: 0 when the table is the gray ramp. */
static int palette_needed(const uint8_t *t, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (t[3 * i] != (uint8_t)i || t[3 * i + 1] != (uint8_t)i || t[3 * i + 2] != (uint8_t)i)
			return 1;
	return 0;
}

/* A sub-block chain from pos: the position after its terminator, or 0
 * when the file ends first. */
static size_t skip_blocks(const uint8_t *d, size_t n, size_t pos)
{
	while (pos < n && d[pos])
		pos += (size_t)d[pos] + 1;
	return pos < n ? pos + 1 : 0;
}

int hi3i_gif_decode(const uint8_t *d, size_t n, const char *name, int64_t max_pixels, struct hi3i_picture *p,
                    hi3_error *err)
{
	const uint8_t *gtab = NULL, *tab;
	size_t gn = 0, tn, pos = 13;
	int trans = -1, sw, sh, gray;
	struct raster r = {0};
	struct lzw z = {0};
	uint8_t *rgb;
	int rc;

	if (n < 13)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: truncated GIF file (no screen descriptor)", name);
	sw = (int)(d[6] | d[7] << 8);
	sh = (int)(d[8] | d[9] << 8);
	if (d[10] & 0x80) {
		gn = (size_t)1 << ((d[10] & 7) + 1);
		gtab = d + 13;
		if (n - 13 < 3 * gn)
			return hi3_error_set(err, HI3_ERR_INPUT, "%s: truncated GIF file (the colour table)", name);
		pos += 3 * gn;
	}
	for (;;) {                          /* extensions up to the first image */
		if (pos >= n || d[pos] == 0x3B)
			return hi3_error_set(err, HI3_ERR_INPUT, "%s: a GIF file without an image", name);
		if (d[pos] == 0x2C)
			break;
		if (d[pos] == 0x21) {
			if (n - pos < 3)
				return hi3_error_set(err, HI3_ERR_INPUT, "%s: truncated GIF file (an extension)", name);
			if (d[pos + 1] == 0xF9 && d[pos + 2]) {  /* graphic control: its first sub-block */
				if (d[pos + 2] < 4 || n - pos - 3 < d[pos + 2])
					return hi3_error_set(err, HI3_ERR_INPUT, "%s: a broken graphic control extension", name);
				if (d[pos + 3] & 1)
					trans = d[pos + 6];
			}
			if (!(pos = skip_blocks(d, n, pos + 2)))
				return hi3_error_set(err, HI3_ERR_INPUT, "%s: truncated GIF file (an extension)", name);
			continue;
		}
		pos++;                          /* Pillow skips any other byte */
	}
	if (n - pos < 11)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: truncated GIF file (the image descriptor)", name);
	r.x0 = d[pos + 1] | d[pos + 2] << 8;
	r.y0 = d[pos + 3] | d[pos + 4] << 8;
	r.w = d[pos + 5] | d[pos + 6] << 8;
	r.h = d[pos + 7] | d[pos + 8] << 8;
	tab = gtab;
	tn = gn;
	if (d[pos + 9] & 0x80) {
		tn = (size_t)1 << ((d[pos + 9] & 7) + 1);
		tab = d + pos + 10;
		if (n - pos - 10 < 3 * tn + 1)
			return hi3_error_set(err, HI3_ERR_INPUT, "%s: truncated GIF file (the colour table)", name);
	}
	r.pass = d[pos + 9] & 0x40 ? 1 : 0;
	r.step = r.pass ? 8 : 1;
	pos += 10 + (d[pos + 9] & 0x80 ? 3 * tn : 0);
	if (pos >= n)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: truncated GIF file (the image data)", name);
	if (d[pos] > 12)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: a GIF image of LZW code size %d (at most 12)", name, d[pos]);
	sw = HI3_MAX(sw, r.x0 + r.w);       /* Pillow grows the picture to hold the image */
	sh = HI3_MAX(sh, r.y0 + r.h);
	if (hi3i_picture_size(name, "GIF", sw, sh, max_pixels, err))
		return -1;
	if (r.w == 0 || r.h == 0)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: the first GIF image is %dx%d", name, r.w, r.h);
	if (!(r.idx = malloc((size_t)sw * sh)))
		return hi3_error_set(err, HI3_ERR_RUNTIME, "%s: out of memory for a %dx%d image", name, sw, sh);
	memset(r.idx, trans >= 0 ? trans : 0, (size_t)sw * sh);
	r.cw = sw;
	z.d = d;
	z.n = n;
	z.pos = pos + 1;
	rc = lzw_decode(&z, d[pos], &r);
	if (rc) {
		free(r.idx);
		return hi3_error_set(err, HI3_ERR_INPUT, rc == 1 ? "%s: truncated GIF file (the first image's data ends "
		                     "before its last pixel)" : "%s: broken GIF image data (a bad LZW code)", name);
	}
	if (!(rgb = malloc((size_t)sw * sh * 3))) {
		free(r.idx);
		return hi3_error_set(err, HI3_ERR_RUNTIME, "%s: out of memory for a %dx%d image", name, sw, sh);
	}
	gray = !tab || !palette_needed(tab, tn);
	for (size_t i = 0; i < (size_t)sw * sh; i++) {
		uint8_t v = r.idx[i];
		if (gray)
			rgb[3 * i] = rgb[3 * i + 1] = rgb[3 * i + 2] = v;
		else if (v < tn)
			memcpy(rgb + 3 * i, tab + 3 * (size_t)v, 3);
		else
			rgb[3 * i] = rgb[3 * i + 1] = rgb[3 * i + 2] = 0;
	}
	free(r.idx);
	p->width = sw;
	p->height = sh;
	p->rgb = rgb;
	p->mode = gray ? "L" : "P";
	p->channels = 1;
	p->bits = 8;
	return 0;
}
