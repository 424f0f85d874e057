/* fuzz-image.c -- hi3_image_decode on any bytes: the container walk and
 * the EXIF and XMP orientation readers (lib/cond/image-load.c), the
 * decoders of every accepted format (image-jpeg.c: libjpeg-turbo,
 * image-webp.c: libwebp, image-png.c: libpng, image-gif.c, image-bmp.c),
 * then both views of a small image that decodes (lib/cond/image-prep.c,
 * lib/core/resize.c). A refusal is an input error naming the file; an
 * accepted image is what the header promised: at most max_pixels, one of
 * the five formats with a mode, every byte readable, its orientation 1..8,
 * and its views of the sizes the geometry gives. */
#include <string.h>
#include "cond/image-internal.h"
#include "fuzz/fuzz.h"

#define MAX_PIXELS (1 << 20)      /* bounds each input's memory and time */

static void one(const uint8_t *data, size_t size)
{
	const hi3_image_opts o = {.max_pixels = MAX_PIXELS};
	hi3_image *im = NULL;
	hi3_error err = {0};
	int rc = hi3_image_decode(&im, data, size, "fuzz.img", &o, &err), sum = 0, o1;

	fuzz_check_status(rc, &err, "hi3_image_decode");
	o1 = hi3i_image_orientation(data, size);
	FUZZ_CHECK(o1 >= 1 && o1 <= 8, "orientation %d", o1);
	if (rc != 0) {
		FUZZ_CHECK(im == NULL && err.status == HI3_ERR_INPUT && strstr(err.msg, "fuzz.img"),
		           "a refused image is not an input error naming it: %s", err.msg);
		return;
	}
	FUZZ_CHECK(im->width >= 1 && im->height >= 1 && (int64_t)im->width * im->height <= MAX_PIXELS && im->rgb &&
	           im->format && im->mode && im->orientation >= 1 && im->orientation <= 8 && im->channels >= 1 &&
	           im->channels <= 4, "image %dx%d, orientation %d, %d channels", im->width, im->height,
	           im->orientation, im->channels);
	FUZZ_CHECK(hi3_image_sniff(data, size) && !strcmp(hi3_image_sniff(data, size), im->format) &&
	           strstr("JPEG PNG WEBP GIF BMP", im->format), "decoded as %s, sniffed as %s", im->format,
	           hi3_image_sniff(data, size) ? hi3_image_sniff(data, size) : "nothing");
	FUZZ_CHECK(im->orientation < 5 ? im->width == im->file_width && im->height == im->file_height
	                               : im->width == im->file_height && im->height == im->file_width,
	           "orientation %d turned %dx%d into %dx%d", im->orientation, im->file_width, im->file_height,
	           im->width, im->height);
	for (size_t i = 0; i < (size_t)im->width * im->height * 3; i++)
		sum += im->rgb[i];
	(void)sum;
	if ((int64_t)im->width * im->height <= 4096) {
		hi3_image_vit_opts vo = {.patch = 16, .max_patches = 16};
		hi3_image_vae_opts ao = {.base_size = 256};
		hi3_image_vit *vit = NULL;
		hi3_image_vae *vae = NULL;
		int gh, gw;

		hi3_image_vit_grid(im->height, im->width, 16, 16, &gh, &gw);
		rc = hi3_image_vit_view(&vit, im, &vo, &err);
		fuzz_check_status(rc, &err, "hi3_image_vit_view");
		FUZZ_CHECK(rc == 0 && vit->grid_h == gh && vit->grid_w == gw && gh * gw <= 16 && vit->n_patches == 16,
		           "ViT view of %dx%d: %s", im->width, im->height, err.msg);
		hi3_image_vit_free(vit);
		rc = hi3_image_vae_view(&vae, im, &ao, &err);
		fuzz_check_status(rc, &err, "hi3_image_vae_view");
		/* a thin image's cover resize can exceed the limit: an input error, never a crash */
		FUZZ_CHECK(rc == 0 ? vae->height % 16 == 0 && vae->width % 16 == 0 : err.status == HI3_ERR_INPUT,
		           "VAE view of %dx%d: %s", im->width, im->height, err.msg);
		hi3_image_vae_free(vae);
	}
	hi3_image_free(im);
}

HI3_FUZZ_TARGET(image, NULL, one)
