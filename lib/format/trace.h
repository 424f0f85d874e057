/*
 * trace.h -- the names of trace points (internal; trace.c), shared by the
 * trace file module and the recorder (model/trace.c).
 */
#ifndef HI3_FORMAT_TRACE_H
#define HI3_FORMAT_TRACE_H

#include "format/format.h"

/* Tensors of the logits point (hi3_trace_point.sub). */
enum { HI3I_LOGITS_TOPK, HI3I_LOGITS_TOPK_IDS, HI3I_LOGITS_LSE, HI3I_LOGITS_SUBS };

/* 1 when the kind has one point per layer. */
int hi3i_trace_per_layer(int kind);
/* The tensor name of a point ("layer.3.q", "logits.lse", ...) into buf. */
const char *hi3i_trace_point_name(char *buf, size_t n, int kind, int layer, int sub);
/* The dtype a point is stored in, and its rank (with the token axis). */
hi3_dtype hi3i_trace_point_dtype(int kind, int sub);
int hi3i_trace_point_ndim(int kind, int sub);
/* qsort order of hi3_trace_point: forward order. */
int hi3i_trace_point_cmp(const void *a, const void *b);
#endif
