/*
 * image-prep.c -- the two views upstream makes of every input image
 * (HunyuanImage3ImageProcessor.get_image_with_size, image_processor.py at
 * 1201fe8; facts/image-input.md 1 and 7):
 *
 *   VAE: the bucket nearest the image's H/W; resize_and_crop to it (cover
 *        with LANCZOS, centre crop at Python-rounded offsets; or, with
 *        crop_type "resize", a plain LANCZOS resize); ToTensor and
 *        Normalize(0.5, 0.5).
 *   ViT: Siglip2ImageProcessorFast: the patch grid of at most max patches,
 *        torchvision's antialiased bilinear resize of the uncropped image,
 *        the fused (x - 127.5) / 127.5, patches (py, px, c) row-major,
 *        zero rows to max patches with a mask.
 *
 * Legend: H, W image; th, tw bucket; P max patches, D = 3 p p features.
 */
#include <math.h>
#include <string.h>
#include "cond/cond-internal.h"
#include "cond/image-internal.h"
#include "core/resize.h"

/* ------------------------------------------------------------ buckets */

int hi3_image_buckets(int base, int (*hw)[2], int max)
{
	/* the Instruct code's ResolutionGroup (align 16, the extra resolutions),
	 * as the template builds it (template.c) */
	return hi3i_buckets_variant(HI3_VARIANT_INSTRUCT, base, hw, max);
}

int hi3_image_bucket_of(const int (*hw)[2], int n, int64_t h, int64_t w)
{
	return hi3i_bucket_of(hw, n, h, w);
}

void hi3_image_vit_grid(int64_t h, int64_t w, int p, int max, int *gh, int *gw)
{
	hi3i_vit_grid(h, w, p, max, gh, gw);
}

/* ------------------------------------------------------ normalisation */

float hi3i_vae_value(uint8_t u)
{
	float x = (float)u / 255.0f;    /* ToTensor: img.to(float32).div(255) */

	return (x - 0.5f) / 0.5f;       /* Normalize: sub_(mean).div_(std) */
}

float hi3i_vit_value(uint8_t u)
{
	/* mean and std 0.5 times 1 / rescale_factor (1 / 0.00392156862745098),
	 * in float32: 127.5 */
	return ((float)u - 127.5f) / 127.5f;
}

/* ------------------------------------------------------------ the VAE */

void hi3_image_vae_free(hi3_image_vae *v)
{
	if (!v)
		return;
	free(v->rgb);
	free(v->pixels);
	free(v);
}

int hi3_image_vae_view(hi3_image_vae **out, const hi3_image *im, const hi3_image_vae_opts *o, hi3_error *err)
{
	int hw[64][2], n, base = o && o->base_size ? o->base_size : 1024, b, th, tw;
	int64_t max = o && o->max_pixels ? o->max_pixels : HI3_IMAGE_MAX_PIXELS, rw, rh, top = 0, left = 0;
	hi3_image_vae *v = NULL;
	float lut[256];
	size_t plane;

	*out = NULL;
	if (!im || !im->rgb || im->width < 1 || im->height < 1)
		return hi3_error_set(err, HI3_ERR_USAGE, "VAE preprocessing: no image");
	if ((n = hi3_image_buckets(base, hw, 64)) < 1)
		return hi3_error_set(err, HI3_ERR_USAGE, "image_base_size %d gives no resolution buckets", base);
	/* get_target_size(w, h): the bucket of the image as loaded */
	b = hi3_image_bucket_of((const int (*)[2])hw, n, im->height, im->width);
	th = hw[b][0];
	tw = hw[b][1];
	if (o && o->target_h > 0 && o->target_w > 0) {
		th = o->target_h;
		tw = o->target_w;
	}
	if (o && o->resize) {
		rw = tw;
		rh = th;
	} else {
		double tr = (double)th / tw, r = (double)im->height / im->width;
		if (r < tr) {
			rh = th;
			rw = (int64_t)rint((double)th / im->height * im->width);
		} else {
			rw = tw;
			rh = (int64_t)rint((double)tw / im->width * im->height);
		}
		top = (int64_t)rint((double)(rh - th) / 2.0);
		left = (int64_t)rint((double)(rw - tw) / 2.0);
	}
	if ((max > 0 && rw * rh > max) || rw > INT32_MAX / 4 || rh > INT32_MAX / 4)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: a %dx%d image (width x height): covering its %dx%d bucket "
		                     "takes a %lldx%lld resize, more than the limit of %lld pixels", im->name, im->width, im->height, tw, th,
		                     (long long)rw, (long long)rh, (long long)max);
	if (!(v = hi3i_calloc(1, sizeof(*v), err)))
		return -1;
	v->height = th;
	v->width = tw;
	v->resized_h = (int)rh;
	v->resized_w = (int)rw;
	v->crop_top = (int)top;
	v->crop_left = (int)left;
	plane = (size_t)th * tw;
	if (!(v->rgb = hi3i_malloc(plane * 3, err)) || !(v->pixels = hi3i_malloc(plane * 3 * sizeof(float), err)))
		goto fail;
	if (hi3i_resize_pil_crop(im->rgb, im->width, im->height, 3, v->rgb, (int)rw, (int)rh, (int)left, (int)top, tw,
	                         th, HI3_RESAMPLE_LANCZOS, err)) {
		hi3_error_prefix(err, "%s", im->name);
		goto fail;
	}
	/* the ratio index of the cropped size (as_image_tensor recomputes it) */
	v->bucket = hi3_image_bucket_of((const int (*)[2])hw, n, th, tw);
	for (int u = 0; u < 256; u++)
		lut[u] = hi3i_vae_value((uint8_t)u);
