/*
 * test-trace.c -- activation traces: the trace file (round trip and the
 * refusals), the recorder behind hi3_forward (what it keeps, and that it
 * changes nothing the forward pass computes), and hi3_trace_diff_run's
 * first difference (causal order, tolerance, ids, row mapping) on traces
 * built by hand.
 */
#include <math.h>
#include <string.h>
#include "hi3.h"
#include "tap.h"
#include "testdir.h"
#include "core/internal.h"

static char *dir;

static const char *path_of(const char *name)
{
	static char buf[4][512];
	static int k;

	k = (k + 1) % 4;
	snprintf(buf[k], sizeof(buf[k]), "%s/%s", dir, name);
	return buf[k];
}

/* ------------------------------------------------------------- the file */

/* A hand-made trace: n tokens of one row (positions pos0 ...), embed (n, 4),
 * layer.0.experts (n, 2), layer.0.expert_out (n, 2, 4), logits.lse (n). */
struct fake {
	int32_t rows[8];
	int64_t pos[8], tok[8];
	float embed[8 * 4], out[8 * 2 * 4], lse[8];
	int16_t experts[8 * 2];
	hi3_trace_point p[4];
	hi3_trace_file f;
};

static void fake_init(struct fake *x, int n, int row, int pos0)
{
	static const char *meta[] = {"stage", "test", "model_fingerprint", "0123456789abcdef"};

	memset(x, 0, sizeof(*x));
	for (int i = 0; i < n; i++) {
		x->rows[i] = row;
		x->pos[i] = pos0 + i;
		x->tok[i] = 100 + i;
		x->lse[i] = (float)i / 3.0f;
		for (int j = 0; j < 4; j++)
			x->embed[i * 4 + j] = (float)(i * 10 + j);
		for (int j = 0; j < 8; j++)
			x->out[i * 8 + j] = (float)(i * 100 + j) * 0.5f;
		x->experts[2 * i] = (int16_t)(i % 3);
		x->experts[2 * i + 1] = 3;
	}
	x->p[0] = (hi3_trace_point){"embed", HI3_TRACE_EMBED, -1, 0, HI3_F32, 2, {n, 4}, x->embed};
	x->p[1] = (hi3_trace_point){"layer.0.experts", HI3_TRACE_EXPERTS, 0, 0, HI3_I16, 2, {n, 2}, x->experts};
	x->p[2] = (hi3_trace_point){"layer.0.expert_out", HI3_TRACE_EXPERT_OUT, 0, 0, HI3_F32, 3, {n, 2, 4}, x->out};
	x->p[3] = (hi3_trace_point){"logits.lse", HI3_TRACE_LOGITS, -1, 2, HI3_F32, 1, {n}, x->lse};
	x->f = (hi3_trace_file){.n = n, .rows = x->rows, .positions = x->pos, .tokens = x->tok, .n_points = 4,
	                        .points = x->p, .meta = meta, .n_meta = 2};
}

