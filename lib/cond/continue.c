/*
 * continue.c -- the image stage after a text stage (tokenize-concat
 * --continue, hi3-tokenize-concat(1)): what upstream's generate_image
 * (modeling_hunyuan_image_3.py, the Instruct code at 1201fe8) does between
 * its text stage and its image stage, for every row of a batch.
 *
 * The text stage is the conditions of gen_image requests with image_size
 * "auto" (metadata next_stage) and the segment decode wrote from them. For
 * row i, with g its generated tokens:
 *
 *   - think, recaption, think_recaption: the cot is the first task's start
 *     token (<think>, or <recaption> for recaption) and the decoded g up
 *     to and including its first end token (</recaption> when the task has
 *     recaption, else </think>); when g has none, all of g, its last token
 *     (the ratio token) included, as upstream keeps it. With drop_think,
 *     a cot holding <think> and <recaption> is cut to
 *     <recaption>...</recaption> (the text between the first and second
 *     <recaption>, up to </recaption>), and a non-empty system prompt
 *     becomes en_recaption's, which generate_image does not strip;
 *   - other tasks (the img_ratio stage): the request's own cot;
 *   - the image size: the bucket of g's last token, a ratio token (none:
 *     the row is refused, as upstream fails on it).
 *
 * The row's request is then the explicit gen_image request with that cot,
 * size and the row's seed, built by the template as tokenize-concat builds
 * any request (so the CFG uncond rows are upstream's too); its cond images
 * are the text stage's (their views, and encoder outputs when stored), as
 * generate_image hands batch_cond_images from one stage to the next.
 */
#include <string.h>
#include "cond/template.h"
#include "format/provenance.h"

/* The index of tok among the ratio tokens of the buckets, or -1. */
static int ratio_of(const hi3_template *t, int64_t tok)
{
	for (int k = 0; k < t->n_reso; k++) {
		char name[32];
		snprintf(name, sizeof(name), "<img_ratio_%d>", k);
		if (hi3_tok_id(t->tok, name) == tok)
			return k;
	}
	return -1;
}

/* A text that may hold NUL bytes (a decoded byte 0 is one). */
struct text {
	char *p;
	size_t n;
};

static const char *find(const char *s, size_t n, const char *sub)
{
	return memmem(s, n, sub, strlen(sub));
}

/* The cot generate_image takes from the text stage of task (think,
 * recaption or think_recaption) that generated g (n tokens): the start
 * token, then the decoded tokens up to the first end token. */
static int cot_of(const hi3_template *t, int task, const int64_t *g, int64_t n, struct text *cot, hi3_error *err)
{
	const char *start = task == HI3I_BOT_RECAPTION ? "<recaption>" : "<think>";
	const char *end = task == HI3I_BOT_THINK ? "</think>" : "</recaption>";
	const int flags = HI3_TOK_SPECIAL | HI3_TOK_SKIP_UNKNOWN | (t->clean_up ? HI3_TOK_CLEAN_UP : 0);
	int64_t end_id = hi3_tok_id(t->tok, end), m = n;
	size_t sl = strlen(start), len;
	char *text = NULL;

	for (int64_t j = 0; j < n; j++)
		if (g[j] == end_id) {
			m = j + 1;
			break;
		}
	if (hi3_tok_decode(t->tok, g, (size_t)m, flags, &text, &len, err))
		return -1;
	if (!(cot->p = hi3i_malloc(sl + len + 1, err))) {
		free(text);
		return -1;
	}
	memcpy(cot->p, start, sl);
	memcpy(cot->p + sl, text, len + 1);
	cot->n = sl + len;
	free(text);
	return 0;
}

/* drop_think: a cot with <think> and <recaption> becomes
 * <recaption>part</recaption>, part Python's cot.split("<recaption>")[1]
 * cut at its first </recaption> (*cut = 1); others stay. */
static int drop_think(struct text *cot, int *cut, hi3_error *err)
{
	static const char open[] = "<recaption>", close[] = "</recaption>";
	const char *a, *b, *e;
	char *p;
	size_t n;

	*cut = 0;
	if (!find(cot->p, cot->n, "<think>") || !(a = find(cot->p, cot->n, open)))
		return 0;
	a += strlen(open);
	b = find(a, (size_t)(cot->p + cot->n - a), open);
	n = (size_t)((b ? b : cot->p + cot->n) - a);
	if ((e = find(a, n, close)))
		n = (size_t)(e - a);
	if (!(p = hi3i_malloc(strlen(open) + n + strlen(close) + 1, err)))
		return -1;
	memcpy(p, open, strlen(open));
	memcpy(p + strlen(open), a, n);
	memcpy(p + strlen(open) + n, close, strlen(close) + 1);
	free(cot->p);
	cot->p = p;
	cot->n = strlen(open) + n + strlen(close);
	*cut = 1;
	return 0;
}

/* The explicit gen_image request that continues text stage row i (its
 * request obj), as a new object into *out. */
