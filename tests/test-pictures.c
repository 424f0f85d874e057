/*
 * test-pictures.c -- every picture of the corpus (tests/fixtures/pictures,
 * made by tests/ref/pictures_ref.py) decoded by hi3_image_load and
 * compared, value for value, with the RGB that Pillow's Image.open,
 * exif_transpose and convert("RGB") gave for it: tolerance 0. Also the
 * format, Pillow's mode, the stored size and the orientation; then, per
 * format, how many values differ (0 is the promise).
 */
#include <jansson.h>
#include <string.h>
#include "cond/image-internal.h"
#include "tap.h"

struct tally {
	const char *format;
	long long values, differ, files;
};

/* Pillow 9.4 (the reference) names a 16-bit gray PNG "I"; Pillow 12
 * (upstream's, and hi3's) "I;16". */
static const char *mode12(const char *format, const char *mode)
{
	return !strcmp(format, "PNG") && !strcmp(mode, "I") ? "I;16" : mode;
}

int main(void)
{
	const char *src = getenv("SRCDIR") ? getenv("SRCDIR") : ".";
	char *dir = hi3i_asprintf("%s/tests/fixtures/pictures", src), *exp = hi3i_asprintf("%s/expected.safetensors", dir);
	struct tally t[8] = {{.format = "JPEG"}, {.format = "PNG"}, {.format = "WEBP"}, {.format = "GIF"}, {.format = "BMP"}};
	const char *meta, *file;
	json_t *cases, *refused, *m;
	json_error_t je;
	hi3_error err = {0};
	hi3_st *want = NULL;

	if (hi3_st_open(&want, exp, HI3_ST_READ, &err) || !(meta = hi3_st_meta(want, "cases")) ||
	    !(cases = json_loads(meta, 0, &je)) || !(meta = hi3_st_meta(want, "refused")) ||
	    !(refused = json_loads(meta, 0, &je))) {
		ok(0, "open the fixtures %s: %s", exp, err.msg[0] ? err.msg : "no 'cases' or 'refused' metadata");
		return done_testing();
	}
	diag("reference: %s", hi3_st_meta(want, "reference"));
	json_object_foreach(cases, file, m) {
		const char *format = json_string_value(json_object_get(m, "format"));
		const char *mode = mode12(format, json_string_value(json_object_get(m, "mode")));
		json_t *size = json_object_get(m, "size");
		int fw = (int)json_integer_value(json_array_get(size, 0)), fh = (int)json_integer_value(json_array_get(size, 1));
		int orient = (int)json_integer_value(json_object_get(m, "orientation"));
		const hi3_tensor *ref = hi3_st_find(want, file);
		char *path = hi3i_asprintf("%s/%s", dir, file);
		struct tally *k = t;
		hi3_image *im = NULL;
		long long differ = 0;

		while (k->format && strcmp(k->format, format))
			k++;
		if (!k->format)
			k->format = format;
		if (hi3_image_load(&im, path, NULL, &err)) {
			ok(0, "%s: %s", file, err.msg);
			k->differ += ref ? (long long)ref->nbytes : 0;
			k->values += ref ? (long long)ref->nbytes : 0;
			free(path);
			continue;
		}
		if (!ref || ref->ndim != 3 || ref->shape[0] != im->height || ref->shape[1] != im->width ||
		    ref->shape[2] != 3) {
			ok(0, "%s: decoded %dx%d, Pillow's is %lldx%lld", file, im->width, im->height,
			   ref ? (long long)ref->shape[1] : -1LL, ref ? (long long)ref->shape[0] : -1LL);
		} else {
			const uint8_t *r = ref->data;
			size_t first = SIZE_MAX;
			for (size_t i = 0; i < ref->nbytes; i++)
				if (im->rgb[i] != r[i]) {
					differ++;
					if (first == SIZE_MAX)
						first = i;
				}
			if (differ)
				diag("%s: first difference at y %zu x %zu channel %zu: %u, Pillow %u", file,
				     first / 3 / (size_t)im->width, first / 3 % (size_t)im->width, first % 3, im->rgb[first],
				     r[first]);
			ok(!differ && !strcmp(im->format, format) && !strcmp(im->mode, mode) && im->file_width == fw &&
			   im->file_height == fh && im->orientation == orient,
			   "%s: %s %s %dx%d, orientation %d: %lld of %zu values differ from Pillow's (format %s, mode %s, "
			   "%dx%d, orientation %d)", file, im->format, im->mode, im->file_width, im->file_height,
			   im->orientation, differ, ref->nbytes, format, mode, fw, fh, orient);
			k->values += (long long)ref->nbytes;
			k->differ += differ;
		}
		k->files++;
		hi3_image_free(im);
		free(path);
	}
	json_object_foreach(refused, file, m) {
		char *path = hi3i_asprintf("%s/%s", dir, file);
		hi3_image *im = NULL;
		int rc = hi3_image_load(&im, path, NULL, &err);
		ok(rc == -1 && err.status == HI3_ERR_INPUT && strstr(err.msg, file), "%s: refused as Pillow refuses it "
		   "(%s): %s", file, json_string_value(m), rc ? err.msg : "decoded");
		hi3_image_free(im);
		free(path);
	}
	for (struct tally *k = t; k->format; k++)
		ok(k->files > 0 && k->differ == 0, "%s: %lld files, %lld of %lld values differ from Pillow's", k->format,
		   k->files, k->differ, k->values);
	json_decref(cases);
	json_decref(refused);
	hi3_st_close(want);
	free(dir);
	free(exp);
	return done_testing();
}
