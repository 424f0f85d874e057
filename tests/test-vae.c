/*
 * test-vae.c -- the VAE (model/vae.c) against upstream's own
 * AutoencoderKLConv3D (tests/ref/vae_ref.py; fixtures in
 * tests/fixtures/vae: vae-tiny, and vae-nomatch for the constructor's other
 * branches: unmatched resample channels, so ResnetBlocks with a
 * nin_shortcut, factors 8 and 2, a shift_factor): decoder images and
 * encoder mean/logvar at two sizes within 1e-5 relative, fp32; the weights are
 * regenerated here by tests/vae-model.c's generator and checked against
 * the fixture's checksum. Then what must hold beyond the fixtures: a
 * batch gives each image's bits alone (CPU), the latent of a posterior,
 * the pixel conversion, and a model without a VAE says which tensor or
 * block it lacks.
 *
 * Built for the CPU backend (tests/test-vae) and for the CUDA backend on
 * the emulator (tests/test-vae-cuda-emu: the fixtures at the smaller
 * size, the emulator's GEMM being slow) or a GPU (tests/test-vae-cuda,
 * both sizes). SRCDIR locates the fixtures.
 */
#include "config.h"
#include <math.h>
#include <string.h>
#include <unistd.h>
#include "core/internal.h"
#include "tap.h"
#include "cuda-test.h"
#include "testdir.h"
#include "vae-model.h"

#define TOL 1e-5

static char *root;

static const hi3_tensor *get(const hi3_st *st, const char *fmt, int i)
{
	char nm[64];
	const hi3_tensor *t;

	snprintf(nm, sizeof(nm), fmt, i);
	t = hi3_st_find(st, nm);
	if (!t || t->dtype != HI3_F32) {
		printf("Bail out! fixture tensor %s missing or not F32\n", nm);
		exit(1);
	}
	return t;
}

static void compare(const char *what, const float *out, const hi3_tensor *ref)
{
	const size_t n = (size_t)hi3_tensor_numel(ref);
	double e = rel_err(out, ref->data, n);

	ok(e <= TOL, "%s: |hi3 - upstream| / |upstream| = %.2e (at most %.0e)", what, e, TOL);
}

static void test_fixtures(hi3_vae *v, const hi3_st *fx, const char *backend)
{
	const hi3_vae_config *c = hi3_vae_get_config(v);
	const int f = c->ffactor_spatial, z = c->latent_channels;

#ifdef HI3_CUDA_EMU
	const int sizes = 1;
#else
	const int sizes = 2;
#endif

	for (int i = 0; i < sizes; i++) {
		const hi3_tensor *lat = get(fx, "dec.latent.%d", i), *img = get(fx, "dec.image.%d", i);
		const hi3_tensor *in = get(fx, "enc.image.%d", i), *mean = get(fx, "enc.mean.%d", i);
		const hi3_tensor *lv = get(fx, "enc.logvar.%d", i), *noise = get(fx, "enc.noise.%d", i);
		const hi3_tensor *el = get(fx, "enc.latent.%d", i);
		const int h = (int)lat->shape[2], w = (int)lat->shape[3], H = (int)in->shape[2], W = (int)in->shape[3];
		const size_t nz = (size_t)z * (H / f) * (W / f);
		float *out = malloc(sizeof(float) * 3 * (size_t)h * w * f * f), *m = malloc(sizeof(float) * nz),
		      *l = malloc(sizeof(float) * nz), *x = malloc(sizeof(float) * nz);
		hi3_error err = {0};
		char what[128];

		HI3_ASSERT(out && m && l && x);
		snprintf(what, sizeof(what), "%s decode %dx%d -> %dx%d", backend, h, w, h * f, w * f);
		if (hi3_vae_decode(v, lat->data, 1, h, w, out, &err))
			ok(0, "%s: %s", what, err.msg);
		else
			compare(what, out, img);
		snprintf(what, sizeof(what), "%s encode %dx%d", backend, H, W);
		if (hi3_vae_encode(v, in->data, 1, H, W, m, l, &err)) {
			ok(0, "%s: %s", what, err.msg);
		} else {
			char w2[256];
			snprintf(w2, sizeof(w2), "%s: posterior mean", what);
			compare(w2, m, mean);
			snprintf(w2, sizeof(w2), "%s: posterior logvar", what);
			compare(w2, l, lv);
			/* the sample from the fixture's noise, from upstream's mean and logvar */
			hi3_vae_latent(v, mean->data, lv->data, noise->data, nz, x);
			snprintf(w2, sizeof(w2), "%s: sampled latent (mean + exp(logvar/2) noise) scaled", what);
			compare(w2, x, el);
		}
		free(out), free(m), free(l), free(x);
	}
}

