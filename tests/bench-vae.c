/*
 * bench-vae.c -- the VAE benchmark driver (scripts/bench-vae runs it beside
 * tests/ref/vae_ref.py bench on the same weights).
 *
 *   bench-vae --write tiny|wide DIR     write a model directory (vae-model.h)
 *   bench-vae DIR SIZES REPEAT [decode|encode] [cpu|cuda] [invariant|blas] [THREADS]
 *
 * SIZES: latent sizes "2x2,4x4"; an encode takes the image of that latent
 * size. One JSON line per size: the mean seconds of REPEAT runs after one
 * warm-up, per image, wall and CPU seconds (every thread's), the
 * process's peak resident memory so far
 * (getrusage) and the bytes of the part's weights (vae.encoder.* or
 * vae.decoder.*: what a pass touches) and a digest of the output (FNV-1a
 * of its bytes: two builds give the same one exactly when their bits agree).
 */
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include "core/internal.h"
#include "vae-model.h"

static const hi3_vae_config tiny = {
	.in_channels = 3, .out_channels = 3, .latent_channels = 16, .n_levels = 5,
	.block_out_channels = {32, 32, 32, 64, 64}, .layers_per_block = 1, .ffactor_spatial = 16,
	.ffactor_temporal = 4, .downsample_match_channel = 1, .upsample_match_channel = 1,
	.scaling_factor = 0.562679178327931,
};

/* the released VAE's shape (config.json's vae block) */
static const hi3_vae_config wide = {
	.in_channels = 3, .out_channels = 3, .latent_channels = 32, .n_levels = 5,
	.block_out_channels = {128, 256, 512, 1024, 1024}, .layers_per_block = 2, .ffactor_spatial = 16,
	.ffactor_temporal = 4, .downsample_match_channel = 1, .upsample_match_channel = 1,
	.scaling_factor = 0.562679178327931,
};

/* CPU seconds of the process (every thread; OpenMP's waiting threads sleep:
 * OMP_WAIT_POLICY=passive, as hi3 sets) */
static double cpu_seconds(void)
{
	struct timespec t;

	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
	return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* FNV-1a over n bytes: the output's digest, equal between two builds
 * exactly when their bits are */
static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
	const unsigned char *b = p;

	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 1099511628211u;
	return h;
}

static int usage(void)
{
	fprintf(stderr, "usage: bench-vae --write tiny|wide DIR\n"
	                "       bench-vae DIR SIZES REPEAT [decode|encode] [cpu|cuda] [invariant|blas] [THREADS]\n");
	return 2;
}

int main(int argc, char **argv)
{
	hi3_error err = {0};
	hi3_model_opts mo = {.backend = "cpu", .batch_invariant = 1};
	int64_t repeat, threads = 0;
	int enc = 0;
	double wbytes = 0;
	hi3_vae *v = NULL;
	char *sizes, *tok, *save = NULL;

	if (argc == 4 && !strcmp(argv[1], "--write")) {
		const hi3_vae_config *c = !strcmp(argv[2], "tiny") ? &tiny : !strcmp(argv[2], "wide") ? &wide : NULL;
		if (!c)
			return usage();
		if (vae_model_write(argv[3], c, HI3_VAE_DECODER | HI3_VAE_ENCODER, 7, HI3_F32, NULL, &err)) {
			fprintf(stderr, "bench-vae: %s\n", err.msg);
			return 1;
		}
		return 0;
	}
	if (argc < 4 || hi3i_parse_i64(argv[3], 1, 1000, &repeat))
		return usage();
	enc = argc > 4 && !strcmp(argv[4], "encode");
	if (argc > 5)
		mo.backend = argv[5];
	if (argc > 6)
		mo.batch_invariant = strcmp(argv[6], "blas") != 0;
	if (argc > 7 && hi3i_parse_i64(argv[7], 0, 1024, &threads))
		return usage();
	mo.threads = (int)threads;
	if (hi3_vae_open_dir(&v, argv[1], &mo, enc ? HI3_VAE_ENCODER : HI3_VAE_DECODER, &err)) {
		fprintf(stderr, "bench-vae: %s\n", err.msg);
		return 1;
	}
	{
		hi3_ckpt *ck = NULL;
		const char *pre = enc ? "vae.encoder." : "vae.decoder.";
		if (hi3_ckpt_open(&ck, argv[1], &err) == 0) {
			for (int i = 0; i < hi3_ckpt_count(ck); i++)
				if (!strncmp(hi3_ckpt_at(ck, i)->name, pre, strlen(pre)))
					wbytes += (double)hi3_ckpt_at(ck, i)->nbytes;
			hi3_ckpt_close(ck);
		}
	}
	sizes = hi3i_strdup(argv[2]);
	for (tok = strtok_r(sizes, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		const hi3_vae_config *c = hi3_vae_get_config(v);
		const int f = c->ffactor_spatial, z = c->latent_channels;
		int h, w;
		size_t nl, ni;
		float *lat, *img, *m, *lv;
		double t0, c0, dt = 0, dc = 0;

		if (sscanf(tok, "%dx%d", &h, &w) != 2 || h < 1 || w < 1 || h > 256 || w > 256)
			return usage();
		nl = (size_t)z * h * w;
		ni = 3 * (size_t)h * w * f * f;
		lat = malloc(nl * 4), img = malloc(ni * 4), m = malloc(nl * 4), lv = malloc(nl * 4);
		HI3_ASSERT(lat && img && m && lv);
		for (size_t i = 0; i < nl; i++)
			lat[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
		for (size_t i = 0; i < ni; i++)
			img[i] = (float)((i * 40503u) % 2001) / 1000.0f - 1.0f;
		for (int r = 0; r <= repeat; r++) {
			t0 = hi3i_now();
			c0 = cpu_seconds();
			if (enc ? hi3_vae_encode(v, img, 1, h * f, w * f, m, lv, &err) : hi3_vae_decode(v, lat, 1, h, w, img, &err)) {
				fprintf(stderr, "bench-vae: %s\n", err.msg);
				return 1;
			}
			if (r) {                            /* run 0 warms up */
				dt += hi3i_now() - t0;
				dc += cpu_seconds() - c0;
			}
		}
		{
			struct rusage ru;
			const uint64_t d0 = 14695981039346656037u;
			const uint64_t dg = enc ? fnv(fnv(d0, m, nl * 4), lv, nl * 4) : fnv(d0, img, ni * 4);
			getrusage(RUSAGE_SELF, &ru);
			printf("{\"engine\": \"hi3\", \"backend\": \"%s\", \"batch_invariant\": %d, \"threads\": %d, "
			       "\"latent\": [%d, %d], \"image\": [%d, %d], \"%s_s\": %.4f, \"cpu_s\": %.4f, \"peak_rss_mb\": %.1f, "
			       "\"weights_mb\": %.1f, \"digest\": \"%016llx\"}\n", mo.backend, mo.batch_invariant, mo.threads, h, w, h * f, w * f,
			       enc ? "encode" : "decode", dt / (double)repeat, dc / (double)repeat, (double)ru.ru_maxrss / 1024.0,
			       wbytes / 1048576.0, (unsigned long long)dg);
		}
		fflush(stdout);
		free(lat), free(img), free(m), free(lv);
	}
	free(sizes);
	hi3_vae_close(v);
	return 0;
}
