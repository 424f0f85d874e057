/* test-cond.c -- conditions: build, the batching rule (hi3-batching(7),
 * rule 1), per-row vs batch, the pad-position ablation, merge, validation
 * of bad files, and the image geometry facts (buckets, ViT grid). */
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include "hi3.h"
#include "cond/cond-internal.h"
#include "tap.h"
#include "testdir.h"

static char *tmpdir;

static const char *tmp(const char *name)
{
	static char buf[4][512];
	static int k;

	k = (k + 1) % 4;
	snprintf(buf[k], sizeof(buf[k]), "%s/%s", tmpdir, name);
	return buf[k];
}

static hi3_template *pretok_template(int64_t pad_id)
{
	hi3_template_opts o = {.pad_id = pad_id};
	hi3_template *t = NULL;
	hi3_error err = {0};

	if (hi3_template_open(&t, &o, &err) != 0)
		diag("template: %s", err.msg);
	return t;
}

static hi3_cond *build(const char *jsonl, int per_row, int pad_zero, int64_t seed_base, hi3_error *err)
{
	hi3_requests *rq = NULL;
	hi3_template *t = pretok_template(7);
	hi3_cond_build_opts o = {.per_row = per_row, .pad_zero = pad_zero, .seed_base = seed_base};
	hi3_cond *c = NULL;

	if (hi3_requests_parse(&rq, jsonl, strlen(jsonl), "req.jsonl", err) == 0)
		hi3_cond_build(&c, t, rq, &o, err);
	hi3_requests_free(rq);
	hi3_template_free(t);
	return c;
}

static const char batch3[] =
	"{\"tokens\": [1, 2, 3], \"seed\": 100}\n"
	"\n"
	"{\"tokens\": [4, 5, 6, 8, 9, 10], \"stop_tokens\": [11, 12]}\n"
	"{\"tokens\": [13], \"bot_task\": \"think\"}\n";

/* Column t of row b is valid when t < real_pos[b]. */
static int same_valid(const hi3_cond *a, const hi3_cond *b)
{
	if (a->B != b->B || a->L != b->L || a->S != b->S || a->NS != b->NS || a->K != b->K)
		return 0;
	for (int r = 0; r < a->B; r++) {
		if (a->real_pos[r] != b->real_pos[r] || a->seeds[r] != b->seeds[r])
			return 0;
		for (int t = 0; t < a->real_pos[r]; t++) {
			size_t i = (size_t)r * a->L + t;
			if (a->input_ids[i] != b->input_ids[i] || a->rope_pos[2 * i] != b->rope_pos[2 * i] ||
			    a->rope_pos[2 * i + 1] != b->rope_pos[2 * i + 1])
				return 0;
		}
		if (memcmp(a->image_blocks + (size_t)r * a->S * 2, b->image_blocks + (size_t)r * b->S * 2,
		           (size_t)a->S * 8) ||
		    memcmp(a->stop_tokens + (size_t)r * a->NS, b->stop_tokens + (size_t)r * b->NS, (size_t)a->NS * 8))
			return 0;
	}
	return 1;
}

