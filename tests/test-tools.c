/*
 * test-tools.c -- unit tests of the inspection tools (slices, statistics,
 * PNG, diff locations and tolerances), and, with a command, a fixture maker
 * for the shell tests (tests/t3000-inspect.sh, t3100-diff.sh):
 *
 *   test-tools                      run the unit tests (TAP)
 *   test-tools kv OUT SPEC          a kv file (see parse_kv_spec)
 *   test-tools seg OUT IDS LENS     a segment file: rows with these identities and lengths
 *   test-tools cond OUT             a 2-row conditions file (L 8, real_pos 8 and 5, image blocks)
 *   test-tools poke FILE TENSOR I,J,.. VALUE   set one element in place
 *   test-tools json [PATH]          standard input must be one JSON object; print the value at
 *                                   PATH (keys, array indices or KEY=VALUE joined by '/')
 *   test-tools pnginfo FILE         check the signature and IHDR, decode; print "WIDTH HEIGHT"
 *   test-tools pngpix FILE X Y      print the pixel "R G B"
 *   test-tools argmax FILE TENSOR R print the index of the largest value of row R of a 2-D F32
 *                                   tensor (ties to the lowest)
 *   test-tools rollout COND SEG FORMAT   a rollout as another engine returns it, on stdout:
 *                                   FORMAT vllm (RequestOutput), openai (choices), sglang (/generate)
 *   test-tools strip FILE PREFIX    rewrite FILE without the tensors named PREFIX...
 *   test-tools pngtext FILE         print its text chunks, "KEY=VALUE" a line
 *   test-tools requests COND        its requests (metadata) as JSONL, one a line
 *
 * Values are a hash of what a row *is* (its identity), not where it sits in
 * the batch, so a batched file and a B = 1 file agree on a row's valid
 * slots; invalid slots hash the batch position and a salt, so they differ.
 */
#include <math.h>
#include <png.h>
#include <string.h>
#include <unistd.h>
#include "tools/tools.h"
#include "tap.h"
#include "testdir.h"

/* ----------------------------------------------------------- fixtures */

static double hval(uint64_t a, uint64_t b, uint64_t c, uint64_t d, uint64_t e)
{
	uint64_t k[5] = {a, b, c, d, e}, h = hi3i_hash(HI3_HASH_INIT, k, sizeof(k));

	return (double)(h >> 11) * 0x1p-53 * 4.0 - 2.0;
}

#define MAXB 16

struct kvspec {
	int B, L, C, layers, heads, d, V;
	int64_t ids[MAXB], lens[MAXB], gen[MAXB];
	uint64_t salt;
	hi3_dtype dt;
};

static void put_f(void *base, hi3_dtype dt, size_t i, double v)
{
	if (dt == HI3_BF16)
		((uint16_t *)base)[i] = hi3_f32_to_bf16((float)v);
	else
		((float *)base)[i] = (float)v;
}

static int make_kv(const char *path, const struct kvspec *s, hi3_error *err)
{
	hi3_st_writer *w = hi3_stw_new();
	size_t esz = hi3_dtype_size(s->dt), n = (size_t)s->B * s->heads * s->C * s->d;
	int64_t shape[4] = {s->B, s->heads, s->C, s->d}, sb[1] = {s->B}, sg[2] = {s->B, s->C - s->L},
	        sv[2] = {s->B, s->V};
	void **bufs = calloc((size_t)s->layers * 2, sizeof(void *));
	int64_t kv_len[MAXB], gen_len[MAXB], *gt = calloc((size_t)(s->B * (s->C - s->L)) + 1, 8);
	float *glp = calloc((size_t)(s->B * (s->C - s->L)) + 1, 4), *nl = calloc((size_t)(s->B * s->V), 4);
	uint8_t fin[MAXB] = {0};
	char name[32], num[32];
	int rc = -1;

	for (int l = 0; l < s->layers; l++) {
		for (int kv = 0; kv < 2; kv++) {
			void *b = calloc(n, esz);
			bufs[2 * l + kv] = b;
			for (int r = 0; r < s->B; r++)
				for (int h = 0; h < s->heads; h++)
					for (int c = 0; c < s->C; c++)
						for (int j = 0; j < s->d; j++) {
							size_t i = (((size_t)r * s->heads + h) * s->C + c) * s->d + j;
							int valid = c < s->lens[r] + s->gen[r];
							put_f(b, s->dt, i,
							      valid ? hval(2 * l + kv, s->ids[r], h, c, j)
							            : hval(1000 + s->salt, 2 * l + kv, r, c, h * 64 + j));
						}
			snprintf(name, sizeof(name), "%c.%d", kv ? 'v' : 'k', l);
			hi3_stw_add(w, name, s->dt, 4, shape, b);
		}
	}
	for (int r = 0; r < s->B; r++) {
		kv_len[r] = s->lens[r] + s->gen[r];
		gen_len[r] = s->gen[r];
		for (int j = 0; j < s->C - s->L; j++) {
			size_t i = (size_t)r * (s->C - s->L) + j;
			if (j < s->gen[r]) {
				gt[i] = (int64_t)((hval(3000, s->ids[r], j, 0, 0) + 2) * 1000) % s->V;
				glp[i] = (float)-fabs(hval(4000, s->ids[r], j, 0, 0));
			} else {
				gt[i] = (int64_t)s->salt;
				glp[i] = (float)s->salt;
			}
		}
		for (int v = 0; v < s->V; v++)
			nl[(size_t)r * s->V + v] = (float)hval(5000, s->ids[r], v, 0, 0);
	}
	hi3_stw_add(w, "kv_len", HI3_I64, 1, sb, kv_len);
	hi3_stw_add(w, "gen_len", HI3_I64, 1, sb, gen_len);
	hi3_stw_add(w, "finished", HI3_U8, 1, sb, fin);
	hi3_stw_add(w, "gen_tokens", HI3_I64, 2, sg, gt);
	hi3_stw_add(w, "gen_logprobs", HI3_F32, 2, sg, glp);
	hi3_stw_add(w, "next_logits", HI3_F32, 2, sv, nl);
	hi3_stw_meta(w, "format", "hi3.kv");
	hi3_stw_meta(w, "format_version", HI3_FORMAT_VERSION);
	hi3_stw_meta(w, "model_fingerprint", "0123456789abcdef");
	snprintf(num, sizeof(num), "%d", s->L);
	hi3_stw_meta(w, "L", num);
	snprintf(num, sizeof(num), "%d", s->C);
	hi3_stw_meta(w, "C", num);
	snprintf(num, sizeof(num), "%d", s->C - s->L);
	hi3_stw_meta(w, "max_new", num);
	hi3_stw_meta(w, "cond_file", "cond.safetensors");
	hi3_stw_meta(w, "conditions_hash", "fedcba9876543210");
	rc = hi3_stw_write(w, path, err);
	hi3_stw_free(w);
	for (int i = 0; i < 2 * s->layers; i++)
		free(bufs[i]);
	free(bufs);
	free(gt);
	free(glp);
	free(nl);
	return rc;
}