static int continue_row(const hi3_template *t, const hi3_cond *text, const hi3_segment *seg, int i, json_t *obj,
                        json_t **out, hi3_error *err)
{
	const char *name = HI3I_COND(text)->name;
	const int64_t *g = seg->tokens + seg->cu_seqlens[i];
	const int64_t n = seg->cu_seqlens[i + 1] - seg->cu_seqlens[i];
	hi3_requests *one = NULL;
	json_t *req = NULL;
	struct text cot = {0};
	char *line = NULL, size[32];
	int k = n ? ratio_of(t, g[n - 1]) : -1, task, rc = -1;

	*out = NULL;
	if (k < 0) {
		const char *why = seg->stop_reason[i] == 2 ? "it reached its length" :
		                  seg->stop_reason[i] == 1 ? "it stopped at another token" : "it is not finished";
		if (n)
			return hi3_error_set(err, HI3_ERR_INPUT, "%s: row %d: the text stage ended at token %lld, not a ratio "
			                     "token (%s): no image size to continue with", name, i, (long long)g[n - 1], why);
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: row %d: the text stage generated nothing (%s): no image "
		                     "size to continue with", name, i, why);
	}
	if (!(line = json_dumps(obj, JSON_COMPACT)) || !(req = json_deep_copy(obj))) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		goto out;
	}
	if (hi3_requests_parse(&one, line, strlen(line), name, err))
		goto out;
	if (!hi3i_request_text_stage(&one->r[0])) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: row %d: its request is not a gen_image request with image_size "
		              "auto", name, i);
		goto out;
	}
	task = hi3i_template_row_task(t, &one->r[0]);
	if (task != HI3I_BOT_IMG_RATIO) {
		int cut = 0;
		if (cot_of(t, task, g, n, &cot, err) || (t->drop_think && drop_think(&cot, &cut, err)))
			goto out;
		if (json_object_set_new(req, "cot", json_stringn(cot.p, cot.n)))
			goto oom;
		if (t->drop_think && cut) {
			/* generate_image: the system prompt becomes en_recaption's, unstripped */
			const char *sys;
			size_t sys_len;
			if (hi3i_template_system(t, one, &one->r[0], &sys, &sys_len, err))
				goto out;
			if (sys && sys_len && (json_object_set_new(req, "system", json_string("en_recaption")) ||
			                       json_object_set_new(req, "strip_system", json_false())))
				goto oom;
		}
	}
	snprintf(size, sizeof(size), "%dx%d", t->reso[k][0], t->reso[k][1]);
	if (json_object_set_new(req, "image_size", json_string(size)) ||
	    json_object_set_new(req, "seed", json_integer(text->seeds[i])))
		goto oom;
	*out = req;
	req = NULL;
	rc = 0;
	goto out;
oom:
	hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
out:
	json_decref(req);
	hi3_requests_free(one);
	free(line);
	free(cot.p);
	return rc;
}

/* The text stage's conditions and segment, checked: what --continue reads. */
static int check_text_stage(const hi3_template *t, const hi3_cond *text, const hi3_segment *seg, hi3_error *err)
{
	const char *name = HI3I_COND(text)->name, *next = hi3_cond_meta(text, "next_stage");
	const char *sp = seg->st ? hi3_st_path(seg->st) : "the segment";

	if (!next || strcmp(next, "gen_image"))
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: not the text stage of gen_image requests (metadata "
		                     "next_stage is %s%s%s): tokenize-concat makes one from requests with \"mode\": "
		                     "\"gen_image\", \"image_size\": \"auto\"", name, next ? "'" : "absent",
		                     next ? next : "", next ? "'" : "");
	if (seg->B != text->B)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: %d rows, but the conditions %s have %d", sp, seg->B, name,
		                     text->B);
	if (hi3i_check_made_from(sp, seg->conditions_hash, text, err))
		return -1;
	if (!t->tok)
		return hi3_error_set(err, HI3_ERR_USAGE, "--continue needs the tokenizer: give -m MODEL");
	if (strcmp(text->tokenizer_hash, hi3_tok_hash(t->tok)))
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: made with tokenizer %s, but %s hashes to %s", name,
		                     text->tokenizer_hash, t->tok_path, hi3_tok_hash(t->tok));
	if (text->model_fingerprint[0] && t->fingerprint[0] && strcmp(text->model_fingerprint, t->fingerprint))
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: made for model fingerprint %s, but the model has %s", name,
		                     text->model_fingerprint, t->fingerprint);
	return 0;
}

/* Each continued request's cond images as the text stage's row has them. */
static int take_geometry(const hi3_cond *text, const int *rows, hi3_requests *rq, hi3_error *err)
{
	for (int q = 0; q < rq->n; q++) {
		struct hi3i_request *r = &rq->r[q];
		int k0 = 0, n = 0;
		for (int k = 0; k < text->NI; k++)
			if (text->image_row[k] == rows[q])
				n++;
			else if (text->image_row[k] < rows[q])
				k0++;
		if (!r->image_paths)
			continue;
		if (n != r->n_cond)
			return hi3_error_set(err, HI3_ERR_INPUT, "%s: row %d: %d images in the conditions, %d in its request",
			                     HI3I_COND(text)->name, rows[q], n, r->n_cond);
		if (!(r->cond_grid = hi3i_calloc((size_t)n, sizeof(*r->cond_grid), err)))
			return -1;
		for (int k = 0; k < n; k++) {
			r->cond_grid[k][0] = text->vae_shape[2 * (k0 + k)];
			r->cond_grid[k][1] = text->vae_shape[2 * (k0 + k) + 1];
			r->cond_grid[k][2] = text->vit_grid[2 * (k0 + k)];
			r->cond_grid[k][3] = text->vit_grid[2 * (k0 + k) + 1];
		}
	}
	return 0;
}

