/*
 * test-vit.c -- the vision encoder and aligner (model/vit.c) against
 * upstream's own Siglip2VisionTransformer and LightProjector
 * (tests/ref/vit_ref.py; fixtures in tests/fixtures/vit: vit-tiny, three
 * pictures through upstream's image processor and one grid given directly,
 * batched; vit-gelu, another config on two grids). The weights are
 * regenerated here by tests/model-gen.c's generator and checked against
 * the fixture's checksum; the pictures go through hi3_image_vit_view (its
 * float kernel, the one torch's plain build runs) and must give upstream's
 * pixel_values bit for bit; the position grids resized per image must be
 * upstream's bit for bit; last_hidden_state and the aligner's output, pad
 * slots included, within 1e-5 relative (L2 per image), fp32.
 *
 * Then what must hold beyond the fixtures (CPU): an image gives the same
 * bits alone as in a batch, wherever it sits; bad batches are refused; a
 * model without vision weights is an input error naming what it lacks; the
 * release preset's ViT opens from its model and runs.
 *
 * Built for the CPU backend (tests/test-vit) and for the CUDA backend, on
 * the emulator (tests/test-vit-cuda-emu) or a GPU (tests/test-vit-cuda):
 * the fixtures, and the CUDA outputs against the CPU backend's on the same
 * inputs. SRCDIR locates the fixtures.
 */
#include "config.h"
#include <jansson.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include "core/internal.h"
#include "cond/image-internal.h"
#include "model/config-internal.h"
#include "model/vit.h"
#include "tap.h"
#include "cuda-test.h"
#include "testdir.h"
#include "vit-model.h"

#if defined(HI3_CUDA_EMU) || defined(HI3_VIT_TEST_CUDA)
#define TEST_CUDA 1
#endif

#define TOL 1e-5
#define MAX_ENTRIES 8

static char *root;

/* One fixture file and the batch it describes. */
struct fixture {
	const char *name;
	hi3_st *st;
	hi3_vit_config c;
	hi3_vit_aligner_config a;
	int n, P, D;
	int shapes[MAX_ENTRIES][2];
	float *pv;                /* (n, P, D) */
	int32_t *mask;            /* (n, P) */
	json_t *entries;
};

static const hi3_tensor *get(const struct fixture *fx, const char *fmt, int i, hi3_dtype dt)
{
	char nm[64];
	const hi3_tensor *t;

	snprintf(nm, sizeof(nm), fmt, i);
	t = hi3_st_find(fx->st, nm);
	if (!t || t->dtype != dt) {
		printf("Bail out! %s: fixture tensor %s missing or not %s\n", fx->name, nm, hi3_dtype_name(dt));
		exit(1);
	}
	return t;
}

static const char *entry_str(const struct fixture *fx, int i, const char *key)
{
	return json_string_value(json_object_get(json_array_get(fx->entries, (size_t)i), key));
}

static char *hex64(char buf[17], const void *data, size_t n)
{
	snprintf(buf, 17, "%016llx", (unsigned long long)hi3i_hash(HI3_HASH_INIT, data, n));
	return buf;
}

/* The configs of the fixture's metadata, through config.json as hi3 reads it. */
static void fixture_configs(struct fixture *fx, const char *dir)
{
	char *path = hi3i_asprintf("%s/config.json", dir);
	char *text = hi3i_asprintf("{\"vit\": %s, \"vit_aligner\": %s}", hi3_st_meta(fx->st, "vit"),
	                           hi3_st_meta(fx->st, "vit_aligner"));
	hi3_error err = {0};
	hi3_config cfg;

	HI3_ASSERT(path && text);
	if (hi3i_write_file(path, text, strlen(text), &err) || hi3i_config_load_partial(&cfg, path, &err)) {
		printf("Bail out! %s: %s\n", fx->name, err.msg);
		exit(1);
	}
	fx->c = cfg.vit;
	fx->a = cfg.vit_aligner;
	hi3_config_release(&cfg);
	free(path), free(text);
}