static int make_seg(const char *path, int B, const int64_t *ids, const int64_t *lens, hi3_error *err)
{
	hi3_st_writer *w = hi3_stw_new();
	int64_t cu[MAXB + 1] = {0}, T, st[1], sc[1] = {B + 1}, sb[1] = {B};
	int64_t *tok;
	float *lp;
	uint8_t stop[MAXB];
	int rc;

	for (int r = 0; r < B; r++)
		cu[r + 1] = cu[r] + lens[r];
	T = cu[B];
	st[0] = T;
	tok = calloc((size_t)T + 1, 8);
	lp = calloc((size_t)T + 1, 4);
	for (int r = 0; r < B; r++) {
		for (int64_t j = 0; j < lens[r]; j++) {
			tok[cu[r] + j] = (int64_t)((hval(6000, ids[r], j, 0, 0) + 2) * 1000) % 500;
			lp[cu[r] + j] = (float)-fabs(hval(7000, ids[r], j, 0, 0));
		}
		stop[r] = 2;
	}
	hi3_stw_add(w, "tokens", HI3_I64, 1, st, tok);
	hi3_stw_add(w, "logprobs", HI3_F32, 1, st, lp);
	hi3_stw_add(w, "cu_seqlens", HI3_I64, 1, sc, cu);
	hi3_stw_add(w, "stop_reason", HI3_U8, 1, sb, stop);
	hi3_stw_meta(w, "format", "hi3.segment");
	hi3_stw_meta(w, "format_version", HI3_FORMAT_VERSION);
	rc = hi3_stw_write(w, path, err);
	hi3_stw_free(w);
	free(tok);
	free(lp);
	return rc;
}

/* Two rows, L = 8: row 0 has 8 real tokens and an image block [2, 5);
 * row 1 has 5 real tokens and an image block [1, 3); the second block
 * slot of each row is unused (stop = start). */
static int make_cond(const char *path, hi3_error *err)
{
	enum { B = 2, L = 8, S = 2, NS = 2 };
	hi3_st_writer *w = hi3_stw_new();
	int64_t ids[B * L], pos[B * L], real[B] = {8, 5}, seeds[B] = {11, 12}, stops[B * NS] = {1, -1, 1, -1};
	int32_t rope[B * L * 2], blocks[B * S * 2] = {2, 5, 0, 0, 1, 3, 0, 0};
	int rc;

	for (int r = 0; r < B; r++)
		for (int j = 0; j < L; j++) {
			ids[r * L + j] = j < real[r] ? 10 + j : 0;
			pos[r * L + j] = j;
			rope[(r * L + j) * 2] = rope[(r * L + j) * 2 + 1] = j;
		}
	hi3_stw_add(w, "input_ids", HI3_I64, 2, (int64_t[]){B, L}, ids);
	hi3_stw_add(w, "position_ids", HI3_I64, 2, (int64_t[]){B, L}, pos);
	hi3_stw_add(w, "real_pos", HI3_I64, 1, (int64_t[]){B}, real);
	hi3_stw_add(w, "rope_pos", HI3_I32, 3, (int64_t[]){B, L, 2}, rope);
	hi3_stw_add(w, "image_blocks", HI3_I32, 3, (int64_t[]){B, S, 2}, blocks);
	hi3_stw_add(w, "seeds", HI3_I64, 1, (int64_t[]){B}, seeds);
	hi3_stw_add(w, "stop_tokens", HI3_I64, 2, (int64_t[]){B, NS}, stops);
	hi3_stw_meta(w, "format", "hi3.conditions");
	hi3_stw_meta(w, "format_version", HI3_FORMAT_VERSION);
	hi3_stw_meta(w, "mode", "gen_text");
	rc = hi3_stw_write(w, path, err);
	hi3_stw_free(w);
	return rc;
}