static void test_file(void)
{
	struct fake x;
	hi3_trace_file *f = NULL;
	hi3_error err = {0};

	fake_init(&x, 3, 2, 5);
	ok(hi3_trace_file_write(&x.f, path_of("a.trace"), &err) == 0, "write a trace: %s", err.msg);
	ok(hi3_trace_file_open(&f, path_of("a.trace"), &err) == 0, "open it: %s", err.msg);
	if (f) {
		ok(f->n == 3 && f->rows[2] == 2 && f->positions[2] == 7 && f->tokens[1] == 101, "index tensors round-trip");
		ok(f->n_points == 4 && !strcmp(f->points[0].name, "embed") && !strcmp(f->points[1].name, "layer.0.experts") &&
		   !strcmp(f->points[2].name, "layer.0.expert_out") && !strcmp(f->points[3].name, "logits.lse"),
		   "points in forward order");
		ok(f->points[2].ndim == 3 && f->points[2].shape[1] == 2 && f->points[2].shape[2] == 4 &&
		   !memcmp(f->points[2].data, x.out, sizeof(float) * 24) && f->points[3].sub == 2,
		   "a point's shape and data round-trip");
		ok(f->points[1].kind == HI3_TRACE_EXPERTS && f->points[1].layer == 0 && f->points[1].dtype == HI3_I16,
		   "names parse to kind and layer");
		ok(!strcmp(hi3_trace_file_meta(f, "stage"), "test") && !strcmp(hi3_trace_file_meta(f, "format"), "hi3.trace"),
		   "metadata, format named");
	}
	hi3_trace_file_close(f);

	fake_init(&x, 3, 2, 5);
	x.pos[2] = 5;
	ok(hi3_trace_file_write(&x.f, path_of("b.trace"), &err) == -1 && err.status == HI3_ERR_INPUT &&
	   strstr(err.msg, "b.trace") && strstr(err.msg, "(row, position) order"),
	   "tokens out of order, or twice, are refused: %s", err.msg);
	fake_init(&x, 3, 2, 5);
	x.p[0].dtype = HI3_I32;
	ok(hi3_trace_file_write(&x.f, path_of("b.trace"), &err) == -1 && strstr(err.msg, "'embed'") &&
	   strstr(err.msg, "expected F32"), "a point of the wrong dtype is refused: %s", err.msg);
	fake_init(&x, 3, 2, 5);
	x.p[2].shape[0] = 2;
	ok(hi3_trace_file_write(&x.f, path_of("b.trace"), &err) == -1 && strstr(err.msg, "expert_out"),
	   "a point with another token count is refused");
	fake_init(&x, 3, 2, 5);
	x.p[1] = x.p[2];
	ok(hi3_trace_file_write(&x.f, path_of("b.trace"), &err) == -1 && strstr(err.msg, "repeated"),
	   "a point twice is refused");
	{
		hi3_st_writer *w = hi3_stw_new();
		int64_t s1[1] = {1}, s2[2] = {1, 4};
		int32_t r = 0;
		int64_t p = 0;
		float v[4] = {0};
		hi3_stw_meta(w, "format", HI3_FORMAT_TRACE);
		hi3_stw_meta(w, "format_version", HI3_FORMAT_VERSION);
		hi3_stw_add(w, "rows", HI3_I32, 1, s1, &r);
		hi3_stw_add(w, "positions", HI3_I64, 1, s1, &p);
		hi3_stw_add(w, "tokens", HI3_I64, 1, s1, &p);
		hi3_stw_add(w, "layer.0.attn_output", HI3_F32, 2, s2, v);
		ok(hi3_stw_write(w, path_of("c.trace"), &err) == 0, "a file with a stray tensor");
		hi3_stw_free(w);
		ok(hi3_trace_file_open(&f, path_of("c.trace"), &err) == -1 && err.status == HI3_ERR_INPUT &&
		   strstr(err.msg, "'layer.0.attn_output' is not a trace point"), "is refused, naming it: %s", err.msg);
	}
	ok(hi3_trace_kind_parse("attn_out") == HI3_TRACE_ATTN_OUT && hi3_trace_kind_parse("nope") == -1 &&
	   !strcmp(hi3_trace_kind_name(HI3_TRACE_LOGITS), "logits"), "kind names");
}

/* ------------------------------------------------------------ the recorder */

