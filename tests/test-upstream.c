/* test-upstream.c -- the sequence template against upstream's own code
 * (tests/ref/upstream_template.py ran hunyuan_image_3/ of
 * suryatmodulus/HunyuanImage-3.0 at 1201fe8, the Instruct code, and of
 * Tencent-Hunyuan/HunyuanImage-3.0 at 1d011c8, the base code, on these
 * requests): for every
 * case of tests/fixtures/upstream/SET.json, the rows hi3 encodes have
 * exactly upstream's token ids (cond and uncond rows), 2-D RoPE positions,
 * full-attention blocks, <timestep> positions and image masks; the stop
 * tokens are those upstream's generate is called with; the decoding rules
 * are upstream's stage transitions and ratio slice. The resolution buckets
 * and where sizes land are upstream's too.
 *
 * The release presets hold exactly the tensors (names and shapes) of
 * upstream's HunyuanImage3ForCausalMM built with their config.json
 * (tensors-PRESET.txt), in bf16 (the router float32) and three shards.
 *
 * The rollout sets (rollout-SET.json, tests/ref/upstream_rollout.py ran
 * generate_image with image_size "auto" on given text-stage tokens): the
 * text stage of a gen_image request with image_size auto is upstream's
 * (rows, stops, rules), and hi3_cond_continue on the same tokens gives
 * upstream's cot, system prompt, image size and image-stage rows (CFG
 * uncond rows included), with and without drop_think, or refuses the row
 * where upstream fails.
 *
 * Sets: the tiny-release, tiny-instruct and tiny-distil presets (made here
 * with hi3_init_model; the fixture names the tokenizer's hash); the released
 * files (config.json, generation_config.json verbatim) and the released
 * config.json made Instruct, with a tokenizer at the release's special-token
 * ids (<img_ratio_33> = 130103). */
#include <jansson.h>
#include <string.h>
#include <unistd.h>
#include "cond/template.h"
#include "format/provenance.h"
#include "tap.h"
#include "testdir.h"

/* Expand [id, count] runs. */
static int64_t *unrun(json_t *runs, int64_t *n)
{
	size_t i;
	json_t *r;
	int64_t total = 0, k = 0, *v;

	json_array_foreach(runs, i, r)
		total += json_integer_value(json_array_get(r, 1));
	v = malloc(sizeof(int64_t) * (size_t)(total + 1));
	json_array_foreach(runs, i, r)
		for (int64_t c = 0; c < json_integer_value(json_array_get(r, 1)); c++)
			v[k++] = json_integer_value(json_array_get(r, 0));
	*n = total;
	return v;
}

/* A 0/1 mask of n columns from [start, stop) runs (NULL: all 0). */
static int mask_equal(const uint8_t *m, int64_t n, json_t *runs)
{
	uint8_t *want = calloc((size_t)n + 1, 1);
	size_t i;
	json_t *r;
	int good = 1;

	json_array_foreach(runs, i, r)
		for (int64_t t = json_integer_value(json_array_get(r, 0)); t < json_integer_value(json_array_get(r, 1)); t++)
			want[t] = 1;
	for (int64_t t = 0; t < n; t++)
		good &= (m ? m[t] : 0) == want[t];
	free(want);
	return good;
}

/* A rule list of upstream ([[trigger, [ids]], ...]) flattened as hi3 keeps
 * it (trigger, k, ids ...). */
static int rules_equal(const int64_t *got, int n_got, json_t *want)
{
	size_t i, j;
	json_t *r, *id;
	int k = 0;

	json_array_foreach(want, i, r) {
		json_t *ids = json_array_get(r, 1);
		if (k + 2 > n_got || got[k] != json_integer_value(json_array_get(r, 0)) ||
		    got[k + 1] != (int64_t)json_array_size(ids))
			return 0;
		k += 2;
		json_array_foreach(ids, j, id)
			if (k >= n_got || got[k++] != json_integer_value(id))
				return 0;
	}
	return k == n_got;
}

static int list_equal(const int64_t *got, int n, json_t *want)
{
	if ((int)json_array_size(want) != n)
		return 0;
	for (int k = 0; k < n; k++)
		if (got[k] != json_integer_value(json_array_get(want, (size_t)k)))
			return 0;
	return 1;
}