/* Two latents decoded together give the bits of each alone; so do two
 * images encoded together. */
static void test_batch(hi3_vae *v, const hi3_st *fx)
{
	const hi3_tensor *lat = get(fx, "dec.latent.%d", 0), *in = get(fx, "enc.image.%d", 0);
	const int h = (int)lat->shape[2], w = (int)lat->shape[3], H = (int)in->shape[2], W = (int)in->shape[3];
	const int f = hi3_vae_get_config(v)->ffactor_spatial, z = hi3_vae_get_config(v)->latent_channels;
	const size_t nl = (size_t)hi3_tensor_numel(lat), ni = (size_t)hi3_tensor_numel(in), no = 3 * (size_t)h * w * f * f;
	const size_t nz = (size_t)z * h * w;
	float *l2 = malloc(sizeof(float) * 2 * nl), *o2 = malloc(sizeof(float) * 2 * no), *o1 = malloc(sizeof(float) * no);
	float *i2 = malloc(sizeof(float) * 2 * ni), *m2 = malloc(sizeof(float) * 4 * nz), *m1 = malloc(sizeof(float) * 2 * nz);
	hi3_error err = {0};

	HI3_ASSERT(l2 && o2 && o1 && i2 && m2 && m1);
	for (size_t i = 0; i < nl; i++) {
		l2[i] = 0.5f * ((const float *)lat->data)[i];
		l2[nl + i] = ((const float *)lat->data)[i];
	}
	for (size_t i = 0; i < ni; i++) {
		i2[i] = -((const float *)in->data)[i];
		i2[ni + i] = ((const float *)in->data)[i];
	}
	ok(hi3_vae_decode(v, l2, 2, h, w, o2, &err) == 0 && hi3_vae_decode(v, l2 + nl, 1, h, w, o1, &err) == 0 &&
	   !memcmp(o1, o2 + no, sizeof(float) * no), "decode: the second of a batch of 2 gives its bits alone %s",
	   err.msg);
	ok(hi3_vae_encode(v, i2, 2, H, W, m2, m2 + 2 * nz, &err) == 0 &&
	   hi3_vae_encode(v, i2 + ni, 1, H, W, m1, m1 + nz, &err) == 0 && !memcmp(m1, m2 + nz, sizeof(float) * nz) &&
	   !memcmp(m1 + nz, m2 + 3 * nz, sizeof(float) * nz), "encode: the second of a batch of 2 gives its bits alone %s",
	   err.msg);
	free(l2), free(o2), free(o1), free(i2), free(m2), free(m1);
}