static void test_build(void)
{
	hi3_error err = {0};
	hi3_cond *c = build(batch3, 0, 0, 40, &err), *p = build(batch3, 1, 0, 40, &err);
	int ok_pos = 1, ok_pad = 1;

	if (!ok(c && p, "pre-tokenized requests build without a tokenizer, batch and per row")) {
		diag("%s", err.msg);
		return;
	}
	ok(c->B == 3 && c->L == 6 && c->S == 1 && c->NS == 2 && c->K == 0, "shape: B 3, L 6 (longest row), S 1, NS 2");
	ok(c->real_pos[0] == 3 && c->real_pos[1] == 6 && c->real_pos[2] == 1, "real_pos is each row's length");
	ok(c->seeds[0] == 100 && c->seeds[1] == 41 && c->seeds[2] == 42, "seeds: the request's, else base + row");
	ok(c->stop_tokens[0] == -1 && c->stop_tokens[2] == 11 && c->stop_tokens[3] == 12,
	   "stop tokens: explicit ones kept, -1 padded (no eos known without a model)");
	for (int b = 0; b < c->B; b++)
		for (int t = 0; t < c->L; t++) {
			size_t i = (size_t)b * c->L + t;
			ok_pos &= c->position_ids[i] == t && c->rope_pos[2 * i] == t && c->rope_pos[2 * i + 1] == t;
			if (t >= c->real_pos[b])
				ok_pad &= c->input_ids[i] == 7;
		}
	ok(ok_pos, "position_ids[b, t] = t on every column, pads included; rope (t, t)");
	ok(ok_pad, "pad columns hold the pad id");
	ok(c->input_ids[6] == 4 && c->input_ids[11] == 10 && c->input_ids[12] == 13, "rows verbatim");
	ok(!strcmp(c->template_name, "none") && !strcmp(c->bot_task, "mixed") && !strcmp(c->mode, "gen_text") &&
	   hi3_cond_cfg_factor(c) == 1 && !strcmp(hi3_cond_meta(c, "pad_positions"), "continue"),
	   "metadata: template none, bot_task mixed, gen_text, cfg_factor 1, pad_positions continue");
	ok(same_valid(c, p) && !memcmp(c->position_ids, p->position_ids, (size_t)c->B * c->L * 8) &&
	   !memcmp(c->input_ids, p->input_ids, (size_t)c->B * c->L * 8) && !strcmp(c->requests, p->requests),
	   "--per-row equals --batch on every valid position, on position_ids everywhere, and on the requests");
	if (ok(hi3_cond_write(c, tmp("a.st"), &err) == 0 && hi3_cond_write(p, tmp("p.st"), &err) == 0,
	       "write both")) {
		char *x = NULL, *y = NULL;
		size_t nx = 0, ny = 0;
		hi3i_read_file(tmp("a.st"), &x, &nx, &err);
		hi3i_read_file(tmp("p.st"), &y, &ny, &err);
		ok(x && y && nx == ny && !memcmp(x, y, nx), "the two files are byte for byte the same");
		free(x);
		free(y);
	}
	hi3_cond_close(c);
	hi3_cond_close(p);
}

static void test_pad_zero(void)
{
	hi3_error err = {0};
	hi3_cond *c = build(batch3, 0, 0, 0, &err), *z = build(batch3, 0, 1, 0, &err), *zr = build(batch3, 1, 1, 0, &err);
	int exact = 1, n_diff = 0;

	if (!ok(c && z && zr, "build with --pad-positions=zero")) {
		diag("%s", err.msg);
		return;
	}
	for (int b = 0; b < c->B; b++)
		for (int t = 0; t < c->L; t++) {
			size_t i = (size_t)b * c->L + t;
			int pad = t >= c->real_pos[b];
			if (c->position_ids[i] != z->position_ids[i]) {
				n_diff++;
				exact &= pad && z->position_ids[i] == 0;
			} else {
				exact &= !pad;
			}
		}
	ok(exact && n_diff == 3 + 0 + 5, "pad_zero differs exactly at the 8 pad columns of position_ids (there 0)");
	ok(same_valid(c, z) && !memcmp(c->input_ids, z->input_ids, (size_t)c->B * c->L * 8) &&
	   !memcmp(c->rope_pos, z->rope_pos, (size_t)c->B * c->L * 8),
	   "and nowhere else (ids, rope, blocks, stops, seeds)");
	ok(!memcmp(z->position_ids, zr->position_ids, (size_t)c->B * c->L * 8), "per row agrees with pad_zero too");
	ok(!strcmp(hi3_cond_meta(z, "pad_positions"), "zero"), "metadata pad_positions zero");
	ok(hi3_cond_write(z, tmp("z.st"), &err) == 0, "write the pad_zero file");
	hi3_cond_close(z);
	ok(hi3_cond_open(&z, tmp("z.st"), &err) == 0, "a pad_zero file opens (its rule is in the metadata)");
	hi3_cond_close(z);
	hi3_cond_close(zr);
	hi3_cond_close(c);
}

