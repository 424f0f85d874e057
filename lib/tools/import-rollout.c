/*
 * import-rollout.c -- another engine's rollout (JSONL, one request per
 * line, as vLLM and SGLang return them) into a conditions file and a
 * segment file, so that hi3 replay measures that engine's rollout/replay
 * gap and --trace localises it (hi3-import-rollout(1) lists the fields).
 *
 * A line is one request: its prompt token ids and one or more completions
 * (vLLM RequestOutput.outputs[], an OpenAI-style choices[], or the line
 * itself), each with its token ids, per-token log-probs, finish reason and
 * optionally the routed experts. Each completion becomes a row, its
 * request's prompt pre-tokenized (template none); rows keep line order.
 *
 * Routed experts (vLLM CompletionOutput.routed_experts, SGLang
 * meta_info.routed_experts) cover the whole sequence fed, prompt included,
 * except the last token, which is never fed: N = P + R - 1 rows (P prompt,
 * R response tokens) of (layers, k) int32, a nested array or base64 of
 * little-endian int32. Response token j is row P + j; the last token has
 * none (-1, as hi3 decode records). With the line's prompt_routed_experts
 * beside it, routed_experts is the response's alone (row j). The layer
 * axis is the model's layers (the MoE ones are taken) or its MoE layers.
 * Weights are not reported by the engines: the segment carries NaN and
 * says so (routing_weights "none"), so replay recomputes them.
 */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include "format/provenance.h"
#include "tools/tools.h"

/* One completion, gathered from wherever its engine put it. */
struct row {
	int line;
	int64_t *prompt;          /* (P) borrowed from the line's arrays: copied below */
	int64_t P;
	int64_t *tokens;          /* (R) */
	float *logprobs;          /* (R) */
	int64_t R;
	uint8_t stop_reason;
	int64_t seed;
	int have_seed;
	int32_t *routes;          /* (N, layers, k) or NULL */
	int64_t N, layers, k;
	int response_only;        /* routes start at response token 0 */
	const char *source;       /* "vllm", "sglang", "openai", "hi3" */
};

static void row_free(struct row *r)
{
	free(r->prompt);
	free(r->tokens);
	free(r->logprobs);
	free(r->routes);
}