/* An error about a continued request names it "NAME:ROW: ..." (the
 * requests' name and line); say "NAME: row ROW: ..." instead. */
static void name_row(hi3_error *err, const hi3_requests *rq)
{
	for (int q = 0; err && q < rq->n; q++) {
		char pre[128], msg[sizeof(err->msg)];
		size_t n = (size_t)snprintf(pre, sizeof(pre), "%s:%d: ", rq->name, rq->r[q].line);
		if (n < sizeof(pre) && !strncmp(err->msg, pre, n)) {
			snprintf(msg, sizeof(msg), "%s: row %d: %s", rq->name, rq->r[q].line, err->msg + n);
			memcpy(err->msg, msg, sizeof(msg));
			return;
		}
	}
}

int hi3_cond_continue(hi3_cond **out, const hi3_template *t, const hi3_cond *text, const hi3_segment *seg,
                      const hi3_continue_opts *o, hi3_error *err)
{
	const int n = o->rows ? o->n_rows : text->B;
	json_t *all = NULL, *lines = json_array(), *picked = json_array();
	hi3_requests *rq = NULL;
	hi3_cond_build_opts bo = o->build;
	int *rows = NULL, rc = -1;
	char *jsonl = NULL, *rows_text = NULL, name[64], hash[17];

	*out = NULL;
	if (!lines || !picked)
		goto oom;
	if (check_text_stage(t, text, seg, err))
		goto out;
	if (n < 1) {
		hi3_error_set(err, HI3_ERR_USAGE, "no rows to continue");
		goto out;
	}
	if (!(rows = hi3i_malloc(sizeof(int) * (size_t)n, err)))
		goto out;
	for (int q = 0; q < n; q++) {
		rows[q] = o->rows ? o->rows[q] : q;
		if (rows[q] < 0 || rows[q] >= text->B) {
			hi3_error_set(err, HI3_ERR_USAGE, "--rows: row %d of %s, which has %d", rows[q], HI3I_COND(text)->name,
			              text->B);
			goto out;
		}
	}
	if (!(all = json_loads(text->requests, JSON_ALLOW_NUL, NULL)) || json_array_size(all) != (size_t)text->B) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: __metadata__ 'requests' is not an array of its %d requests",
		              HI3I_COND(text)->name, text->B);
		goto out;
	}
	for (int q = 0; q < n; q++) {
		json_t *req;
		if (continue_row(t, text, seg, rows[q], json_array_get(all, (size_t)rows[q]), &req, err))
			goto out;
		if (json_array_append_new(lines, req) || json_array_append_new(picked, json_integer(rows[q])))
			goto oom;
	}
	/* the explicit requests, one a line, parsed as any requests are */
	for (size_t q = 0; q < json_array_size(lines); q++) {
		char *l = json_dumps(json_array_get(lines, q), JSON_COMPACT | JSON_ENSURE_ASCII), *nj;
		nj = l ? hi3i_asprintf("%s%s\n", jsonl ? jsonl : "", l) : NULL;
		free(l);
		free(jsonl);
		if (!(jsonl = nj))
			goto oom;
	}
	snprintf(name, sizeof(name), "%.60s", HI3I_COND(text)->name);
	if (hi3_requests_parse(&rq, jsonl, strlen(jsonl), name, err))
		goto out;
	for (int q = 0; q < rq->n; q++)
		rq->r[q].line = rows[q];    /* messages name the text stage's row */
	if (take_geometry(text, rows, rq, err))
		goto out;
	{
		const char *post = hi3_cond_meta(text, "vae_posterior");
		bo.vae_sample = post && !strcmp(post, "sample");
	}
	if (hi3i_cond_build(out, t, rq, &bo, text, rows, err)) {
		name_row(err, rq);
		goto out;
	}
	hi3i_cond_hash(text, hash);
	if (hi3i_cond_set_meta(HI3I_COND(*out), "text_conditions_hash", hash, err))
		goto out;
	hi3_segment_hash(seg, hash);
	if (!(rows_text = json_dumps(picked, JSON_COMPACT)))
		goto oom;
	if (hi3i_cond_set_meta(HI3I_COND(*out), "text_segment_hash", hash, err) ||
	    hi3i_cond_set_meta(HI3I_COND(*out), "text_rows", rows_text, err))
		goto out;
	rc = 0;
	goto out;
oom:
	hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
out:
	if (rc) {
		hi3_cond_close(*out);
		*out = NULL;
	}
	hi3_requests_free(rq);
	json_decref(all);
	json_decref(lines);
	json_decref(picked);
	free(rows);
	free(jsonl);
	free(rows_text);
	return rc;
}