/* The inputs: pictures through hi3's ViT view, levels as given. */
static void fixture_inputs(struct fixture *fx)
{
	const int P = fx->P, D = fx->D;

	fx->pv = calloc((size_t)fx->n * P * D, sizeof(float));
	fx->mask = calloc((size_t)fx->n * P, sizeof(int32_t));
	HI3_ASSERT(fx->pv && fx->mask);
	for (int i = 0; i < fx->n; i++) {
		const hi3_tensor *sh = get(fx, "shape.%d", i, HI3_I32);
		float *pv = fx->pv + (size_t)i * P * D;
		int32_t *mask = fx->mask + (size_t)i * P;
		char hex[17], what[64];

		fx->shapes[i][0] = ((const int32_t *)sh->data)[0];
		fx->shapes[i][1] = ((const int32_t *)sh->data)[1];
		if (!strcmp(entry_str(fx, i, "kind"), "image")) {
			const hi3_tensor *im = get(fx, "image.%d", i, HI3_U8);
			hi3_image img = {.width = (int)im->shape[1], .height = (int)im->shape[0], .rgb = im->data,
			                 .name = what};
			hi3_image_vit_opts o = {.patch = fx->c.patch_size, .max_patches = P, .kernel = HI3_TV_FLOAT};
			hi3_image_vit *v = NULL;
			hi3_error err = {0};

			snprintf(what, sizeof(what), "%s picture %d", fx->name, i);
			if (hi3_image_vit_view(&v, &img, &o, &err) || v->n_patches != P || v->dim != D) {
				printf("Bail out! %s: %s\n", what, err.msg);
				exit(1);
			}
			ok(v->grid_h == fx->shapes[i][0] && v->grid_w == fx->shapes[i][1], "%s (%dx%d): grid %dx%d, "
			   "upstream's %dx%d", what, img.height, img.width, v->grid_h, v->grid_w, fx->shapes[i][0],
			   fx->shapes[i][1]);
			memcpy(pv, v->pixel_values, sizeof(float) * (size_t)P * D);
			memcpy(mask, v->mask, sizeof(int32_t) * (size_t)P);
			hi3_image_vit_free(v);
		} else {
			const hi3_tensor *lv = get(fx, "levels.%d", i, HI3_U8);
			const size_t n = (size_t)hi3_tensor_numel(lv);
			for (size_t k = 0; k < n; k++)
				pv[k] = hi3i_vit_value(((const uint8_t *)lv->data)[k]);
			for (int k = 0; k < fx->shapes[i][0] * fx->shapes[i][1]; k++)
				mask[k] = 1;
			snprintf(what, sizeof(what), "%s grid %d", fx->name, i);
		}
		ok(!strcmp(hex64(hex, pv, sizeof(float) * (size_t)P * D), entry_str(fx, i, "pixel_values")),
		   "%s: pixel_values are upstream's bit for bit (FNV-1a %s, upstream %s)", what, hex,
		   entry_str(fx, i, "pixel_values"));
	}
}

static void fixture_open(struct fixture *fx, const char *srcdir, const char *name)
{
	char *path = hi3i_asprintf("%s/tests/fixtures/vit/%s.safetensors", srcdir, name);
	char *dir = hi3i_asprintf("%s/%s", root, name);
	hi3_error err = {0};
	json_error_t je;
	int64_t P, seed;
	double sum = 0, want;

	memset(fx, 0, sizeof(*fx));
	fx->name = name;
	HI3_ASSERT(path && dir && mkdir(dir, 0777) == 0);
	if (hi3_st_open(&fx->st, path, HI3_ST_READ, &err) ||
	    !(fx->entries = json_loads(hi3_st_meta(fx->st, "entries") ? hi3_st_meta(fx->st, "entries") : "", 0, &je)) ||
	    hi3i_parse_i64(hi3_st_meta(fx->st, "slots"), 1, 1 << 20, &P) ||
	    hi3i_parse_i64(hi3_st_meta(fx->st, "seed"), 0, INT64_MAX, &seed) ||
	    hi3i_parse_f64(hi3_st_meta(fx->st, "checksum"), &want) || json_array_size(fx->entries) > MAX_ENTRIES) {
		printf("Bail out! %s: %s\n", path, err.msg);
		exit(1);
	}
	diag("fixtures: %s (upstream %s, torch %s, capability %s)", path, hi3_st_meta(fx->st, "upstream"),
	     hi3_st_meta(fx->st, "torch"), hi3_st_meta(fx->st, "capability"));
	fx->n = (int)json_array_size(fx->entries);
	fx->P = (int)P;
	fixture_configs(fx, dir);
	fx->D = fx->c.num_channels * fx->c.patch_size * fx->c.patch_size;
	ok(vit_model_write(dir, &fx->c, &fx->a, 1, (uint64_t)seed, HI3_F32, &sum, &err) == 0, "%s: the weights %s",
	   name, err.msg);
	ok(fabs(sum - want) <= 1e-9 * fabs(want), "%s: weights' checksum %.12g equals upstream's %.12g (the same "
	   "generator, the same tensors, the pooling head's among them)", name, sum, want);
	fixture_inputs(fx);
	free(path), free(dir);
}