static int fail(hi3_error *err, const char *path, int line, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int fail(hi3_error *err, const char *path, int line, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return hi3_error_set(err, HI3_ERR_INPUT, "%s:%d: %s", path, line, msg);
}

/* An array of integers into a fresh int64 array. */
static int ints(json_t *a, int64_t **out, int64_t *n, int64_t lo, int64_t hi)
{
	size_t i;
	json_t *v;

	*out = calloc(json_array_size(a) + 1, sizeof(int64_t));
	*n = (int64_t)json_array_size(a);
	if (!*out)
		return -1;
	json_array_foreach(a, i, v) {
		if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
			return -2;
		(*out)[i] = json_integer_value(v);
	}
	return 0;
}

static json_t *path_get(json_t *o, const char *a, const char *b)
{
	json_t *v = json_is_object(o) ? json_object_get(o, a) : NULL;

	return b && v ? (json_is_object(v) ? json_object_get(v, b) : NULL) : v;
}

/* The log-prob of token tok in one position of a logprobs list: a number;
 * {"<id>": {"logprob": x, ...}} or {"<id>": x} (vLLM's SampleLogprobs as
 * dicts); {"logprob": x, ...} (OpenAI chat content[]); [x, id, text]
 * (SGLang's output_token_logprobs). */
static int one_logprob(json_t *v, int64_t tok, double *lp)
{
	char key[32];
	json_t *e;

	if (json_is_number(v)) {
		*lp = json_number_value(v);
		return 0;
	}
	if (json_is_array(v) && json_array_size(v) >= 2 && json_is_number(json_array_get(v, 0))) {
		if (json_is_integer(json_array_get(v, 1)) && json_integer_value(json_array_get(v, 1)) != tok)
			return -2;
		*lp = json_number_value(json_array_get(v, 0));
		return 0;
	}
	if (!json_is_object(v))
		return -1;
	if (json_is_number(e = json_object_get(v, "logprob"))) {
		*lp = json_number_value(e);
		return 0;
	}
	snprintf(key, sizeof(key), "%lld", (long long)tok);
	e = json_object_get(v, key);
	if (json_is_number(e)) {
		*lp = json_number_value(e);
		return 0;
	}
	if (json_is_object(e) && json_is_number(json_object_get(e, "logprob"))) {
		*lp = json_number_value(json_object_get(e, "logprob"));
		return 0;
	}
	return -3;
}

/* base64 (RFC 4648, padding optional) into bytes; -1 on a bad character. */
static int64_t base64_decode(const char *s, unsigned char **out)
{
	size_t n = strlen(s), k = 0;
	uint32_t acc = 0;
	int bits = 0;

	*out = malloc(n * 3 / 4 + 4);
	if (!*out)
		return -1;
	for (size_t i = 0; i < n; i++) {
		int c = (unsigned char)s[i], v;
		if (c >= 'A' && c <= 'Z')
			v = c - 'A';
		else if (c >= 'a' && c <= 'z')
			v = c - 'a' + 26;
		else if (c >= '0' && c <= '9')
			v = c - '0' + 52;
		else if (c == '+' || c == '-')
			v = 62;
		else if (c == '/' || c == '_')
			v = 63;
		else if (c == '=' || c == '\n' || c == '\r')
			continue;
		else
			return -1;
		acc = acc << 6 | (uint32_t)v;
		bits += 6;
		if (bits >= 8) {
			bits -= 8;
			(*out)[k++] = (unsigned char)(acc >> bits);
		}
	}
	return (int64_t)k;
}

/* Routed experts: a (N, layers, k) nested array, or base64 int32 of
 * N * layers * k values with layers and k to infer. */
static int routes_of(json_t *v, struct row *r, const hi3_model *m, const char *path, hi3_error *err)
{
	const int nl = hi3_model_config(m)->num_hidden_layers, nm = hi3_model_n_moe_layers(m), K = hi3_model_max_topk(m);

	if (json_is_string(v)) {
		unsigned char *b = NULL;
		int64_t n = base64_decode(json_string_value(v), &b), vals;
		if (n < 0 || n % 4) {
			free(b);
			return fail(err, path, r->line, "routed_experts: not base64 of int32 values");
		}
		vals = n / 4;
		r->k = K;
		/* the engines report every layer; a model of MoE layers only is both */
		r->layers = vals % ((int64_t)nl * K) == 0 ? nl : nm;
		if (!r->layers || vals % (r->layers * K)) {
			free(b);
			return fail(err, path, r->line, "routed_experts: %lld values are not rows of %d layers (or %d MoE "
			            "layers) of top-%d", (long long)vals, nl, nm, K);
		}
		r->N = vals / (r->layers * K);
		r->routes = (int32_t *)(void *)b;     /* little endian, as hi3 runs */
		return 0;
	}
	if (!json_is_array(v))
		return fail(err, path, r->line, "routed_experts: expected an array (N, layers, k) or a base64 string");
	r->N = (int64_t)json_array_size(v);
	r->layers = r->N ? (int64_t)json_array_size(json_array_get(v, 0)) : nl;
	r->k = r->N && r->layers ? (int64_t)json_array_size(json_array_get(json_array_get(v, 0), 0)) : K;
	r->routes = calloc((size_t)(r->N * r->layers * r->k) + 1, sizeof(int32_t));
	if (!r->routes)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	for (int64_t i = 0; i < r->N; i++) {
		json_t *li = json_array_get(v, (size_t)i);
		if (!json_is_array(li) || (int64_t)json_array_size(li) != r->layers)
			return fail(err, path, r->line, "routed_experts[%lld]: expected %lld layers", (long long)i,
			            (long long)r->layers);
		for (int64_t l = 0; l < r->layers; l++) {
			json_t *e = json_array_get(li, (size_t)l);
			if (!json_is_array(e) || (int64_t)json_array_size(e) != r->k)
				return fail(err, path, r->line, "routed_experts[%lld][%lld]: expected %lld experts",
				            (long long)i, (long long)l, (long long)r->k);
			for (int64_t j = 0; j < r->k; j++) {
				json_t *x = json_array_get(e, (size_t)j);
				if (!json_is_integer(x))
					return fail(err, path, r->line, "routed_experts[%lld][%lld][%lld]: not an integer",
					            (long long)i, (long long)l, (long long)j);
				r->routes[(i * r->layers + l) * r->k + j] = (int32_t)json_integer_value(x);
			}
		}
	}
	return 0;
}

static uint8_t stop_reason_of(json_t *f)
{
	const char *s = json_is_string(f) ? json_string_value(f)
	              : json_is_object(f) && json_is_string(json_object_get(f, "type"))
	                ? json_string_value(json_object_get(f, "type")) : NULL;

	if (!s)
		return 0;
	return !strcmp(s, "stop") || !strcmp(s, "eos") ? 1 : !strcmp(s, "length") ? 2 : 0;
}

/* One completion c of line object l into r. */
static int completion(json_t *l, json_t *c, struct row *r, const hi3_model *m, const char *path, hi3_error *err)
{
	const int64_t V = hi3_model_config(m)->vocab_size;
	json_t *v, *lps = NULL, *meta = json_object_get(c, "meta_info");
	int rc;

	/* the prompt: the request's ids */
	if (json_is_array(v = json_object_get(l, "prompt_token_ids")) || json_is_array(v = json_object_get(l, "input_ids")) ||
	    json_is_array(v = json_object_get(l, "prompt_ids")) || json_is_array(v = json_object_get(c, "prompt_token_ids")) ||
	    json_is_array(v = json_object_get(c, "input_ids"))) {
		if ((rc = ints(v, &r->prompt, &r->P, 0, V - 1)) != 0)
			return rc == -1 ? hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory")
			                : fail(err, path, r->line, "the prompt's token ids must be integers in [0, %lld)",
			                       (long long)V);
	} else {
		return fail(err, path, r->line, "no prompt token ids (prompt_token_ids, input_ids or prompt_ids)");
	}
	/* the response */
	if (json_is_array(v = json_object_get(c, "token_ids")) || json_is_array(v = json_object_get(c, "output_ids")) ||
	    json_is_array(v = json_object_get(c, "response_ids"))) {
		if ((rc = ints(v, &r->tokens, &r->R, 0, V - 1)) != 0)
			return rc == -1 ? hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory")
			                : fail(err, path, r->line, "the response's token ids must be integers in [0, %lld)",
			                       (long long)V);
	} else if (json_is_array(v = path_get(meta, "output_token_logprobs", NULL))) {
		size_t i;
		json_t *e;
		r->R = (int64_t)json_array_size(v);
		if (!(r->tokens = calloc((size_t)r->R + 1, sizeof(int64_t))))
			return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		json_array_foreach(v, i, e) {
			json_t *id = json_array_get(e, 1);
			if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= V)
				return fail(err, path, r->line, "meta_info.output_token_logprobs[%zu]: no token id in [0, %lld)",
				            i, (long long)V);
			r->tokens[i] = json_integer_value(id);
		}
	} else {
		return fail(err, path, r->line, "no response token ids (token_ids, output_ids, or "
		            "meta_info.output_token_logprobs)");
	}
	/* the log-probs, one per response token */
	if (json_is_array(v = path_get(meta, "output_token_logprobs", NULL))) {
		lps = v;
		r->source = "sglang";
	} else if (json_is_array(v = json_object_get(c, "logprobs"))) {
		lps = v;
		r->source = "vllm";
	} else if (json_is_array(v = path_get(c, "logprobs", "content"))) {
		lps = v;
		r->source = "openai";
	} else if (json_is_array(v = path_get(c, "logprobs", "token_logprobs"))) {
		lps = v;
		r->source = "openai";
	} else if (json_is_array(v = json_object_get(c, "rollout_log_probs"))) {
		lps = v;
		r->source = "hi3";
	} else {
		return fail(err, path, r->line, "no per-token log-probs (logprobs, meta_info.output_token_logprobs, "
		            "logprobs.content, logprobs.token_logprobs or rollout_log_probs)");
	}
	if ((int64_t)json_array_size(lps) != r->R)
		return fail(err, path, r->line, "%zu log-probs for %lld response tokens", json_array_size(lps),
		            (long long)r->R);
	if (!(r->logprobs = calloc((size_t)r->R + 1, sizeof(float))))
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	for (int64_t j = 0; j < r->R; j++) {
		double lp;
		rc = one_logprob(json_array_get(lps, (size_t)j), r->tokens[j], &lp);
		if (rc != 0 || !(lp <= 0) || isinf(lp))
			return fail(err, path, r->line, "log-prob of response token %lld (id %lld): %s", (long long)j,
			            (long long)r->tokens[j], rc == -2 ? "given for another token id"
			            : rc == -3 ? "the sampled token is not among the ones listed"
			            : rc ? "not a number, [logprob, id, ...] or {id: logprob}" : "not a finite log-prob <= 0");
		r->logprobs[j] = (float)lp;
	}
	/* the rest */
	v = json_object_get(c, "finish_reason");
	r->stop_reason = stop_reason_of(v ? v : path_get(meta, "finish_reason", NULL));
	if (json_is_integer(v = json_object_get(l, "seed")) || json_is_integer(v = json_object_get(c, "seed"))) {
		r->seed = json_integer_value(v);
		r->have_seed = r->seed >= 0;
	}
	v = json_object_get(c, "routed_experts");
	if (!v)
		v = path_get(meta, "routed_experts", NULL);
	if (v && !json_is_null(v)) {
		if (routes_of(v, r, m, path, err) != 0)
			return -1;
		r->response_only = json_object_get(l, "prompt_routed_experts") != NULL;
	}
	return 0;
}

