/*
 * test-mismatch.c -- hi3_mismatch_compute against the numpy reference of
 * verl's rollout-correction metrics (tests/ref/mismatch_ref.py, committed
 * as tests/fixtures/mismatch.json): every metric of every case, over all
 * rows and each row alone.
 *
 * Tolerance: both sides compute in double from the same f32 log-probs, in
 * other summation orders, so a metric agrees within 1e-12 + 1e-10 |ref|;
 * counts agree exactly; NaN must meet NaN. The standard deviations, which
 * verl takes as sqrt(E[w^2] - E[w]^2) and hi3 about the mean, agree within
 * 1e-7 (1 + |ref|): the cancellation leaves rounding of order 1e-16 in the
 * variance, 1e-8 in its square root.
 */
#include <jansson.h>
#include <math.h>
#include <string.h>
#include "hi3.h"
#include "tap.h"
#include "core/internal.h"

static int close_to(double got, double want, int is_std)
{
	if (isnan(want) || isnan(got))
		return isnan(want) && isnan(got);
	if (isinf(want))
		return got == want;
	if (is_std)
		return fabs(got - want) <= 1e-7 * (1 + fabs(want));
	return fabs(got - want) <= 1e-12 + 1e-10 * fabs(want);
}

static int bad;

static void check(const char *what, const char *key, double got, json_t *want)
{
	double w = json_is_number(want) ? json_number_value(want) : NAN;

	if (!want || !close_to(got, w, !strcmp(key, "std") || !strcmp(key, "seq_std"))) {
		diag("%s: %s = %.17g, numpy %.17g", what, key, got, w);
		bad++;
	}
}

static void check_is(const char *what, const hi3_mismatch_is *m, json_t *o)
{
	static const struct {
		const char *key;
		size_t off;
	} f[] = {
#define F(k) {#k, offsetof(hi3_mismatch_is, k)}
		F(mean), F(std), F(min), F(max), F(fraction_high), F(fraction_low), F(eff_sample_size), F(seq_mean),
		F(seq_std), F(seq_min), F(seq_max), F(seq_max_deviation), F(seq_fraction_high), F(seq_fraction_low),
#undef F
	};

	for (size_t i = 0; i < HI3_ARRAY_SIZE(f); i++)
		check(what, f[i].key, *(const double *)(const void *)((const char *)m + f[i].off),
		      json_object_get(o, f[i].key));
}

static void check_all(const char *what, const hi3_mismatch *m, json_t *o)
{
	static const struct {
		const char *key;
		size_t off;
	} f[] = {
#define F(k) {#k, offsetof(hi3_mismatch, k)}
		F(kl), F(k3_kl), F(chi2_token), F(chi2_seq), F(training_ppl), F(training_log_ppl), F(rollout_ppl),
		F(rollout_log_ppl), F(log_ppl_diff), F(log_ppl_abs_diff), F(log_ppl_diff_max), F(log_ppl_diff_min),
		F(ppl_ratio), F(log_ratio_sum),
#undef F
	};
	char sub[256];

	for (size_t i = 0; i < HI3_ARRAY_SIZE(f); i++)
		check(what, f[i].key, *(const double *)(const void *)((const char *)m + f[i].off),
		      json_object_get(o, f[i].key));
	if (m->tokens != json_integer_value(json_object_get(o, "tokens")) ||
	    m->rows != json_integer_value(json_object_get(o, "rows"))) {
		diag("%s: %lld tokens, %d rows; numpy %lld, %lld", what, (long long)m->tokens, m->rows,
		     (long long)json_integer_value(json_object_get(o, "tokens")),
		     (long long)json_integer_value(json_object_get(o, "rows")));
		bad++;
	}
	snprintf(sub, sizeof(sub), "%s, token level", what);
	check_is(sub, &m->token, json_object_get(o, "token"));
	snprintf(sub, sizeof(sub), "%s, sequence level", what);
	check_is(sub, &m->sequence, json_object_get(o, "sequence"));
}

static float *floats(json_t *a, size_t *n)
{
	float *v = calloc(json_array_size(a) + 1, sizeof(float));

	*n = json_array_size(a);
	for (size_t i = 0; v && i < *n; i++)
		v[i] = (float)json_number_value(json_array_get(a, i));
	return v;
}

int main(void)
{
	const char *srcdir = getenv("SRCDIR");
	char path[1024];
	json_error_t je;
	json_t *root, *cases, *c;
	size_t ci;
	hi3_error err = {0};

	snprintf(path, sizeof(path), "%s/tests/fixtures/mismatch.json", srcdir ? srcdir : ".");
	root = json_load_file(path, 0, &je);
	if (!ok(root != NULL, "the numpy fixture %s", path)) {
		diag("%s (line %d)", je.text, je.line);
		return done_testing();
	}
	cases = json_object_get(root, "cases");
	ok(json_array_size(cases) >= 5, "%zu cases", json_array_size(cases));
	json_array_foreach(cases, ci, c) {
		const char *name = json_string_value(json_object_get(c, "name"));
		json_t *cuj = json_object_get(c, "cu"), *rows = json_object_get(c, "rows");
		int B = (int)json_array_size(cuj) - 1;
		size_t nr, nl;
		float *rep = floats(json_object_get(c, "replay"), &nr), *rol = floats(json_object_get(c, "rollout"), &nl);
		int64_t *cu = calloc((size_t)B + 1, sizeof(int64_t));
		hi3_mismatch all, *per = calloc((size_t)B, sizeof(*per));

		for (int i = 0; i <= B; i++)
			cu[i] = json_integer_value(json_array_get(cuj, (size_t)i));
		bad = 0;
		if (ok(rep && rol && cu && per && nr == nl &&
		       hi3_mismatch_compute(rep, rol, cu, B, json_number_value(json_object_get(c, "cap")), &all, per,
		                            &err) == 0, "%s: computed", name)) {
			check_all(name, &all, json_object_get(c, "all"));
			ok(bad == 0, "%s: all rows as numpy says", name);
			bad = 0;
			for (int i = 0; i < B; i++) {
				json_t *r = json_array_get(rows, (size_t)i);
				char what[256];
				snprintf(what, sizeof(what), "%s, row %d", name, i);
				if (json_is_null(r)) {
					if (per[i].tokens != 0 || !isnan(per[i].kl)) {
						diag("%s: an empty row has metrics", what);
						bad++;
					}
				} else {
					check_all(what, &per[i], r);
				}
			}
			ok(bad == 0, "%s: each row alone as numpy says", name);
		}
		free(rep);
		free(rol);
		free(cu);
		free(per);
	}
	{
		hi3_mismatch m;
		float x = -1.0f;
		int64_t cu[2] = {0, 1};
		ok(hi3_mismatch_compute(&x, &x, cu, 1, 1.0, &m, NULL, &err) == -1 && err.status == HI3_ERR_USAGE,
		   "a cap of 1 is refused");
	}
	json_decref(root);
	return done_testing();
}
