/*
 * image-jpeg.c -- JPEG as Pillow decodes it: libjpeg-turbo (Debian's
 * libjpeg62-turbo, the library Debian's Pillow links) with the settings of
 * Pillow's JpegDecode.c and JpegImagePlugin.py:
 *  - the library's defaults for everything Pillow leaves alone: the ISLOW
 *    IDCT, fancy upsampling, block smoothing (it only changes a progressive
 *    file whose scans stop early), no scaling (Pillow asks for draft mode
 *    only when told to, and upstream does not);
 *  - the output colour space from the number of components, as Pillow's
 *    mode: 1 -> L (JCS_GRAYSCALE), 3 -> RGB (JCS_RGB: libjpeg converts
 *    YCbCr, or keeps an Adobe RGB file), 4 -> CMYK (JCS_CMYK: libjpeg turns
 *    YCCK into CMYK); Pillow reads CMYK as "CMYK;I" (inverted, Adobe's
 *    convention, whether or not the file has an Adobe marker) and converts
 *    it with Convert.c's cmyk2rgb;
 *  - libjpeg's warnings (corrupt data) ignored, its errors fatal; running
 *    out of data is an error (Pillow: "image file is truncated").
 * The progress hook refuses a file of more than 1000 scans (no camera or
 * encoder makes one; a crafted one costs minutes), where Pillow would go on.
 */
#include <setjmp.h>
#include <stdio.h>
#include <string.h>
#include <jpeglib.h>
#include <jerror.h>
#include "cond/image-internal.h"

#define MAX_SCANS 1000

struct jerr {
	struct jpeg_error_mgr pub;
	jmp_buf jump;
	int eof;                      /* the data ran out (libjpeg then inserts an EOI) */
	int scans;                    /* too many scans */
	char msg[JMSG_LENGTH_MAX];
};

static void on_error(j_common_ptr c)
{
	struct jerr *e = (struct jerr *)c->err;

	(*c->err->format_message)(c, e->msg);
	longjmp(e->jump, 1);
}

static void on_message(j_common_ptr c, int level)
{
	struct jerr *e = (struct jerr *)c->err;

	if (level < 0) {
		c->err->num_warnings++;
		if (c->err->msg_code == JWRN_JPEG_EOF)
			e->eof = 1;
	}
}

static void on_progress(j_common_ptr c)
{
	struct jerr *e = (struct jerr *)c->err;

	if (!c->is_decompressor)
		return;
	if (((j_decompress_ptr)c)->input_scan_number > MAX_SCANS) {
		e->scans = 1;
		snprintf(e->msg, sizeof(e->msg), "more than %d scans", MAX_SCANS);
		longjmp(e->jump, 1);
	}
}

/* Pillow's MULDIV255: a * b / 255, rounded. */
static inline int muldiv255(int a, int b)
{
	int t = a * b + 128;

	return ((t >> 8) + t) >> 8;
}

static inline uint8_t clip8(int v)
{
	return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

int hi3i_jpeg_decode(const uint8_t *d, size_t n, const char *name, int64_t max_pixels, struct hi3i_picture *p,
                     hi3_error *err)
{
	struct jpeg_decompress_struct c;
	struct jpeg_progress_mgr progress = {.progress_monitor = on_progress};
	struct jerr e;
	uint8_t *volatile rgb = NULL, *volatile row = NULL;
	volatile int started = 0;
	int w, h, comps;

	memset(&c, 0, sizeof(c));
	c.err = jpeg_std_error(&e.pub);
	e.pub.error_exit = on_error;
	e.pub.emit_message = on_message;
	e.eof = e.scans = 0;
	e.msg[0] = 0;
	if (setjmp(e.jump)) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: cannot decode the JPEG image: %s", name, e.msg);
		goto fail;
	}
	jpeg_create_decompress(&c);
	started = 1;
	c.progress = &progress;
	jpeg_mem_src(&c, d, (unsigned long)n);
	jpeg_read_header(&c, TRUE);
	if (e.eof)
		goto truncated;
	comps = c.num_components;
	if (comps != 1 && comps != 3 && comps != 4) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: a JPEG of %d components (Pillow reads 1, 3 or 4)", name, comps);
		goto fail;
	}
	if (hi3i_picture_size(name, "JPEG", c.image_width, c.image_height, max_pixels, err))
		goto fail;
	c.out_color_space = comps == 1 ? JCS_GRAYSCALE : comps == 3 ? JCS_RGB : JCS_CMYK;
	jpeg_start_decompress(&c);
	if (e.eof)
		goto truncated;
	w = (int)c.output_width;
	h = (int)c.output_height;
	if (!(rgb = malloc((size_t)w * h * 3)) || !(row = malloc((size_t)w * comps))) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "%s: out of memory for a %dx%d image", name, w, h);
		goto fail;
	}
	while (c.output_scanline < c.output_height) {
		uint8_t *out = rgb + (size_t)c.output_scanline * w * 3;
		JSAMPROW r = comps == 3 ? out : row;

		if (jpeg_read_scanlines(&c, &r, 1) != 1 || e.eof)
			goto truncated;
		if (comps == 1) {
			for (int x = 0; x < w; x++)
				out[3 * x] = out[3 * x + 1] = out[3 * x + 2] = row[x];
		} else if (comps == 4) {
			for (int x = 0; x < w; x++) {
				/* "CMYK;I": every sample inverted, then cmyk2rgb */
				const uint8_t *s = row + 4 * x;
				int nk = 255 - (255 - s[3]);
				for (int ch = 0; ch < 3; ch++)
					out[3 * x + ch] = clip8(nk - muldiv255(255 - s[ch], nk));
			}
		}
	}
	jpeg_finish_decompress(&c);
	if (e.eof)
		goto truncated;
	jpeg_destroy_decompress(&c);
	free(row);
	p->width = w;
	p->height = h;
	p->rgb = rgb;
	p->mode = comps == 1 ? "L" : comps == 3 ? "RGB" : "CMYK";
	p->channels = comps;
	p->bits = 8;
	return 0;
truncated:
	hi3_error_set(err, HI3_ERR_INPUT, "%s: truncated JPEG file (the data ends inside the image)", name);
fail:
	if (started)
		jpeg_destroy_decompress(&c);
	free(rgb);
	free(row);
	return -1;
}