static void test_recorder(void)
{
	hi3_init_opts io = {.preset = "tiny-moe", .seed = 3, .dtype = HI3_F32};
	hi3_model *m = NULL;
	hi3_error err = {0};
	hi3_trace *t = NULL;
	hi3_trace_file *f = NULL;
	const char *md = path_of("model");
	enum { B = 2, T = 5 };
	int64_t ids[B * T];
	int32_t rope[B * T * 2], hi[B * T], at[4] = {0, 4, 1, 4};
	int64_t sel[1] = {1}, ranges[2] = {2, 4};
	static float l0[2 * 512], l1[2 * 512];
	hi3_batch b = {.B = B, .T = T, .mode = HI3_ATTN_SELF, .ids = ids, .rope = rope, .hi = hi, .n_logits = 2,
	               .logit_at = at, .logits = l0};

	for (int i = 0; i < B * T; i++) {
		ids[i] = (i * 37) % 200;
		rope[2 * i] = rope[2 * i + 1] = hi[i] = i % T;
	}
	if (!ok(hi3_init_model(md, &io, &err) == 0 &&
	        hi3_model_open(&m, md, &(hi3_model_opts){.batch_invariant = 1}, &err) == 0, "a tiny-moe model: %s", err.msg))
		return;
	ok(hi3_model_config(m)->vocab_size <= 512, "its vocabulary fits the buffers");
	ok(hi3_forward(m, NULL, &b, &err) == 0, "forward without a trace");
	ok(hi3_trace_new(&t, m, &(hi3_trace_opts){.rows = sel, .n_rows = 1}, &err) == 0, "a recorder of row 1");
	b.trace = t;
	b.logits = l1;
	ok(hi3_forward(m, NULL, &b, &err) == 0, "forward with it: %s", err.msg);
	ok(!memcmp(l0, l1, sizeof(float) * 2 * (size_t)hi3_model_config(m)->vocab_size),
	   "tracing changes no logit (bitwise)");
	ok(hi3_trace_count(t) == T, "it kept row 1's %d tokens", T);
	ok(hi3_trace_set_meta(t, "stage", "test", &err) == 0 && hi3_trace_write(t, path_of("r.trace"), &err) == 0,
	   "write it: %s", err.msg);
	ok(hi3_trace_write(t, path_of("r2.trace"), &err) == 0, "write it twice");
	hi3_trace_free(t);
	t = NULL;
	if (ok(hi3_trace_file_open(&f, path_of("r.trace"), &err) == 0, "open it: %s", err.msg)) {
		const hi3_trace_point *emb = NULL, *in0 = NULL, *lse = NULL, *topk = NULL;
		int n_layers = hi3_model_config(m)->num_hidden_layers;
		for (int i = 0; i < f->n_points; i++) {
			const hi3_trace_point *p = &f->points[i];
			emb = !strcmp(p->name, "embed") ? p : emb;
			in0 = !strcmp(p->name, "layer.0.in") ? p : in0;
			lse = !strcmp(p->name, "logits.lse") ? p : lse;
			topk = !strcmp(p->name, "logits.topk") ? p : topk;
		}
		ok(f->n == T && f->rows[0] == 1 && f->positions[T - 1] == T - 1 && f->tokens[2] == ids[T + 2],
		   "rows, positions and tokens of row 1");
		ok(f->n_points == 1 + n_layers * 14 + 2 + 3, "every point of every layer: %d", f->n_points);
		ok(emb && in0 && !memcmp(emb->data, in0->data, sizeof(float) * (size_t)(T * emb->shape[1])),
		   "layer 0's input is the embedding");
		if (lse && topk) {
			/* the last token of row 1 is logit row 1 of the batch */
			const int V = hi3_model_config(m)->vocab_size;
			const float *x = l0 + V;
			double mx = -INFINITY, s = 0;
			for (int v = 0; v < V; v++)
				mx = fmax(mx, x[v]);
			for (int v = 0; v < V; v++)
				s += exp(x[v] - mx);
			ok(fabs(((const float *)lse->data)[T - 1] - (mx + log(s))) < 1e-5 &&
			   ((const float *)topk->data)[(T - 1) * 16] == (float)mx, "its top logit and log-sum-exp");
		}
		hi3_trace_file_close(f);
		f = NULL;
	}
	ok(hi3_trace_new(&t, m, &(hi3_trace_opts){.rows = sel, .n_rows = 1, .ranges = ranges, .n_ranges = 1,
	                                          .kinds = 1u << HI3_TRACE_ATTN_OUT}, &err) == 0, "a recorder of positions 2-3");
	b.trace = t;
	ok(hi3_forward(m, NULL, &b, &err) == 0 && hi3_trace_count(t) == 2, "keeps 2 tokens");
	ok(hi3_trace_write(t, path_of("s.trace"), &err) == 0 && hi3_trace_file_open(&f, path_of("s.trace"), &err) == 0 &&
	   f->n_points == hi3_model_config(m)->num_hidden_layers && f->positions[0] == 2,
	   "of one kind per layer: %s", err.msg);
	hi3_trace_file_close(f);
	ok(hi3_forward(m, NULL, &b, &err) == 0 && hi3_trace_write(t, path_of("s2.trace"), &err) == -1 &&
	   strstr(err.msg, "traced twice"), "the same tokens twice cannot be written: %s", err.msg);
	hi3_trace_free(t);
	hi3_model_close(m);
}

/* ---------------------------------------------------------- the first diff */