/* Row r of a case against upstream's. */
static int row_equal(const char *what, const hi3_cond_row *row, json_t *want)
{
	int64_t n, *ids = unrun(json_object_get(want, "input_ids"), &n);
	json_t *rope = json_object_get(want, "rope"), *blocks = json_object_get(want, "blocks"), *e;
	int32_t *rp;
	size_t i;
	int good = 1;

	if (n != row->n) {
		diag("%s: %lld tokens, upstream %lld", what, (long long)row->n, (long long)n);
		good = 0;
	} else {
		for (int64_t t = 0; t < n && good; t++)
			if (row->ids[t] != ids[t]) {
				diag("%s: token %lld is %lld, upstream %lld", what, (long long)t, (long long)row->ids[t],
				     (long long)ids[t]);
				good = 0;
			}
	}
	free(ids);
	if (!good)
		return 0;
	rp = malloc(sizeof(int32_t) * 2 * (size_t)(n + 1));
	for (int64_t t = 0; t < n; t++)
		rp[2 * t] = rp[2 * t + 1] = (int32_t)t;
	json_array_foreach(rope, i, e) {
		int64_t t0 = json_integer_value(json_array_get(e, 0)), y = json_integer_value(json_array_get(e, 1));
		int64_t x = json_integer_value(json_array_get(e, 2)), c = json_integer_value(json_array_get(e, 3));
		for (int64_t k = 0; k < c; k++) {
			rp[2 * (t0 + k)] = (int32_t)y;
			rp[2 * (t0 + k) + 1] = (int32_t)(x + k);
		}
	}
	for (int64_t t = 0; t < n && good; t++)
		if (row->rope[2 * t] != rp[2 * t] || row->rope[2 * t + 1] != rp[2 * t + 1]) {
			diag("%s: column %lld: RoPE (%d, %d), upstream (%d, %d)", what, (long long)t, row->rope[2 * t],
			     row->rope[2 * t + 1], rp[2 * t], rp[2 * t + 1]);
			good = 0;
		}
	free(rp);
	if (row->n_blocks != (int)json_array_size(blocks)) {
		diag("%s: %d full-attention blocks, upstream %zu", what, row->n_blocks, json_array_size(blocks));
		good = 0;
	} else {
		json_array_foreach(blocks, i, e)
			if (row->blocks[2 * i] != json_integer_value(json_array_get(e, 0)) ||
			    row->blocks[2 * i + 1] != json_integer_value(json_array_get(e, 1))) {
				diag("%s: block %zu is [%d, %d), upstream [%lld, %lld)", what, i, row->blocks[2 * i],
				     row->blocks[2 * i + 1], (long long)json_integer_value(json_array_get(e, 0)),
				     (long long)json_integer_value(json_array_get(e, 1)));
				good = 0;
			}
	}
	if (!list_equal(row->timestep_index, row->n_ts, json_object_get(want, "timestep_index"))) {
		diag("%s: <timestep> positions differ (%d, upstream %zu)", what, row->n_ts,
		     json_array_size(json_object_get(want, "timestep_index")));
		good = 0;
	}
	if (!mask_equal(row->gen_image_mask, n, json_object_get(want, "gen_image_mask")) ||
	    !mask_equal(row->cond_vae_mask, n, json_object_get(want, "cond_vae_mask")) ||
	    !mask_equal(row->cond_vit_mask, n, json_object_get(want, "cond_vit_mask"))) {
		diag("%s: an image mask differs", what);
		good = 0;
	}
	return good;
}

