/*
 * bench-vit.c -- the vision encoder benchmark driver (scripts/bench-vit runs
 * it beside tests/ref/vit_ref.py bench on the same weights).
 *
 *   bench-vit --write wide|tiny DIR     write a model directory (vit-model.h)
 *   bench-vit DIR REPEAT [cpu|cuda] [invariant|blas] [THREADS]
 *
 * One image of a 1024 x 1024 picture's grid: 32 x 32 patches filling the
 * 1024 slots. One JSON line: the mean seconds of REPEAT runs after one
 * warm-up, of the ViT alone (last_hidden_state) and of the ViT and the
 * aligner, wall and CPU (every thread's) seconds.
 */
#include <string.h>
#include <time.h>
#include "core/internal.h"
#include "vit-model.h"

#define SLOTS 1024

/* the released vit and vit_aligner blocks (config.json) */
static const hi3_vit_config wide = {
	.present = 1, .hidden_size = 1152, .intermediate_size = 4304, .num_attention_heads = 16,
	.num_hidden_layers = 27, .num_channels = 3, .num_patches = 256, .patch_size = 16, .layer_norm_eps = 1e-6,
	.hidden_act = "gelu_pytorch_tanh",
};
static const hi3_vit_aligner_config wide_aligner = {
	.present = 1, .projector_type = "mlp_gelu", .input_dim = 1152, .n_embed = 4096, .depth = 2,
};
/* the test fixture's */
static const hi3_vit_config tiny = {
	.present = 1, .hidden_size = 32, .intermediate_size = 64, .num_attention_heads = 2, .num_hidden_layers = 2,
	.num_channels = 3, .num_patches = 256, .patch_size = 16, .layer_norm_eps = 1e-6,
	.hidden_act = "gelu_pytorch_tanh",
};
static const hi3_vit_aligner_config tiny_aligner = {
	.present = 1, .projector_type = "mlp_gelu", .input_dim = 32, .n_embed = 48, .depth = 2,
};

/* CPU seconds of the process, every thread's */
static double cpu_seconds(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int usage(void)
{
	fprintf(stderr, "usage: bench-vit --write wide|tiny DIR\n"
	                "       bench-vit DIR REPEAT [cpu|cuda] [invariant|blas] [THREADS]\n");
	return 2;
}

static int fail(const hi3_error *err)
{
	fprintf(stderr, "bench-vit: %s\n", err->msg);
	return 1;
}

int main(int argc, char **argv)
{
	hi3_error err = {0};
	hi3_model_opts mo = {.backend = "cpu", .batch_invariant = 1};
	int64_t repeat, threads = 0;
	int32_t shape[2] = {32, 32}, *mask;
	double t[2] = {0, 0};
	double c[2] = {0, 0};
	float *pv, *hid, *emb;
	hi3_vit *v = NULL;
	int D, H, E;

	if (argc == 4 && !strcmp(argv[1], "--write")) {
		int w = !strcmp(argv[2], "wide");
		if (!w && strcmp(argv[2], "tiny"))
			return usage();
		if (vit_model_write(argv[3], w ? &wide : &tiny, w ? &wide_aligner : &tiny_aligner, 1, 7, HI3_F32, NULL,
		                    &err))
			return fail(&err);
		return 0;
	}
	if (argc < 3 || hi3i_parse_i64(argv[2], 1, 1000, &repeat))
		return usage();
	if (argc > 3)
		mo.backend = argv[3];
	if (argc > 4)
		mo.batch_invariant = strcmp(argv[4], "blas") != 0;
	if (argc > 5 && hi3i_parse_i64(argv[5], 0, 1024, &threads))
		return usage();
	mo.threads = (int)threads;
	if (hi3_vit_open_dir(&v, argv[1], &mo, &err))
		return fail(&err);
	D = hi3_vit_get_config(v)->num_channels * hi3_vit_get_config(v)->patch_size * hi3_vit_get_config(v)->patch_size;
	H = hi3_vit_get_config(v)->hidden_size;
	E = hi3_vit_get_aligner_config(v)->n_embed;
	pv = malloc(sizeof(float) * SLOTS * (size_t)D);
	mask = malloc(sizeof(int32_t) * SLOTS);
	hid = malloc(sizeof(float) * SLOTS * (size_t)H);
	emb = malloc(sizeof(float) * SLOTS * (size_t)E);
	HI3_ASSERT(pv && mask && hid && emb);
	for (size_t i = 0; i < (size_t)SLOTS * D; i++)
		pv[i] = (float)((i * 2654435761u) % 256) / 127.5f - 1.0f;
	for (int i = 0; i < SLOTS; i++)
		mask[i] = 1;
	for (int part = 0; part < 2; part++)
		for (int r = 0; r <= repeat; r++) {
			double t0 = hi3i_now(), c0 = cpu_seconds();
			if (hi3_vit_encode(v, pv, mask, shape, 1, SLOTS, part ? NULL : hid, part ? emb : NULL, &err))
				return fail(&err);
			if (r) {                            /* run 0 warms up */
				t[part] += hi3i_now() - t0;
				c[part] += cpu_seconds() - c0;
			}
		}
	printf("{\"engine\": \"hi3\", \"backend\": \"%s\", \"batch_invariant\": %d, \"threads\": %d, \"grid\": [32, 32], "
	       "\"vit_s\": %.4f, \"vit_aligner_s\": %.4f, \"vit_cpu_s\": %.4f, \"vit_aligner_cpu_s\": %.4f}\n",
	       mo.backend, mo.batch_invariant, mo.threads, t[0] / (double)repeat, t[1] / (double)repeat,
	       c[0] / (double)repeat, c[1] / (double)repeat);
	free(pv), free(mask), free(hid), free(emb);
	hi3_vit_close(v);
	return 0;
}