/* The rows of one line. */
static int parse_line(json_t *l, int line, struct row **rows, int *n, int *cap, const hi3_model *m, const char *path,
                      hi3_error *err)
{
	json_t *list = json_object_get(l, "outputs"), *c;
	size_t i;

	if (!json_is_array(list))
		list = json_object_get(l, "choices");
	if (list && !json_is_array(list))
		return fail(err, path, line, "'outputs' or 'choices' is not an array");
	for (i = 0; i < (list ? json_array_size(list) : 1); i++) {
		struct row *r;
		c = list ? json_array_get(list, i) : l;
		if (!json_is_object(c))
			return fail(err, path, line, "completion %zu is not an object", i);
		if (*n == *cap) {
			struct row *q = realloc(*rows, sizeof(**rows) * (size_t)(*cap * 2 + 8));
			if (!q)
				return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
			*rows = q;
			*cap = *cap * 2 + 8;
		}
		r = &(*rows)[(*n)++];
		memset(r, 0, sizeof(*r));
		r->line = line;
		if (completion(l, c, r, m, path, err) != 0)
			return -1;
	}
	if (list && !json_array_size(list))
		return fail(err, path, line, "no completions");
	return 0;
}

/* The segment's routing (T, n_moe, k) of row r at offset off. */
static int fill_routes(const struct row *r, const hi3_model *m, int16_t *dst, const char *path, hi3_error *err)
{
	const hi3_config *c = hi3_model_config(m);
	const int nm = hi3_model_n_moe_layers(m), K = hi3_model_max_topk(m), nl = c->num_hidden_layers;
	int64_t first = r->response_only ? 0 : r->P;

	if (r->k != K || (r->layers != nl && r->layers != nm))
		return fail(err, path, r->line, "routed_experts are (%lld layers, top-%lld); the model has %d layers, %d of "
		            "them MoE, top-%d", (long long)r->layers, (long long)r->k, nl, nm, K);
	if (!r->response_only && r->N != r->P + r->R - 1 && r->N != r->P + r->R)
		return fail(err, path, r->line, "routed_experts has %lld rows; the %lld prompt and %lld response tokens "
		            "fed take %lld (with prompt_routed_experts beside it, the response's alone)", (long long)r->N,
		            (long long)r->P, (long long)r->R, (long long)(r->P + r->R - 1));
	if (r->response_only && r->N != r->R - 1 && r->N != r->R)
		return fail(err, path, r->line, "routed_experts has %lld rows for %lld response tokens", (long long)r->N,
		            (long long)r->R);
	for (int64_t j = 0; j < r->R; j++) {
		int64_t src = first + j;
		int moe = 0;
		for (int l = 0; l < nl; l++) {
			int E;
			if (!hi3_config_is_moe_layer(c, l))
				continue;
			E = c->num_experts[l];
			for (int a = 0; a < K; a++) {
				int16_t *d = dst + ((size_t)j * nm + (size_t)moe) * K + a;
				int32_t e;
				/* the last token is never fed: no routing, as decode records */
				if (j == r->R - 1 || src >= r->N) {
					*d = -1;
					continue;
				}
				e = r->routes[(src * r->layers + (r->layers == nl ? l : moe)) * r->k + a];
				if (e < 0 || e >= E)
					return fail(err, path, r->line, "routed_experts of response token %lld, layer %d: expert %d "
					            "of %d", (long long)j, l, e, E);
				*d = (int16_t)e;
			}
			moe++;
		}
	}
	return 0;
}

