/*
 * image-bmp.c -- a BMP as Pillow's BmpImagePlugin reads it (no library:
 * the rules below are Pillow's, and small):
 *  - headers of 12 (OS/2), 40, 52, 56, 64, 108 or 124 bytes; a height
 *    whose top byte is 0xFF is a top-down picture (Pillow's test);
 *  - uncompressed 1, 4, 8 bits (a colour table), 16 (5-5-5), 24, 32 bits
 *    (B, G, R, unused); BI_BITFIELDS with the masks Pillow knows: 32 bits
 *    with the byte orders of Pillow's MASK_MODES, 24 bits B-G-R, 16 bits
 *    5-6-5 and 5-5-5, each 5- or 6-bit value widened as v * 255 / 31 (63);
 *  - a colour table of `colours used` entries (all 2^bits when 0) of 4
 *    bytes (3 for OS/2) right after the header (and the masks): when it is
 *    a gray ramp Pillow's mode is 1 or L and the index is the level (0/255
 *    for two colours), otherwise P and an index past the table is black;
 *  - the pixels at the header's offset (just past the table when the
 *    offset points at the table), rows padded to 4 bytes; a file shorter
 *    than its rows is truncated.
 * Refused as Pillow refuses them: other depths, other masks, JPEG or PNG
 * inside; refused although Pillow 12 reads them: RLE4 and RLE8
 * compression (rare; Pillow 9.4 read RLE8 only).
 */
#include <string.h>
#include "cond/image-internal.h"

static uint32_t u32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint32_t u16(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }

/* 32-bit BI_BITFIELDS layouts Pillow reads: masks (R, G, B, A) and the
 * byte of each of R, G, B in a little-endian pixel. */
static const struct { uint32_t m[4]; int r, g, b; } layouts[] = {
	{{0xFF0000, 0xFF00, 0xFF, 0}, 2, 1, 0},                 /* BGRX */
	{{0xFF000000, 0xFF0000, 0xFF00, 0}, 3, 2, 1},           /* XBGR */
	{{0xFF000000, 0xFF00, 0xFF, 0}, 3, 1, 0},               /* BGXR */
	{{0xFF000000, 0xFF0000, 0xFF00, 0xFF}, 3, 2, 1},        /* ABGR */
	{{0xFF, 0xFF00, 0xFF0000, 0xFF000000}, 0, 1, 2},        /* RGBA */
	{{0xFF0000, 0xFF00, 0xFF, 0xFF000000}, 2, 1, 0},        /* BGRA */
	{{0xFF000000, 0xFF00, 0xFF, 0xFF0000}, 3, 1, 0},        /* BGAR */
	{{0, 0, 0, 0}, 2, 1, 0},                                /* BGRA */
};

