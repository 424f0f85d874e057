/* test-tok.c -- the tokenizer against the Hugging Face `tokenizers` library.
 *
 * For every tokenizer named in tests/fixtures/tok/tokenizers.txt and every
 * string of strings.jsonl, the ids (special tokens recognised, and not), and
 * the decoded text (special tokens kept, and dropped) must equal what the
 * library produced (tests/ref/make_tok_fixtures.py); so must the decoding of
 * random id sequences. The "init" tokenizer is made here by hi3_init_model,
 * as `hi3 init-model --preset tiny` writes it. Then the error paths. */
#include <jansson.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>
#include "hi3.h"
#include "core/internal.h"
#include "tok/tok.h"
#include "tap.h"
#include "testdir.h"

static char *dir;
static const char *fixdir;

/* The inputs (JSON strings: they may hold NUL): strings.jsonl for most
 * tokenizers, classes.jsonl (runs of code points) for the class-* ones. */
static json_t *strings, *classes;

static json_t *load_jsonl(const char *path)
{
	FILE *f = fopen(path, "rb");
	json_t *arr = json_array();
	char *line = NULL;
	size_t cap = 0;
	ssize_t n;

	if (!f) {
		diag("cannot open %s", path);
		return arr;
	}
	while ((n = getline(&line, &cap, f)) > 0) {
		json_error_t e;
		json_t *v = json_loadb(line, (size_t)n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &e);
		if (!v) {
			diag("%s: %s", path, e.text);
			break;
		}
		json_array_append_new(arr, v);
	}
	free(line);
	fclose(f);
	return arr;
}

static int ids_equal(const int64_t *ids, size_t n, json_t *want)
{
	if (!json_is_array(want) || json_array_size(want) != n)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (json_integer_value(json_array_get(want, i)) != ids[i])
			return 0;
	return 1;
}

static int text_equal(const char *s, size_t n, json_t *want)
{
	return json_is_string(want) && json_string_length(want) == n && !memcmp(json_string_value(want), s, n);
}

static void show_ids(const char *what, const int64_t *ids, size_t n)
{
	char buf[400];
	size_t k = 0;

	for (size_t i = 0; i < n && k < sizeof(buf) - 24; i++)
		k += (size_t)snprintf(buf + k, sizeof(buf) - k, "%s%lld", i ? "," : "", (long long)ids[i]);
	diag("  %s [%s]", what, buf);
}

static void show_want(json_t *want)
{
	int64_t ids[64];
	size_t n = HI3_MIN(json_array_size(want), HI3_ARRAY_SIZE(ids));

	for (size_t i = 0; i < n; i++)
		ids[i] = json_integer_value(json_array_get(want, i));
	show_ids("want", ids, n);
}