static char *requests_text(const struct row *rows, int n, const hi3_import_opts *o)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	if (!f)
		return NULL;
	for (int i = 0; i < n; i++) {
		fputs("{\"tokens\": [", f);
		for (int64_t t = 0; t < rows[i].P; t++)
			fprintf(f, "%s%lld", t ? ", " : "", (long long)rows[i].prompt[t]);
		fprintf(f, "], \"seed\": %lld}\n", (long long)(rows[i].have_seed ? rows[i].seed : o->seed_base + i));
	}
	if (fclose(f) != 0) {
		free(buf);
		return NULL;
	}
	return buf;
}

int hi3_import_rollout(hi3_model *m, const char *path, const hi3_import_opts *o, const char *cond_path,
                       const char *seg_path, hi3_import_report *rep, hi3_error *err)
{
	char *text = NULL, *req = NULL, hash[17];
	size_t len = 0;
	struct row *rows = NULL;
	int n = 0, cap = 0, rc = -1, routed = 0, line = 0;
	hi3_requests *rq = NULL;
	hi3_template *t = NULL;
	hi3_cond *c = NULL;
	struct hi3i_segbuf sb = {0};
	int64_t *lens = NULL, T = 0;
	const int NM = hi3_model_n_moe_layers(m), K = hi3_model_max_topk(m);

	memset(rep, 0, sizeof(*rep));
	if (hi3i_read_file(path, &text, &len, err) != 0)
		return -1;
	for (char *p = text, *nl; p && *p; p = nl ? nl + 1 : NULL) {
		json_error_t je;
		json_t *l;
		nl = strchr(p, '\n');
		if (nl)
			*nl = '\0';
		line++;
		if (strspn(p, " \t\r") == strlen(p))
			continue;
		if (!(l = json_loads(p, 0, &je)) || !json_is_object(l)) {
			fail(err, path, line, "not a JSON object%s%s", l ? "" : ": ", l ? "" : je.text);
			json_decref(l);
			rc = -1;
			goto out;
		}
		rc = parse_line(l, line, &rows, &n, &cap, m, path, err);
		json_decref(l);
		if (rc != 0) {
			rc = -1;
			goto out;
		}
		rep->lines++;
	}
	rc = -1;
	if (!n) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: no rollout in it", path);
		goto out;
	}
	for (int i = 0; i < n; i++) {
		if (!rows[i].P) {
			fail(err, path, rows[i].line, "the prompt is empty");
			goto out;
		}
		routed += rows[i].routes != NULL;
		T += rows[i].R;
		rep->prompt_tokens += rows[i].P;
	}
	if (routed && routed != n) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: %d of %d rows carry routed experts: all or none", path, routed, n);
		goto out;
	}
	if (routed && !NM) {
		hi3_log(HI3_LOG_WARN, "%s: routed experts given, but the model has no MoE layer: dropped", path);
		routed = 0;
	}
	/* the conditions: each row's prompt, pre-tokenized */
	if (!(req = requests_text(rows, n, o))) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		goto out;
	}
	if (hi3_requests_parse(&rq, req, strlen(req), path, err) != 0 ||
	    hi3_template_open(&t, &(hi3_template_opts){.model_dir = hi3_model_dir(m), .fingerprint = 1, .pad_id = -1},
	                      err) != 0 ||
	    hi3_cond_build(&c, t, rq, &(hi3_cond_build_opts){.seed_base = o->seed_base}, err) != 0)
		goto out;
	/* the segment */
	if (!(lens = hi3i_malloc(sizeof(int64_t) * (size_t)n, err)))
		goto out;
	for (int i = 0; i < n; i++)
		lens[i] = rows[i].R;
	if (hi3i_segbuf_init(&sb, n, lens, routed ? NM : 0, K, err) != 0)
		goto out;
	for (int i = 0; i < n; i++) {
		const int64_t off = sb.cu_seqlens[i];
		memcpy(sb.tokens + off, rows[i].tokens, sizeof(int64_t) * (size_t)rows[i].R);
		memcpy(sb.logprobs + off, rows[i].logprobs, sizeof(float) * (size_t)rows[i].R);
		if (routed && fill_routes(&rows[i], m, sb.route_ids + (size_t)off * NM * K, path, err) != 0)
			goto out;
		sb.stop_reason[i] = rows[i].stop_reason;
	}
	for (int64_t j = 0; routed && j < T * NM * K; j++)
		sb.route_w[j] = NAN;
	/* every row checked: the files */
	if (hi3_cond_write(c, cond_path, err) != 0)
		goto out;
	hi3i_cond_hash(c, hash);
	{
		char src[64];
		const char *s0 = rows[0].source;
		int mixed = 0;
		for (int i = 1; i < n; i++)
			mixed |= strcmp(rows[i].source, s0) != 0;
		snprintf(rep->source, sizeof(rep->source), "%s", mixed ? "mixed" : s0);
		snprintf(src, sizeof(src), "imported (%s)", rep->source);
		sb.s.model_fingerprint = hi3_model_fingerprint(m);
		sb.s.conditions_hash = hash;
		sb.s.sampler = src;
		sb.s.routing_weights = routed ? "none" : NULL;
		if (hi3_segment_write(&sb.s, seg_path, err) != 0)
			goto out;
	}
	rep->rows = n;
	rep->response_tokens = T;
	rep->routed = routed;
	rc = 0;
out:
	for (int i = 0; i < n; i++)
		row_free(&rows[i]);
	free(rows);
	free(text);
	free(req);
	hi3_requests_free(rq);
	hi3_template_free(t);
	hi3_cond_close(c);
	hi3i_segbuf_release(&sb);
	free(lens);
	return rc;
}
