/* fuzz-config.c -- hi3_config_parse on any text (lib/model/config.c), then
 * the checks a parsed config passes: validation against the tiny-moe
 * checkpoint (only a config of its dimensions passes), the fingerprint and
 * the bench byte count. A parsed config
 * is one hi3 can size: every width and count in range, the shared-expert
 * MLP included. */
#include <math.h>
#include <string.h>
#include "model/config-internal.h"
#include "fuzz/fuzz.h"

static hi3_ckpt *ck;
static hi3_config tiny;

static int init(void)
{
	hi3_error err = {0};
	char *path = hi3i_asprintf("%s/config.json", fuzz_model_dir());

	if (hi3_ckpt_open(&ck, fuzz_model_dir(), &err) != 0 || hi3_config_load(&tiny, path, &err) != 0) {
		fprintf(stderr, "fuzz: config: %s\n", err.msg);
		free(path);
		return -1;
	}
	free(path);
	return 0;
}

static void check_ranges(const hi3_config *c)
{
	FUZZ_CHECK(c->vocab_size >= 1 && c->hidden_size >= 1 && c->num_hidden_layers >= 1 &&
	           c->num_hidden_layers <= HI3_MAX_LAYERS && c->num_attention_heads >= 1 &&
	           c->num_key_value_heads >= 1 && c->num_attention_heads % c->num_key_value_heads == 0 &&
	           c->attention_head_dim >= 4 && c->attention_head_dim % 4 == 0 && c->json,
	           "accepted config with vocab %d, H %d, layers %d, heads %d/%d, d %d", c->vocab_size,
	           c->hidden_size, c->num_hidden_layers, c->num_attention_heads, c->num_key_value_heads,
	           c->attention_head_dim);
	for (int l = 0; l < c->num_hidden_layers; l++) {
		int moe = hi3_config_is_moe_layer(c, l);

		FUZZ_CHECK(c->num_experts[l] >= 1 && c->num_experts[l] <= HI3_MAX_EXPERTS && c->moe_topk[l] >= 1 &&
		           c->moe_intermediate_size[l] >= 1 && c->num_shared_expert[l] >= 0,
		           "layer %d: experts %d top-%d width %d shared %d", l, c->num_experts[l], c->moe_topk[l],
		           c->moe_intermediate_size[l], c->num_shared_expert[l]);
		FUZZ_CHECK(!moe || c->moe_topk[l] <= c->num_experts[l], "layer %d: top-%d of %d experts", l,
		           c->moe_topk[l], c->num_experts[l]);
		FUZZ_CHECK(moe || c->intermediate_size > 0, "dense layer %d without intermediate_size", l);
		FUZZ_CHECK(!moe || !c->use_mixed_mlp_moe || !c->num_shared_expert[l] ||
		           hi3i_config_shared_width(c, l) > 0, "layer %d: shared MLP %d x %d accepted", l,
		           c->moe_intermediate_size[l], c->num_shared_expert[l]);
	}
	FUZZ_CHECK(c->rms_norm_eps > 0 && c->rope_theta > 0, "eps %g theta %g", c->rms_norm_eps, c->rope_theta);
}

static void one(const uint8_t *data, size_t size)
{
	char *text = malloc(size + 1);
	hi3_config cfg;
	hi3_error err = {0};
	char fp[17];
	int rc;

	FUZZ_CHECK(text, "out of memory");
	memcpy(text, data, size);
	text[size] = '\0';
	rc = hi3_config_parse(&cfg, text, "fuzz-config.json", &err);
	fuzz_check_status(rc, &err, "hi3_config_parse");
	FUZZ_CHECK(rc != 0 || err.status == 0, "success with an error set");
	if (rc == 0) {
		check_ranges(&cfg);
		rc = hi3_config_validate(&cfg, ck, &err);
		fuzz_check_status(rc, &err, "hi3_config_validate");
		/* the embedding fixes H and V; fewer layers or experts than the
		 * checkpoint holds validate (unused tensors are not refused) */
		if (rc == 0)
			FUZZ_CHECK(cfg.hidden_size == tiny.hidden_size && cfg.vocab_size == tiny.vocab_size &&
			           cfg.num_hidden_layers <= tiny.num_hidden_layers, "another model's config validated");
		FUZZ_CHECK(hi3_fingerprint(&cfg, ck, fp) == 0 && strlen(fp) == 16, "fingerprint");
		FUZZ_CHECK(isfinite(hi3_bench_step_bytes(&cfg, HI3_BF16, HI3_BF16, 4096)), "bench byte count");
		hi3_config_release(&cfg);
	}
	free(text);
}

HI3_FUZZ_TARGET(config, init, one)