/* Every string through one tokenizer; one TAP line per kind of check. */
static void check_tokenizer(const char *name, const char *path, json_t *inputs, int round_trip)
{
	char fx[512];
	json_t *rows;
	hi3_tok *t = NULL;
	hi3_error err = {0};
	int bad_ids = 0, bad_plain = 0, bad_dec = 0, bad_skip = 0, bad_rt = 0, bad_cases = 0;
	size_t n_rows;

	if (!ok(hi3_tok_load(&t, path, &err) == 0, "%s: load: %s", name, err.msg))
		return;
	snprintf(fx, sizeof(fx), "%s/tok/%s.expected.jsonl", fixdir, name);
	rows = load_jsonl(fx);
	n_rows = json_array_size(rows);
	ok(n_rows == json_array_size(inputs) && n_rows > 0, "%s: %zu expected rows for %zu strings", name, n_rows,
	   json_array_size(inputs));
	for (size_t i = 0; i < n_rows && i < json_array_size(inputs); i++) {
		json_t *row = json_array_get(rows, i), *s = json_array_get(inputs, i);
		json_t *want_ids = json_array_get(row, 0), *want_plain = json_array_get(row, 1);
		json_t *want_dec = json_array_get(row, 2), *want_skip = json_array_get(row, 3);
		int64_t *ids = NULL, *plain = NULL;
		size_t n = 0, np = 0, tl = 0;
		char *text = NULL;

		if (json_is_null(want_plain))
			want_plain = want_ids;
		if (json_is_null(want_dec))
			want_dec = s;
		if (json_is_null(want_skip))
			want_skip = want_dec;
		if (hi3_tok_encode(t, json_string_value(s), json_string_length(s), HI3_TOK_SPECIAL, &ids, &n, &err) ||
		    !ids_equal(ids, n, want_ids)) {
			if (bad_ids++ < 3) {
				diag("%s: string %zu %.80s: %s", name, i + 1, json_string_value(s), err.msg);
				show_ids("got ", ids, n);
				show_want(want_ids);
			}
		}
		if (hi3_tok_encode(t, json_string_value(s), json_string_length(s), 0, &plain, &np, &err) ||
		    !ids_equal(plain, np, want_plain)) {
			if (bad_plain++ < 3) {
				diag("%s: string %zu (special tokens as text): %s", name, i + 1, err.msg);
				show_ids("got ", plain, np);
			}
		}
		if (ids && (hi3_tok_decode(t, ids, n, HI3_TOK_SPECIAL, &text, &tl, &err) ||
		            !text_equal(text, tl, want_dec))) {
			if (bad_dec++ < 3)
				diag("%s: string %zu decode: got '%.80s' want '%.80s'", name, i + 1, text ? text : err.msg,
				     json_string_value(want_dec));
		}
		if (round_trip && (!text || tl != json_string_length(s) || memcmp(text, json_string_value(s), tl)))
			bad_rt++;
		free(text);
		text = NULL;
		if (ids && (hi3_tok_decode(t, ids, n, 0, &text, &tl, &err) || !text_equal(text, tl, want_skip))) {
			if (bad_skip++ < 3)
				diag("%s: string %zu decode without special tokens: got '%.80s'", name, i + 1,
				     text ? text : err.msg);
		}
		free(text);
		free(ids);
		free(plain);
	}
	ok(bad_ids == 0, "%s: ids equal the library's for every string (%d differ)", name, bad_ids);
	ok(bad_plain == 0, "%s: ids with special tokens as text equal the library's (%d differ)", name, bad_plain);
	ok(bad_dec == 0, "%s: decode equals the library's (%d differ)", name, bad_dec);
	ok(bad_skip == 0, "%s: decode dropping special tokens equals the library's (%d differ)", name, bad_skip);
	if (round_trip)
		ok(bad_rt == 0, "%s: decode(encode(s)) == s for every string (%d differ)", name, bad_rt);
	json_decref(rows);

	snprintf(fx, sizeof(fx), "%s/tok/%s.decode.jsonl", fixdir, name);
	if (access(fx, R_OK) != 0)  /* the class-* tokenizers have none */
		goto out;
	rows = load_jsonl(fx);
	for (size_t i = 0; i < json_array_size(rows); i++) {
		json_t *row = json_array_get(rows, i), *jids = json_array_get(row, 0);
		int64_t ids[64];
		size_t n = HI3_MIN(json_array_size(jids), HI3_ARRAY_SIZE(ids));
		char *text = NULL, *skip = NULL;
		size_t tl = 0, sl = 0;

		for (size_t k = 0; k < n; k++)
			ids[k] = json_integer_value(json_array_get(jids, k));
		if (hi3_tok_decode(t, ids, n, HI3_TOK_SPECIAL, &text, &tl, &err) ||
		    hi3_tok_decode(t, ids, n, 0, &skip, &sl, &err) || !text_equal(text, tl, json_array_get(row, 1)) ||
		    !text_equal(skip, sl, json_array_get(row, 2))) {
			if (bad_cases++ < 3)
				diag("%s: decode case %zu: got '%s' / '%s': %s", name, i + 1, text ? text : "", skip ? skip : "",
				     err.msg);
		}
		free(text);
		free(skip);
	}
	ok(json_array_size(rows) > 0 && bad_cases == 0, "%s: decoding %zu random id sequences equals the library's "
	   "(%d differ)", name, json_array_size(rows), bad_cases);
	json_decref(rows);
out:
	hi3_tok_free(t);
}

/* Two threads encoding the same strings at once get the same ids. */
struct job {
	const hi3_tok *t;
	uint64_t sum;
	int failed;
};