static void test_concat(void)
{
	hi3_error err = {0};
	hi3_cond *a = build("{\"tokens\": [1, 2]}\n{\"tokens\": [3, 4, 5, 6, 7, 8, 9]}\n", 0, 0, 0, &err);
	hi3_cond *b = build("{\"tokens\": [10, 11, 12]}\n", 0, 0, 5, &err);
	hi3_cond *m = NULL, *fa = NULL, *fb = NULL, *all = NULL;
	const hi3_cond *in[2];
	int good = 1;

	if (!a || !b || hi3_cond_write(a, tmp("ca.st"), &err) || hi3_cond_write(b, tmp("cb.st"), &err) ||
	    hi3_cond_open(&fa, tmp("ca.st"), &err) || hi3_cond_open(&fb, tmp("cb.st"), &err)) {
		ok(0, "make two files: %s", err.msg);
		goto out;
	}
	in[0] = fb;
	in[1] = fa;
	if (!ok(hi3_cond_concat(&m, in, 2, 0, &err) == 0, "merge files of B 1 and 2, L 3 and 7")) {
		diag("%s", err.msg);
		goto out;
	}
	ok(m->B == 3 && m->L == 7, "merged: B 3, L 7");
	ok(m->real_pos[0] == 3 && m->real_pos[1] == 2 && m->real_pos[2] == 7 && m->seeds[0] == 5 &&
	   m->seeds[1] == 0 && m->seeds[2] == 1, "rows in file order with their lengths and seeds");
	for (int r = 0; r < 3; r++)
		for (int t = 0; t < 7; t++) {
			size_t i = (size_t)r * 7 + t;
			good &= m->position_ids[i] == t;
			if (t >= m->real_pos[r])
				good &= m->input_ids[i] == 7 && m->rope_pos[2 * i] == t;
		}
	ok(good, "merged pads: pad id, position ids continuing each row, rope (t, t)");
	all = build("{\"tokens\": [10, 11, 12], \"seed\": 5}\n{\"tokens\": [1, 2], \"seed\": 0}\n"
	            "{\"tokens\": [3, 4, 5, 6, 7, 8, 9], \"seed\": 1}\n", 0, 0, 0, &err);
	ok(all && same_valid(m, all) && !memcmp(m->position_ids, all->position_ids, 3 * 7 * 8),
	   "merging equals encoding the whole batch at once");
	ok(hi3_cond_write(m, tmp("m.st"), &err) == 0, "write the merged file");
	hi3_cond_close(m);
	m = NULL;
	ok(hi3_cond_open(&m, tmp("m.st"), &err) == 0 && m->B == 3, "the merged file opens and validates");
	{
		json_t *rq = m ? json_loads(m->requests, 0, NULL) : NULL;
		ok(json_array_size(rq) == 3 &&
		   json_integer_value(json_array_get(json_object_get(json_array_get(rq, 0), "tokens"), 0)) == 10,
		   "merged requests: all three, in row order");
		json_decref(rq);
	}
out:
	hi3_cond_close(all);
	hi3_cond_close(m);
	hi3_cond_close(fa);
	hi3_cond_close(fb);
	hi3_cond_close(a);
	hi3_cond_close(b);
}

/* ------------------------------------------------- bad files, by tensor */

struct mut {
	const char *what;            /* test name */
	const char *tensor;          /* tensor to alter, or NULL */
	size_t index;                /* element to set */
	int64_t value;
	const char *meta_key, *meta_val;   /* metadata to change (NULL: none; val NULL: drop) */
	int drop;                    /* drop the tensor */
	int64_t bad_shape;           /* >0: give the tensor this many columns extra */
	const char *expect;          /* the message names this */
};

