/* test-quantize.c -- hi3 quantize (hi3-quant(7)) on a sharded bf16 model
 * (tiny-release) and a one-file f32 one (tiny-moe): every quantized weight
 * within one rounding of its source (fp8: half an e4m3 step of w / scale,
 * times the scale; int8: half of SCB / 127), the layout's names, dtypes and
 * shapes, the other tensors byte-equal, the config's quantization fields,
 * a --skip pattern honoured, and an already quantized or non-float input
 * refused (status 3) with nothing written. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include "backend/quant.h"
#include "format/format.h"
#include "model/hi3-model.h"
#include "tools/hi3-tools.h"
#include "tap.h"
#include "testdir.h"

static float elem(const hi3_tensor *t, size_t i)
{
	return (float)hi3_elem_f64(t->data, t->dtype, i);
}

static char *path2(const char *a, const char *b)
{
	char *p = malloc(strlen(a) + strlen(b) + 2);
	sprintf(p, "%s/%s", a, b);
	return p;
}

/* Check out against src; returns the number of quantized weights. */
static int check(const char *src, const char *out, int int8, const char *skipped)
{
	hi3_ckpt *a = NULL, *b = NULL;
	hi3_error err = {0};
	int nq = 0, within = 1, layout = 1, kept = 1, skip_ok = 1;
	double worst = 0;

	if (hi3_ckpt_open(&a, src, &err) || hi3_ckpt_open(&b, out, &err)) {
		ok(0, "open: %s", err.msg);
		return 0;
	}
	for (int i = 0; i < hi3_ckpt_count(a); i++) {
		const hi3_tensor *s = hi3_ckpt_at(a, i), *q = hi3_ckpt_find(b, s->name), *sc;
		char nm[512];
		size_t n = strlen(s->name);

		if (!q) {
			layout = 0;
			diag("missing: %s", s->name);
			continue;
		}
		if (q->dtype == s->dtype) {
			kept &= q->nbytes == s->nbytes && !memcmp(q->data, s->data, s->nbytes);
			if (skipped && strstr(s->name, skipped) && s->ndim == 2)
				skip_ok &= 1;
			continue;
		}
		if (skipped && strstr(s->name, skipped))
			skip_ok = 0;
		nq++;
		snprintf(nm, sizeof(nm), "%.*s%s", (int)(n - 7), s->name, int8 ? ".SCB" : ".weight_scale");
		sc = hi3_ckpt_find(b, nm);
		if (!sc || sc->dtype != HI3_F32 || hi3_tensor_numel(sc) != s->shape[0] ||
		    q->dtype != (int8 ? HI3_I8 : HI3_F8_E4M3) || q->ndim != 2 || q->shape[0] != s->shape[0] ||
		    q->shape[1] != s->shape[1] || (!int8 && (sc->ndim != 2 || sc->shape[1] != 1))) {
			layout = 0;
			diag("layout of %s", s->name);
			continue;
		}
		for (int64_t r = 0; r < s->shape[0]; r++) {
			float scale;
			memcpy(&scale, (const float *)sc->data + r, 4);
			for (int64_t k = 0; k < s->shape[1]; k++) {
				const size_t e = (size_t)(r * s->shape[1] + k);
				const double w = elem(s, e);
				double deq, bound;
				if (int8) {
					deq = (double)((const int8_t *)q->data)[e] * scale / 127;
					bound = scale / 127.0 / 2 * (1 + 1e-3);
				} else {
					const double a1 = fmax(fabs(w / scale), 0x1p-6);
					deq = (double)hi3i_e4m3_to_f32(((const uint8_t *)q->data)[e]) * scale;
					bound = ldexp(1.0, ilogb(a1) - 4) * scale * (1 + 1e-6) + 4 * fabs(w) * 0x1p-24;
				}
				worst = fmax(worst, fabs(deq - w) / bound);
				within &= fabs(deq - w) <= bound;
			}
		}
	}
	ok(layout, "%s: every source tensor present, quantized ones with their scale (names, dtypes, shapes)", out);
	ok(within && nq > 0, "%s: %d weights, each value within one %s rounding of its source (worst %.3f of the bound)",
	   out, nq, int8 ? "int8" : "e4m3", worst);
	ok(kept, "%s: the tensors kept are byte-equal to the source's", out);
	if (skipped)
		ok(skip_ok, "%s: the --skip pattern's tensors are kept", out);
	hi3_ckpt_close(a);
	hi3_ckpt_close(b);
	return nq;
}

static int config_has(const char *dir, const char *method)
{
	char *p = path2(dir, "config.json");
	json_t *j = json_load_file(p, 0, NULL), *q = json_object_get(j, "quantization_config");
	int r = json_is_string(json_object_get(q, "quant_method")) &&
	        !strcmp(json_string_value(json_object_get(q, "quant_method")), method);

	json_decref(j);
	free(p);
	return r;
}

int main(void)
{
	char *dir = testdir_new("quantize");
	char *rel = path2(dir, "rel"), *moe = path2(dir, "moe"), *o1 = path2(dir, "fp8"), *o2 = path2(dir, "int8");
	char *o3 = path2(dir, "again"), *o4 = path2(dir, "skip");
	hi3_init_opts io = {.preset = "tiny-release", .seed = 3};
	hi3_quantize_opts qo = {0};
	hi3_quantize_result r;
	hi3_error err = {0};
	const char *skip[] = {"model.layers.1.*"};
	struct stat sb;
	hi3_model *m = NULL;

	ok(hi3_init_model(rel, &io, &err) == 0, "tiny-release (bf16, shards): %s", err.msg);
	io.preset = "tiny-moe";
	ok(hi3_init_model(moe, &io, &err) == 0, "tiny-moe (f32, one file)");
	ok(hi3_quantize(rel, o1, &qo, &r, &err) == 0 && r.shards == 3, "fp8 of the sharded model: its 3 files %s",
	   err.msg);
	check(rel, o1, 0, NULL);
	ok(config_has(o1, "compressed-tensors"), "fp8: config.json says compressed-tensors");
	ok(hi3_model_open(&m, o1, NULL, &err) == 0, "hi3 opens what it wrote %s", err.msg);
	hi3_model_close(m);
	m = NULL;
	qo.int8 = 1;
	ok(hi3_quantize(moe, o2, &qo, &r, &err) == 0 && r.shards == 1, "int8 of the one-file model %s", err.msg);
	check(moe, o2, 1, NULL);
	ok(config_has(o2, "bitsandbytes"), "int8: config.json says bitsandbytes");
	ok(hi3_model_open(&m, o2, NULL, &err) == 0, "hi3 opens what it wrote %s", err.msg);
	hi3_model_close(m);
	qo.int8 = 0;
	qo.skip = skip;
	qo.n_skip = 1;
	ok(hi3_quantize(moe, o4, &qo, &r, &err) == 0, "--skip 'model.layers.1.*'");
	check(moe, o4, 0, "model.layers.1.");
	qo.n_skip = 0;
	err = (hi3_error){0};
	ok(hi3_quantize(o2, o3, &qo, &r, &err) != 0 && err.status == HI3_ERR_INPUT && strstr(err.msg, "already quantized")
	   && stat(o3, &sb) != 0, "an already quantized model: status 3, nothing written (%s)", err.msg);
	testdir_done(dir);
	free(rel), free(moe), free(o1), free(o2), free(o3), free(o4);
	return done_testing();
}
