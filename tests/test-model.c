/* test-model.c -- checkpoints: init-model determinism, sharded loading, and
 * the bad checkpoints model loading must refuse (or warn about), by name. */
#include <omp.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "hi3.h"
#include "core/internal.h"
#include "tap.h"
#include "testdir.h"

static char *root;
static char warned[4096];

static void capture(int level, const char *msg, void *ctx)
{
	(void)ctx;
	if (level == HI3_LOG_WARN)
		snprintf(warned + strlen(warned), sizeof(warned) - strlen(warned), "%s\n", msg);
}

static char *p(const char *a, const char *b)
{
	return hi3i_asprintf("%s/%s%s%s", root, a, b ? "/" : "", b ? b : "");
}

static int same_file(const char *a, const char *b)
{
	char *x, *y;
	size_t nx, ny;
	int same;

	if (hi3i_read_file(a, &x, &nx, NULL) || hi3i_read_file(b, &y, &ny, NULL))
		return 0;
	same = nx == ny && !memcmp(x, y, nx);
	free(x);
	free(y);
	return same;
}

static void copy_dir(const char *from, const char *to)
{
	if (testdir_copy(from, to) != 0)
		diag("could not copy %s to %s", from, to);
}

/* Rewrite DIR/model.safetensors: drop tensor `drop`, or poison `nan` with a NaN. */
static int rewrite(const char *dir, const char *drop, const char *nan)
{
	char *path = hi3i_asprintf("%s/model.safetensors", dir), *tmp = hi3i_asprintf("%s.new", path);
	hi3_st *st;
	hi3_st_writer *w = hi3_stw_new();
	hi3_error err = {0};
	void **bufs;
	int rc;

	if (hi3_st_open(&st, path, HI3_ST_READ, &err))
		return -1;
	bufs = calloc((size_t)hi3_st_count(st), sizeof(void *));
	for (int i = 0; i < hi3_st_count(st); i++) {
		const hi3_tensor *t = hi3_st_at(st, i);
		if (drop && !strcmp(t->name, drop))
			continue;
		bufs[i] = malloc(t->nbytes ? t->nbytes : 1);
		memcpy(bufs[i], t->data, t->nbytes);
		if (nan && !strcmp(t->name, nan))
			((float *)bufs[i])[3] = 0.0f / 0.0f;
		hi3_stw_add(w, t->name, t->dtype, t->ndim, t->shape, bufs[i]);
	}
	rc = hi3_stw_write(w, tmp, &err);
	for (int i = 0; i < hi3_st_count(st); i++)
		free(bufs[i]);
	free(bufs);
	hi3_st_close(st);
	hi3_stw_free(w);
	rc |= rename(tmp, path);
	free(path);
	free(tmp);
	return rc;
}

/* Split DIR/model.safetensors into two shards with an index. */
static int shard(const char *dir, int name_missing_shard)
{
	char *path = hi3i_asprintf("%s/model.safetensors", dir);
	hi3_st *st;
	hi3_st_writer *w[2] = {hi3_stw_new(), hi3_stw_new()};
	hi3_error err = {0};
	FILE *idx;
	char *ip = hi3i_asprintf("%s/model.safetensors.index.json", dir);
	int rc = 0;

	if (hi3_st_open(&st, path, HI3_ST_READ, &err))
		return -1;
	idx = fopen(ip, "w");
	fprintf(idx, "{\"metadata\": {}, \"weight_map\": {");
	for (int i = 0; i < hi3_st_count(st); i++) {
		const hi3_tensor *t = hi3_st_at(st, i);
		int s = i % 2;
		hi3_stw_add(w[s], t->name, t->dtype, t->ndim, t->shape, t->data);
		fprintf(idx, "%s\"%s\": \"model-0000%d-of-00002.safetensors\"", i ? ", " : "", t->name,
		        name_missing_shard && s ? 3 : s + 1);
	}
	fprintf(idx, "}}\n");
	fclose(idx);
	for (int s = 0; s < 2; s++) {
		char *sp = hi3i_asprintf("%s/model-0000%d-of-00002.safetensors", dir, s + 1);
		rc |= hi3_stw_write(w[s], sp, &err);
		free(sp);
		hi3_stw_free(w[s]);
	}
	hi3_st_close(st);
	unlink(path);
	free(path);
	free(ip);
	return rc;
}

