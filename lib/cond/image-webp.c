/*
 * image-webp.c -- WebP as Pillow decodes it: libwebp (Debian's libwebp,
 * the library Debian's Pillow links), through the animation decoder for
 * every file as Pillow's WebPImagePlugin does (WebPAnimDecoderNew with the
 * default options: RGBA, no threads), taking the first frame: a still
 * picture is its one frame; an animation's first frame is drawn on a
 * transparent black canvas of the animation's size. Pillow's mode is RGBA
 * when WebPGetFeatures says the file has alpha, else RGB; convert("RGB")
 * drops the alpha. (Its EXIF and XMP chunks: image-load.c.)
 */
#include <string.h>
#include <webp/decode.h>
#include <webp/demux.h>
#include "cond/image-internal.h"

int hi3i_webp_decode(const uint8_t *d, size_t n, const char *name, int64_t max_pixels, struct hi3i_picture *p,
                     hi3_error *err)
{
	WebPData data = {d, n};
	WebPBitstreamFeatures f;
	WebPDemuxer *dmx = WebPDemux(&data);
	WebPAnimDecoder *dec = NULL;
	WebPAnimInfo info;
	uint8_t *frame, *rgb = NULL;
	int64_t w, h;
	int ts, alpha;

	if (!dmx)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: cannot read the WebP file (truncated or malformed)", name);
	w = WebPDemuxGetI(dmx, WEBP_FF_CANVAS_WIDTH);
	h = WebPDemuxGetI(dmx, WEBP_FF_CANVAS_HEIGHT);
	if (hi3i_picture_size(name, "WebP", w, h, max_pixels, err))
		goto fail;
	alpha = WebPGetFeatures(d, n, &f) == VP8_STATUS_OK ? f.has_alpha : 1;
	if (!(dec = WebPAnimDecoderNew(&data, NULL)) || !WebPAnimDecoderGetInfo(dec, &info)) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: cannot decode the WebP file", name);
		goto fail;
	}
	if (info.canvas_width != (uint32_t)w || info.canvas_height != (uint32_t)h) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: the WebP decoder's canvas is not the file's", name);
		goto fail;
	}
	if (!WebPAnimDecoderGetNext(dec, &frame, &ts)) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: cannot decode the first frame of the WebP file", name);
		goto fail;
	}
	if (!(rgb = malloc((size_t)w * h * 3))) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "%s: out of memory for a %lldx%lld image", name, (long long)w,
		              (long long)h);
		goto fail;
	}
	for (size_t i = 0; i < (size_t)w * h; i++)
		memcpy(rgb + 3 * i, frame + 4 * i, 3);
	WebPAnimDecoderDelete(dec);
	WebPDemuxDelete(dmx);
	p->width = (int)w;
	p->height = (int)h;
	p->rgb = rgb;
	p->mode = alpha ? "RGBA" : "RGB";
	p->channels = alpha ? 4 : 3;
	p->bits = 8;
	return 0;
fail:
	WebPAnimDecoderDelete(dec);
	WebPDemuxDelete(dmx);
	return -1;
}