static void run_case(const hi3_template *t, const char *set, json_t *c)
{
	const char *name = json_string_value(json_object_get(c, "name"));
	json_t *rows = json_object_get(c, "rows"), *stops = json_object_get(c, "stops");
	char *line = json_dumps(json_object_get(c, "request"), JSON_COMPACT | JSON_ENSURE_ASCII), what[160];
	hi3_requests *rq = NULL;
	hi3_error err = {0};
	int good = 1, f;

	snprintf(what, sizeof(what), "%s/%s", set, name);
	if (hi3_requests_parse(&rq, line, strlen(line), name, &err) != 0) {
		ok(0, "%s: request: %s", what, err.msg);
		free(line);
		return;
	}
	f = hi3i_template_cfg_factor(t, rq->r[0].mode);
	if (f != (int)json_array_size(rows)) {
		diag("%s: %d rows per request, upstream %zu", what, f, json_array_size(rows));
		good = 0;
	}
	for (int g = 0; good && g < f; g++) {
		hi3_cond_row row;
		char rw[200];
		snprintf(rw, sizeof(rw), "%s row %d (%s)", what, g, g ? "uncond" : "cond");
		if (hi3_template_encode(t, rq, 0, g, &row, &err) != 0) {
			diag("%s: %s", rw, err.msg);
			good = 0;
			break;
		}
		good &= row_equal(rw, &row, json_array_get(rows, (size_t)g));
		if (g == 0 && !json_is_null(stops) && !list_equal(row.stop_tokens, row.n_stop, stops)) {
			diag("%s: stop tokens differ (%d, upstream %zu)", rw, row.n_stop, json_array_size(stops));
			good = 0;
		}
		if (g == 0 && (!rules_equal(row.forced_after, row.n_forced, json_object_get(c, "forced_after")) ||
		               !rules_equal(row.greedy_among, row.n_greedy, json_object_get(c, "greedy_among")))) {
			diag("%s: decoding rules differ from upstream's stage transitions / ratio slice", rw);
			good = 0;
		}
		hi3_cond_row_release(&row);
	}
	ok(good, "%s: %s", what, line);
	hi3_requests_free(rq);
	free(line);
}

/* The preset's checkpoint against upstream's module tree. */
static void check_tensors(const char *src, const char *preset, const char *dir)
{
	char *path = hi3i_asprintf("%s/tests/fixtures/upstream/tensors-%s.txt", src, preset), line[512];
	FILE *f = fopen(path, "r");
	hi3_ckpt *ck = NULL;
	hi3_error err = {0};
	int n = 0, good = 1, dtypes = 1;

	if (!ok(f && hi3_ckpt_open(&ck, dir, &err) == 0, "%s: the checkpoint and %s open %s", preset, path, err.msg))
		goto out;
	while (fgets(line, sizeof(line), f)) {
		char *tab = strchr(line, '\t'), sh[128];
		const hi3_tensor *t;
		if (!tab)
			continue;
		*tab = 0;
		tab[strcspn(tab + 1, "\n") + 1] = 0;
		n++;
		if (!(t = hi3_ckpt_find(ck, line))) {
			diag("%s: no tensor '%s'", preset, line);
			good = 0;
			continue;
		}
		sh[0] = 0;
		for (int d = 0; d < t->ndim; d++)
			snprintf(sh + strlen(sh), sizeof(sh) - strlen(sh), "%s%lld", d ? "," : "", (long long)t->shape[d]);
		if (strcmp(sh, tab + 1)) {
			diag("%s: tensor '%s' is (%s), upstream (%s)", preset, line, sh, tab + 1);
			good = 0;
		}
		dtypes &= t->dtype == (strstr(line, ".mlp.gate.wg.") ? HI3_F32 : HI3_BF16);
	}
	ok(good && n == hi3_ckpt_count(ck), "%s: its %d tensors are upstream's %d, names and shapes", preset,
	   hi3_ckpt_count(ck), n);
	ok(dtypes, "%s: bf16, the router float32", preset);
	{
		char *shard = hi3i_asprintf("%s/model-00003-of-00003.safetensors", dir);
		const char *f0 = hi3_ckpt_file_of(ck, "model.wte.weight"), *f2 = hi3_ckpt_file_of(ck, "vae.decoder.conv_out.weight");
		ok(f0 && f2 && strstr(f0, "model-00001-of-00003.safetensors") && !strcmp(f2, shard),
		   "%s: three shards named by model.safetensors.index.json (%s, %s)", preset, f0, f2);
		free(shard);
	}
out:
	if (f)
		fclose(f);
	hi3_ckpt_close(ck);
	free(path);
}