/* Write a copy of the good file src (B 3, L 6) with one mutation. */
static int write_mutant(const hi3_st *src, const struct mut *m, const char *path)
{
	hi3_st_writer *w = hi3_stw_new();
	void *bufs[16] = {0};
	hi3_error err = {0};
	int rc;

	for (int i = 0; i < hi3_st_count(src); i++) {
		const hi3_tensor *t = hi3_st_at(src, i);
		int64_t shape[HI3_MAX_DIMS];
		size_t sz = hi3_dtype_size(t->dtype);
		if (m->drop && !strcmp(t->name, m->tensor))
			continue;
		memcpy(shape, t->shape, sizeof(shape));
		bufs[i] = calloc(1, t->nbytes + 64 * sz);
		memcpy(bufs[i], t->data, t->nbytes);
		if (m->tensor && !strcmp(t->name, m->tensor)) {
			if (m->bad_shape)
				shape[t->ndim - 1] += m->bad_shape;
			else if (t->dtype == HI3_I64)
				((int64_t *)bufs[i])[m->index] = m->value;
			else if (t->dtype == HI3_I32)
				((int32_t *)bufs[i])[m->index] = (int32_t)m->value;
			else
				((uint8_t *)bufs[i])[m->index] = (uint8_t)m->value;
		}
		hi3_stw_add(w, t->name, t->dtype, t->ndim, shape, bufs[i]);
	}
	for (int i = 0; i < hi3_st_meta_count(src); i++) {
		const char *k, *v;
		hi3_st_meta_at(src, i, &k, &v);
		if (m->meta_key && !strcmp(k, m->meta_key)) {
			if (m->meta_val)
				hi3_stw_meta(w, k, m->meta_val);
			continue;
		}
		hi3_stw_meta(w, k, v);
	}
	rc = hi3_stw_write(w, path, &err);
	hi3_stw_free(w);
	for (int i = 0; i < 16; i++)
		free(bufs[i]);
	return rc;
}

static void test_validation(void)
{
	/* the good file: rows of 3, 6 and 1 tokens, L 6; row-major (B, L) */
	static const struct mut muts[] = {
		{"real_pos 0", "real_pos", 0, 0, .expect = "'real_pos': row 0"},
		{"real_pos past L", "real_pos", 2, 7, .expect = "'real_pos': row 2"},
		{"position id of a valid column", "position_ids", 1, 5, .expect = "'position_ids': row 0, column 1"},
		{"pad position 0 in a continue file", "position_ids", 4, 0, .expect = "'position_ids': row 0, column 4"},
		{"pad column without the pad id", "input_ids", 5, 3, .expect = "'input_ids': row 0, column 5"},
		{"negative token id", "input_ids", 0, -2, .expect = "'input_ids': row 0, column 0"},
		{"pad rope not (t, t)", "rope_pos", 2 * 4, 0, .expect = "'rope_pos': row 0, column 4"},
		{"block past the row", "image_blocks", 1, 4, .expect = "'image_blocks': row 0"},
		{"block reversed", "image_blocks", 0, 2, .expect = "'image_blocks': row 0"},
		{"stop token below -1", "stop_tokens", 0, -5, .expect = "'stop_tokens': row 0"},
		{"stop token after the -1 padding", "stop_tokens", 1, 9, .expect = "'stop_tokens': row 0"},
		{"mask value 2", "gen_image_mask", 0, 2, .expect = "'gen_image_mask': row 0, column 0"},
		{"mask set at a pad column", "gen_image_mask", 5, 1, .expect = "'gen_image_mask': row 0, column 5"},
		{"position_ids of the wrong shape", "position_ids", .bad_shape = 1, .expect = "position_ids"},
		{"real_pos missing", "real_pos", .drop = 1, .expect = "'real_pos' is missing"},
		{"wrong format", .meta_key = "format", .meta_val = "hi3.kv", .expect = "expected format 'hi3.conditions'"},
		{"wrong version", .meta_key = "format_version", .meta_val = "9", .expect = "format_version"},
		{"unknown mode", .meta_key = "mode", .meta_val = "gen_video", .expect = "'mode'"},
		{"unknown bot_task", .meta_key = "bot_task", .meta_val = "dream", .expect = "'bot_task'"},
		{"cfg_factor not dividing B", .meta_key = "cfg_factor", .meta_val = "2", .expect = "'cfg_factor'"},
		{"requests not an array of B", .meta_key = "requests", .meta_val = "[1]", .expect = "'requests'"},
		{"pad_id missing", .meta_key = "pad_id", .expect = "'pad_id' is missing"},
		{"pad_positions unknown", .meta_key = "pad_positions", .meta_val = "left", .expect = "'pad_positions'"},
	};
	hi3_error err = {0};
	hi3_cond *c = build(batch3, 0, 0, 0, &err), *x;
	hi3_st *st = NULL;

	/* add a gen_image_mask to the good file to exercise mask checks */
	if (c) {
		uint8_t *mask = calloc((size_t)c->B * c->L, 1);
		mask[1] = 1;
		c->gen_image_mask = mask;
		hi3_cond_write(c, tmp("good.st"), &err);
		c->gen_image_mask = NULL;
		free(mask);
	}
	if (!ok(c && hi3_st_open(&st, tmp("good.st"), HI3_ST_READ, &err) == 0 &&
	        hi3_cond_open(&x, tmp("good.st"), &err) == 0, "the unaltered file opens")) {
		diag("%s", err.msg);
		hi3_cond_close(c);
		return;
	}
	hi3_cond_close(x);
	for (size_t k = 0; k < HI3_ARRAY_SIZE(muts); k++) {
		const struct mut *m = &muts[k];
		hi3_error e = {0};
		x = NULL;
		write_mutant(st, m, tmp("bad.st"));
		int rc = hi3_cond_open(&x, tmp("bad.st"), &e);
		ok(rc == -1 && !x && e.status == HI3_ERR_INPUT && strstr(e.msg, "bad.st") && strstr(e.msg, m->expect),
		   "refused, status 3, naming the file and %s: %s", m->expect, m->what);
		if (rc == 0 || !strstr(e.msg, m->expect))
			diag("got: %s", rc == 0 ? "(opened)" : e.msg);
		hi3_cond_close(x);
	}
	hi3_st_close(st);
	hi3_cond_close(c);
}

