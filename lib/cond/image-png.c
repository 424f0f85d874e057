/*
 * image-png.c -- PNG as Pillow decodes it. libpng (already hi3's PNG
 * writer) inflates and unfilters the rows, Adam7 included, with no
 * transformation but the unpacking of 1/2/4-bit samples to bytes; the
 * samples then become RGB by the rules of Pillow's PngImagePlugin modes
 * and its convert("RGB"):
 *   gray 1 -> "1" (0/255); gray 2, 4 -> "L" (x 85, x 17); gray 8 -> "L";
 *   gray 16 -> "I;16", clipped at 255 (not its high byte);
 *   RGB 8/16, RGBA 8/16, gray+alpha 8/16 -> the high byte, alpha dropped;
 *   palette 1/2/4/8 -> "P": the PLTE entry, black for an index past the
 *   entries the file has (Pillow 12; 9.4 showed its gray ramp there).
 * tRNS never changes the colours (convert("RGB") ignores transparency).
 * Pillow checks the CRC of every chunk before the first IDAT (image-load.c
 * does) and no other: libpng is told to ignore CRCs. Its benign errors
 * (extra image data, a bad Adler-32 after the last row, palette indices
 * past the PLTE) are warnings, as they are not errors to Pillow either.
 */
#include <setjmp.h>
#include <string.h>
#include <png.h>
#include "cond/image-internal.h"

struct source {
	const uint8_t *d;
	size_t n, pos;
	int eof;                /* the data ran out */
	char msg[200];
};

static void on_read(png_structp png, png_bytep out, png_size_t len)
{
	struct source *s = png_get_io_ptr(png);

	if (len > s->n - s->pos) {
		s->eof = 1;
		png_error(png, "the file ends inside the image data");
	}
	memcpy(out, s->d + s->pos, len);
	s->pos += len;
}

static void on_error(png_structp png, png_const_charp msg)
{
	struct source *s = png_get_error_ptr(png);

	snprintf(s->msg, sizeof(s->msg), "%s", msg);
	png_longjmp(png, 1);
}

static void on_warning(png_structp png, png_const_charp msg)
{
	(void)png;
	(void)msg;
}

/* One unpacked row (w samples of `ch` channels, 1 or 2 bytes each) to RGB. */
static void convert_row(uint8_t *out, const uint8_t *in, int w, int type, int depth, const uint8_t (*pal)[3],
                        int npal)
{
	for (int x = 0; x < w; x++, out += 3) {
		switch (type) {
		case PNG_COLOR_TYPE_GRAY:
			if (depth == 16) {
				unsigned v = (unsigned)in[2 * x] << 8 | in[2 * x + 1];
				out[0] = out[1] = out[2] = v > 255 ? 255 : (uint8_t)v;
			} else {
				static const uint8_t scale[9] = {0, 255, 85, 0, 17, 0, 0, 0, 1};
				out[0] = out[1] = out[2] = (uint8_t)(in[x] * scale[depth]);
			}
			break;
		case PNG_COLOR_TYPE_GRAY_ALPHA:
			out[0] = out[1] = out[2] = in[(size_t)x * (depth / 4)];
			break;
		case PNG_COLOR_TYPE_RGB:
		case PNG_COLOR_TYPE_RGB_ALPHA: {
			int step = (type == PNG_COLOR_TYPE_RGB ? 3 : 4) * depth / 8, b = depth / 8;
			for (int c = 0; c < 3; c++)
				out[c] = in[(size_t)x * step + c * b];
			break;
		}
		default:                      /* palette */
			if (in[x] < npal)
				memcpy(out, pal[in[x]], 3);
			else
				out[0] = out[1] = out[2] = 0;
			break;
		}
	}
}