static void run_set(const char *src, const char *set, const char *model_dir, const char *tok_path)
{
	char *path = hi3i_asprintf("%s/tests/fixtures/upstream/%s.json", src, set);
	hi3_template_opts to = {.model_dir = model_dir, .tokenizer = tok_path, .load_tokenizer = 1, .pad_id = -1};
	json_t *fx = json_load_file(path, 0, NULL), *buckets, *probes, *c, *e;
	hi3_template *t = NULL;
	hi3_error err = {0};
	int reso[128][2], n, good = 1;
	size_t i;

	if (!ok(fx && hi3_template_open(&t, &to, &err) == 0, "%s: the fixture and the model open %s", set, err.msg))
		goto out;
	ok(!strcmp(hi3_tok_hash(hi3_template_tok(t)), json_string_value(json_object_get(fx, "tokenizer_hash"))),
	   "%s: the tokenizer the fixture was made with (else: make check-ref-upstream)", set);
	buckets = json_object_get(fx, "buckets");
	n = hi3_template_buckets(t, reso, 128);
	good = n == (int)json_array_size(buckets);
	json_array_foreach(buckets, i, e)
		good &= (int)i < n && reso[i][0] == json_integer_value(json_array_get(e, 0)) &&
		        reso[i][1] == json_integer_value(json_array_get(e, 1));
	ok(good, "%s: the %d resolution buckets are upstream's (33 and 1024x768, 1280x720, 768x1024, 720x1280)", set, n);
	probes = json_object_get(fx, "bucket_of");
	good = 1;
	json_array_foreach(probes, i, e) {
		int64_t h = json_integer_value(json_array_get(e, 0)), w = json_integer_value(json_array_get(e, 1));
		int b = hi3i_bucket_of((const int (*)[2])reso, n, h, w);
		if (b != json_integer_value(json_array_get(e, 2))) {
			diag("%s: %lldx%lld lands in bucket %d, upstream %lld", set, (long long)h, (long long)w, b,
			     (long long)json_integer_value(json_array_get(e, 2)));
			good = 0;
		}
	}
	ok(good, "%s: sizes land in upstream's buckets (HxW, extras by exact ratio)", set);
	json_array_foreach(json_object_get(fx, "cases"), i, c)
		run_case(t, set, c);
out:
	hi3_template_free(t);
	json_decref(fx);
	free(path);
}

/* Row b of conditions c as a hi3_cond_row (pointers into c; nothing owned). */
static void row_of_cond(const hi3_cond *c, int b, hi3_cond_row *row)
{
	size_t o = (size_t)b * c->L;

	memset(row, 0, sizeof(*row));
	row->n = c->real_pos[b];
	row->ids = (int64_t *)c->input_ids + o;
	row->rope = (int32_t *)c->rope_pos + 2 * o;
	row->blocks = (int32_t *)c->image_blocks + (size_t)b * c->S * 2;
	while (row->n_blocks < c->S && row->blocks[2 * row->n_blocks] != row->blocks[2 * row->n_blocks + 1])
		row->n_blocks++;
	row->gen_image_mask = c->gen_image_mask ? (uint8_t *)c->gen_image_mask + o : NULL;
	row->cond_vit_mask = c->cond_vit_mask ? (uint8_t *)c->cond_vit_mask + o : NULL;
	row->cond_vae_mask = c->cond_vae_mask ? (uint8_t *)c->cond_vae_mask + o : NULL;
	row->timestep_index = c->timestep_index ? (int64_t *)c->timestep_index + (size_t)b * c->K : NULL;
	while (row->timestep_index && row->n_ts < c->K && row->timestep_index[row->n_ts] >= 0)
		row->n_ts++;
}

/* A JSON string (NUL bytes kept) equal to n bytes at p; null for p NULL. */
static int text_equal(json_t *want, const char *p, size_t n)
{
	if (json_is_null(want) || !want)
		return p == NULL;
	return p && json_string_length(want) == n && !memcmp(json_string_value(want), p, n);
}