static void test_latent_and_pixels(hi3_vae *v)
{
	const hi3_vae_config *c = hi3_vae_get_config(v);
	const float mean[3] = {1.0f, -2.0f, 0.25f}, lv[3] = {0.0f, 2.0f, -30.0f}, noise[3] = {0.5f, 1.0f, -1.0f};
	float x[3];
	/* image (3, 1, 4): pixel p of channel c at c * 4 + p */
	const float im[12] = {-1.0f, 1.0f, 0.0f, 2.0f, -3.0f, -0.5f, 0.25f, 0.5f, -0.999f, 0.999f, 1e-7f, 0.0f};
	static const uint8_t want[12] = {0, 0, 0, 255, 64, 255, 128, 159, 128, 255, 191, 128};
	uint8_t rgb[12];
	int good = 1;

	hi3_vae_latent(v, mean, lv, NULL, 3, x);
	for (int i = 0; i < 3; i++)
		good &= x[i] == mean[i] * (float)c->scaling_factor;
	ok(good, "latent without noise: the posterior mean times scaling_factor");
	hi3_vae_latent(v, mean, lv, noise, 3, x);
	ok(x[1] == (-2.0f + expf(1.0f) * 1.0f) * (float)c->scaling_factor, "latent with noise: mean + exp(logvar/2) noise");
	hi3_vae_to_rgb8(im, 1, 4, rgb);
	ok(!memcmp(rgb, want, 12), "pixels: round(clamp(x/2 + 0.5, 0, 1) 255), 127.5 to 128: "
	   "%d %d %d | %d %d %d | %d %d %d | %d %d %d", rgb[0], rgb[1], rgb[2], rgb[3], rgb[4], rgb[5], rgb[6], rgb[7],
	   rgb[8], rgb[9], rgb[10], rgb[11]);
}

static void test_missing(const hi3_vae_config *c)
{
	char *dir = hi3i_asprintf("%s/enc-only", root), *dir2 = hi3i_asprintf("%s/no-block", root);
	char *dir3 = hi3i_asprintf("%s/text", root), *cfg;
	hi3_vae_config other = *c;
	hi3_error err = {0};
	hi3_vae *v = NULL;
	hi3_model *m = NULL;
	/* the tiny preset without its image modules */
	hi3_init_opts io = {.preset = "tiny", .seed = 1, .dtype = HI3_F32, .overrides = "{\"vae\": null}"};

	HI3_ASSERT(dir && dir2 && dir3);
	ok(vae_model_write(dir, c, HI3_VAE_ENCODER, 1, HI3_F32, NULL, &err) == 0, "an encoder-only VAE %s", err.msg);
	ok(hi3_vae_open_dir(&v, dir, NULL, HI3_VAE_DECODER, &err) != 0 && err.status == HI3_ERR_INPUT && !v &&
	   strstr(err.msg, "'vae.decoder.conv_in.weight'") && strstr(err.msg, "no VAE decoder"),
	   "its decoder: an input error naming the missing tensor: %s", err.msg);
	memset(&err, 0, sizeof(err));
	ok(hi3_vae_open_dir(&v, dir, NULL, HI3_VAE_ENCODER, &err) == 0, "its encoder opens %s", err.msg);
	hi3_vae_close(v);
	v = NULL;
	/* weights of another latent width than the config says */
	other.latent_channels = c->latent_channels / 2;
	ok(vae_model_write(dir, &other, HI3_VAE_DECODER, 1, HI3_F32, NULL, &err) == 0, "a decoder of latent %d",
	   other.latent_channels);
	cfg = vae_model_config_json(c);
	{
		char *path = hi3i_asprintf("%s/config.json", dir);
		HI3_ASSERT(path && cfg && hi3i_write_file(path, cfg, strlen(cfg), &err) == 0);
		free(path);
	}
	ok(hi3_vae_open_dir(&v, dir, NULL, HI3_VAE_DECODER, &err) != 0 && err.status == HI3_ERR_INPUT &&
	   strstr(err.msg, "'vae.decoder.conv_in.weight'") && strstr(err.msg, "expected (64, 16, 3, 3, 3)") &&
	   strstr(err.msg, "found (64, 8, 3, 3, 3)"), "... under a config of latent %d: the tensor and both shapes: %s",
	   c->latent_channels, err.msg);
	free(cfg);
	/* a model without a vae block */
	memset(&err, 0, sizeof(err));
	ok(hi3_init_model(dir3, &io, &err) == 0 && hi3_model_open(&m, dir3, NULL, &err) == 0, "a tiny text model %s", m ? "" :
	   err.msg);
	ok(m && hi3_vae_open(&v, m, HI3_VAE_DECODER, &err) != 0 && err.status == HI3_ERR_INPUT &&
	   strstr(err.msg, "no 'vae' block") && strstr(err.msg, "config.json"),
	   "hi3_vae_open on it: an input error naming config.json: %s", err.msg);
	hi3_model_close(m);
	ok(hi3_vae_open_dir(&v, dir3, NULL, HI3_VAE_DECODER, &err) != 0 && err.status == HI3_ERR_INPUT,
	   "hi3_vae_open_dir on it: %s", err.msg);
	free(dir), free(dir2), free(dir3);
}

