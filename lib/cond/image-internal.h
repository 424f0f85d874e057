/*
 * image-internal.h -- what image-load.c and image-prep.c
 * share, and the pieces their unit tests (tests/test-image.c) call
 * directly. Not installed.
 */
#ifndef HI3_IMAGE_INTERNAL_H
#define HI3_IMAGE_INTERNAL_H

#include "cond/hi3-cond.h"
#include "core/internal.h"

/* ------------------------------------------------- the picture decoders */

/* A picture as Pillow's Image.open gives it, converted as convert("RGB")
 * converts it, before any EXIF orientation: what each format's decoder
 * (image-jpeg.c, image-webp.c, image-png.c, image-gif.c, image-bmp.c)
 * fills. */
struct hi3i_picture {
	int width, height;
	uint8_t *rgb;               /* (height, width, 3), malloc'd */
	const char *mode;           /* Pillow 12's mode: "1", "L", "P", "LA", "RGB", "RGBA", "CMYK", "I;16" */
	int channels, bits;         /* samples per pixel and bits per sample in the file */
};

/* The checks every decoder makes on the size it read from the header,
 * before it allocates pixels: at least one pixel, at most max_pixels (> 0;
 * <= 0: no limit). 0, or an input error naming `name` and the format. */
int hi3i_picture_size(const char *name, const char *format, int64_t w, int64_t h, int64_t max_pixels,
                      hi3_error *err);

/* Decode the picture in [d, d + n) into *p. Each refuses what Pillow
 * refuses (an input error naming `name`), and checks the declared size
 * with hi3i_picture_size before any pixel buffer exists. */
int hi3i_jpeg_decode(const uint8_t *d, size_t n, const char *name, int64_t max_pixels, struct hi3i_picture *p,
                     hi3_error *err);
int hi3i_webp_decode(const uint8_t *d, size_t n, const char *name, int64_t max_pixels, struct hi3i_picture *p,
                     hi3_error *err);
int hi3i_png_decode(const uint8_t *d, size_t n, const char *name, int64_t max_pixels, struct hi3i_picture *p,
                    hi3_error *err);
int hi3i_gif_decode(const uint8_t *d, size_t n, const char *name, int64_t max_pixels, struct hi3i_picture *p,
                    hi3_error *err);
int hi3i_bmp_decode(const uint8_t *d, size_t n, const char *name, int64_t max_pixels, struct hi3i_picture *p,
                    hi3_error *err);

/* The EXIF orientation (tag 0x0112 of IFD0, 1..8) of a JPEG (first APP1
 * "Exif" segment), PNG (last eXIf chunk) or either's XMP packet
 * (tiff:Orientation, used when the EXIF block has none), as Pillow's
 * Image.getexif() finds it; 1 when there is none or it cannot be read.
 * Reads only inside [data, data + len). */
int hi3i_image_orientation(const uint8_t *data, size_t len);

/* The orientation entry of a TIFF block ("II*\0" / "MM\0*" header, any
 * number of leading "Exif\0\0"): its first value; -1 when it is of a type
 * that is not an integer (Pillow keeps it and does not transpose); 0 when
 * there is none or the block is not TIFF. */
int hi3i_exif_orientation(const uint8_t *tiff, size_t len);

/* dst (w', h', c) = src (w, h, c) turned as ImageOps.exif_transpose does
 * for orientation o (w' = h, h' = w for 5..8). dst must not alias src. */
void hi3i_image_transpose(uint8_t *dst, const uint8_t *src, int w, int h, int c, int o);

/* One fp32 value of each normalisation, for a u8 value u:
 * VAE: ToTensor then Normalize([0.5], [0.5]): (fp32(u) / 255 - 0.5) / 0.5;
 * ViT: the fast processor's fused rescale and normalise: (fp32(u) - 127.5) / 127.5. */
float hi3i_vae_value(uint8_t u);
float hi3i_vit_value(uint8_t u);

#endif