/* One case of a rollout set: the text stage, then --continue on its tokens. */
static void rollout_case(hi3_template *const tt[2], const char *set, json_t *c)
{
	const char *name = json_string_value(json_object_get(c, "name"));
	json_t *text = json_object_get(c, "text"), *gen = json_object_get(c, "generated"), *want_err;
	const hi3_template *t = tt[json_is_true(json_object_get(c, "drop_think"))];
	char *line = json_dumps(json_object_get(c, "request"), JSON_COMPACT | JSON_ENSURE_ASCII), what[160];
	hi3_requests *rq = NULL, *cont = NULL;
	hi3_cond_build_opts bo = {0};
	hi3_continue_opts co = {0};
	hi3_cond *tc = NULL, *ic = NULL;
	hi3_cond_row row = {0};
	hi3_segment seg = {.B = 1};
	hi3_error err = {0};
	int64_t *tokens = NULL, cu[2] = {0, 0};
	uint8_t stop = 1;
	float *lp = NULL;
	char hash[17];
	int good = 1;
	size_t i;
	json_t *e;

	snprintf(what, sizeof(what), "%s/%s", set, name);
	if (hi3_requests_parse(&rq, line, strlen(line), name, &err) || hi3_template_encode(t, rq, 0, 0, &row, &err)) {
		ok(0, "%s: the text stage: %s", what, err.msg);
		goto out;
	}
	good = row_equal(what, &row, json_array_get(json_object_get(text, "rows"), 0)) &&
	       list_equal(row.stop_tokens, row.n_stop, json_object_get(text, "stops")) &&
	       rules_equal(row.forced_after, row.n_forced, json_object_get(text, "forced_after")) &&
	       rules_equal(row.greedy_among, row.n_greedy, json_object_get(text, "greedy_among")) &&
	       hi3i_template_cfg_factor(t, hi3i_request_row_mode(&rq->r[0])) == 1;
	hi3_cond_row_release(&row);
	ok(good, "%s: the text stage of image_size auto is generate_image's (row, stops, rules)", what);
	/* the text stage's conditions and a segment of the tokens upstream was given */
	cu[1] = (int64_t)json_array_size(gen);
	tokens = calloc((size_t)cu[1] + 1, sizeof(int64_t));
	lp = calloc((size_t)cu[1] + 1, sizeof(float));
	json_array_foreach(gen, i, e)
		tokens[i] = json_integer_value(e);
	if (hi3_cond_build(&tc, t, rq, &bo, &err)) {
		ok(0, "%s: the text stage's conditions: %s", what, err.msg);
		goto out;
	}
	hi3i_cond_hash(tc, hash);
	seg.T = cu[1], seg.tokens = tokens, seg.logprobs = lp, seg.cu_seqlens = cu, seg.stop_reason = &stop;
	seg.conditions_hash = hash;
	want_err = json_object_get(c, "error");
	if (want_err) {
		int rc = hi3_cond_continue(&ic, t, tc, &seg, &co, &err);
		ok(rc != 0 && err.status == HI3_ERR_INPUT && strstr(err.msg, "row 0") && !ic,
		   "%s: refused, naming the row, where upstream fails (%s): %s", what, json_string_value(want_err), err.msg);
		goto out;
	}
	if (hi3_cond_continue(&ic, t, tc, &seg, &co, &err) ||
	    hi3_requests_parse(&cont, ic->requests + 1, strlen(ic->requests) - 2, "continued", &err)) {
		ok(0, "%s: --continue: %s", what, err.msg);
		goto out;
	}
	{
		/* the cot, system prompt and size generate_image hands its image stage */
		const struct hi3i_request *r = &cont->r[0];
		json_t *size = json_object_get(c, "image_size");
		const char *sys;
		size_t sys_len;
		good = text_equal(json_object_get(c, "cot_text"), r->cot, r->cot_len);
		if (!good)
			diag("%s: cot '%.*s', upstream '%s'", what, (int)r->cot_len, r->cot ? r->cot : "",
			     json_string_value(json_object_get(c, "cot_text")));
		if (hi3i_template_system(t, cont, r, &sys, &sys_len, &err) || !text_equal(json_object_get(c, "system"),
		                                                                        sys_len ? sys : NULL, sys_len)) {
			diag("%s: the system prompt differs from upstream's (%.20s...)", what, sys_len ? sys : "none");
			good = 0;
		}
		if (r->size_kind != 1 || r->size_h != json_integer_value(json_array_get(size, 0)) ||
		    r->size_w != json_integer_value(json_array_get(size, 1))) {
			diag("%s: image_size %lldx%lld, upstream %lldx%lld", what, (long long)r->size_h, (long long)r->size_w,
			     (long long)json_integer_value(json_array_get(size, 0)),
			     (long long)json_integer_value(json_array_get(size, 1)));
			good = 0;
		}
		ok(good, "%s: the cot, system prompt and image size are generate_image's", what);
	}
	good = ic->B == (int)json_array_size(json_object_get(c, "image")) && !strcmp(ic->mode, "gen_image");
	json_array_foreach(json_object_get(c, "image"), i, e) {
		char rw[200];
		snprintf(rw, sizeof(rw), "%s image row %zu", what, i);
		if (!good)
			break;
		row_of_cond(ic, (int)i, &row);
		good &= row_equal(rw, &row, e);
	}
	memset(&row, 0, sizeof(row));
	ok(good, "%s: the image stage's %d rows are upstream's, token for token", what, ic ? ic->B : 0);
out:
	hi3_cond_row_release(&row);
	hi3_cond_close(ic);
	hi3_cond_close(tc);
	hi3_requests_free(cont);
	hi3_requests_free(rq);
	free(tokens);
	free(lp);
	free(line);
}