static void *encode_all(void *arg)
{
	struct job *j = arg;
	hi3_error err;

	for (int rep = 0; rep < 3; rep++)
		for (size_t i = 0; i < json_array_size(strings); i++) {
			json_t *s = json_array_get(strings, i);
			int64_t *ids;
			size_t n;
			if (hi3_tok_encode(j->t, json_string_value(s), json_string_length(s), HI3_TOK_SPECIAL, &ids, &n,
			                   &err)) {
				j->failed = 1;
				continue;
			}
			for (size_t k = 0; k < n; k++)
				j->sum = j->sum * 31 + (uint64_t)ids[k];
			free(ids);
		}
	return NULL;
}

static void check_threads(const char *path)
{
	hi3_tok *t = NULL;
	hi3_error err;
	struct job a = {0}, b = {0}, c = {0};
	pthread_t ta, tb;

	if (hi3_tok_load(&t, path, &err))
		return;
	a.t = b.t = c.t = t;
	encode_all(&c);
	pthread_create(&ta, NULL, encode_all, &a);
	pthread_create(&tb, NULL, encode_all, &b);
	pthread_join(ta, NULL);
	pthread_join(tb, NULL);
	ok(!a.failed && !b.failed && a.sum == c.sum && b.sum == c.sum, "two threads sharing one tokenizer encode "
	   "as one thread does");
	hi3_tok_free(t);
}

/* ------------------------------------------------------------ errors */

static const char *write_file(const char *name, const char *text)
{
	static char path[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "wb");
	fputs(text, f);
	fclose(f);
	return path;
}

#define MODEL_BPE "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]"

static void expect_refused(const char *name, const char *json, const char *needle)
{
	hi3_tok *t = NULL;
	hi3_error err = {0};
	const char *path = write_file(name, json);
	int rc = hi3_tok_load(&t, path, &err);

	ok(rc == -1 && t == NULL && err.status == HI3_ERR_INPUT && strstr(err.msg, needle) && strstr(err.msg, name),
	   "%s refused naming '%s': %s", name, needle, err.msg);
	hi3_tok_free(t);
}