int hi3i_png_decode(const uint8_t *d, size_t n, const char *name, int64_t max_pixels, struct hi3i_picture *p,
                    hi3_error *err)
{
	static const char *const modes[] = {"L", "?", "RGB", "P", "LA", "?", "RGBA"};
	struct source src = {.d = d, .n = n};
	png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src, on_error, on_warning);
	png_infop info = png ? png_create_info_struct(png) : NULL;
	uint8_t *volatile rgb = NULL, *volatile raw = NULL;
	png_bytep *volatile rows = NULL;
	uint8_t pal[256][3];
	png_uint_32 w, h;
	int depth, type, interlace, npal = 0;
	size_t rowbytes;

	if (!info) {
		png_destroy_read_struct(&png, NULL, NULL);
		return hi3_error_set(err, HI3_ERR_RUNTIME, "%s: out of memory for the PNG decoder", name);
	}
	if (setjmp(png_jmpbuf(png))) {
		if (src.eof)
			hi3_error_set(err, HI3_ERR_INPUT, "%s: truncated PNG file (the data ends inside the image)", name);
		else
			hi3_error_set(err, HI3_ERR_INPUT, "%s: cannot decode the PNG image: %s", name, src.msg);
		goto fail;
	}
	png_set_read_fn(png, &src, on_read);
	png_set_crc_action(png, PNG_CRC_QUIET_USE, PNG_CRC_QUIET_USE);
	png_set_benign_errors(png, 1);
	png_set_user_limits(png, 0x7fffffff, 0x7fffffff);   /* hi3i_picture_size is the limit */
	png_set_keep_unknown_chunks(png, PNG_HANDLE_CHUNK_NEVER, NULL, 0);
	png_read_info(png, info);
	png_get_IHDR(png, info, &w, &h, &depth, &type, &interlace, NULL, NULL);
	if (hi3i_picture_size(name, "PNG", w, h, max_pixels, err))
		goto fail;
	if (type == PNG_COLOR_TYPE_PALETTE) {
		png_colorp plte;
		if (png_get_PLTE(png, info, &plte, &npal) != PNG_INFO_PLTE)
			npal = 0;
		for (int i = 0; i < npal && i < 256; i++) {
			pal[i][0] = plte[i].red;
			pal[i][1] = plte[i].green;
			pal[i][2] = plte[i].blue;
		}
	}
	if (depth < 8)
		png_set_packing(png);
	png_set_interlace_handling(png);
	png_read_update_info(png, info);
	rowbytes = png_get_rowbytes(png, info);
	if (!(rgb = malloc((size_t)w * h * 3)) ||
	    !(raw = malloc(interlace != PNG_INTERLACE_NONE ? rowbytes * h : rowbytes))) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "%s: out of memory for a %ux%u image", name, (unsigned)w, (unsigned)h);
		goto fail;
	}
	if (interlace != PNG_INTERLACE_NONE) {
		if (!(rows = malloc(h * sizeof(*rows)))) {
			hi3_error_set(err, HI3_ERR_RUNTIME, "%s: out of memory for a %ux%u image", name, (unsigned)w,
			              (unsigned)h);
			goto fail;
		}
		for (png_uint_32 y = 0; y < h; y++)
			rows[y] = raw + y * rowbytes;
		png_read_image(png, rows);
		for (png_uint_32 y = 0; y < h; y++)
			convert_row(rgb + (size_t)y * w * 3, raw + y * rowbytes, (int)w, type, depth,
			            (const uint8_t(*)[3])pal, npal);
	} else {
		for (png_uint_32 y = 0; y < h; y++) {
			png_read_row(png, raw, NULL);
			convert_row(rgb + (size_t)y * w * 3, raw, (int)w, type, depth, (const uint8_t(*)[3])pal, npal);
		}
	}
	png_destroy_read_struct(&png, &info, NULL);
	free(raw);
	free(rows);
	p->width = (int)w;
	p->height = (int)h;
	p->rgb = rgb;
	p->channels = type == PNG_COLOR_TYPE_GRAY || type == PNG_COLOR_TYPE_PALETTE ? 1 :
	              type == PNG_COLOR_TYPE_GRAY_ALPHA ? 2 : type == PNG_COLOR_TYPE_RGB ? 3 : 4;
	p->bits = depth;
	p->mode = type == PNG_COLOR_TYPE_GRAY ? (depth == 1 ? "1" : depth == 16 ? "I;16" : "L") :
	          type == PNG_COLOR_TYPE_GRAY_ALPHA && depth == 16 ? "RGBA" : type <= 6 ? modes[type] : "?";
	return 0;
fail:
	png_destroy_read_struct(&png, &info, NULL);
	free(rgb);
	free(raw);
	free(rows);
	return -1;
}