/* Merges of incompatible files are refused, naming both and the field. */
static void test_concat_refusals(void)
{
	static const struct { const char *key, *a, *b; int ok; } cases[] = {
		{"mode", "gen_text", "gen_image", 0},
		{"tokenizer_hash", "0123456789abcdef", "fedcba9876543210", 0},
		{"model_fingerprint", "0123456789abcdef", "fedcba9876543210", 0},
		{"template", "pretrain", "instruct", 0},
		{"pad_id", "7", "8", 0},
		{"model_fingerprint", "", "fedcba9876543210", 1},
		{"tokenizer_hash", "0123456789abcdef", "", 1},
	};
	hi3_error err = {0};
	hi3_cond *c = build("{\"tokens\": [1, 2]}\n", 0, 0, 0, &err);
	hi3_st *st = NULL;

	uint8_t mask[2] = {0, 0};

	/* with an (empty) gen_image_mask, so that the file may claim either mode */
	if (c)
		c->gen_image_mask = mask;
	if (!c || hi3_cond_write(c, tmp("one.st"), &err) || hi3_st_open(&st, tmp("one.st"), HI3_ST_READ, &err)) {
		ok(0, "make a file: %s", err.msg);
		hi3_cond_close(c);
		return;
	}
	c->gen_image_mask = NULL;
	for (size_t k = 0; k < HI3_ARRAY_SIZE(cases); k++) {
		struct mut ma = {.meta_key = cases[k].key, .meta_val = cases[k].a};
		struct mut mb = {.meta_key = cases[k].key, .meta_val = cases[k].b};
		hi3_cond *a = NULL, *b = NULL, *m = NULL;
		hi3_error e = {0};
		int rc;
		write_mutant(st, &ma, tmp("A.st"));
		write_mutant(st, &mb, tmp("B.st"));
		hi3_cond_open(&a, tmp("A.st"), &e);
		hi3_cond_open(&b, tmp("B.st"), &e);
		if (!a || !b) {
			ok(0, "open the pair for '%s': %s", cases[k].key, e.msg);
			hi3_cond_close(a);
			hi3_cond_close(b);
			continue;
		}
		const hi3_cond *in[2] = {a, b};
		rc = hi3_cond_concat(&m, in, 2, 0, &e);
		if (cases[k].ok)
			ok(rc == 0 && !strcmp(hi3_cond_meta(m, cases[k].key), cases[k].a[0] ? cases[k].a : cases[k].b),
			   "'%s' '%s' and '%s' merge (empty agrees), keeping the known value", cases[k].key, cases[k].a,
			   cases[k].b);
		else
			ok(rc == -1 && e.status == HI3_ERR_INPUT && strstr(e.msg, "'") && strstr(e.msg, cases[k].key) &&
			   strstr(e.msg, cases[k].b),
			   "merge refused, status 3, naming the field '%s' and both values", cases[k].key);
		if (!cases[k].ok && rc == -1)
			ok(strstr(e.msg, "A.st") && strstr(e.msg, "B.st"), "and both files: %s", e.msg);
		hi3_cond_close(m);
		hi3_cond_close(a);
		hi3_cond_close(b);
	}
	hi3_st_close(st);
	hi3_cond_close(c);
}