/* The tests of one fixture file NAME (tests/fixtures/vae/NAME.safetensors);
 * the others only on the first (tiny) and the CPU. */
static void run_fixture(const char *srcdir, const char *name, const char *backend, int more)
{
	char *path = hi3i_asprintf("%s/tests/fixtures/vae/%s.safetensors", srcdir, name), *cfgtext = NULL, *dir;
	/* the backend's default: on for the CPU, off (cuBLAS) for CUDA */
	hi3_model_opts mo = {.backend = backend, .threads = 2, .batch_invariant = strcmp(backend, "cuda") != 0};
	hi3_error err = {0};
	hi3_vae_config c;
	hi3_st *fx = NULL;
	hi3_vae *v = NULL;
	double sum = 0, want;
	int64_t seed;

	dir = hi3i_asprintf("%s/%s", root, name);
	if (!path || !dir || hi3_st_open(&fx, path, HI3_ST_READ, &err) ||
	    !(cfgtext = hi3i_asprintf("{\"vae\": %s}", hi3_st_meta(fx, "vae"))) ||
	    hi3_vae_config_parse(&c, cfgtext, path, &err) || hi3i_parse_i64(hi3_st_meta(fx, "seed"), 0, INT64_MAX, &seed) ||
	    hi3i_parse_f64(hi3_st_meta(fx, "checksum"), &want)) {
		printf("Bail out! %s: %s\n", path ? path : name, err.msg);
		exit(1);
	}
	diag("fixtures: %s (upstream %s, torch %s)", path, hi3_st_meta(fx, "upstream"), hi3_st_meta(fx, "torch"));
	ok(vae_model_write(dir, &c, HI3_VAE_DECODER | HI3_VAE_ENCODER, (uint64_t)seed, HI3_F32, &sum, &err) == 0,
	   "%s: the weights %s", name, err.msg);
	ok(fabs(sum - want) <= 1e-9 * fabs(want), "%s: weights' checksum %.12g equals upstream's %.12g (the same "
	   "generator, the same tensors)", name, sum, want);
	if (hi3_vae_open_dir(&v, dir, &mo, HI3_VAE_DECODER | HI3_VAE_ENCODER, &err)) {
		ok(0, "open %s on %s: %s", name, backend, err.msg);
	} else {
		char label[64];
		snprintf(label, sizeof(label), "%s %s", name, backend);
		test_fixtures(v, fx, label);
		if (more) {
			test_batch(v, fx);
			test_latent_and_pixels(v);
			test_missing(&c);
		}
	}
	hi3_vae_close(v);
	hi3_st_close(fx);
	free(path), free(cfgtext), free(dir);
}

int main(void)
{
	const char *srcdir = getenv("SRCDIR") ? getenv("SRCDIR") : ".";
#if defined(HI3_CUDA_EMU) || defined(HI3_VAE_TEST_CUDA)
	const char *backend = "cuda";
#else
	const char *backend = "cpu";
#endif

	if (!(root = testdir_new("test-vae")))
		return 1;
	run_fixture(srcdir, "vae-tiny", backend, !strcmp(backend, "cpu"));
	run_fixture(srcdir, "vae-nomatch", backend, 0);
	testdir_done(root);
	return done_testing();
}