static void check_errors(const char *init_path)
{
	hi3_tok *t = NULL;
	hi3_error err = {0};
	int64_t *ids = NULL, bad_ids[2] = {5, 100000};
	size_t n;
	char *text = NULL, path[512];

	snprintf(path, sizeof(path), "%s/missing.json", dir);
	ok(hi3_tok_load(&t, path, &err) == -1 && err.status == HI3_ERR_INPUT && strstr(err.msg, "missing.json"),
	   "missing file: %s", err.msg);
	expect_refused("badjson.json", "{\"model\": {\"type\": \"BPE\",\n \"vocab\": {\"a\": 0,}}}", "line 2");
	expect_refused("wordpiece.json", "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}}", "WordPiece");
	expect_refused("unigram.json", "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", "Unigram");
	expect_refused("fallback.json", "{" MODEL_BPE ", \"byte_fallback\": true}}", "byte_fallback");
	expect_refused("dropout.json", "{" MODEL_BPE ", \"dropout\": 0.1}}", "dropout");
	expect_refused("merge.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, "
	               "\"merges\": [[\"a\", \"b\"]]}}", "'ab' is not in the vocab");
	expect_refused("pretok.json", "{" MODEL_BPE "}, \"pre_tokenizer\": {\"type\": \"Whitespace\"}}",
	               "pre_tokenizer 'Whitespace'");
	expect_refused("norm.json", "{" MODEL_BPE "}, \"normalizer\": {\"type\": \"BertNormalizer\"}}",
	               "normalizer 'BertNormalizer'");
	expect_refused("decoder.json", "{" MODEL_BPE "}, \"decoder\": {\"type\": \"WordPiece\"}}", "decoder 'WordPiece'");
	expect_refused("behavior.json", "{" MODEL_BPE "}, \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": "
	               "{\"Regex\": \"a\"}, \"behavior\": \"Sideways\", \"invert\": false}}", "Sideways");
	expect_refused("regex.json", "{" MODEL_BPE "}, \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": "
	               "{\"Regex\": \"(a\"}, \"behavior\": \"Isolated\", \"invert\": false}}", "does not compile");
	/* issue 16: \C matches one byte and cuts UTF-8 characters apart */
	expect_refused("backslash-c.json", "{" MODEL_BPE "}, \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": "
	               "{\"Regex\": \"a\\\\C\"}, \"behavior\": \"Isolated\", \"invert\": false}}", "regex 'a\\C'");
	expect_refused("backslash-c-class.json", "{" MODEL_BPE "}, \"pre_tokenizer\": {\"type\": \"Split\", "
	               "\"pattern\": {\"Regex\": \"[x\\\\C]\"}, \"behavior\": \"Isolated\", \"invert\": false}}",
	               "\\C");
	expect_refused("unk.json", "{" MODEL_BPE ", \"unk_token\": \"<unk>\"}}", "unk_token '<unk>'");
	/* a token is named as a C string: one with a NUL in it could not be found again by its name */
	expect_refused("nul-vocab.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0,\n \"b\\u0000\": 1}, "
	               "\"merges\": []}}", "line 2 column 2: a token holds a NUL character");
	expect_refused("nul-added.json", "{" MODEL_BPE "}, \"added_tokens\": [{\"id\": 3, \"content\": \"<s>\"}, "
	               "{\"id\": 4, \"content\": \"<img_r\\u00009>\"}]}", "added_tokens[1]: \"content\" holds a NUL");
	expect_refused("array.json", "[1, 2]", "not a JSON object");

	ok(hi3_tok_load(&t, init_path, &err) == 0, "load init tokenizer: %s", err.msg);
	if (!t)
		return;
	ok(hi3_tok_encode(t, "ok \xff\xfe", 5, HI3_TOK_SPECIAL, &ids, &n, &err) == -1 && err.status == HI3_ERR_INPUT &&
	   strstr(err.msg, "UTF-8") && strstr(err.msg, "byte 3") && ids == NULL, "invalid UTF-8 refused: %s", err.msg);
	ok(hi3_tok_encode(t, "\xed\xa0\x80", 3, 0, &ids, &n, &err) == -1 && err.status == HI3_ERR_INPUT,
	   "UTF-8 surrogate refused: %s", err.msg);
	ok(hi3_tok_encode(t, "\xc0\xaf", 2, 0, &ids, &n, &err) == -1 && err.status == HI3_ERR_INPUT,
	   "overlong UTF-8 refused: %s", err.msg);
	ok(hi3_tok_decode(t, bad_ids, 2, 0, &text, &n, &err) == -1 && err.status == HI3_ERR_INPUT &&
	   strstr(err.msg, "100000") && text == NULL, "id outside the vocabulary refused: %s", err.msg);
	bad_ids[1] = -1;
	ok(hi3_tok_decode(t, bad_ids, 2, 0, &text, &n, &err) == -1 && err.status == HI3_ERR_INPUT,
	   "negative id refused: %s", err.msg);
	ok(hi3_tok_encode(t, "", 0, HI3_TOK_SPECIAL, &ids, &n, &err) == 0 && n == 0 && ids != NULL,
	   "empty string encodes to no ids");
	free(ids);
	/* the UTF-8 reader stops at the end of its piece */
	{
		size_t l1 = 0, l2 = 0, l3 = 0, l4 = 0;
		uint32_t euro = hi3i_utf8_get("\xe2\x82\xac", 3, &l1), cut = hi3i_utf8_get("\xe2\x82\xac", 2, &l2);
		uint32_t lone = hi3i_utf8_get("\x82", 1, &l3), bad = hi3i_utf8_get("\xe2" "a" "b", 3, &l4);
		ok(euro == 0x20ac && l1 == 3 && cut == 0xfffd && l2 == 1 && lone == 0xfffd && l3 == 1 && bad == 0xfffd &&
		   l4 == 1, "hi3i_utf8_get: a sequence cut by the end of the piece, or broken, is one U+FFFD byte");
	}
	/* issue 16: each lone continuation byte becomes a 3-byte U+FFFD; the
	 * output grew past the n + 1 bytes reserved for it */
	{
		size_t nb = 2000, na = 5000, len = 0;
		int64_t *many = malloc(sizeof(int64_t) * (nb + na));
		int good;
		for (size_t i = 0; i < nb + na; i++)
			many[i] = i < nb ? 128 : 'a';
		good = hi3_tok_decode(t, many, nb + na, 0, &text, &len, &err) == 0 && len == 3 * nb + na &&
		       strlen(text) == len;
		for (size_t i = 0; good && i < len; i++)
			good = text[i] == (i >= 3 * nb ? 'a' : "\xef\xbf\xbd"[i % 3]);
		ok(good, "2000 lone continuation bytes, then 5000 'a': 2000 U+FFFD then the a's (%zu bytes)", len);
		free(text);
		free(many);
		text = NULL;
	}

	/* lookups */
	{
		int64_t eos = hi3_tok_id(t, "<|endoftext|>"), a = hi3_tok_id(t, "a");
		char *buf = NULL;
		size_t len = 0;
		char want[17];

		ok(eos >= 256 && !strcmp(hi3_tok_token(t, eos), "<|endoftext|>"), "special token id %lld <-> name",
		   (long long)eos);
		ok(a == 'a' && !strcmp(hi3_tok_token(t, a), "a"), "byte token 'a' is id 97");
		ok(hi3_tok_id(t, "<no such token>") == -1 && hi3_tok_token(t, 1 << 20) == NULL && hi3_tok_token(t, -3) == NULL,
		   "absent token and id give -1 and NULL");
		ok(hi3_tok_vocab_size(t) == 256 + 56, "vocab size 312 (256 bytes + 56 special tokens): %lld",
		   (long long)hi3_tok_vocab_size(t));
		hi3i_read_file(init_path, &buf, &len, &err);
		snprintf(want, sizeof(want), "%016llx", (unsigned long long)hi3i_hash(HI3_HASH_INIT, buf, len));
		ok(strlen(hi3_tok_hash(t)) == 16 && !strcmp(hi3_tok_hash(t), want), "hash is FNV-1a of the file: %s",
		   hi3_tok_hash(t));
		free(buf);
	}
	hi3_tok_free(t);
}