static int list(const char *arg, int64_t *out, int max)
{
	int n = 0;
	char *copy = strdup(arg), *save = NULL;

	for (char *t = strtok_r(copy, ",", &save); t && n < max; t = strtok_r(NULL, ",", &save))
		out[n++] = strtoll(t, NULL, 10);
	free(copy);
	return n;
}

/* "ids=7,9 lens=8,5 gen=2,2 L=8 C=12 salt=1 [bf16]" */
static void parse_kv_spec(struct kvspec *s, int argc, char **argv)
{
	memset(s, 0, sizeof(*s));
	s->layers = 2;
	s->heads = 2;
	s->d = 8;
	s->V = 16;
	s->dt = HI3_F32;
	for (int i = 0; i < argc; i++) {
		char *eq = strchr(argv[i], '=');
		const char *v = eq ? eq + 1 : "";
		int64_t x = strtoll(v, NULL, 10);

		if (!strncmp(argv[i], "ids=", 4))
			s->B = list(v, s->ids, MAXB);
		else if (!strncmp(argv[i], "lens=", 5))
			list(v, s->lens, MAXB);
		else if (!strncmp(argv[i], "gen=", 4))
			list(v, s->gen, MAXB);
		else if (!strncmp(argv[i], "L=", 2))
			s->L = (int)x;
		else if (!strncmp(argv[i], "C=", 2))
			s->C = (int)x;
		else if (!strncmp(argv[i], "salt=", 5))
			s->salt = (uint64_t)x;
		else if (!strcmp(argv[i], "bf16"))
			s->dt = HI3_BF16;
	}
}

static int poke(const char *path, const char *name, const char *idx, const char *val, hi3_error *err)
{
	hi3_st *st;
	const hi3_tensor *t;
	int64_t ix[HI3_MAX_DIMS];
	double v = strtod(val, NULL);
	int n = list(idx, ix, HI3_MAX_DIMS);
	size_t off;
	unsigned char *p;

	if (hi3_st_open(&st, path, HI3_ST_RDWR, err) != 0)
		return -1;
	t = hi3_st_find(st, name);
	if (!t || n != t->ndim) {
		hi3_st_close(st);
		return hi3_error_set(err, 2, "poke: no tensor '%s' with %d dimensions", name, n);
	}
	off = (size_t)hi3i_flat(t->ndim, t->shape, ix);
	p = (unsigned char *)t->data + off * hi3_dtype_size(t->dtype);
	switch (t->dtype) {
	case HI3_F32: { float f = (float)v; memcpy(p, &f, 4); break; }
	case HI3_BF16: { uint16_t h = hi3_f32_to_bf16((float)v); memcpy(p, &h, 2); break; }
	case HI3_I64: { int64_t i = (int64_t)v; memcpy(p, &i, 8); break; }
	case HI3_I32: { int32_t i = (int32_t)v; memcpy(p, &i, 4); break; }
	case HI3_I16: { int16_t i = (int16_t)v; memcpy(p, &i, 2); break; }
	case HI3_U8: *p = (uint8_t)v; break;
	default:
		hi3_st_close(st);
		return hi3_error_set(err, 2, "poke: dtype %s not handled", hi3_dtype_name(t->dtype));
	}
	hi3_st_sync(st, p, 8, err);
	hi3_st_close(st);
	return 0;
}

/* An array element by index, or "KEY=VALUE": the object whose KEY is VALUE. */
static json_t *array_get(json_t *a, const char *k)
{
	const char *eq = strchr(k, '=');
	size_t i;
	json_t *e;

	if (!eq)
		return json_array_get(a, (size_t)strtoul(k, NULL, 10));
	json_array_foreach(a, i, e) {
		json_t *f;
		char key[64];

		snprintf(key, sizeof(key), "%.*s", (int)(eq - k), k);
		f = json_object_get(e, key);
		if (json_is_string(f) && !strcmp(json_string_value(f), eq + 1))
			return e;
	}
	return NULL;
}

static int json_cmd(const char *path)
{
	json_error_t e;
	json_t *root = json_loadf(stdin, 0, &e), *v;
	char *copy, *save = NULL;

	if (!root || !json_is_object(root)) {
		fprintf(stderr, "not one JSON object: %s (line %d)\n", root ? "not an object" : e.text, e.line);
		return 1;
	}
	v = root;
	copy = strdup(path ? path : "");
	for (char *k = strtok_r(copy, "/", &save); k && v; k = strtok_r(NULL, "/", &save))
		v = json_is_array(v) ? array_get(v, k) : json_object_get(v, k);
	free(copy);
	if (!v) {
		fprintf(stderr, "no value at '%s'\n", path);
		json_decref(root);
		return 1;
	}
	if (path) {
		if (json_is_string(v)) {
			printf("%s\n", json_string_value(v));
		} else {
			char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
			printf("%s\n", s);
			free(s);
		}
	}
	json_decref(root);
	return 0;
}

/* hi3's rollout (conditions + segment) as JSONL in another engine's fields
 * (hi3-import-rollout(1)), log-probs printed exactly (%.9g round-trips an
 * f32). Routed experts: the segment's for the response; the prompt's rows
 * (which import-rollout does not take) are experts 0, 1, ... */
