/*
 * tools.h -- internal pieces shared by the inspection tools (inspect.c,
 * diff.c, colormap.c, plot.c); not installed.
 */
#ifndef HI3_TOOLS_H
#define HI3_TOOLS_H

#include <jansson.h>
#include "core/internal.h"
#include "tools/hi3-tools.h"

/* XOR of the n 64-bit words at a (32-byte aligned), read as parts (1, 2
 * or HI3I_READ_PARTS) equal parts side by side: the plain streaming read. */
uint64_t hi3i_read_xor_parts(const uint64_t *a, size_t n, int parts);

/* Parts a thread's read is split in: one stream of each at a time read
 * faster than one stream alone, and more than 4 no faster (an AMD EPYC
 * VM, 2 vCPUs, 248 MB, 15 rounds: two threads read 23.8 GB/s as 1 stream
 * each, 28.8 as 2, 30.8 as 4, 30.4 as 8; one thread 14.6, 22.2, 25.2 and
 * 25.1 GB/s; docs/PERFORMANCE.md, "Decode at B = 1, tenth round"). */
#define HI3I_READ_PARTS 4

/* hi3i_read_xor_parts(a, n, HI3I_READ_PARTS): the read that `hi3 bench`
 * takes as a decode step's floor (bench.c). */
uint64_t hi3i_read_xor(const uint64_t *a, size_t n);

/* Natural name order: digit runs compare as numbers ("k.2" < "k.10"). */
int hi3i_natcmp(const char *a, const char *b);

/* A numpy-style selection of a tensor: one item per dimension, each an
 * index (the dimension is dropped) or start:stop:step (kept). */
typedef struct hi3i_slice {
	int ndim;                        /* of the source tensor */
	int64_t start[HI3_MAX_DIMS];
	int64_t step[HI3_MAX_DIMS];
	int64_t count[HI3_MAX_DIMS];     /* elements selected along the dimension */
	int keep[HI3_MAX_DIMS];          /* 0: a single index */
} hi3i_slice;

/* Parse spec ("" or NULL: everything) against shape; errors are usage
 * errors (status 2) naming the spec, the dimension and its size. */
int hi3i_slice_parse(hi3i_slice *s, const char *spec, int ndim, const int64_t *shape, hi3_error *err);
/* Shape of the selection (kept dimensions only); returns its ndim. */
int hi3i_slice_shape(const hi3i_slice *s, int64_t *shape);
int64_t hi3i_slice_numel(const hi3i_slice *s);
/* Source index (all dimensions) of the i-th selected element, row major
 * over the selection. */
void hi3i_slice_src(const hi3i_slice *s, int64_t i, int64_t *src);

/* Row-major flat offset of a multi-index. */
int64_t hi3i_flat(int ndim, const int64_t *shape, const int64_t *idx);

/* A double as a JSON value: a real (or an integer when it is one, and
 * as_int), or the strings "NaN", "Infinity", "-Infinity". */
json_t *hi3i_json_num(double v, int as_int);

/* Write root (consumed) to f as JSON and a newline, with json_dumps
 * flags (JSON_PRESERVE_ORDER added). */
int hi3i_json_emit(FILE *f, json_t *root, size_t flags, hi3_error *err);

/* hi3 inspect of a picture file (inspect-picture.c): the report to f, and
 * o->png the RGB after the orientation. */
int hi3i_inspect_picture(const char *path, const hi3_inspect_opts *o, FILE *f, hi3_error *err);

/* Colour maps for PNG rendering (colormap.c): n values to RGB (3 bytes each). With
 * diverging, [-m, m] (m = max(|lo|, |hi|)) maps blue - white - red; else
 * [lo, hi] maps a dark-to-bright ramp. NaN is magenta; +-Inf take the ends. */
void hi3i_colormap(const double *v, int64_t n, double lo, double hi, int diverging, uint8_t *rgb);
/* Expand a (rows, cols) RGB image so each cell is scale x scale pixels. */
uint8_t *hi3i_upscale(const uint8_t *rgb, int rows, int cols, int scale, hi3_error *err);
/* Pixels per cell for a (rows, cols) picture: 1024 / max(rows, cols)
 * clamped to [1, 16]. */
int hi3i_auto_scale(int64_t rows, int64_t cols);

/* An RGB canvas (plot.c): rectangles, lines width px thick, and text in a
 * 5x7 font at scale (each glyph 5 scale wide, 7 scale high, advancing 6
 * scale; returns the width drawn). Drawing outside is clipped. */
typedef struct hi3i_canvas {
	int w, h;
	uint8_t *rgb;                    /* (h, w, 3) */
} hi3i_canvas;
int hi3i_canvas_init(hi3i_canvas *c, int w, int h, const uint8_t bg[3], hi3_error *err);
void hi3i_canvas_release(hi3i_canvas *c);
void hi3i_canvas_rect(hi3i_canvas *c, int x, int y, int w, int h, const uint8_t rgb[3]);
void hi3i_canvas_line(hi3i_canvas *c, int x0, int y0, int x1, int y1, int width, const uint8_t rgb[3]);
int hi3i_canvas_text(hi3i_canvas *c, int x, int y, const char *s, int scale, const uint8_t rgb[3]);
int hi3i_canvas_write(const hi3i_canvas *c, const char *path, hi3_error *err);

/* A checkpoint directory's model for hi3 inspect (inspect-model.c): the
 * variant and why, config.json's fields by role, warnings, generation
 * defaults, buckets; {"error": ...} when config.json is refused; NULL
 * without config.json. hi3i_inspect_model_text prints it. */
json_t *hi3i_inspect_model(const char *dir);
void hi3i_inspect_model_text(FILE *f, json_t *m);

#endif
