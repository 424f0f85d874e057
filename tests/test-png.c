/*
 * test-png.c -- hi3_png_write_rgb_text: the PNG read back through libpng
 * gives the pixels and every key/value text (tEXt, iTXt for UTF-8), the
 * write is atomic (an existing file is replaced whole, a refused write
 * leaves it as it was, no temporary is left), bad keys are refused.
 */
#include <dirent.h>
#include <png.h>
#include <string.h>
#include <unistd.h>
#include "hi3.h"
#include "core/internal.h"
#include "tap.h"
#include "cuda-test.h"
#include "testdir.h"

static char *root;

struct image {
	int w, h;
	uint8_t *rgb;
	int n_text;
	char key[8][80], *value[8];
	int itxt[8];
};

static int read_png(const char *path, struct image *im)
{
	FILE *f = fopen(path, "rb");
	png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
	png_infop info = png ? png_create_info_struct(png) : NULL;
	png_textp t = NULL;
	int n = 0;

	memset(im, 0, sizeof(*im));
	if (!f || !png || !info || setjmp(png_jmpbuf(png))) {
		if (f)
			fclose(f);
		png_destroy_read_struct(&png, &info, NULL);
		return -1;
	}
	png_init_io(png, f);
	png_read_info(png, info);
	im->w = (int)png_get_image_width(png, info);
	im->h = (int)png_get_image_height(png, info);
	if (png_get_color_type(png, info) != PNG_COLOR_TYPE_RGB || png_get_bit_depth(png, info) != 8)
		longjmp(png_jmpbuf(png), 1);
	im->rgb = malloc((size_t)im->w * im->h * 3);
	for (int y = 0; y < im->h; y++)
		png_read_row(png, im->rgb + (size_t)y * im->w * 3, NULL);
	png_read_end(png, info);
	png_get_text(png, info, &t, &n);
	for (int i = 0; i < n && i < 8; i++) {
		snprintf(im->key[i], sizeof(im->key[i]), "%s", t[i].key);
		im->value[i] = strdup(t[i].text);
		im->itxt[i] = t[i].compression >= PNG_ITXT_COMPRESSION_NONE;
	}
	im->n_text = n;
	png_destroy_read_struct(&png, &info, NULL);
	fclose(f);
	return 0;
}

static void release(struct image *im)
{
	free(im->rgb);
	for (int i = 0; i < im->n_text && i < 8; i++)
		free(im->value[i]);
}

static int n_files(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	while (d && (e = readdir(d)))
		n += e->d_name[0] != '.';
	if (d)
		closedir(d);
	return n;
}

int main(void)
{
	const int W = 5, H = 3;
	uint8_t rgb[5 * 3 * 3], rgb2[5 * 3 * 3];
	const hi3_png_text text[] = {
		{"prompt", "a lighthouse at dusk, caf\xc3\xa9 on the pier \xe2\x80\x94 oil on canvas"},
		{"seed", "1234"},
		{"parameters", "steps: 50, sampler: euler, guidance: 5.0, flow_shift: 3.0\nsize: 1024x1024"},
	};
	const hi3_png_text bad[][1] = {{{" lead", "x"}}, {{"a  b", "x"}}, {{"", "x"}}, {{"caf\xc3\xa9", "x"}},
	                               {{"ok", NULL}}};
	hi3_error err = {0};
	struct image im;
	char *path;

	if (!(root = testdir_new("test-png")) || !(path = hi3i_asprintf("%s/row-0.png", root)))
		return 1;
	for (size_t i = 0; i < sizeof(rgb); i++) {
		rgb[i] = (uint8_t)(i * 37 + 11);
		rgb2[i] = (uint8_t)(255 - i);
	}
	ok(hi3_png_write_rgb_text(path, W, H, rgb, text, 3, &err) == 0, "a PNG with 3 text chunks %s", err.msg);
	if (read_png(path, &im) != 0)
		diag("libpng cannot read %s", path);
	ok(im.rgb && im.w == W && im.h == H && !memcmp(im.rgb, rgb, sizeof(rgb)),
	   "libpng reads it back: %d x %d RGB8, the same pixels", im.w, im.h);
	ok(im.n_text == 3, "three texts (%d)", im.n_text);
	for (int i = 0; i < 3 && i < im.n_text; i++)
		ok(!strcmp(im.key[i], text[i].key) && !strcmp(im.value[i], text[i].value),
		   "text '%s' = '%s' (%s)", im.key[i], im.value[i], im.itxt[i] ? "iTXt" : "tEXt");
	ok(im.n_text == 3 && im.itxt[0] && !im.itxt[1] && !im.itxt[2],
	   "the UTF-8 prompt went to iTXt, the ASCII values to tEXt");
	release(&im);
	/* refused keys: nothing written, the file stays */
	for (size_t i = 0; i < HI3_ARRAY_SIZE(bad); i++) {
		memset(&err, 0, sizeof(err));
		ok(hi3_png_write_rgb_text(path, W, H, rgb2, bad[i], 1, &err) != 0 && err.status == HI3_ERR_USAGE &&
		   strstr(err.msg, path), "key '%s' refused: %s", bad[i][0].key, err.msg);
	}
	ok(read_png(path, &im) == 0 && !memcmp(im.rgb, rgb, sizeof(rgb)) && im.n_text == 3,
	   "the existing PNG is as it was");
	release(&im);
	/* replaced whole; the plain writer writes no text */
	ok(hi3_png_write_rgb(path, W, H, rgb2, &err) == 0 && read_png(path, &im) == 0 &&
	   !memcmp(im.rgb, rgb2, sizeof(rgb2)) && im.n_text == 0, "hi3_png_write_rgb replaces it, without texts");
	release(&im);
	ok(n_files(root) == 1, "no temporary file is left beside it (%d files)", n_files(root));
	testdir_done(root);
	free(path);
	return done_testing();
}