static int export_rollout(const char *cond, const char *segp, const char *fmt, hi3_error *err)
{
	hi3_cond *c = NULL;
	hi3_segment *s = NULL;
	int rc = -1;

	if (hi3_cond_open(&c, cond, err) || hi3_segment_open(&s, segp, err))
		goto out;
	for (int i = 0; i < s->B; i++) {
		int64_t n = c->real_pos[i], o = s->cu_seqlens[i], R = s->cu_seqlens[i + 1] - o, NK = s->n_moe * s->k;
		int vllm = !strcmp(fmt, "vllm"), openai = !strcmp(fmt, "openai"), sgl = !strcmp(fmt, "sglang");
		const char *reason = s->stop_reason[i] == 1 ? "stop" : s->stop_reason[i] == 2 ? "length" : "abort";

		printf("{\"%s\": [", sgl ? "input_ids" : "prompt_token_ids");
		for (int64_t t = 0; t < n; t++)
			printf("%s%lld", t ? ", " : "", (long long)c->input_ids[(size_t)i * c->L + t]);
		printf("], \"seed\": %lld, ", (long long)c->seeds[i]);
		printf(vllm ? "\"outputs\": [{\"token_ids\": [" : openai ? "\"choices\": [{\"token_ids\": [" : "\"output_ids\": [");
		for (int64_t j = 0; j < R; j++)
			printf("%s%lld", j ? ", " : "", (long long)s->tokens[o + j]);
		printf("], ");
		if (vllm) {
			printf("\"logprobs\": [");
			for (int64_t j = 0; j < R; j++)
				printf("%s{\"%lld\": {\"logprob\": %.9g, \"rank\": 1, \"decoded_token\": null}}", j ? ", " : "",
				       (long long)s->tokens[o + j], s->logprobs[o + j]);
			printf("], \"finish_reason\": \"%s\"", reason);
		} else if (openai) {
			printf("\"logprobs\": {\"content\": [");
			for (int64_t j = 0; j < R; j++)
				printf("%s{\"token\": \"t%lld\", \"logprob\": %.9g}", j ? ", " : "", (long long)s->tokens[o + j],
				       s->logprobs[o + j]);
			printf("]}, \"finish_reason\": \"%s\"", reason);
		} else {
			printf("\"meta_info\": {\"finish_reason\": {\"type\": \"%s\"}, \"output_token_logprobs\": [", reason);
			for (int64_t j = 0; j < R; j++)
				printf("%s[%.9g, %lld, null]", j ? ", " : "", s->logprobs[o + j], (long long)s->tokens[o + j]);
			printf("]");
		}
		if (s->route_ids && sgl) {
			/* base64 of int32 (n + R - 1, n_moe, k) */
			static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
			int64_t N = n + R - 1, nb = N * NK * 4;
			unsigned char *b = calloc((size_t)nb + 3, 1);
			for (int64_t r = 0; r < N; r++)
				for (int64_t x = 0; x < NK; x++) {
					int32_t e = r < n ? (int32_t)(x % s->k) : s->route_ids[(size_t)(o + r - n) * NK + x];
					memcpy(b + (r * NK + x) * 4, &e, 4);
				}
			printf(", \"routed_experts\": \"");
			for (int64_t q = 0; q < nb; q += 3) {
				uint32_t v = (uint32_t)b[q] << 16 | (uint32_t)b[q + 1] << 8 | b[q + 2];
				putchar(b64[v >> 18 & 63]);
				putchar(b64[v >> 12 & 63]);
				putchar(q + 1 < nb ? b64[v >> 6 & 63] : '=');
				putchar(q + 2 < nb ? b64[v & 63] : '=');
			}
			printf("\"");
			free(b);
		} else if (s->route_ids) {
			printf(", \"routed_experts\": [");
			for (int64_t r = 0; r < n + R - 1; r++) {
				printf("%s[", r ? ", " : "");
				for (int l = 0; l < s->n_moe; l++) {
					printf("%s[", l ? ", " : "");
					for (int a = 0; a < s->k; a++)
						printf("%s%d", a ? ", " : "",
						       r < n ? a : s->route_ids[((size_t)(o + r - n) * s->n_moe + l) * s->k + a]);
					printf("]");
				}
				printf("]");
			}
			printf("]");
		}
		printf(sgl ? "}}\n" : "}]}\n");
	}
	rc = 0;
out:
	hi3_segment_close(s);
	hi3_cond_close(c);
	return rc;
}

/* Read a PNG (checked: signature, IHDR first, decodes); pixels as RGB. */
static uint8_t *png_read(const char *path, int *w, int *h)
{
	unsigned char head[24];
	png_image img;
	uint8_t *px;
	FILE *f = fopen(path, "rb");

	if (!f || fread(head, 1, 24, f) != 24) {
		if (f)
			fclose(f);
		return NULL;
	}
	fclose(f);
	if (memcmp(head, "\x89PNG\r\n\x1a\n", 8) || memcmp(head + 8, "\0\0\0\x0dIHDR", 8))
		return NULL;
	*w = (int)((uint32_t)head[16] << 24 | (uint32_t)head[17] << 16 | (uint32_t)head[18] << 8 | head[19]);
	*h = 0;
	memset(&img, 0, sizeof(img));
	img.version = PNG_IMAGE_VERSION;
	if (!png_image_begin_read_from_file(&img, path))
		return NULL;
	img.format = PNG_FORMAT_RGB;
	px = malloc(PNG_IMAGE_SIZE(img));
	if (!px || !png_image_finish_read(&img, NULL, px, 0, NULL) || (int)img.width != *w) {
		free(px);
		png_image_free(&img);
		return NULL;
	}
	*h = (int)img.height;
	return px;
}