static void test_requests(void)
{
	static const struct { const char *text, *expect; } bad[] = {
		{"{\"tokens\": [1]}\n{\"prompt\": \"x\"\n", "req.jsonl:2: not valid JSON"},
		{"{\"tokens\": [1]}\n\n[1, 2]\n", "req.jsonl:3: expected a JSON object"},
		{"{\"prompt\": \"x\", \"bot_task\": \"dream\"}\n", "req.jsonl:1: field 'bot_task': unknown value 'dream'"},
		{"{\"prompt\": \"x\", \"mode\": \"gen_video\"}\n", "req.jsonl:1: field 'mode': unknown value 'gen_video'"},
		{"{\"promt\": \"x\"}\n", "req.jsonl:1: unknown field 'promt'"},
		{"{\"tokens\": []}\n", "req.jsonl:1: field 'tokens': the array is empty"},
		{"{\"tokens\": [1, -3]}\n", "req.jsonl:1: field 'tokens': element 1 is -3"},
		{"{\"tokens\": [1], \"prompt\": \"x\"}\n", "req.jsonl:1: field 'tokens' is a complete row"},
		{"{\"prompt\": \"x\", \"mode\": \"gen_image\"}\n", "req.jsonl:1: mode gen_image needs image_size"},
		{"{\"prompt\": \"x\", \"image_size\": \"10x\"}\n", "req.jsonl:1: field 'image_size'"},
		{"{\"prompt\": \"x\", \"image_size\": \"<img_ratio_x>\"}\n", "req.jsonl:1: field 'image_size'"},
		{"{\"prompt\": \"x\", \"cond_images\": [[0, 4]]}\n", "req.jsonl:1: field 'cond_images': element 0"},
		{"{\"prompt\": \"x\", \"seed\": 1.5}\n", "req.jsonl:1: field 'seed'"},
		{"{\"system\": \"x\"}\n", "req.jsonl:1: no 'prompt'"},
		{"", "req.jsonl: no requests"},
		{"\n  \n", "req.jsonl: no requests"},
	};
	for (size_t k = 0; k < HI3_ARRAY_SIZE(bad); k++) {
		hi3_requests *rq = NULL;
		hi3_error e = {0};
		int rc = hi3_requests_parse(&rq, bad[k].text, strlen(bad[k].text), "req.jsonl", &e);
		ok(rc == -1 && !rq && e.status == HI3_ERR_INPUT && strstr(e.msg, bad[k].expect), "refused: %s",
		   bad[k].expect);
		if (rc == 0 || !strstr(e.msg, bad[k].expect))
			diag("got: %s", rc == 0 ? "(accepted)" : e.msg);
		hi3_requests_free(rq);
	}
	{
		hi3_requests *rq = NULL;
		hi3_error e = {0};
		const char *good = "{\"prompt\": \"a\", \"image_size\": [512, 2048], \"mode\": \"gen_image\", "
		                   "\"cond_images\": [[1080, 1920]], \"cot\": \"\", \"system\": \"s\"}\r\n"
		                   "{\"prompt\": \"b\", \"image_size\": \"<img_ratio_3>\"}\n"
		                   "{\"prompt\": \"c\", \"image_size\": \"16:9\", \"bot_task\": \"img_ratio\"}";
		ok(hi3_requests_parse(&rq, good, strlen(good), "req.jsonl", &e) == 0 && hi3_requests_count(rq) == 3 &&
		   hi3_requests_need_tokenizer(rq), "well-formed requests parse (CRLF, no final newline)");
		if (rq) {
			const struct hi3i_request *r = rq->r;
			ok(r[0].size_kind == 1 && r[0].size_h == 512 && r[0].size_w == 2048 && r[0].n_cond == 1 &&
			   r[0].cond[0][0] == 1080 && r[0].cot && r[0].cot_len == 0 && r[1].size_kind == 2 &&
			   r[1].ratio_index == 3 && r[2].size_h == 16 && r[2].size_w == 9 && r[2].bot_task == HI3I_BOT_IMG_RATIO,
			   "fields as given: image_size forms, cond_images, empty cot kept, bot_task");
		} else {
			diag("%s", e.msg);
		}
		hi3_requests_free(rq);
	}
}

