/*
 * backend.c -- what every backend shares: the recorded failure of an op,
 * the check at model open that a backend has every op the model calls,
 * and making a backend by name.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
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

#define OP(name) {#name, offsetof(hi3_backend_ops, name)}
struct op_entry {
	const char *name;
	size_t off;
};

static int check_ops(const hi3_backend *be, const struct op_entry *ops, size_t n, const char *who, hi3_error *err)
{
	for (size_t i = 0; i < n; i++) {
		void (*const *fn)(void) = (void (*const *)(void))((const char *)be->ops + ops[i].off);
		if (!*fn)
			return hi3_error_set(err, HI3_ERR_USAGE, "the %s backend has no '%s' op, which %s", be->name,
			                     ops[i].name, who);
	}
	return 0;
}

int hi3i_backend_check(const hi3_backend *be, hi3_error *err)
{
	/* every op but matmul_group, which the model can do without */
	static const struct op_entry required[] = {
		OP(destroy), OP(alloc), OP(free), OP(upload), OP(download), OP(mem_free), OP(weight), OP(weight_free),
		OP(kv_attach), OP(kv_detach), OP(kv_layer), OP(kv_sync_host), OP(matmul), OP(embed), OP(rmsnorm),
		OP(zero), OP(add), OP(rope_qk), OP(kv_store), OP(attention), OP(swiglu), OP(gather), OP(scatter_add),
		OP(scatter),
	};

	return check_ops(be, required, HI3_ARRAY_SIZE(required), "the model needs", err);
}

int hi3i_backend_check_image(const hi3_backend *be, hi3_error *err)
{
	static const struct op_entry image[] = {
		OP(conv), OP(bias_add), OP(groupnorm), OP(layernorm), OP(act), OP(scale_shift), OP(add_repeat),
		OP(add_group_mean), OP(depth_to_space), OP(space_to_depth), OP(attention_dense),
	};

	return check_ops(be, image, HI3_ARRAY_SIZE(image), "the image modules need", err);
}
#undef OP