static void fixture_close(struct fixture *fx)
{
	hi3_st_close(fx->st);
	json_decref(fx->entries);
	free(fx->pv);
	free(fx->mask);
}

static char *model_dir(const struct fixture *fx)
{
	char *dir = hi3i_asprintf("%s/%s", root, fx->name);

	HI3_ASSERT(dir);
	return dir;
}

/* Image i's output rows (P, W) against the fixture's rows 0 .. nph npw: the
 * pad slots against its first pad row. */
static double entry_err(const struct fixture *fx, const float *out, const hi3_tensor *ref, int i, int W)
{
	const int n = fx->shapes[i][0] * fx->shapes[i][1];
	double num = 0.0, den = 0.0;

	for (int r = 0; r < fx->P; r++) {
		const float *want = (const float *)ref->data + (size_t)HI3_MIN(r, n) * W;
		for (int j = 0; j < W; j++) {
			double e = (double)out[(size_t)r * W + j] - want[j];
			num += e * e;
			den += (double)want[j] * want[j];
		}
	}
	return sqrt(num / den);
}

static void test_fixture(const struct fixture *fx, hi3_vit *v, const char *backend, float *hid, float *emb)
{
	const int P = fx->P, H = fx->c.hidden_size, E = fx->a.n_embed;
	float *pos = malloc(sizeof(float) * (size_t)P * H);
	hi3_error err = {0};

	HI3_ASSERT(pos);
	for (int i = 0; i < fx->n; i++) {
		char hex[17];
		if (hi3i_vit_position_grid(v, fx->shapes[i][0], fx->shapes[i][1], P, pos, &err))
			ok(0, "%s position grid %d: %s", fx->name, i, err.msg);
		else
			ok(!strcmp(hex64(hex, pos, sizeof(float) * (size_t)P * H), entry_str(fx, i, "position")),
			   "%s %d: the %dx%d grid resized to %dx%d (antialiased bilinear, fp32), row 0 in the pad slots: "
			   "upstream's bits (FNV-1a %s, upstream %s)", fx->name, i, (int)sqrt(fx->c.num_patches),
			   (int)sqrt(fx->c.num_patches), fx->shapes[i][0], fx->shapes[i][1], hex, entry_str(fx, i, "position"));
	}
	free(pos);
	if (hi3_vit_encode(v, fx->pv, fx->mask, &fx->shapes[0][0], fx->n, P, hid, emb, &err)) {
		ok(0, "%s %s: encode: %s", fx->name, backend, err.msg);
		return;
	}
	for (int i = 0; i < fx->n; i++) {
		double eh = entry_err(fx, hid + (size_t)i * P * H, get(fx, "hidden.%d", i, HI3_F32), i, H);
		double ee = entry_err(fx, emb + (size_t)i * P * E, get(fx, "embeds.%d", i, HI3_F32), i, E);
		ok(eh <= TOL, "%s %s %d (%dx%d of %d slots): last_hidden_state within %.0e of upstream's: %.2e", fx->name,
		   backend, i, fx->shapes[i][0], fx->shapes[i][1], P, TOL, eh);
		ok(ee <= TOL, "%s %s %d: aligner output within %.0e of upstream's: %.2e", fx->name, backend, i, TOL, ee);
	}
}

