/*
 * test-heads.c -- the image heads (model/heads.c) against upstream's own
 * TimestepEmbedder, UNetDown (patch_embed) and UNetUp (final_layer), run by
 * tests/ref/diffusion_ref.py on the models `hi3 init-model` makes at seed 1
 * (tiny in f32; tiny-distil in bf16, whose guidance_emb and timestep_r_emb
 * it adds): every output within 1e-5 relative (L2), fp32. Then what the
 * fixtures do not show: the sinusoid's layout (cos first), a row's bits
 * alone and in a batch, and the refusals of a model without heads.
 * Built for the CPU backend (tests/test-heads) and for the CUDA backend on
 * the emulator (tests/test-heads-cuda-emu), whose ops the heads run on.
 * SRCDIR locates the fixtures.
 */
#include <math.h>
#include <string.h>
#include "model/heads.h"
#include "model/model.h"
#include "tap.h"
#include "cuda-test.h"
#include "testdir.h"

/* fp32 weights: 1e-5 relative (L2). The CUDA backend multiplies bf16
 * weights in bf16 (activations rounded to bf16, fp32 accumulation), so
 * tiny-distil there is held to 1e-2, the bf16 tolerance of test-cuda-ops. */
#define TOL 1e-5
#define TOL_BF16_CUDA 1e-2
static double tol = TOL;

#ifdef HI3_CUDA_EMU
static const char *backend = "cuda";
#else
static const char *backend = "cpu";
#endif
static char *root;

static const hi3_tensor *fx(const hi3_st *st, const char *name)
{
	const hi3_tensor *t = hi3_st_find(st, name);

	if (!t || t->dtype != HI3_F32) {
		printf("Bail out! fixture tensor %s missing or not F32\n", name);
		exit(1);
	}
	return t;
}

static void *dev(hi3_backend *be, const void *host, size_t bytes)
{
	void *d = be->ops->alloc(be, bytes);

	HI3_ASSERT(d && (!host || be->ops->upload(be, d, host, bytes) == 0));
	return d;
}

static void compare(const char *what, hi3_backend *be, const float *dout, const hi3_tensor *ref)
{
	size_t n = (size_t)hi3_tensor_numel(ref);
	float *out = malloc(sizeof(float) * n);
	double e;

	HI3_ASSERT(out && be->ops->download(be, out, dout, sizeof(float) * n) == 0);
	e = rel_err(out, ref->data, n);
	ok(e <= tol, "%s: |hi3 - upstream| / |upstream| = %.2e (at most %.0e)", what, e, tol);
	free(out);
}

