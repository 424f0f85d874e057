/*
 * resize.h -- the resamplers of resize.c that only libhi3 and its tests
 * call (internal; the public hi3_resize_pil and hi3_resize_tv are in
 * hi3.h).
 */
#ifndef HI3_CORE_RESIZE_H
#define HI3_CORE_RESIZE_H

#include "core/internal.h"

/* The window (x0, y0, cw, ch) of hi3_resize_pil(src, ..., rw, rh): the
 * same bytes as resizing to rw x rh and cropping, without computing the
 * rest (Image.resize then Image.crop). */
int hi3i_resize_pil_crop(const uint8_t *src, int sw, int sh, int c, uint8_t *dst, int rw, int rh, int x0, int y0,
                         int cw, int ch, int filter, hi3_error *err);

/* dst (dh, dw, C) = src (sh, sw, C) channels-last, float32, resized as
 * torch's F.interpolate(mode="bilinear", align_corners=False,
 * antialias=True) does on the CPU (_upsample_bilinear2d_aa's float kernel
 * as the plain x86-64 build computes it: taps in float, width pass then
 * height pass, each axis only where its size changes). */
int hi3i_resize_aa_f32(const float *src, int sw, int sh, int C, float *dst, int dw, int dh, hi3_error *err);

#endif