/* Each image alone, and a batch of 3 in another order: the bits of the
 * batch of all (the CPU backend). */
static void test_batch(const struct fixture *fx, hi3_vit *v, const float *hid, const float *emb)
{
	const int P = fx->P, H = fx->c.hidden_size, E = fx->a.n_embed, D = fx->D;
	const int order[3] = {fx->n - 1, 1, 0};
	float *h1 = malloc(sizeof(float) * (size_t)3 * P * H), *e1 = malloc(sizeof(float) * (size_t)3 * P * E);
	float *pv = malloc(sizeof(float) * (size_t)3 * P * D);
	int32_t *mask = malloc(sizeof(int32_t) * (size_t)3 * P), shapes[3][2];
	hi3_error err = {0};
	int same = 1;

	HI3_ASSERT(h1 && e1 && pv && mask && fx->n >= 3);
	for (int i = 0; i < fx->n; i++) {
		same = !hi3_vit_encode(v, fx->pv + (size_t)i * P * D, fx->mask + (size_t)i * P, fx->shapes[i], 1, P, h1, e1,
		                       &err) &&
		       !memcmp(h1, hid + (size_t)i * P * H, sizeof(float) * (size_t)P * H) &&
		       !memcmp(e1, emb + (size_t)i * P * E, sizeof(float) * (size_t)P * E);
		ok(same, "%s %d alone: the bits it has in the batch of %d, last_hidden_state and aligner %s", fx->name, i,
		   fx->n, err.msg);
	}
	for (int k = 0; k < 3; k++) {
		memcpy(pv + (size_t)k * P * D, fx->pv + (size_t)order[k] * P * D, sizeof(float) * (size_t)P * D);
		memcpy(mask + (size_t)k * P, fx->mask + (size_t)order[k] * P, sizeof(int32_t) * (size_t)P);
		shapes[k][0] = fx->shapes[order[k]][0];
		shapes[k][1] = fx->shapes[order[k]][1];
	}
	same = !hi3_vit_encode(v, pv, mask, &shapes[0][0], 3, P, h1, e1, &err);
	for (int k = 0; same && k < 3; k++)
		same = !memcmp(h1 + (size_t)k * P * H, hid + (size_t)order[k] * P * H, sizeof(float) * (size_t)P * H) &&
		       !memcmp(e1 + (size_t)k * P * E, emb + (size_t)order[k] * P * E, sizeof(float) * (size_t)P * E);
	ok(same, "%s: a batch of 3 in the order %d, %d, %d: each image's bits of the batch of %d %s", fx->name,
	   order[0], order[1], order[2], fx->n, err.msg);
	/* refusals */
	shapes[0][0] = 40;
	shapes[0][1] = 40;
	ok(hi3_vit_encode(v, pv, mask, &shapes[0][0], 1, P, h1, NULL, &err) && err.status == HI3_ERR_USAGE &&
	   strstr(err.msg, "40 x 40"), "a 40 x 40 grid in %d slots: refused: %s", P, err.msg);
	memset(&err, 0, sizeof(err));
	shapes[0][0] = 2;
	shapes[0][1] = 2;
	memset(mask, 0, sizeof(int32_t) * (size_t)P);
	ok(hi3_vit_encode(v, pv, mask, &shapes[0][0], 1, P, h1, NULL, &err) && err.status == HI3_ERR_USAGE &&
	   strstr(err.msg, "image 0") && strstr(err.msg, "no patch"), "a mask without a real patch: refused: %s",
	   err.msg);
	free(h1), free(e1), free(pv), free(mask);
}