int main(void)
{
	hi3_init_opts io = {.preset = "tiny", .dtype = HI3_F32};
	hi3_error err = {0};
	char list[512], init_path[512], line[256];
	FILE *f;

	fixdir = getenv("SRCDIR") ? NULL : "tests/fixtures";
	if (!fixdir) {
		static char buf[512];
		snprintf(buf, sizeof(buf), "%s/tests/fixtures", getenv("SRCDIR"));
		fixdir = buf;
	}
	if (!(dir = testdir_new("test-tok")))
		return 1;
	ok(hi3_init_model(dir, &io, &err) == 0, "init-model tiny: %s", err.msg);
	snprintf(init_path, sizeof(init_path), "%s/tokenizer.json", dir);
	snprintf(list, sizeof(list), "%s/tok/strings.jsonl", fixdir);
	strings = load_jsonl(list);
	ok(json_array_size(strings) >= 500, "%zu test strings", json_array_size(strings));
	snprintf(list, sizeof(list), "%s/tok/classes.jsonl", fixdir);
	classes = load_jsonl(list);

	snprintf(list, sizeof(list), "%s/tok/tokenizers.txt", fixdir);
	f = fopen(list, "r");
	ok(f != NULL, "list of fixture tokenizers");
	while (f && fgets(line, sizeof(line), f)) {
		char path[512], *input;
		line[strcspn(line, "\n")] = '\0';
		if (!line[0] || line[0] == '#')
			continue;
		input = strchr(line, ' ');
		if (input)
			*input++ = '\0';
		if (!strcmp(line, "init"))
			snprintf(path, sizeof(path), "%s", init_path);
		else
			snprintf(path, sizeof(path), "%s/tok/%s.json", fixdir, line);
		check_tokenizer(line, path, input && !strcmp(input, "classes.jsonl") ? classes : strings,
		                !strcmp(line, "init") || !strcmp(line, "bpe"));
	}
	if (f)
		fclose(f);
	snprintf(list, sizeof(list), "%s/tok/bpe.json", fixdir);
	check_threads(list);
	check_errors(init_path);
	json_decref(strings);
	json_decref(classes);
	testdir_done(dir);
	return done_testing();
}
