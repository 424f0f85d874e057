/*
 * diffusion-png.c -- the last part of the diffusion stage (hi3-batching(7),
 * DIFFUSION): the final latents of a trajectory decoded by the model's VAE
 * decoder into one PNG per request, DIR/row-<i>.png, with the request's
 * prompt, seed and the sampler settings in text chunks (as
 * stable-diffusion.cpp writes its "parameters").
 *
 * Shapes: B requests, T steps, C latent channels, h x w latent grid, f the
 * VAE's spatial factor, H = h f, W = w f.
 */
#include <errno.h>
#include <jansson.h>
#include <string.h>
#include <sys/stat.h>
#include "core/internal.h"
#include "stage/hi3-stage.h"

/* Request b's prompt: its "prompt", else its "tokens" as JSON; the seed is
 * the trajectory's. The strings are malloc'd. */
static char *request_prompt(json_t *reqs, int b)
{
	json_t *r = json_is_array(reqs) ? json_array_get(reqs, (size_t)b) : NULL;
	json_t *p = r ? json_object_get(r, "prompt") : NULL;

	if (json_is_string(p))
		return hi3i_strdup(json_string_value(p));
	if (r && (p = json_object_get(r, "tokens")))
		return json_dumps(p, JSON_COMPACT);
	return hi3i_strdup("");
}

static char *row_seed(json_t *seeds, int b)
{
	json_t *s = json_is_array(seeds) ? json_array_get(seeds, (size_t)b) : NULL;

	if (json_is_integer(s))
		return hi3i_asprintf("%lld", (long long)json_integer_value(s));
	return hi3i_strdup("unknown");
}

int hi3_trajectory_png(hi3_model *m, const hi3_trajectory *t, const char *dir, hi3_error *err)
{
	const size_t n = (size_t)t->C * t->h * t->w;
	hi3_vae *vae = NULL;
	json_t *reqs = NULL, *seeds = NULL;
	float *z = NULL, *img = NULL;                /* (C, h, w), (3, H, W) */
	uint8_t *rgb = NULL;                         /* (H, W, 3) */
	char *path = NULL, *prompt = NULL, *seed = NULL, *params = NULL;
	int f, H, W, rc = -1;

	/* the VAE first: a model without one writes nothing */
	if (hi3_vae_open(&vae, m, HI3_VAE_DECODER, err))
		return -1;
	if (hi3_vae_get_config(vae)->latent_channels != t->C) {
		hi3_error_set(err, HI3_ERR_INPUT, "the trajectory's latents have %d channels, the VAE of %s takes %d",
		              t->C, hi3_model_dir(m), hi3_vae_get_config(vae)->latent_channels);
		goto out;
	}
	f = hi3_vae_get_config(vae)->ffactor_spatial;
	H = t->h * f;
	W = t->w * f;
	if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "%s: cannot make the directory: %s", dir, strerror(errno));
		goto out;
	}
	if (t->requests)
		reqs = json_loads(t->requests, 0, NULL);
	if (t->seeds)
		seeds = json_loads(t->seeds, 0, NULL);
	if (!(z = hi3i_malloc(sizeof(float) * n, err)) ||
	    !(img = hi3i_malloc(sizeof(float) * 3 * (size_t)H * W, err)) || !(rgb = hi3i_malloc(3 * (size_t)H * W, err)))
		goto out;
	for (int b = 0; b < t->B; b++) {
		const size_t base = ((size_t)b * (t->T + 1) + t->T) * n;   /* latents[b, T] */
		char steps[16], eta[32], g[32], shift[32], size[32];

		for (size_t i = 0; i < n; i++)
			z[i] = hi3_trajectory_latent(t, base + i);
		if (hi3_vae_decode(vae, z, 1, t->h, t->w, img, err)) {
			hi3_error_prefix(err, "request %d", b);
			goto out;
		}
		hi3_vae_to_rgb8(img, H, W, rgb);
		free(path), free(prompt), free(seed), free(params);
		params = NULL;
		path = hi3i_asprintf("%s/row-%d.png", dir, b);
		prompt = request_prompt(reqs, b);
		seed = row_seed(seeds, b);
		snprintf(steps, sizeof(steps), "%d", t->T);
		snprintf(eta, sizeof(eta), "%g", t->eta);
		snprintf(g, sizeof(g), "%g", t->guidance);
		snprintf(shift, sizeof(shift), "%g", t->flow_shift);
		snprintf(size, sizeof(size), "%dx%d", W, H);
		if (!path || !prompt || !seed ||
		    !(params = hi3i_asprintf("%s\nSteps: %s, Sampler: %s, CFG scale: %s, Seed: %s, Size: %s, "
		                             "Flow shift: %s, Eta: %s, Model: %s", prompt, steps,
		                             t->sampler ? t->sampler : "euler", g, seed, size, shift, eta,
		                             t->model_fingerprint ? t->model_fingerprint : "unknown"))) {
			hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
			goto out;
		}
		{
			const hi3_png_text text[] = {
				{"parameters", params}, {"prompt", prompt}, {"seed", seed},
				{"sampler", t->sampler ? t->sampler : "euler"}, {"steps", steps}, {"guidance", g},
				{"flow_shift", shift}, {"eta", eta}, {"Software", "hi3 diffusion-capture"},
			};
			if (hi3_png_write_rgb_text(path, W, H, rgb, text, (int)HI3_ARRAY_SIZE(text), err))
				goto out;
		}
	}
	rc = 0;
out:
	hi3_vae_close(vae);
	json_decref(reqs);
	json_decref(seeds);
	free(z), free(img), free(rgb), free(path), free(prompt), free(seed), free(params);
	return rc;
}