/* Rewrite the safetensors file path without the tensors whose names start
 * with prefix (a model without its VAE, say). */
static int strip(const char *path, const char *prefix, hi3_error *err)
{
	hi3_st *st = NULL;
	hi3_st_writer *w = NULL;
	int rc = -1;

	if (hi3_st_open(&st, path, HI3_ST_READ, err))
		return -1;
	if (!(w = hi3_stw_new()))
		goto out;
	for (int i = 0; i < hi3_st_meta_count(st); i++) {
		const char *k, *v;
		hi3_st_meta_at(st, i, &k, &v);
		if (hi3_stw_meta(w, k, v))
			goto out;
	}
	for (int i = 0; i < hi3_st_count(st); i++) {
		const hi3_tensor *t = hi3_st_at(st, i);
		if (strncmp(t->name, prefix, strlen(prefix)) &&
		    hi3_stw_add(w, t->name, t->dtype, t->ndim, t->shape, t->data))
			goto out;
	}
	if (hi3_stw_write(w, path, err))   /* atomic: the mapping stays valid */
		goto out;
	rc = 0;
out:
	if (rc && !err->msg[0])
		hi3_error_set(err, HI3_ERR_RUNTIME, "%s: cannot strip it", path);
	hi3_stw_free(w);
	hi3_st_close(st);
	return rc;
}

/* Print the text chunks of a PNG, one "key=value" a line (values on one line). */
static int print_png_text(const char *path)
{
	FILE *f = fopen(path, "rb");
	png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
	png_infop info = png ? png_create_info_struct(png) : NULL;
	png_textp t = NULL;
	int n = 0;

	if (!f || !png || !info || setjmp(png_jmpbuf(png))) {
		if (f)
			fclose(f);
		png_destroy_read_struct(&png, &info, NULL);
		fprintf(stderr, "%s: not a valid PNG\n", path);
		return 1;
	}
	png_init_io(png, f);
	png_read_png(png, info, PNG_TRANSFORM_IDENTITY, NULL);
	png_get_text(png, info, &t, &n);
	for (int i = 0; i < n; i++) {
		printf("%s=", t[i].key);
		for (const char *c = t[i].text; *c; c++)
			putchar(*c == '\n' ? ' ' : *c);
		putchar('\n');
	}
	png_destroy_read_struct(&png, &info, NULL);
	fclose(f);
	return 0;
}

/* A conditions file's requests (metadata) as JSONL, one request a line:
 * what tokenize-concat builds the same rows from. */
static int requests_cmd(const char *path, hi3_error *err)
{
	hi3_cond *c = NULL;
	json_t *all, *r;
	size_t i;

	if (hi3_cond_open(&c, path, err))
		return -1;
	if (!(all = json_loads(c->requests, JSON_ALLOW_NUL, NULL))) {
		hi3_cond_close(c);
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: requests are not JSON", path);
	}
	json_array_foreach(all, i, r) {
		char *line = json_dumps(r, JSON_COMPACT | JSON_ENSURE_ASCII | JSON_PRESERVE_ORDER);
		printf("%s\n", line ? line : "");
		free(line);
	}
	json_decref(all);
	hi3_cond_close(c);
	return 0;
}

static int tool(int argc, char **argv)
{
	hi3_error err = {0};
	int rc = 0;

	if (!strcmp(argv[1], "kv") && argc >= 3) {
		struct kvspec s;
		parse_kv_spec(&s, argc - 3, argv + 3);
		rc = make_kv(argv[2], &s, &err);
	} else if (!strcmp(argv[1], "seg") && argc == 5) {
		int64_t ids[MAXB], lens[MAXB];
		int B = list(argv[3], ids, MAXB);
		list(argv[4], lens, MAXB);
		rc = make_seg(argv[2], B, ids, lens, &err);
	} else if (!strcmp(argv[1], "cond") && argc == 3) {
		rc = make_cond(argv[2], &err);
	} else if (!strcmp(argv[1], "poke") && argc == 6) {
		rc = poke(argv[2], argv[3], argv[4], argv[5], &err);
	} else if (!strcmp(argv[1], "requests") && argc == 3) {
		rc = requests_cmd(argv[2], &err);
	} else if (!strcmp(argv[1], "json")) {
		return json_cmd(argc > 2 ? argv[2] : NULL);
	} else if (!strcmp(argv[1], "rollout") && argc == 5) {
		rc = export_rollout(argv[2], argv[3], argv[4], &err);
	} else if (!strcmp(argv[1], "argmax") && argc == 5) {
		hi3_st *st = NULL;
		const hi3_tensor *t;
		int64_t r = atoll(argv[4]);
		rc = hi3_st_open(&st, argv[2], HI3_ST_READ, &err) ||
		     hi3_st_get(st, argv[3], HI3_F32, 2, (int64_t[]){-1, -1}, &t, &err);
		if (!rc && (r < 0 || r >= t->shape[0]))
			rc = hi3_error_set(&err, HI3_ERR_USAGE, "row %lld of %lld", (long long)r, (long long)t->shape[0]);
		if (!rc) {
			const float *v = (const float *)t->data + r * t->shape[1];
			int64_t best = 0;
			for (int64_t i = 1; i < t->shape[1]; i++)
				best = v[i] > v[best] ? i : best;
			printf("%lld\n", (long long)best);
		}
		hi3_st_close(st);
	} else if (!strcmp(argv[1], "strip") && argc == 4) {
		rc = strip(argv[2], argv[3], &err);
	} else if (!strcmp(argv[1], "pngtext") && argc == 3) {
		return print_png_text(argv[2]);
	} else if ((!strcmp(argv[1], "pnginfo") && argc == 3) || (!strcmp(argv[1], "pngpix") && argc == 5)) {
		int w, h;
		uint8_t *px = png_read(argv[2], &w, &h);
		if (!px) {
			fprintf(stderr, "%s: not a valid PNG\n", argv[2]);
			return 1;
		}
		if (argc == 3) {
			printf("%d %d\n", w, h);
		} else {
			int x = atoi(argv[3]), y = atoi(argv[4]);
			if (x < 0 || y < 0 || x >= w || y >= h) {
				free(px);
				return 1;
			}
			printf("%d %d %d\n", px[(y * w + x) * 3], px[(y * w + x) * 3 + 1], px[(y * w + x) * 3 + 2]);
		}
		free(px);
		return 0;
	} else {
		fprintf(stderr, "test-tools: unknown command or arguments\n");
		return 2;
	}
	if (rc != 0)
		fprintf(stderr, "test-tools: %s\n", err.msg);
	return rc ? 1 : 0;
}