static void run_rollout(const char *src, const char *set, const char *model_dir, const char *tok_path)
{
	char *path = hi3i_asprintf("%s/tests/fixtures/upstream/rollout-%s.json", src, set);
	hi3_template_opts to = {.model_dir = model_dir, .tokenizer = tok_path, .load_tokenizer = 1, .pad_id = -1};
	json_t *fx = json_load_file(path, JSON_ALLOW_NUL, NULL), *c;
	hi3_template *t[2] = {NULL, NULL};
	hi3_error err = {0};
	size_t i;

	if (!ok(fx && hi3_template_open(&t[0], &to, &err) == 0 &&
	        (to.drop_think = 1, hi3_template_open(&t[1], &to, &err) == 0), "%s: the fixture %s and the model open %s",
	        set, path, err.msg))
		goto out;
	ok(!strcmp(hi3_tok_hash(hi3_template_tok(t[0])), json_string_value(json_object_get(fx, "tokenizer_hash"))),
	   "rollout-%s: the tokenizer the fixture was made with (else: make check-ref-upstream)", set);
	json_array_foreach(json_object_get(fx, "cases"), i, c)
		rollout_case(t, set, c);
out:
	hi3_template_free(t[0]);
	hi3_template_free(t[1]);
	json_decref(fx);
	free(path);
}

int main(void)
{
	const char *src = getenv("SRCDIR") ? getenv("SRCDIR") : ".";
	char *root = testdir_new("upstream");
	static const char *const presets[] = {"tiny-release", "tiny-instruct", "tiny-distil"};

	if (!root)
		return 1;
	for (int p = 0; p < 3; p++) {
		char *dir = hi3i_asprintf("%s/%s", root, presets[p]);
		hi3_init_opts io = {.preset = presets[p]};
		hi3_error err = {0};
		if (ok(hi3_init_model(dir, &io, &err) == 0, "%s: init-model %s", presets[p], err.msg)) {
			check_tensors(src, presets[p], dir);
			run_set(src, presets[p], dir, NULL);
			if (p > 0)
				run_rollout(src, presets[p], dir, NULL);
		}
		free(dir);
	}
	{
		char *dir = hi3i_asprintf("%s/tests/fixtures/released/instruct", src);
		char *tok = hi3i_asprintf("%s/tests/fixtures/released/tokenizer.json", src);
		run_set(src, "released-instruct", dir, tok);
		run_rollout(src, "released-instruct", dir, tok);
		free(dir);
		dir = hi3i_asprintf("%s/tests/fixtures/released", src);
		run_set(src, "released-base", dir, tok);
		free(dir);
		free(tok);
	}
	testdir_done(root);
	return done_testing();
}
