/*
 * inspect-picture.c -- hi3 inspect PICTURE: what hi3 decoded from a picture
 * file, as the stages read it (hi3_image_load): the format, Pillow's mode,
 * the stored size, the EXIF orientation and the size after it; --png
 * writes the RGB after the orientation, to compare hi3's decode with any
 * other decoder's.
 */
#include <string.h>
#include "tools/tools.h"

static const char *const transposes[9] = {"", "none", "FLIP_LEFT_RIGHT", "ROTATE_180", "FLIP_TOP_BOTTOM",
                                          "TRANSPOSE", "ROTATE_270", "TRANSVERSE", "ROTATE_90"};

int hi3i_inspect_picture(const char *path, const hi3_inspect_opts *o, FILE *f, hi3_error *err)
{
	const hi3_image_opts io = {.max_pixels = o->max_image_pixels, .max_bytes = o->max_image_bytes};
	hi3_image *im = NULL;
	int rc;

	if (o->tensor || o->slice || o->row >= 0 || o->scale)
		return hi3_error_set(err, HI3_ERR_USAGE, "%s is a picture: --tensor, --slice, --row and --scale are for "
		                     "safetensors files (a picture takes --json and --png)", path);
	if (hi3_image_load(&im, path, &io, err))
		return -1;
	if (o->png && hi3_png_write_rgb(o->png, im->width, im->height, im->rgb, err)) {
		hi3_image_free(im);
		return -1;
	}
	if (o->json) {
		json_t *root = json_object();
		json_object_set_new(root, "file", json_string(path));
		json_object_set_new(root, "kind", json_string("picture"));
		json_object_set_new(root, "format", json_string(im->format));
		json_object_set_new(root, "mode", json_string(im->mode));
		json_object_set_new(root, "width", json_integer(im->file_width));
		json_object_set_new(root, "height", json_integer(im->file_height));
		json_object_set_new(root, "channels", json_integer(im->channels));
		json_object_set_new(root, "bits", json_integer(im->bits));
		json_object_set_new(root, "orientation", json_integer(im->orientation));
		json_object_set_new(root, "transpose", im->orientation > 1 ? json_string(transposes[im->orientation])
		                                                           : json_null());
		json_object_set_new(root, "oriented_width", json_integer(im->width));
		json_object_set_new(root, "oriented_height", json_integer(im->height));
		if (o->png)
			json_object_set_new(root, "png", json_string(o->png));
		rc = hi3i_json_emit(f, root, JSON_INDENT(1), err);
	} else {
		fprintf(f, "file: %s\nkind: picture\nformat: %s\nmode: %s (Pillow's, on opening)\n", path, im->format,
		        im->mode);
		fprintf(f, "stored size: %d x %d (width x height), %d channel%s of %d bit%s\n", im->file_width,
		        im->file_height, im->channels, im->channels > 1 ? "s" : "", im->bits, im->bits > 1 ? "s" : "");
		fprintf(f, "EXIF orientation: %d (%s)\n", im->orientation, transposes[im->orientation]);
		fprintf(f, "size after orientation: %d x %d\n", im->width, im->height);
		if (o->png)
			fprintf(f, "png: %s (RGB, %d x %d, after the orientation)\n", o->png, im->width, im->height);
		rc = 0;
	}
	hi3_image_free(im);
	return rc;
}