/* ------------------------------------------------------------ unit tests */

static char *dir;

static const char *path_of(const char *name)
{
	static char buf[4][512];
	static int k;

	k = (k + 1) % 4;
	snprintf(buf[k], sizeof(buf[k]), "%s/%s", dir, name);
	return buf[k];
}

static void test_natcmp(void)
{
	ok(hi3i_natcmp("k.2", "k.10") < 0 && hi3i_natcmp("k.10", "k.2") > 0, "natural order: k.2 before k.10");
	ok(hi3i_natcmp("k.10", "kv_len") < 0 && hi3i_natcmp("a", "a") == 0 && hi3i_natcmp("a", "ab") < 0,
	   "natural order: plain text compares bytewise");
	ok(hi3i_natcmp("x007", "x7") == 0 && hi3i_natcmp("layers.9.w", "layers.10.w") < 0,
	   "natural order: leading zeros ignored, inner numbers compare as numbers");
}

static void test_slices(void)
{
	int64_t shape[3] = {4, 5, 9}, out[HI3_MAX_DIMS], src[HI3_MAX_DIMS];
	hi3i_slice s;
	hi3_error err = {0};
	int nd;
	struct {
		const char *spec, *needle;
	} bad[] = {
		{"4", "index 4 is out of range [-4, 4)"},  {"-5", "index -5"},           {"0,0,0,0", "more items"},
		{"0,:,3:10", "stop 10 is out of range"},    {"0,::0", "step '0'"},        {"0,::-1", "step '-1'"},
		{"x", "'x' is not an index"},               {"0,,1", "empty item"},       {"0,3:1", "start 3 is after stop 1"},
		{"1:2:3:4", "more than two ':'"},           {"0,a:3", "start 'a'"},
	};

	ok(hi3i_slice_parse(&s, NULL, 3, shape, &err) == 0 && hi3i_slice_numel(&s) == 180 &&
	   hi3i_slice_shape(&s, out) == 3, "no slice selects everything");
	ok(hi3i_slice_parse(&s, "1,:,3:7", 3, shape, &err) == 0, "parse 1,:,3:7: %s", err.msg);
	nd = hi3i_slice_shape(&s, out);
	ok(nd == 2 && out[0] == 5 && out[1] == 4, "1,:,3:7 has shape (5, 4)");
	hi3i_slice_src(&s, 6, src);
	ok(src[0] == 1 && src[1] == 1 && src[2] == 5, "element 6 of 1,:,3:7 is [1, 1, 5]");
	ok(hi3i_slice_parse(&s, "-1, 1:5:2, ::4", 3, shape, &err) == 0, "parse with spaces, steps, negatives");
	nd = hi3i_slice_shape(&s, out);
	ok(nd == 2 && out[0] == 2 && out[1] == 3, "-1,1:5:2,::4 has shape (2, 3)");
	hi3i_slice_src(&s, 5, src);
	ok(src[0] == 3 && src[1] == 3 && src[2] == 8, "last element of -1,1:5:2,::4 is [3, 3, 8]");
	ok(hi3i_slice_parse(&s, "2", 3, shape, &err) == 0 && hi3i_slice_shape(&s, out) == 2 && out[0] == 5 &&
	   out[1] == 9, "fewer items than dimensions: the rest is ':'");
	ok(hi3i_slice_parse(&s, "0,0,-9", 3, shape, &err) == 0 && hi3i_slice_shape(&s, out) == 0 &&
	   (hi3i_slice_src(&s, 0, src), src[2] == 0), "all indices: a 0-d selection");
	ok(hi3i_slice_parse(&s, "0,2:2", 3, shape, &err) == 0 && hi3i_slice_numel(&s) == 0, "an empty range");
	for (size_t i = 0; i < HI3_ARRAY_SIZE(bad); i++) {
		err = (hi3_error){0};
		ok(hi3i_slice_parse(&s, bad[i].spec, 3, shape, &err) == -1 && err.status == HI3_ERR_USAGE &&
		   strstr(err.msg, bad[i].needle) && strstr(err.msg, bad[i].spec),
		   "bad slice '%s' refused (usage): %s", bad[i].spec, err.msg);
	}
}