#pragma omp parallel for schedule(static) if (plane > (1 << 18))
	for (size_t i = 0; i < plane; i++)
		for (int c = 0; c < 3; c++)
			v->pixels[c * plane + i] = lut[v->rgb[3 * i + c]];
	*out = v;
	return 0;
fail:
	hi3_image_vae_free(v);
	return -1;
}

/* ------------------------------------------------------------ the ViT */

void hi3_image_vit_free(hi3_image_vit *v)
{
	if (!v)
		return;
	free(v->rgb);
	free(v->pixel_values);
	free(v->mask);
	free(v);
}

int hi3_image_vit_view(hi3_image_vit **out, const hi3_image *im, const hi3_image_vit_opts *o, hi3_error *err)
{
	int p = o && o->patch ? o->patch : 16, P = o && o->max_patches ? o->max_patches : 1024;
	int kernel = o ? o->kernel : HI3_TV_UINT8, gh, gw;
	hi3_image_vit *v = NULL;
	float lut[256];
	size_t D;

	*out = NULL;
	if (!im || !im->rgb || im->width < 1 || im->height < 1)
		return hi3_error_set(err, HI3_ERR_USAGE, "ViT preprocessing: no image");
	if (p < 1 || p > 1024 || P < 1 || P > (1 << 20))
		return hi3_error_set(err, HI3_ERR_USAGE, "ViT preprocessing: patch size %d, %d patches: out of range", p, P);
	hi3_image_vit_grid(im->height, im->width, p, P, &gh, &gw);
	if (!(v = hi3i_calloc(1, sizeof(*v), err)))
		return -1;
	D = (size_t)3 * p * p;
	v->grid_h = gh;
	v->grid_w = gw;
	v->height = gh * p;
	v->width = gw * p;
	v->n_patches = P;
	v->dim = (int)D;
	if (!(v->rgb = hi3i_malloc((size_t)v->height * v->width * 3, err)) ||
	    !(v->pixel_values = hi3i_calloc((size_t)P * D, sizeof(float), err)) ||
	    !(v->mask = hi3i_calloc((size_t)P, sizeof(int32_t), err)))
		goto fail;
	if (hi3_resize_tv(im->rgb, im->width, im->height, 3, v->rgb, v->width, v->height, kernel, err)) {
		hi3_error_prefix(err, "%s", im->name);
		goto fail;
	}
	for (int u = 0; u < 256; u++)
		lut[u] = hi3i_vit_value((uint8_t)u);
	/* (C, nph, p, npw, p) -> (nph, npw, py, px, C) */
	for (int ty = 0; ty < gh; ty++)
		for (int tx = 0; tx < gw; tx++) {
			float *row = v->pixel_values + ((size_t)ty * gw + tx) * D;
			for (int py = 0; py < p; py++) {
				const uint8_t *s = v->rgb + (((size_t)ty * p + py) * v->width + (size_t)tx * p) * 3;
				for (int k = 0; k < 3 * p; k++)
					row[(size_t)py * p * 3 + k] = lut[s[k]];
			}
			v->mask[(size_t)ty * gw + tx] = 1;
		}
	*out = v;
	return 0;
fail:
	hi3_image_vit_free(v);
	return -1;
}
