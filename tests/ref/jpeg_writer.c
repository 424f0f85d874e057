/*
 * jpeg_writer.c -- the JPEG encodings of the picture corpus that Pillow's
 * encoder cannot make (tests/ref/pictures_ref.py builds and runs it):
 * any sampling factors (4:1:1, 4:4:0), restart markers, arithmetic coding,
 * RGB, CMYK and YCCK JPEGs, with or without the Adobe marker. Written with
 * the libjpeg the reference Pillow links; never part of make check.
 *
 *   jpeg_writer W H SPACE OUT [option=value ...] < raw pixels (H, W, C)
 *   SPACE: gray (C 1), ycc (C 3, stored YCbCr), rgb (C 3, stored RGB),
 *          cmyk (C 4, stored CMYK), ycck (C 4, stored YCCK)
 *   options: quality=N  sample=H0xV0,H1xV1,...  restart=MCUs  progressive=1
 *            arithmetic=1  adobe=0|1
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jpeglib.h>

int main(int argc, char **argv)
{
	struct jpeg_compress_struct c;
	struct jpeg_error_mgr e;
	int w, h, comps, quality = 90, restart = 0, progressive = 0, arithmetic = 0, adobe = -1;
	const char *space, *sample = NULL;
	J_COLOR_SPACE in, stored;
	unsigned char *px;
	FILE *out;

	if (argc < 5) {
		fprintf(stderr, "usage: jpeg_writer W H SPACE OUT [option=value ...]\n");
		return 2;
	}
	w = atoi(argv[1]);
	h = atoi(argv[2]);
	space = argv[3];
	if (!strcmp(space, "gray")) { in = stored = JCS_GRAYSCALE; comps = 1; }
	else if (!strcmp(space, "ycc")) { in = JCS_RGB; stored = JCS_YCbCr; comps = 3; }
	else if (!strcmp(space, "rgb")) { in = JCS_RGB; stored = JCS_RGB; comps = 3; }
	else if (!strcmp(space, "cmyk")) { in = JCS_CMYK; stored = JCS_CMYK; comps = 4; }
	else if (!strcmp(space, "ycck")) { in = JCS_CMYK; stored = JCS_YCCK; comps = 4; }
	else { fprintf(stderr, "jpeg_writer: unknown space %s\n", space); return 2; }
	for (int i = 5; i < argc; i++) {
		if (!strncmp(argv[i], "quality=", 8)) quality = atoi(argv[i] + 8);
		else if (!strncmp(argv[i], "sample=", 7)) sample = argv[i] + 7;
		else if (!strncmp(argv[i], "restart=", 8)) restart = atoi(argv[i] + 8);
		else if (!strncmp(argv[i], "progressive=", 12)) progressive = atoi(argv[i] + 12);
		else if (!strncmp(argv[i], "arithmetic=", 11)) arithmetic = atoi(argv[i] + 11);
		else if (!strncmp(argv[i], "adobe=", 6)) adobe = atoi(argv[i] + 6);
		else { fprintf(stderr, "jpeg_writer: unknown option %s\n", argv[i]); return 2; }
	}
	px = malloc((size_t)w * h * comps);
	if (!px || fread(px, 1, (size_t)w * h * comps, stdin) != (size_t)w * h * comps) {
		fprintf(stderr, "jpeg_writer: short input\n");
		return 1;
	}
	if (!(out = fopen(argv[4], "wb"))) {
		perror(argv[4]);
		return 1;
	}
	c.err = jpeg_std_error(&e);
	jpeg_create_compress(&c);
	jpeg_stdio_dest(&c, out);
	c.image_width = (JDIMENSION)w;
	c.image_height = (JDIMENSION)h;
	c.input_components = comps;
	c.in_color_space = in;
	jpeg_set_defaults(&c);
	jpeg_set_colorspace(&c, stored);
	jpeg_set_quality(&c, quality, TRUE);
	if (sample) {
		const char *p = sample;
		for (int k = 0; k < c.num_components && *p; k++) {
			int hs, vs;
			if (sscanf(p, "%dx%d", &hs, &vs) != 2) { fprintf(stderr, "jpeg_writer: bad sample\n"); return 2; }
			c.comp_info[k].h_samp_factor = hs;
			c.comp_info[k].v_samp_factor = vs;
			p = strchr(p, ',');
			if (!p) break;
			p++;
		}
	}
	c.restart_interval = (unsigned)restart;
	c.arith_code = arithmetic ? TRUE : FALSE;
	if (adobe >= 0)
		c.write_Adobe_marker = adobe ? TRUE : FALSE;
	if (progressive)
		jpeg_simple_progression(&c);
	jpeg_start_compress(&c, TRUE);
	while (c.next_scanline < c.image_height) {
		JSAMPROW row = px + (size_t)c.next_scanline * w * comps;
		jpeg_write_scanlines(&c, &row, 1);
	}
	jpeg_finish_compress(&c);
	jpeg_destroy_compress(&c);
	fclose(out);
	free(px);
	return 0;
}