static int open_err(const char *dir, hi3_error *err)
{
	hi3_model *m = NULL;
	int rc;

	memset(err, 0, sizeof(*err));
	rc = hi3_model_open(&m, dir, NULL, err);
	hi3_model_close(m);
	return rc;
}

int main(void)
{
	hi3_init_opts o = {.preset = "tiny-moe", .seed = 5, .dtype = HI3_F32};
	char *a, *b, *c, *f1, *f2;
	hi3_error err = {0};
	hi3_model *m = NULL;
	char fp[17] = "";

	if (!(root = testdir_new("test-model")))
		return 1;
	hi3_set_log(capture, NULL, HI3_LOG_WARN);
	a = p("a", NULL);
	b = p("b", NULL);
	c = p("c", NULL);
	omp_set_num_threads(1);
	ok(hi3_init_model(a, &o, &err) == 0, "init-model tiny-moe, 1 thread: %s", err.msg);
	omp_set_num_threads(2);
	ok(hi3_init_model(b, &o, &err) == 0, "init-model tiny-moe, 2 threads: %s", err.msg);
	f1 = p("a", "model.safetensors");
	f2 = p("b", "model.safetensors");
	ok(same_file(f1, f2), "same preset and seed: identical model.safetensors on any thread count");
	free(f1);
	free(f2);
	f1 = p("a", "tokenizer.json");
	f2 = p("b", "tokenizer.json");
	ok(same_file(f1, f2), "identical tokenizer.json");
	free(f1);
	free(f2);
	o.seed = 6;
	ok(hi3_init_model(c, &o, &err) == 0, "another seed");
	f1 = p("a", "model.safetensors");
	f2 = p("c", "model.safetensors");
	ok(!same_file(f1, f2), "another seed: other weights");
	free(f1);
	free(f2);

	ok(hi3_model_open(&m, a, NULL, &err) == 0, "the model opens: %s", err.msg);
	if (m) {
		const hi3_config *cfg = hi3_model_config(m);
		ok(cfg->num_experts[0] == 4 && cfg->moe_topk[1] == 2 && cfg->num_key_value_heads == 2 &&
		   cfg->use_qk_norm && cfg->use_mixed_mlp_moe, "tiny-moe config: 4 experts top-2, GQA, qk-norm, shared MLP");
		ok(hi3_model_n_moe_layers(m) == 2 && hi3_model_max_topk(m) == 2, "2 MoE layers, top-2");
		snprintf(fp, sizeof(fp), "%s", hi3_model_fingerprint(m));
		hi3_model_close(m);
	}

	/* sharded: same tensors, same fingerprint */
	copy_dir(a, c);
	ok(shard(c, 0) == 0, "split into two shards with an index");
	ok(hi3_model_open(&m, c, NULL, &err) == 0, "sharded checkpoint opens: %s", err.msg);
	if (m) {
		ok(!strcmp(fp, hi3_model_fingerprint(m)), "sharded fingerprint %s equals %s", hi3_model_fingerprint(m),
		   fp);
		hi3_model_close(m);
	}
	copy_dir(a, c);
	shard(c, 1);
	ok(open_err(c, &err) == -1 && err.status == HI3_ERR_INPUT && strstr(err.msg, "model-00003-of-00002") &&
	   strstr(err.msg, "index.json"), "index naming a missing shard: %s", err.msg);

	copy_dir(a, c);
	rewrite(c, "model.layers.1.mlp.experts.3.down_proj.weight", NULL);
	ok(open_err(c, &err) == -1 && err.status == HI3_ERR_INPUT &&
	   strstr(err.msg, "'model.layers.1.mlp.experts.3.down_proj.weight' is missing"),
	   "missing tensor named: %s", err.msg);

	copy_dir(a, c);
	{
		char *cp = p("c", "config.json"), *text;
		hi3i_read_file(cp, &text, NULL, NULL);
		char *pos = strstr(text, "\"moe_intermediate_size\": 96");
		if (pos)
			memcpy(pos, "\"moe_intermediate_size\": 97", 27);
		hi3i_write_file(cp, text, strlen(text), NULL);
		free(text);
		free(cp);
	}
	ok(open_err(c, &err) == -1 && err.status == HI3_ERR_INPUT && strstr(err.msg, "gate_and_up_proj.weight") &&
	   strstr(err.msg, "(194, 128)") && strstr(err.msg, "(192, 128)"),
	   "config contradicting a tensor shape: %s", err.msg);

	/* weights are read when first used, not at open: the NaN check goes with the first read */
	copy_dir(a, c);
	rewrite(c, NULL, "model.layers.0.self_attn.o_proj.weight");
	warned[0] = 0;
	memset(&err, 0, sizeof(err));
	ok(hi3_model_open(&m, c, NULL, &err) == 0 && !warned[0], "NaN in weights: the open reads no weight: %s%s",
	   err.msg, warned);
	if (m) {
		int64_t ids[1] = {7};
		int32_t rope[2] = {0, 0}, hi[1] = {0}, at[2] = {0, 0};
		float *logits = calloc((size_t)hi3_model_config(m)->vocab_size, sizeof(float));
		hi3_batch bt = {.B = 1, .T = 1, .mode = HI3_ATTN_SELF, .ids = ids, .rope = rope, .hi = hi,
		                .n_logits = 1, .logit_at = at, .logits = logits};
		ok(hi3_forward(m, NULL, &bt, &err) == 0 && strstr(warned, "model.layers.0.self_attn.o_proj.weight") &&
		   strstr(warned, "NaN") && strstr(warned, "model.safetensors"),
		   "NaN in weights: the first forward warns, naming the file and tensor: %s", warned);
		warned[0] = 0;
		ok(hi3_forward(m, NULL, &bt, &err) == 0 && !warned[0], "... once: the next forward does not: %s", warned);
		free(logits);
		hi3_model_close(m);
		m = NULL;
	}

	/* a shard cut short fails at open, naming it, before anything maps past its end */
	copy_dir(a, c);
	shard(c, 0);
	{
		char *sp = p("c", "model-00002-of-00002.safetensors");
		struct stat sb;
		ok(stat(sp, &sb) == 0 && truncate(sp, sb.st_size - 100) == 0, "cut 100 bytes off a shard");
		ok(open_err(c, &err) == -1 && err.status == HI3_ERR_INPUT && strstr(err.msg, "model-00002-of-00002") &&
		   strstr(err.msg, "truncated"), "a truncated shard is refused at open: %s", err.msg);
		ok(stat(sp, &sb) == 0 && truncate(sp, 4) == 0 && open_err(c, &err) == -1 &&
		   err.status == HI3_ERR_INPUT && strstr(err.msg, "model-00002-of-00002") && strstr(err.msg, "truncated"),
		   "a shard cut inside its header size is refused at open: %s", err.msg);
		free(sp);
	}

	copy_dir(a, c);
	{
		char *cp = p("c", "config.json");
		hi3i_write_file(cp, "{\"hidden_size\": 128,", 20, NULL);
		free(cp);
	}
	ok(open_err(c, &err) == -1 && err.status == HI3_ERR_INPUT && strstr(err.msg, "config.json:1"),
	   "config.json not JSON: error names file and line: %s", err.msg);

	{
		hi3_init_opts bad = {.preset = "huge", .dtype = HI3_F32};
		ok(hi3_init_model(c, &bad, &err) == -1 && err.status == HI3_ERR_USAGE && strstr(err.msg, "huge"),
		   "unknown preset: %s", err.msg);
		bad.preset = "tiny";
		bad.overrides = "{\"vocab_size\": 100}";
		ok(hi3_init_model(c, &bad, &err) == -1 && strstr(err.msg, "vocab_size 100"),
		   "vocab smaller than the tokenizer: %s", err.msg);
	}
	/* issue 16: the shared MLP's width moe_intermediate_size x
	 * num_shared_expert (128 x 2^24) overflowed int in validation */
	{
		hi3_config cfg;
		const char *wide = "{\"vocab_size\": 512, \"hidden_size\": 64, \"num_hidden_layers\": 2, "
		                   "\"num_attention_heads\": 4, \"num_experts\": 4, \"moe_topk\": 2, "
		                   "\"moe_intermediate_size\": 128, \"use_mixed_mlp_moe\": true, "
		                   "\"num_shared_expert\": 16777216}";
		memset(&err, 0, sizeof(err));
		ok(hi3_config_parse(&cfg, wide, "wide.json", &err) == -1 && err.status == HI3_ERR_INPUT &&
		   strstr(err.msg, "wide.json") && strstr(err.msg, "num_shared_expert"),
		   "a shared MLP 128 x 16777216 wide is refused: %s", err.msg);
		hi3_config_release(&cfg);
	}
	testdir_done(root);
	free(a);
	free(b);
	free(c);
	return done_testing();
}