static void test_missing(const struct fixture *fx)
{
	char *text = hi3i_asprintf("%s/text", root), *bare = hi3i_asprintf("%s/bare", root);
	char *part = hi3i_asprintf("%s/part", root), *rel = hi3i_asprintf("%s/release", root);
	char *blocks = hi3i_asprintf("{\"vit\": %s, \"vit_aligner\": %s}", hi3_st_meta(fx->st, "vit"),
	                             hi3_st_meta(fx->st, "vit_aligner"));
	hi3_init_opts io = {.preset = "tiny", .seed = 1, .dtype = HI3_F32};
	hi3_vit_config one = fx->c;
	hi3_error err = {0};
	hi3_model *m = NULL;
	hi3_vit *v = NULL;
	char *cfg;

	HI3_ASSERT(text && bare && part && rel && blocks);
	/* a text model: no vit block */
	ok(hi3_init_model(text, &io, &err) == 0 && hi3_model_open(&m, text, NULL, &err) == 0, "a tiny text model %s",
	   err.msg);
	ok(m && hi3_vit_open(&v, m, &err) && err.status == HI3_ERR_INPUT && !v && strstr(err.msg, "no 'vit' block") &&
	   strstr(err.msg, "config.json"), "hi3_vit_open on it: an input error naming config.json and the block: %s",
	   err.msg);
	hi3_model_close(m);
	m = NULL;
	/* the same with the blocks but no vision tensors */
	memset(&err, 0, sizeof(err));
	io.overrides = blocks;
	ok(hi3_init_model(bare, &io, &err) == 0 && hi3_model_open(&m, bare, NULL, &err) == 0,
	   "a tiny text model with vit blocks in its config %s", err.msg);
	ok(m && hi3_vit_open(&v, m, &err) && err.status == HI3_ERR_INPUT && !v &&
	   strstr(err.msg, "'vision_model.embeddings.patch_embedding.weight' is missing"),
	   "hi3_vit_open on it: an input error naming the missing tensor: %s", err.msg);
	hi3_model_close(m);
	m = NULL;
	memset(&err, 0, sizeof(err));
	ok(hi3_vit_open_dir(&v, bare, NULL, &err) && err.status == HI3_ERR_INPUT &&
	   strstr(err.msg, "'vision_model.embeddings.patch_embedding.weight'"), "hi3_vit_open_dir on it: %s", err.msg);
	/* weights of one layer under a config of two */
	memset(&err, 0, sizeof(err));
	one.num_hidden_layers = 1;
	ok(vit_model_write(part, &one, &fx->a, 0, 1, HI3_F32, NULL, &err) == 0, "a one-layer ViT %s", err.msg);
	cfg = vit_model_config_json(&fx->c, &fx->a);
	{
		char *path = hi3i_asprintf("%s/config.json", part);
		HI3_ASSERT(path && cfg && hi3i_write_file(path, cfg, strlen(cfg), &err) == 0);
		free(path);
	}
	ok(hi3_vit_open_dir(&v, part, NULL, &err) && err.status == HI3_ERR_INPUT && !v &&
	   strstr(err.msg, "'vision_model.encoder.layers.1.layer_norm1.weight' is missing"),
	   "... under a config of %d layers: the first missing tensor: %s", fx->c.num_hidden_layers, err.msg);
	free(cfg);
	/* the release preset: every module, bf16, sharded */
	{
		hi3_init_opts ro = {.preset = "tiny-release", .seed = 3};
		memset(&err, 0, sizeof(err));
		ok(hi3_init_model(rel, &ro, &err) == 0 && hi3_model_open(&m, rel, NULL, &err) == 0 &&
		   hi3_vit_open(&v, m, &err) == 0, "the tiny-release preset's ViT opens from its model %s", err.msg);
	}
	if (v) {
		const hi3_vit_config *c = hi3_vit_get_config(v);
		const int D = c->num_channels * c->patch_size * c->patch_size, P = 64, H = c->hidden_size;
		const int E = hi3_vit_get_aligner_config(v)->n_embed;
		float *pv = calloc((size_t)P * D, sizeof(float)), *e = malloc(sizeof(float) * (size_t)P * E);
		float *h = malloc(sizeof(float) * (size_t)P * H);
		int32_t mask[64] = {0}, shape[2] = {3, 17};
		int finite = 1;
		HI3_ASSERT(pv && e && h);
		for (int i = 0; i < 51; i++) {
			mask[i] = 1;
			for (int k = 0; k < D; k++)
				pv[(size_t)i * D + k] = (float)((i * 31 + k * 7) % 255) / 127.5f - 1.0f;
		}
		ok(hi3_vit_encode(v, pv, mask, shape, 1, P, h, e, &err) == 0, "it encodes a 3 x 17 grid in 64 slots "
		   "(bf16 weights, a 4 x 4 position grid) %s", err.msg);
		for (size_t i = 0; i < (size_t)P * E; i++)
			finite &= isfinite(e[i]);
		ok(finite && E == hi3_model_config(m)->hidden_size, "... to %d finite values per slot, the LLM's width", E);
		free(pv), free(e), free(h);
	}
	hi3_vit_close(v);
	hi3_model_close(m);
	free(text), free(bare), free(part), free(rel), free(blocks);
}