/* Reference statistics: a plain loop over hi3_elem_f64. */
static void ref_stats(const hi3_tensor *t, hi3_stats *s)
{
	double sum = 0;
	int64_t fin = 0;

	s->n = hi3_tensor_numel(t);
	s->n_nan = s->n_inf = 0;
	s->min = INFINITY;
	s->max = -INFINITY;
	for (int64_t i = 0; i < s->n; i++) {
		double v = hi3_elem_f64(t->data, t->dtype, (size_t)i);
		if (isnan(v)) {
			s->n_nan++;
		} else if (isinf(v)) {
			s->n_inf++;
		} else {
			sum += v;
			fin++;
			s->min = fmin(s->min, v);
			s->max = fmax(s->max, v);
		}
	}
	s->mean = fin ? sum / (double)fin : NAN;
	if (!fin)
		s->min = s->max = NAN;
}

static void test_stats(void)
{
	enum { N = 200003 };
	hi3_dtype dts[] = {HI3_F32, HI3_BF16, HI3_F16, HI3_I64, HI3_I32, HI3_U8, HI3_F64};
	unsigned char *buf = malloc((size_t)N * 8);
	hi3_error err = {0};

	for (size_t k = 0; k < HI3_ARRAY_SIZE(dts); k++) {
		hi3_tensor t = {.name = "t", .dtype = dts[k], .ndim = 2, .shape = {N / 7, 7}};
		hi3_stats s, s1, r;
		int nonfinite = hi3_dtype_is_float(dts[k]);

		t.shape[0] = N / 7;
		t.data = buf;
		for (int64_t i = 0; i < N; i++) {
			double v = hval(9, k, (uint64_t)i, 0, 0) * 50;
			if (nonfinite && i % 9973 == 5)
				v = NAN;
			else if (nonfinite && i % 12007 == 7)
				v = (i & 1) ? INFINITY : -INFINITY;
			switch (dts[k]) {
			case HI3_F32: ((float *)buf)[i] = (float)v; break;
			case HI3_F64: ((double *)buf)[i] = v; break;
			case HI3_BF16: ((uint16_t *)buf)[i] = hi3_f32_to_bf16((float)v); break;
			case HI3_F16: ((uint16_t *)buf)[i] = hi3_f32_to_f16((float)v); break;
			case HI3_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
			case HI3_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
			default: buf[i] = (uint8_t)(v + 100); break;
			}
		}
		ref_stats(&t, &r);
		ok(hi3_tensor_stats(&t, 2, &s, &err) == 0 && s.n == r.n && s.n_nan == r.n_nan && s.n_inf == r.n_inf &&
		   s.min == r.min && s.max == r.max && fabs(s.mean - r.mean) <= 1e-12 * (1 + fabs(r.mean)),
		   "%s stats match a plain loop: n %lld nan %lld inf %lld min %g max %g mean %.15g (ref %.15g)",
		   hi3_dtype_name(dts[k]), (long long)s.n, (long long)s.n_nan, (long long)s.n_inf, s.min, s.max, s.mean,
		   r.mean);
		ok(!nonfinite || (r.n_nan > 0 && r.n_inf > 0), "%s: the data has NaN and Inf to count",
		   hi3_dtype_name(dts[k]));
		hi3_tensor_stats(&t, 1, &s1, &err);
		ok(!memcmp(&s1, &s, sizeof(s)), "%s stats are bitwise the same on 1 and 2 threads",
		   hi3_dtype_name(dts[k]));
	}
	{
		float v[3] = {NAN, INFINITY, NAN};
		hi3_tensor t = {.name = "x", .dtype = HI3_F32, .ndim = 1, .shape = {3}, .data = v};
		hi3_stats s;
		hi3_tensor_stats(&t, 0, &s, &err);
		ok(isnan(s.min) && isnan(s.max) && isnan(s.mean) && s.n_nan == 2 && s.n_inf == 1,
		   "no finite element: min/max/mean are NaN");
	}
	free(buf);
}

static void test_png(void)
{
	uint8_t rgb[2 * 3 * 3];
	hi3_error err = {0};
	int w, h;
	uint8_t *px;

	for (int i = 0; i < (int)sizeof(rgb); i++)
		rgb[i] = (uint8_t)(i * 13);
	ok(hi3_png_write_rgb(path_of("a.png"), 3, 2, rgb, &err) == 0, "write a 3 x 2 PNG: %s", err.msg);
	px = png_read(path_of("a.png"), &w, &h);
	ok(px && w == 3 && h == 2 && !memcmp(px, rgb, sizeof(rgb)), "it decodes to the same pixels");
	free(px);
	ok(hi3_png_write_rgb(path_of("a.png"), 0, 2, rgb, &err) == -1 && err.status == HI3_ERR_USAGE,
	   "a 0-pixel image is refused: %s", err.msg);
	px = png_read(path_of("a.png"), &w, &h);
	ok(px && w == 3 && h == 2, "and the existing PNG is untouched");
	free(px);
	{
		double v[5] = {-2, 0, 2, NAN, INFINITY};
		uint8_t c[15];
		hi3i_colormap(v, 5, -2, 2, 1, c);
		ok(c[9] == 255 && c[10] == 0 && c[11] == 255, "NaN is magenta");
		ok(c[3] == c[4] && c[4] == c[5] && c[3] > 240, "diverging: zero is white");
		ok(c[0] < c[2] && c[6] > c[8], "diverging: negative blue, positive red");
		ok(!memcmp(c + 12, c + 6, 3), "+Inf takes the positive end");
	}
}