/* A row longer than --max-length, and a batch mixing modes. */
static void test_build_refusals(void)
{
	hi3_requests *rq = NULL;
	hi3_template *t = pretok_template(7);
	hi3_cond_build_opts o = {.max_length = 3};
	hi3_cond *c = NULL;
	hi3_error e = {0};
	const char *text = "{\"tokens\": [1, 2, 3]}\n{\"tokens\": [1, 2, 3, 4]}\n";

	hi3_requests_parse(&rq, text, strlen(text), "req.jsonl", &e);
	ok(hi3_cond_build(&c, t, rq, &o, &e) == -1 && !c && e.status == HI3_ERR_INPUT &&
	   strstr(e.msg, "req.jsonl:2: the row has 4 tokens, more than --max-length 3"), "--max-length: %s", e.msg);
	hi3_requests_free(rq);
	hi3_template_free(t);
	{
		hi3_template_opts to = {.pad_id = -1};
		t = NULL;
		hi3_requests_parse(&rq, text, strlen(text), "req.jsonl", &e);
		hi3_template_open(&t, &to, &e);
		o.max_length = 0;
		ok(t && hi3_cond_build(&c, t, rq, &o, &e) == -1 && strstr(e.msg, "no pad id"),
		   "no pad id anywhere: refused");
		hi3_requests_free(rq);
		hi3_template_free(t);
	}
}

/* The fingerprint of the model named at build time, and the check a model
 * stage makes. */
static void test_check_model(void)
{
	hi3_init_opts io = {.preset = "tiny", .seed = 1, .dtype = HI3_F32};
	hi3_template_opts to = {.model_dir = tmp("model"), .fingerprint = 1, .pad_id = -1};
	hi3_cond_build_opts bo = {0};
	const char *text = "{\"tokens\": [1, 2, 3]}\n";
	hi3_template *t = NULL;
	hi3_requests *rq = NULL;
	hi3_model *m = NULL;
	hi3_cond *c = NULL;
	hi3_st *st = NULL;
	hi3_error err = {0};

	if (hi3_init_model(tmp("model"), &io, &err) || hi3_model_open(&m, tmp("model"), NULL, &err) ||
	    hi3_template_open(&t, &to, &err) || hi3_requests_parse(&rq, text, strlen(text), "req.jsonl", &err) ||
	    hi3_cond_build(&c, t, rq, &bo, &err)) {
		ok(0, "make a model and its conditions: %s", err.msg);
		goto out;
	}
	ok(!strcmp(c->model_fingerprint, hi3_model_fingerprint(m)) && strlen(c->model_fingerprint) == 16,
	   "the conditions carry the model's fingerprint (%s)", c->model_fingerprint);
	ok(c->pad_id == hi3_model_config(m)->pad_token_id && c->stop_tokens[0] == hi3_model_config(m)->eos_token_id,
	   "pad id and (no tokenizer) the stop token come from config.json");
	ok(hi3_cond_check_model(c, m, &err) == 0, "the model accepts its own conditions");
	if (hi3_cond_write(c, tmp("fp.st"), &err) || hi3_st_open(&st, tmp("fp.st"), HI3_ST_READ, &err)) {
		ok(0, "write: %s", err.msg);
		goto out;
	}
	{
		struct mut other = {.meta_key = "model_fingerprint", .meta_val = "0123456789abcdef"};
		struct mut none = {.meta_key = "model_fingerprint", .meta_val = ""};
		struct mut big = {.tensor = "input_ids", .index = 1, .value = 512};
		hi3_cond *x = NULL;
		hi3_error e = {0};
		write_mutant(st, &other, tmp("bad.st"));
		hi3_cond_open(&x, tmp("bad.st"), &e);
		ok(x && hi3_cond_check_model(x, m, &e) == -1 && e.status == HI3_ERR_INPUT && strstr(e.msg, "bad.st") &&
		   strstr(e.msg, "0123456789abcdef") && strstr(e.msg, hi3_model_fingerprint(m)),
		   "another model's conditions are refused, naming both fingerprints: %s", e.msg);
		hi3_cond_close(x);
		x = NULL;
		write_mutant(st, &none, tmp("bad.st"));
		hi3_cond_open(&x, tmp("bad.st"), &e);
		ok(x && hi3_cond_check_model(x, m, &e) == 0, "no fingerprint in the file: not checked");
		hi3_cond_close(x);
		x = NULL;
		write_mutant(st, &big, tmp("bad.st"));
		hi3_cond_open(&x, tmp("bad.st"), &e);
		ok(x && hi3_cond_check_model(x, m, &e) == -1 && strstr(e.msg, "'input_ids': row 0, column 1") &&
		   strstr(e.msg, "512"), "a token id outside the model's vocabulary is refused: %s", e.msg);
		hi3_cond_close(x);
	}
out:
	hi3_st_close(st);
	hi3_cond_close(c);
	hi3_requests_free(rq);
	hi3_template_free(t);
	hi3_model_close(m);
}