static void run(const char *srcdir, const char *stem, const char *preset, hi3_dtype dt)
{
	char *dir = hi3i_asprintf("%s/%s", root, stem), *path = hi3i_asprintf("%s/tests/fixtures/diffusion/%s.safetensors",
	                                                                        srcdir, stem);
	hi3_init_opts io = {.preset = preset, .seed = 1, .dtype = dt, .dtype_given = 1};
	/* the backend's default: on for the CPU, off (cuBLAS) for CUDA */
	hi3_model_opts mo = {.backend = backend, .threads = 2, .batch_invariant = strcmp(backend, "cuda") != 0};
	hi3_model *m = NULL;
	hi3_st *st = NULL;
	struct hi3i_heads *hd = NULL;
	hi3_error err = {0};
	hi3_backend *be;

	tol = dt == HI3_BF16 && strcmp(backend, "cpu") ? TOL_BF16_CUDA : TOL;
	if (hi3_st_open(&st, path, HI3_ST_READ, &err)) {
		printf("Bail out! %s\n", err.msg);
		exit(1);
	}
	if (hi3_init_model(dir, &io, &err) || hi3_model_open(&m, dir, &mo, &err) ||
	    hi3i_heads_open(&hd, m->be, m->ck, &m->cfg, m->dir, &err)) {
		ok(0, "%s: the model and its heads: %s", preset, err.msg);
		goto out;
	}
	be = m->be;
	{
		const hi3_tensor *t = fx(st, "t"), *x = fx(st, "pe.x"), *hid = fx(st, "fl.hidden");
		const int n = (int)t->shape[0], R = (int)x->shape[0], Z = (int)x->shape[1], h = (int)x->shape[2];
		const int w = (int)x->shape[3], H = m->cfg.hidden_size, N = h * w;
		float *temb = dev(be, NULL, sizeof(float) * (size_t)n * H), *xcl = malloc(sizeof(float) * (size_t)R * N * Z);
		float *dx, *out = dev(be, NULL, sizeof(float) * (size_t)R * N * H), *te = dev(be, NULL, sizeof(float) * (size_t)R * H);
		float *dh = dev(be, hid->data, hid->nbytes), *v = dev(be, NULL, sizeof(float) * (size_t)R * N * Z);
		float *vp = malloc(sizeof(float) * (size_t)R * N * Z), *vh = malloc(sizeof(float) * (size_t)R * N * Z);
		char what[160];

		HI3_ASSERT(xcl && vp && vh && n == R);
		for (int k = 0; k < HI3I_TEMB_COUNT; k++) {
			char nm[64];
			snprintf(nm, sizeof(nm), "temb.%s", hi3i_temb_names[k]);
			if (!hi3_st_find(st, nm))
				continue;
			snprintf(what, sizeof(what), "%s %s: %s of t = (%g, %g)", backend, preset, hi3i_temb_names[k],
			         ((float *)t->data)[0], ((float *)t->data)[1]);
			if (hi3i_heads_temb(hd, k, t->data, n, temb, &err))
				ok(0, "%s: %s", what, err.msg);
			else
				compare(what, be, temb, fx(st, nm));
		}
		/* planar (R, Z, h, w) to channels-last (R, h, w, Z) */
		for (int r = 0; r < R; r++)
			for (int c = 0; c < Z; c++)
				for (int p = 0; p < N; p++)
					xcl[((size_t)r * N + p) * Z + c] = ((float *)x->data)[((size_t)r * Z + c) * N + p];
		dx = dev(be, xcl, sizeof(float) * (size_t)R * N * Z);
		snprintf(what, sizeof(what), "%s %s: patch_embed of a %d x %d x %d latent (2 images), conditioned on "
		         "time_embed", backend, preset, Z, h, w);
		if (hi3i_heads_temb(hd, HI3I_TEMB_PATCH, t->data, n, te, &err) ||
		    hi3i_heads_patch_embed(hd, dx, R, h, w, te, out, &err))
			ok(0, "%s: %s", what, err.msg);
		else
			compare(what, be, out, fx(st, "pe.out"));
		snprintf(what, sizeof(what), "%s %s: final_layer of %d image tokens' hidden states, conditioned on "
		         "time_embed_2", backend, preset, N);
		if (hi3i_heads_temb(hd, HI3I_TEMB_FINAL, t->data, n, te, &err) ||
		    hi3i_heads_final(hd, dh, R, h, w, te, v, &err)) {
			ok(0, "%s: %s", what, err.msg);
		} else {
			const hi3_tensor *ref = fx(st, "fl.out");
			HI3_ASSERT(be->ops->download(be, vh, v, sizeof(float) * (size_t)R * N * Z) == 0);
			for (int r = 0; r < R; r++)
				for (int c = 0; c < Z; c++)
					for (int p = 0; p < N; p++)
						vp[((size_t)r * Z + c) * N + p] = vh[((size_t)r * N + p) * Z + c];
			ok(rel_err(vp, ref->data, (size_t)R * N * Z) <= tol, "%s: |hi3 - upstream| / |upstream| = %.2e "
			   "(at most %.0e)", what, rel_err(vp, ref->data, (size_t)R * N * Z), tol);
			/* the second image alone gives its bits of the batch of 2 */
			if (!strcmp(preset, "tiny") && !strcmp(backend, "cpu")) {
				float *v1 = dev(be, NULL, sizeof(float) * (size_t)N * Z), *h1 = malloc(sizeof(float) * (size_t)N * Z);
				HI3_ASSERT(h1);
				ok(hi3i_heads_final(hd, dh + (size_t)N * H, 1, h, w, te + H, v1, &err) == 0 &&
				   be->ops->download(be, h1, v1, sizeof(float) * (size_t)N * Z) == 0 &&
				   !memcmp(h1, vh + (size_t)N * Z, sizeof(float) * (size_t)N * Z),
				   "final_layer: the second image alone gives its bits of the batch %s", err.msg);
				be->ops->free(be, v1);
				free(h1);
			}
		}
		be->ops->free(be, temb), be->ops->free(be, dx), be->ops->free(be, out), be->ops->free(be, te);
		be->ops->free(be, dh), be->ops->free(be, v);
		free(xcl), free(vp), free(vh);
	}
out:
	hi3i_heads_close(hd);
	hi3_model_close(m);
	hi3_st_close(st);
	free(dir), free(path);
}

static void test_sinusoid(void)
{
	float e[HI3I_TEMB_FREQ];
	int good = 1;

	hi3i_timestep_sinusoid(0.0f, e);
	for (int k = 0; k < HI3I_TEMB_FREQ / 2; k++)
		good &= e[k] == 1.0f && e[HI3I_TEMB_FREQ / 2 + k] == 0.0f;
	ok(good, "sinusoid of t = 0: 128 cosines of 1 first, then 128 sines of 0");
	hi3i_timestep_sinusoid(500.0f, e);
	ok(e[0] == cosf(500.0f) && e[128] == sinf(500.0f) && fabsf(e[127] - cosf(500.0f * expf(-logf(10000.0f) *
	   127.0f / 128.0f))) < 1e-6f, "sinusoid of t = 500: frequency 1 first, 10000^(-127/128) last");
}

static void test_refusals(void)
{
	char *dir = hi3i_asprintf("%s/text", root);
	hi3_init_opts io = {.preset = "tiny", .seed = 1, .dtype = HI3_F32, .overrides = "{\"vae\": null}"};
	hi3_model *m = NULL;
	struct hi3i_heads *hd = NULL;
	hi3_error err = {0};

	ok(hi3_init_model(dir, &io, &err) == 0 && hi3_model_open(&m, dir, NULL, &err) == 0, "a text-only tiny model %s",
	   err.msg);
	ok(m && hi3i_heads_open(&hd, m->be, m->ck, &m->cfg, m->dir, &err) != 0 && !hd && err.status == HI3_ERR_INPUT &&
	   strstr(err.msg, "vae"), "its heads: an input error (no vae block for the latent channels): %s", err.msg);
	hi3_model_close(m);
	free(dir);
}

int main(void)
{
	const char *srcdir = getenv("SRCDIR") ? getenv("SRCDIR") : ".";

	root = testdir_new("heads");
	run(srcdir, "heads-tiny", "tiny", HI3_F32);
	run(srcdir, "heads-distil", "tiny-distil", HI3_BF16);
	test_sinusoid();
	test_refusals();
	testdir_done(root);
	return done_testing();
}
