/*
 * backend.c -- what every backend shares: the recorded failure of an op,
 * and the check at model open that a backend has every op the model calls.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include "backend/backend.h"

void hi3i_backend_fail(hi3_backend *be, const char *fmt, ...)
{
	va_list ap;

	if (be->err.status)
		return;
	va_start(ap, fmt);
	vsnprintf(be->err.msg, sizeof(be->err.msg), fmt, ap);
	va_end(ap);
	be->err.status = HI3_ERR_RUNTIME;
}

int hi3i_backend_failed(const hi3_backend *be, hi3_error *err)
{
	if (!be->err.status)
		return 0;
	if (err)
		*err = be->err;
	return -1;
}

int hi3i_backend_check(const hi3_backend *be, hi3_error *err)
{
	/* every op but matmul_group, which the model can do without */
#define OP(name) {#name, offsetof(hi3_backend_ops, name)}
	static const struct {
		const char *name;
		size_t off;
	} required[] = {
		OP(destroy), OP(alloc), OP(free), OP(upload), OP(download), OP(mem_free), OP(weight), OP(weight_free),
		OP(kv_attach), OP(kv_detach), OP(kv_layer), OP(kv_sync_host), OP(matmul), OP(embed), OP(rmsnorm),
		OP(zero), OP(add), OP(rope_qk), OP(kv_store), OP(attention), OP(swiglu), OP(gather), OP(scatter_add),
	};
#undef OP
	for (size_t i = 0; i < HI3_ARRAY_SIZE(required); i++) {
		void (*const *fn)(void) = (void (*const *)(void))((const char *)be->ops + required[i].off);
		if (!*fn)
			return hi3_error_set(err, HI3_ERR_USAGE, "the %s backend has no '%s' op, which the model needs",
			                     be->name, required[i].name);
	}
	return 0;
}