static hi3_trace_diff *diff(struct fake *a, struct fake *b, double tol, int64_t ra, int64_t rb)
{
	hi3_error err = {0};
	hi3_trace_diff *d = NULL;
	hi3_trace_diff_opts o = {.tol = tol, .row_a = ra, .row_b = rb};

	if (hi3_trace_file_write(&a->f, path_of("da.trace"), &err) || hi3_trace_file_write(&b->f, path_of("db.trace"), &err) ||
	    hi3_trace_diff_run(path_of("da.trace"), path_of("db.trace"), &o, &d, &err))
		diag("diff: %s", err.msg);
	return d;
}

static const char *first(const hi3_trace_diff *d)
{
	return d && d->first >= 0 ? d->p[d->first].name : "(none)";
}

static void test_diff(void)
{
	struct fake a, b;
	hi3_trace_diff *d;
	hi3_error err = {0};
	char *text = NULL;

	fake_init(&a, 4, 0, 0);
	fake_init(&b, 4, 0, 0);
	d = diff(&a, &b, 0, -1, -1);
	ok(d && d->equal && d->aligned == 4 && d->first < 0 && d->n == 5, "identical traces are equal");
	hi3_trace_diff_free(d);

	b.out[2 * 8 + 3] += 1.0f;     /* position 2, expert_out */
	b.lse[1] += 0.5f;             /* position 1, logits.lse: later in forward order, earlier position */
	d = diff(&a, &b, 0, -1, -1);
	ok(d && !d->equal && !strcmp(first(d), "logits.lse") && d->p[d->first].first.pos == 1,
	   "the first difference is the earliest position's: %s", first(d));
	ok(d && d->n_differ == 2, "two points differ");
	hi3_trace_diff_free(d);

	fake_init(&b, 4, 0, 0);
	b.out[1 * 8 + 5] += 1e-3f;    /* position 1, slot 1, element 1 */
	b.experts[2 * 2 + 1] = 1;     /* position 2: another expert */
	d = diff(&a, &b, 1e-2, -1, -1);
	ok(d && !strcmp(first(d), "layer.0.experts") && d->p[d->first].first.pos == 2,
	   "within --tol floats agree; ids never: %s", first(d));
	hi3_trace_diff_free(d);
	d = diff(&a, &b, 0, -1, -1);
	ok(d && !strcmp(first(d), "layer.0.expert_out") && d->p[d->first].first.pos == 1 &&
	   d->p[d->first].first.n_index == 2 && d->p[d->first].first.index[0] == 1 && d->p[d->first].first.index[1] == 1,
	   "bitwise: the float at position 1, expert slot 1, index 1: %s", first(d));
	if (d && hi3_trace_diff_report(d, 0, &text, NULL, &err) == 0)
		ok(strstr(text, "first difference: layer.0.expert_out at row 0, pos 1, expert slot 1, index 1") != NULL,
		   "the report names it");
	free(text);
	text = NULL;
	if (d && hi3_trace_diff_report(d, 1, &text, NULL, &err) == 0)
		ok(strstr(text, "\"point\": \"layer.0.expert_out\"") != NULL, "and the JSON");
	free(text);
	hi3_trace_diff_free(d);

	fake_init(&b, 4, 0, 0);
	b.tok[3] = 7;
	d = diff(&a, &b, 0, -1, -1);
	ok(d && !strcmp(first(d), "tokens") && d->p[d->first].first.pos == 3, "a token fed differently");
	hi3_trace_diff_free(d);

	fake_init(&b, 3, 5, 1);       /* row 5, positions 1-3 */
	d = diff(&a, &b, 0, 0, 5);
	ok(d && d->aligned == 3 && d->only_a == 1 && d->only_b == 0 && d->pos_lo == 1 && d->pos_hi == 3,
	   "--row 0:5 aligns row 0 of A with row 5 of B by position");
	ok(d && !strcmp(first(d), "tokens"), "and compares what is aligned (the ids differ: positions moved)");
	hi3_trace_diff_free(d);
	ok(hi3_trace_diff_run(path_of("da.trace"), path_of("db.trace"), &(hi3_trace_diff_opts){.row_a = -1, .row_b = -1},
	                      &d, &err) == -1 && err.status == HI3_ERR_USAGE && strstr(err.msg, "no (row, position)"),
	   "rows by number, nothing in common: refused");
}

int main(void)
{
	if (!(dir = testdir_new("test-trace")))
		return 1;
	test_file();
	test_recorder();
	test_diff();
	testdir_done(dir);
	return done_testing();
}
