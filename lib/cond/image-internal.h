/*
 * image-internal.h -- what image-load.c, image-resize.c and image-prep.c
 * share, and the pieces their unit tests (tests/test-image.c) call
 * directly. Not installed.
 */
#ifndef HI3_IMAGE_INTERNAL_H
#define HI3_IMAGE_INTERNAL_H

#include "core/internal.h"

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

/* The window (x0, y0, cw, ch) of hi3_resize_pil(src, ..., rw, rh): the
 * same bytes as resizing to rw x rh and cropping, without computing the
 * rest (Image.resize then Image.crop). */
int hi3i_resize_pil_crop(const uint8_t *src, int sw, int sh, int c, uint8_t *dst, int rw, int rh, int x0, int y0,
                         int cw, int ch, int filter, hi3_error *err);

/* One fp32 value of each normalisation, for a u8 value u:
 * VAE: ToTensor then Normalize([0.5], [0.5]): (fp32(u) / 255 - 0.5) / 0.5;
 * ViT: the fast processor's fused rescale and normalise: (fp32(u) - 127.5) / 127.5. */
float hi3i_vae_value(uint8_t u);
float hi3i_vit_value(uint8_t u);

#endif