static void test_diff_kv(void)
{
	struct kvspec s = {.B = 2, .L = 8, .C = 12, .layers = 2, .heads = 2, .d = 8, .V = 16,
	                   .ids = {7, 9}, .lens = {8, 5}, .gen = {2, 2}, .salt = 1, .dt = HI3_F32};
	hi3_diff_opts o = {.atol = 1e-5, .row_a = -1, .row_b = -1};
	hi3_diff_result *r = NULL;
	hi3_error err = {0};
	const hi3_diff_tensor *t;
	int k0 = -1, rc;

	make_kv(path_of("a.kv"), &s, &err);
	make_kv(path_of("b.kv"), &s, &err);
	rc = hi3_diff(path_of("a.kv"), path_of("b.kv"), &o, &r, &err);
	ok(rc == 0 && r->equal && r->n == 10 && r->n_differ == 0, "identical kv files are equal (%d tensors)",
	   r ? r->n : -1);
	hi3_diff_free(r);
	/* plant slot 0 of row 1 in B, col 5 head 0 of k.0, and a smaller one later */
	poke(path_of("b.kv"), "k.0", "1,0,0,5", "3.5", &err);
	poke(path_of("b.kv"), "k.1", "0,1,2,3", "nan", &err);
	rc = hi3_diff(path_of("a.kv"), path_of("b.kv"), &o, &r, &err);
	ok(rc == 0 && !r->equal && r->n_differ == 2, "two planted differences: %d tensors differ",
	   r ? r->n_differ : -1);
	for (int i = 0; r && i < r->n; i++)
		if (!strcmp(r->t[i].name, "k.0"))
			k0 = i;
	t = k0 >= 0 ? &r->t[k0] : NULL;
	ok(t && t->status == HI3_DIFF_OVER && t->n_over == 1 && t->n_compared == 2 * 2 * 12 * 8,
	   "k.0: 1 of 384 over tolerance");
	ok(t && t->worst.n_named == 4 && !strcmp(t->worst.label[0], "row") && t->worst.val[0] == 1 &&
	   !strcmp(t->worst.label[1], "head") && t->worst.val[1] == 0 && !strcmp(t->worst.label[2], "slot") &&
	   t->worst.val[2] == 0 && !strcmp(t->worst.label[3], "col") && t->worst.val[3] == 5 && t->worst.b == 3.5,
	   "k.0: worst at row 1, head 0, slot 0, col 5 (b = 3.5)");
	ok(r && r->first == k0 && r->worst >= 0 && !strcmp(r->t[r->worst].name, "k.1") &&
	   isinf(r->t[r->worst].max_abs), "first differing tensor k.0; worst k.1 (NaN against a number: +Inf)");
	hi3_diff_free(r);
	r = NULL;
	/* NaN against NaN is equal */
	poke(path_of("a.kv"), "k.1", "0,1,2,3", "nan", &err);
	o.tensors = (const char *[]){"k.1"};
	o.n_tensors = 1;
	ok(hi3_diff(path_of("a.kv"), path_of("b.kv"), &o, &r, &err) == 0 && r->equal && r->n == 1,
	   "NaN against NaN is equal");
	hi3_diff_free(r);
	r = NULL;
	o.tensors = NULL;
	o.n_tensors = 0;
	/* tolerance: |a-b| > atol + rtol |b| */
	{
		float a[6] = {1, 2, 3, 4, 100, -1}, b[6] = {1.001f, 2.01f, 3.1f, 4, 100.5f, -1.0005f};
		int64_t sh[1] = {6};
		double atol[] = {1e-5, 0.005, 0.05, 0, 1.0}, rtol[] = {0, 0, 0, 0.004, 0};
		hi3_st_writer *w = hi3_stw_new();

		hi3_stw_add(w, "x", HI3_F32, 1, sh, a);
		hi3_stw_write(w, path_of("x.st"), &err);
		hi3_stw_free(w);
		w = hi3_stw_new();
		hi3_stw_add(w, "x", HI3_F32, 1, sh, b);
		hi3_stw_write(w, path_of("y.st"), &err);
		hi3_stw_free(w);
		for (size_t k = 0; k < HI3_ARRAY_SIZE(atol); k++) {
			int64_t want = 0;
			for (int i = 0; i < 6; i++)
				want += fabs((double)a[i] - (double)b[i]) > atol[k] + rtol[k] * fabs((double)b[i]);
			o.atol = atol[k];
			o.rtol = rtol[k];
			rc = hi3_diff(path_of("x.st"), path_of("y.st"), &o, &r, &err);
			ok(rc == 0 && r->t[0].n_over == want &&
			   r->equal == (want == 0) && r->t[0].worst.n_named == 0 && r->t[0].worst.idx[0] == 4,
			   "atol %g rtol %g: %lld over (a plain loop says %lld), worst at [4]", atol[k], rtol[k],
			   r ? (long long)r->t[0].n_over : -1LL, (long long)want);
			hi3_diff_free(r);
			r = NULL;
		}
	}
}

int main(int argc, char **argv)
{
	if (argc > 1)
		return tool(argc, argv);
	if (!(dir = testdir_new("test-tools")))
		return 1;
	test_natcmp();
	test_slices();
	test_stats();
	test_png();
	test_diff_kv();
	testdir_done(dir);
	return done_testing();
}