#ifdef TEST_CUDA
/* The CUDA outputs against the CPU backend's on the same inputs. */
static void test_against_cpu(const struct fixture *fx, const float *hid, const float *emb)
{
	const size_t nh = (size_t)fx->n * fx->P * fx->c.hidden_size, ne = (size_t)fx->n * fx->P * fx->a.n_embed;
	hi3_model_opts mo = {.backend = "cpu", .threads = 2, .batch_invariant = 1};
	float *h = malloc(sizeof(float) * nh), *e = malloc(sizeof(float) * ne);
	char *dir = model_dir(fx);
	hi3_error err = {0};
	hi3_vit *v = NULL;

	HI3_ASSERT(h && e);
	if (hi3_vit_open_dir(&v, dir, &mo, &err) ||
	    hi3_vit_encode(v, fx->pv, fx->mask, &fx->shapes[0][0], fx->n, fx->P, h, e, &err)) {
		ok(0, "%s on cpu: %s", fx->name, err.msg);
	} else {
		double a = rel_err(hid, h, nh), b = rel_err(emb, e, ne);
		ok(a <= TOL && b <= TOL, "%s: cuda against cpu: last_hidden_state %.2e, aligner %.2e (at most %.0e)",
		   fx->name, a, b, TOL);
	}
	hi3_vit_close(v);
	free(h), free(e), free(dir);
}
#endif

static void run_fixture(const char *srcdir, const char *name, const char *backend, int more)
{
	/* the backend's default: on for the CPU, off (cuBLAS) for CUDA */
	hi3_model_opts mo = {.backend = backend, .threads = 2, .batch_invariant = strcmp(backend, "cuda") != 0};
	struct fixture fx;
	hi3_error err = {0};
	hi3_vit *v = NULL;
	char *dir;
	float *hid, *emb;

	fixture_open(&fx, srcdir, name);
	dir = model_dir(&fx);
	hid = malloc(sizeof(float) * (size_t)fx.n * fx.P * fx.c.hidden_size);
	emb = malloc(sizeof(float) * (size_t)fx.n * fx.P * fx.a.n_embed);
	HI3_ASSERT(hid && emb);
	if (hi3_vit_open_dir(&v, dir, &mo, &err)) {
		ok(0, "open %s on %s: %s", name, backend, err.msg);
	} else {
		test_fixture(&fx, v, backend, hid, emb);
#ifdef TEST_CUDA
		test_against_cpu(&fx, hid, emb);
#endif
		if (more) {
			test_batch(&fx, v, hid, emb);
			test_missing(&fx);
		}
	}
	hi3_vit_close(v);
	fixture_close(&fx);
	free(hid), free(emb), free(dir);
}

int main(void)
{
	const char *srcdir = getenv("SRCDIR") ? getenv("SRCDIR") : ".";
#ifdef TEST_CUDA
	const char *backend = "cuda";
#else
	const char *backend = "cpu";
#endif

	if (!(root = testdir_new("test-vit")))
		return 1;
	run_fixture(srcdir, "vit-tiny", backend, !strcmp(backend, "cpu"));
	run_fixture(srcdir, "vit-gelu", backend, 0);
	testdir_done(root);
	return done_testing();
}
