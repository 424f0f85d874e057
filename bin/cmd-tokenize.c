/* cmd-tokenize.c -- hi3 tokenize: text lines to token id arrays, and back. */
#include <errno.h>
#include <jansson.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "commands.h"

static const struct cli_help help = {
	.usage = {"hi3 tokenize [--tokenizer FILE | -m MODEL] [--jsonl] [--decode] [--no-special] [--add-special] "
	          "[FILE...]"},
	.description =
	"Encode each input line with a Hugging Face tokenizer.json and write one JSON\n"
	"array of token ids per line, in order; --decode does the inverse. Input comes\n"
	"from the FILEs, or standard input when none is given or FILE is '-'. Nothing\n"
	"is written unless every line succeeds.\n",
};

struct tokenize_opts {
	const hi3_tok *tok;
	int jsonl, decode, flags;
	int64_t bos, eos;             /* -1 unless --add-special */
};

/* Growable output, written once at the end. */
struct outbuf {
	char *p;
	size_t n, cap;
};

static int out_add(struct outbuf *o, const char *s, size_t n)
{
	if (o->n + n + 1 > o->cap) {
		size_t cap = o->cap ? o->cap : 1 << 16;
		char *p;
		while (cap < o->n + n + 1)
			cap *= 2;
		p = realloc(o->p, cap);
		if (!p)
			return -1;
		o->p = p;
		o->cap = cap;
	}
	memcpy(o->p + o->n, s, n);
	o->n += n;
	return 0;
}

static int out_json(struct outbuf *o, json_t *js)
{
	char *s = json_dumps(js, JSON_COMPACT | JSON_ENCODE_ANY);
	int rc = s ? out_add(o, s, strlen(s)) || out_add(o, "\n", 1) : -1;

	free(s);
	return rc;
}

/* The text of a --jsonl line: a JSON string or {"text": "..."}. */
static int jsonl_text(json_t *js, const char **text, size_t *len)
{
	if (json_is_object(js))
		js = json_object_get(js, "text");
	if (!json_is_string(js))
		return -1;
	*text = json_string_value(js);
	*len = json_string_length(js);
	return 0;
}

static int encode_line(const struct tokenize_opts *o, const char *line, size_t len, struct outbuf *out,
                       hi3_error *err)
{
	json_t *js = NULL, *arr = NULL;
	json_error_t jerr;
	int64_t *ids = NULL;
	size_t n = 0;
	int rc = -1;

	if (o->jsonl) {
		js = json_loadb(line, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
		if (!js) {
			hi3_error_set(err, HI3_ERR_INPUT, "malformed JSON: %s", jerr.text);
			goto out;
		}
		if (jsonl_text(js, &line, &len)) {
			hi3_error_set(err, HI3_ERR_INPUT, "expected a JSON string or an object with a \"text\" string");
			goto out;
		}
	}
	if (hi3_tok_encode(o->tok, line, len, o->flags, &ids, &n, err))
		goto out;
	arr = json_array();
	if (!arr || (o->bos >= 0 && json_array_append_new(arr, json_integer(o->bos))))
		goto oom;
	for (size_t i = 0; i < n; i++)
		if (json_array_append_new(arr, json_integer(ids[i])))
			goto oom;
	if ((o->eos >= 0 && json_array_append_new(arr, json_integer(o->eos))) || out_json(out, arr))
		goto oom;
	rc = 0;
	goto out;
oom:
	hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
out:
	free(ids);
	json_decref(arr);
	json_decref(js);
	return rc;
}

static int decode_line(const struct tokenize_opts *o, const char *line, size_t len, struct outbuf *out,
                       hi3_error *err)
{
	json_error_t jerr;
	json_t *js = json_loadb(line, len, JSON_DECODE_ANY, &jerr), *str = NULL;
	int64_t *ids = NULL;
	char *text = NULL;
	size_t n, tl;
	int rc = -1;

	if (!js) {
		hi3_error_set(err, HI3_ERR_INPUT, "malformed JSON: %s", jerr.text);
		goto out;
	}
	if (!json_is_array(js)) {
		hi3_error_set(err, HI3_ERR_INPUT, "expected a JSON array of token ids");
		goto out;
	}
	n = json_array_size(js);
	ids = malloc((n + 1) * sizeof(*ids));
	if (!ids) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		json_t *v = json_array_get(js, i);
		if (!json_is_integer(v)) {
			hi3_error_set(err, HI3_ERR_INPUT, "element %zu is not an integer token id", i);
			goto out;
		}
		ids[i] = json_integer_value(v);
	}
	if (hi3_tok_decode(o->tok, ids, n, o->flags, &text, &tl, err))
		goto out;
	str = json_stringn(text, tl);
	if (!str || out_json(out, str)) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		goto out;
	}
	rc = 0;
out:
	json_decref(str);
	json_decref(js);
	free(ids);
	free(text);
	return rc;
}