int hi3i_bmp_decode(const uint8_t *d, size_t n, const char *name, int64_t max_pixels, struct hi3i_picture *p,
                    hi3_error *err)
{
	uint32_t hsize, comp = 0, colors = 0, masks[4] = {0, 0, 0, 0};
	int64_t w, h, off;
	int bits, top_down = 0, alpha = 0, r5 = 0, layout = -1, pad = 4, gray = 0;
	size_t at, stride, ntab = 0;
	const uint8_t *tab = NULL;
	uint8_t *rgb;

	if (n < 18)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: truncated BMP file (the header)", name);
	off = u32(d + 10);
	hsize = u32(d + 14);
	if (hsize != 12 && hsize != 40 && hsize != 52 && hsize != 56 && hsize != 64 && hsize != 108 && hsize != 124)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: a BMP header of %u bytes (Pillow reads 12, 40, 52, 56, 64, "
		                     "108 and 124)", name, hsize);
	if (n - 14 < hsize)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: truncated BMP file (the header)", name);
	at = 14 + hsize;
	if (hsize == 12) {
		w = u16(d + 18);
		h = u16(d + 20);
		bits = (int)u16(d + 24);
		pad = 3;
	} else {
		w = u32(d + 18);
		top_down = d[25] == 0xFF;
		h = top_down ? (int64_t)4294967296 - u32(d + 22) : u32(d + 22);
		bits = (int)u16(d + 28);
		comp = u32(d + 30);
		colors = u32(d + 46);
		if (comp == 3) {
			if (hsize >= 52) {
				for (int k = 0; k < (hsize >= 56 ? 4 : 3); k++)
					masks[k] = u32(d + 54 + 4 * k);
			} else {
				if (n - at < 12)
					return hi3_error_set(err, HI3_ERR_INPUT, "%s: truncated BMP file (the masks)", name);
				for (int k = 0; k < 3; k++)
					masks[k] = u32(d + at + 4 * k);
				at += 12;
			}
		}
	}
	if (bits != 1 && bits != 4 && bits != 8 && bits != 16 && bits != 24 && bits != 32)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: a BMP of %d bits a pixel (Pillow reads 1, 4, 8, 16, 24 and "
		                     "32)", name, bits);
	if (comp == 3) {
		if (bits == 32) {
			for (size_t k = 0; k < HI3_ARRAY_SIZE(layouts) && layout < 0; k++)
				if (!memcmp(layouts[k].m, masks, sizeof(masks)))
					layout = (int)k;
			alpha = layout >= 3;
		} else if (bits == 24 && masks[0] == 0xFF0000 && masks[1] == 0xFF00 && masks[2] == 0xFF) {
			layout = 0;
		} else if (bits == 16 && masks[0] == 0xF800 && masks[1] == 0x7E0 && masks[2] == 0x1F) {
			layout = 0;
		} else if (bits == 16 && masks[0] == 0x7C00 && masks[1] == 0x3E0 && masks[2] == 0x1F) {
			layout = 0;
			r5 = 1;
		}
		if (layout < 0)
			return hi3_error_set(err, HI3_ERR_INPUT, "%s: a BMP bitfields layout Pillow does not read", name);
	} else if (comp == 0) {
		r5 = bits == 16;
	} else {
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: BMP compression %u (hi3 reads uncompressed and bitfields "
		                     "BMPs; RLE4 and RLE8 are not read)", name, comp);
	}
	if (hi3i_picture_size(name, "BMP", w, h, max_pixels, err))
		return -1;
	if (bits <= 8) {
		if (!colors)
			colors = 1u << bits;
		if (colors > 65536)
			return hi3_error_set(err, HI3_ERR_INPUT, "%s: a BMP colour table of %u entries", name, colors);
		tab = d + at;
		ntab = HI3_MIN((size_t)colors, (n - at) / (size_t)pad);   /* Pillow reads what is there */
		gray = 1;
		for (size_t i = 0; i < colors && gray; i++) {
			uint8_t v = colors == 2 ? (uint8_t)(i ? 255 : 0) : (uint8_t)i;
			gray = i < ntab && tab[i * pad] == v && tab[i * pad + 1] == v && tab[i * pad + 2] == v;
		}
		if (off == 14 + (int64_t)hsize)
			off += 4 * (int64_t)colors;
	}
	stride = (size_t)(((w * bits + 31) >> 3) & ~(int64_t)3);
	if (off < 0 || (uint64_t)off > n || (n - (size_t)off) / stride < (size_t)h)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: truncated BMP file (the pixel data is cut short)", name);
	if (!(rgb = malloc((size_t)w * h * 3)))
		return hi3_error_set(err, HI3_ERR_RUNTIME, "%s: out of memory for a %lldx%lld image", name, (long long)w,
		                     (long long)h);
	for (int64_t y = 0; y < h; y++) {
		const uint8_t *row = d + off + (size_t)(top_down ? y : h - 1 - y) * stride;
		uint8_t *out = rgb + (size_t)y * w * 3;
		for (int64_t x = 0; x < w; x++, out += 3) {
			if (bits <= 8) {
				unsigned v = bits == 8 ? row[x] : bits == 4 ? (row[x / 2] >> (x & 1 ? 0 : 4)) & 15 :
				             (row[x / 8] >> (7 - (x & 7))) & 1;
				if (gray)
					out[0] = out[1] = out[2] = colors == 2 ? (uint8_t)(v ? 255 : 0) : (uint8_t)v;
				else if (v < ntab)
					out[0] = tab[v * pad + 2], out[1] = tab[v * pad + 1], out[2] = tab[v * pad];
				else
					out[0] = out[1] = out[2] = 0;
			} else if (bits == 16) {
				unsigned v = u16(row + 2 * x);
				if (r5) {
					out[0] = (uint8_t)(((v >> 10) & 31) * 255 / 31);
					out[1] = (uint8_t)(((v >> 5) & 31) * 255 / 31);
				} else {
					out[0] = (uint8_t)(((v >> 11) & 31) * 255 / 31);
					out[1] = (uint8_t)(((v >> 5) & 63) * 255 / 63);
				}
				out[2] = (uint8_t)((v & 31) * 255 / 31);
			} else if (bits == 24) {
				out[0] = row[3 * x + 2];
				out[1] = row[3 * x + 1];
				out[2] = row[3 * x];
			} else {
				const uint8_t *px = row + 4 * x;
				int k = layout < 0 ? 0 : layout;
				out[0] = px[layouts[k].r];
				out[1] = px[layouts[k].g];
				out[2] = px[layouts[k].b];
			}
		}
	}
	p->width = (int)w;
	p->height = (int)h;
	p->rgb = rgb;
	p->mode = bits <= 8 ? (gray ? (colors == 2 ? "1" : "L") : "P") : alpha ? "RGBA" : "RGB";
	p->channels = bits <= 8 ? 1 : alpha ? 4 : 3;
	p->bits = bits;
	return 0;
}