/* facts/image-input.md 1: 33 buckets of base 1024, and the ViT grid. */
static void test_geometry(void)
{
	int r[64][2], n = hi3i_buckets(1024, r, 64), gh, gw, good = 1;
	static const int vit[][4] = {{1024, 1024, 32, 32}, {1080, 1920, 24, 42}, {100, 100, 32, 32}, {50, 4000, 4, 256}};

	ok(n == 33, "base 1024: 33 buckets");
	for (int k = 0; k <= 8; k++)
		good &= r[k][0] == 512 && r[k][1] == 2048 - 64 * k;
	ok(good, "buckets 0-8: (512, 2048 - 64k)");
	ok(r[9][0] == 576 && r[9][1] == 1472 && r[15][0] == 960 && r[15][1] == 1088 && r[16][0] == 1024 &&
	   r[16][1] == 1024, "buckets 9, 15, 16: (576, 1472), (960, 1088), (1024, 1024)");
	good = 1;
	for (int k = 17; k < 33; k++)
		good &= r[k][0] == r[32 - k][1] && r[k][1] == r[32 - k][0];
	ok(good, "buckets 17-32 mirror 15-0");
	ok(hi3i_bucket_of((const int (*)[2])r, n, 1024, 1024) == 16 && hi3i_bucket_of((const int (*)[2])r, n, 1, 100) == 0 &&
	   hi3i_bucket_of((const int (*)[2])r, n, 100, 1) == 32 && hi3i_bucket_of((const int (*)[2])r, n, 1080, 1920) == 12,
	   "nearest bucket by H/W");
	for (size_t k = 0; k < HI3_ARRAY_SIZE(vit); k++) {
		hi3i_vit_grid(vit[k][0], vit[k][1], 16, 1024, &gh, &gw);
		ok(gh == vit[k][2] && gw == vit[k][3], "ViT grid of %dx%d is %dx%d (found %dx%d)", vit[k][0], vit[k][1],
		   vit[k][2], vit[k][3], gh, gw);
	}
}

int main(void)
{
	if (!(tmpdir = testdir_new("test-cond")))
		return 1;
	test_build();
	test_pad_zero();
	test_concat();
	test_validation();
	test_concat_refusals();
	test_requests();
	test_build_refusals();
	test_geometry();
	test_check_model();
	testdir_done(tmpdir);
	return done_testing();
}