/* Run every line of one input; the error names file and line. */
static int run_file(const struct tokenize_opts *o, const char *path, struct outbuf *out, hi3_error *err)
{
	int is_stdin = !strcmp(path, "-");
	FILE *f = is_stdin ? stdin : fopen(path, "rb");
	const char *name = is_stdin ? "<stdin>" : path;
	char *line = NULL;
	size_t cap = 0;
	ssize_t got;
	long lineno = 0;
	int rc = 0;

	if (!f)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: cannot open: %s", path, strerror(errno));
	while ((got = getline(&line, &cap, f)) >= 0) {
		size_t len = (size_t)got;
		lineno++;
		if (len && line[len - 1] == '\n')
			len--;
		rc = o->decode ? decode_line(o, line, len, out, err) : encode_line(o, line, len, out, err);
		if (rc) {
			hi3_error_prefix(err, "%s:%ld", name, lineno);
			break;
		}
	}
	if (!rc && ferror(f))
		rc = hi3_error_set(err, HI3_ERR_INPUT, "%s: read error", name);
	free(line);
	if (!is_stdin)
		fclose(f);
	return rc;
}

/* --add-special: the bos/eos ids named by tokenizer_config.json beside the tokenizer. */
static int special_ids(struct tokenize_opts *o, const char *tok_path, hi3_error *err)
{
	char *copy = strdup(tok_path), *cfg = NULL;
	int rc = -1;

	if (!copy || asprintf(&cfg, "%s/tokenizer_config.json", dirname(copy)) < 0) {
		cfg = NULL;
		hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	} else if (hi3_tok_config_id(o->tok, cfg, "bos_token", &o->bos, err) == 0 &&
	           hi3_tok_config_id(o->tok, cfg, "eos_token", &o->eos, err) == 0) {
		rc = 0;
	}
	free(copy);
	free(cfg);
	return rc;
}

int cmd_tokenize(int argc, char **argv)
{
	struct tokenize_opts o = {.flags = HI3_TOK_SPECIAL, .bos = -1, .eos = -1};
	const char *tok_file = NULL;
	char *tok_path = NULL;
	int add_special = 0, no_special = 0, rc;
	hi3_tok *tok = NULL;
	hi3_error err = {0};
	struct outbuf out = {0};
	struct cli_option options[] = {
		OPT_STRING(0, "tokenizer", &tok_file, "FILE", "the tokenizer.json to use"),
		OPT_STRING('m', "model", &cli.model_dir, "DIR", "use DIR/tokenizer.json"),
		OPT_FLAG(0, "jsonl", &o.jsonl, "each line is a JSON string, or an object with a \"text\" field"),
		OPT_FLAG(0, "decode", &o.decode, "each line is a JSON array of ids; write the text as a JSON string"),
		OPT_FLAG(0, "no-special", &no_special, "encode special tokens as plain text; with --decode, drop them"),
		OPT_FLAG(0, "add-special", &add_special, "put the bos token first and the eos token last, as named in "
		         "tokenizer_config.json beside the tokenizer"),
		OPT_GLOBALS(),
		OPT_END(),
	};

	if ((argc = cli_parse_options(argc, argv, options, &help, 0)) < 0)
		return CLI_PARSE_STATUS(argc);
	if (no_special)
		o.flags &= ~HI3_TOK_SPECIAL;
	if (tok_file && cli.model_dir)
		return cli_usage_error("give --tokenizer or -m, not both");
	if (!tok_file && !cli.model_dir)
		return cli_usage_error("no tokenizer: give --tokenizer FILE or -m MODEL");
	if (add_special && o.decode)
		return cli_usage_error("--add-special applies to encoding, not --decode");
	if (tok_file)
		tok_path = strdup(tok_file);
	else if (asprintf(&tok_path, "%s/tokenizer.json", cli.model_dir) < 0)
		tok_path = NULL;
	if (!tok_path) {
		hi3_error_set(&err, HI3_ERR_RUNTIME, "out of memory");
		goto fail;
	}
	if (hi3_tok_load(&tok, tok_path, &err))
		goto fail;
	o.tok = tok;
	if (add_special && special_ids(&o, tok_path, &err))
		goto fail;
	if (argc == 0) {
		if (run_file(&o, "-", &out, &err))
			goto fail;
	}
	for (int i = 0; i < argc; i++)
		if (run_file(&o, argv[i], &out, &err))
			goto fail;
	if (out.n && fwrite(out.p, 1, out.n, stdout) != out.n) {
		hi3_error_set(&err, HI3_ERR_RUNTIME, "standard output: write error");
		goto fail;
	}
	rc = 0;
	goto done;
fail:
	rc = cli_fail(&err);
done:
	free(out.p);
	free(tok_path);
	hi3_tok_free(tok);
	return rc;
}
