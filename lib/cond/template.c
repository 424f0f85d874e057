/*
 * template.c -- the HunyuanImage-3.0 sequence template (hi3-batching(7)): a request
 * becomes a list of sections (text, generated image, joint cond image) the
 * way upstream's chat template builds them, then one row of token ids with
 * its full-attention blocks, 2-D RoPE positions, image masks, <timestep>
 * positions, stop tokens and decoding rules.
 *
 * Row layout (instruct; pretrain has no role texts and no <answer> pair):
 *   <bos> [system "\n\n"] "User: " [joint image...] prompt "\n\n"
 *   ["Assistant: " cot... ["<answer>" gen image "</answer>"] "\n\n"]
 *   [assistant prefix by bot_task, gen_text only]
 * gen image:   <boi> <img_size_B> <img_ratio_R> <timestep> [<guidance>]
 *              [<timestep_r>] <img>*(h*w) <eoi>
 * joint image: <boi> <img_size_B> <img_ratio_R> <timestep> <img>*(vae h*w)
 *              <joint_img_sep> <img>*(vit max patches) <eoi>
 * Every text section is encoded alone (special tokens recognised); in the
 * classifier-free-guidance (uncond) row the user and cot texts become as
 * many <cfg> tokens.
 *
 * The variant decides what the upstream code of that checkpoint does: the
 * base (tokenizer_wrapper.py, hunyuan.py) or the Instruct code
 * (tokenization_hunyuan_image_3.py, modeling_hunyuan_image_3.py,
 * image_processor.py at 1201fe8): its buckets, stop tokens, the W:H reading
 * of "A:B", the <answer> around a plain assistant text, stripped system
 * prompts, cond_token_attn_type, the Distil's <guidance>/<timestep_r>
 * tokens and its single gen_image row, and the decoding rules of
 * generate_image's text stage (forced tokens after </think> or
 * </recaption>, a greedy ratio token after <img_size_B>; rules.c). The
 * resolution buckets and the ViT grid are buckets.c's.
 */
#include <math.h>
#include <string.h>
#include "cond/template.h"
#include "model/config-internal.h"

static int bucket_of(const hi3_template *t, int64_t h, int64_t w);

void hi3i_template_vit(const hi3_template *t, int *patch, int *max_patches)
{
	*patch = t->vit_patch;
	*max_patches = t->vit_max;
}

static int bucket_of(const hi3_template *t, int64_t h, int64_t w)
{
	return hi3i_bucket_of((const int (*)[2])t->reso, t->n_reso, h, w);
}

/* ------------------------------------------------------------ loading */

static json_t *load_json(const char *dir, const char *file, int required, hi3_error *err)
{
	char *path = hi3i_asprintf("%s/%s", dir, file);
	json_error_t je;
	json_t *js;
	FILE *f;

	if (!path) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		return NULL;
	}
	if (!required && !(f = fopen(path, "r"))) {
		free(path);
		return json_object();
	} else if (!required) {
		fclose(f);
	}
	js = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
	if (!js)
		hi3_error_set(err, HI3_ERR_INPUT, "%s: %s (line %d)", path, je.text, je.line);
	else if (!json_is_object(js)) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: expected a JSON object", path);
		json_decref(js);
		js = NULL;
	}
	free(path);
	return js;
}

/* A token name of tokenizer_config.json: a string or {"content": ...}. */
static const char *token_name(json_t *tcfg, const char *key)
{
	json_t *v = json_object_get(tcfg, key);

	if (json_is_object(v))
		v = json_object_get(v, "content");
	return json_string_value(v);
}

/* config.json (the template's view of it, model/config.c) and
 * generation_config.json: ids, geometry, variant, defaults. */
static int read_config(hi3_template *t, const char *dir, hi3_error *err)
{
	static const char *const attn_names[] = {"full", "full_causal", "causal", "joint_full"};
	char *path = hi3i_asprintf("%s/config.json", dir);
	hi3_config c;
	int rc = -1;

	if (!path)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	if (hi3i_config_load_partial(&c, path, err) != 0 || hi3_gen_defaults_load(&t->gen, dir, err) != 0)
		goto out;
	t->vocab = c.vocab_size;
	t->pad_id = c.pad_token_id;
	t->bos_id = c.bos_token_id;
	t->eos_id = c.eos_token_id;
	t->base_size = c.image_base_size;
	t->down_h = c.vae_downsample_factor[0];
	t->down_w = c.vae_downsample_factor[1];
	t->patch = c.patch_size;
	t->vit_patch = c.vit_processor.patch_size;
	t->vit_max = c.vit_processor.max_num_patches;
	t->variant = hi3_variant_of(&c, &t->gen, t->variant_why, sizeof(t->variant_why));
	t->instruct_code = t->variant != HI3_VARIANT_BASE;
	if (t->instruct_code) {
		/* VAEInfo takes both factors from vae_downsample_factor[0] */
		t->down_w = t->down_h;
		t->rope_2d = !strcmp(c.rope_type, "2d");
		for (int i = 0; i < 4; i++)
			if (!strcmp(c.cond_token_attn_type, attn_names[i]))
				t->attn = i;
		t->cond_vae_vit = !strcmp(c.cond_image_type, "vae_vit");
		t->guidance_token = c.cfg_distilled;
		t->timestep_r_token = c.use_meanflow;
	}
	rc = 0;
out:
	hi3_config_release(&c);
	free(path);
	return rc;
}

/* bos/eos/pad by the names of tokenizer_config.json, when it names them. */
static int special_ids(hi3_template *t, json_t *tcfg, const char *dir, hi3_error *err)
{
	static const char *const keys[] = {"bos_token", "eos_token", "pad_token"};
	int64_t *ids[] = {&t->bos_id, &t->eos_id, &t->pad_id};

	/* transformers' default is false (PreTrainedTokenizerBase) */
	t->clean_up = json_is_true(json_object_get(tcfg, "clean_up_tokenization_spaces"));
	for (int i = 0; i < 3; i++) {
		const char *name = token_name(tcfg, keys[i]);
		if (!name)
			continue;
		if ((*ids[i] = hi3_tok_id(t->tok, name)) < 0)
			return hi3_error_set(err, HI3_ERR_INPUT, "%s/tokenizer_config.json: %s '%s' is not a token of %s",
			                     dir, keys[i], name, t->tok_path);
	}
	return 0;
}

static int fingerprint(hi3_template *t, const char *dir, hi3_error *err)
{
	hi3_config cfg = {0};
	hi3_ckpt *ck = NULL;
	char *path = hi3i_asprintf("%s/config.json", dir);
	int rc = -1;

	if (!path)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	if (hi3_config_load(&cfg, path, err) == 0 && hi3_ckpt_open(&ck, dir, err) == 0) {
		rc = hi3_fingerprint(&cfg, ck, t->fingerprint);
		if (rc)
			hi3_error_set(err, HI3_ERR_RUNTIME, "%s: cannot fingerprint the model", dir);
	}
	hi3_ckpt_close(ck);
	hi3_config_release(&cfg);
	free(path);
	return rc;
}

void hi3_template_free(hi3_template *t)
{
	if (!t)
		return;
	hi3_tok_free(t->tok);
	free(t->tok_path);
	free(t);
}

int hi3_template_open(hi3_template **out, const hi3_template_opts *o, hi3_error *err)
{
	hi3_template *t = hi3i_calloc(1, sizeof(*t), err);
	json_t *tcfg = NULL;
	const char *name = o->name;
	int rc;

	*out = NULL;
	if (!t)
		return -1;
	t->pad_id = t->bos_id = t->eos_id = -1;
	t->base_size = 1024;
	t->down_h = t->down_w = 16;
	t->patch = 1;
	t->vit_patch = 16;
	t->vit_max = 1024;
	t->rope_2d = 1;
	t->attn = ATTN_JOINT_FULL;
	t->cond_vae_vit = 1;
	snprintf(t->variant_why, sizeof(t->variant_why), "no model directory");
	if (hi3_gen_defaults_load(&t->gen, NULL, err) != 0)   /* the defaults */
		goto fail;
	if (o->model_dir) {
		if (read_config(t, o->model_dir, err) != 0 ||
		    !(tcfg = load_json(o->model_dir, "tokenizer_config.json", 0, err)))
			goto fail;
		if (!name && t->gen.sequence_template[0])
			name = t->gen.sequence_template;
		if (o->fingerprint && fingerprint(t, o->model_dir, err) != 0)
			goto fail;
	}
	t->drop_think = o->drop_think || t->gen.drop_think;
	t->image_size = o->image_size;
	if (!name)
		name = "pretrain";
	if (strcmp(name, "pretrain") && strcmp(name, "instruct")) {
		hi3_error_set(err, o->name ? HI3_ERR_USAGE : HI3_ERR_INPUT, "%s%s: unknown sequence template '%s' "
		              "(expected pretrain or instruct)", o->name ? "--template" : o->model_dir,
		              o->name ? "" : "/generation_config.json", name);
		goto fail;
	}
	snprintf(t->name, sizeof(t->name), "%s", name);
	if (hi3i_name_index(hi3i_system_prompt_names, t->gen.use_system_prompt) < 0) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s/generation_config.json: field \"use_system_prompt\": unknown "
		              "system prompt '%s'", o->model_dir, t->gen.use_system_prompt);
		goto fail;
	}
	if (hi3i_name_index(hi3i_bot_task_names, t->gen.bot_task) < 0) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s/generation_config.json: field \"bot_task\": unknown bot_task '%s'",
		              o->model_dir, t->gen.bot_task);
		goto fail;
	}
	if ((t->n_reso = hi3i_buckets_variant(t->variant, t->base_size, t->reso, MAX_RESO)) < 1) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s/config.json: field \"image_base_size\": %d gives no resolution "
		              "buckets%s", o->model_dir, t->base_size, t->instruct_code ? " (the Instruct code needs a "
		              "multiple of 16)" : "");
		goto fail;
	}
	if (o->load_tokenizer) {
		if (!o->tokenizer && !o->model_dir) {
			hi3_error_set(err, HI3_ERR_USAGE, "prompts need a tokenizer: give -m MODEL or --tokenizer FILE");
			goto fail;
		}
		t->tok_path = o->tokenizer ? hi3i_strdup(o->tokenizer) : hi3i_asprintf("%s/tokenizer.json", o->model_dir);
		if (!t->tok_path) {
			hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
			goto fail;
		}
		if (hi3_tok_load(&t->tok, t->tok_path, err) != 0)
			goto fail;
		if (!o->model_dir) {
			/* no model: the tokenizer_config.json beside the tokenizer, if any */
			char *dir = hi3i_strdup(t->tok_path), *slash = dir ? strrchr(dir, '/') : NULL;
			if (!dir) {
				hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
				goto fail;
			}
			if (slash)
				*slash = 0;
			tcfg = load_json(slash ? dir : ".", "tokenizer_config.json", 0, err);
			rc = tcfg ? special_ids(t, tcfg, slash ? dir : ".", err) : -1;
			free(dir);
		} else {
			rc = special_ids(t, tcfg, o->model_dir, err);
		}
		if (rc != 0)
			goto fail;
		if (!t->vocab)
			t->vocab = hi3_tok_vocab_size(t->tok);
	}
	if (o->pad_id >= 0)
		t->pad_id = o->pad_id;
	if (t->vocab && t->pad_id >= t->vocab) {
		hi3_error_set(err, HI3_ERR_INPUT, "pad id %lld is outside the vocabulary of %lld tokens",
		              (long long)t->pad_id, (long long)t->vocab);
		goto fail;
	}
	json_decref(tcfg);
	*out = t;
	return 0;
fail:
	json_decref(tcfg);
	hi3_template_free(t);
	return -1;
}

int64_t hi3_template_pad_id(const hi3_template *t) { return t->pad_id; }
const char *hi3_template_name(const hi3_template *t) { return t->name; }
const hi3_tok *hi3_template_tok(const hi3_template *t) { return t->tok; }
const char *hi3_template_fingerprint(const hi3_template *t) { return t->fingerprint; }
int64_t hi3i_template_vocab(const hi3_template *t) { return t->vocab; }
int hi3_template_variant(const hi3_template *t) { return t->variant; }
const char *hi3_template_variant_why(const hi3_template *t) { return t->variant_why; }
const hi3_gen_defaults *hi3_template_gen_defaults(const hi3_template *t) { return &t->gen; }

int hi3_template_buckets(const hi3_template *t, int (*out)[2], int max)
{
	for (int i = 0; i < t->n_reso && i < max; i++) {
		out[i][0] = t->reso[i][0];
		out[i][1] = t->reso[i][1];
	}
	return t->n_reso;
}

/* A request's bot_task, else the model's default; a pre-tokenized row has
 * no assistant prefix, so it defaults to auto (a prompt body does not). */
int hi3i_template_bot_task(const hi3_template *t, const struct hi3i_request *r)
{
	if (r->bot_task >= 0)
		return r->bot_task;
	return r->tokens && !hi3i_request_body(r) ? HI3I_BOT_AUTO : hi3i_name_index(hi3i_bot_task_names, t->gen.bot_task);
}

int hi3i_template_row_task(const hi3_template *t, const struct hi3i_request *r)
{
	int task = hi3i_template_bot_task(t, r);

	if (!hi3i_request_text_stage(r))
		return task;
	/* generate_image: a CoT stage for these, else one greedy ratio token */
	return task == HI3I_BOT_THINK || task == HI3I_BOT_RECAPTION || task == HI3I_BOT_THINK_RECAPTION ? task
	                                                                                      : HI3I_BOT_IMG_RATIO;
}

int hi3i_template_cfg_factor(const hi3_template *t, int mode)
{
	return mode == HI3I_GEN_IMAGE && !t->guidance_token ? 2 : 1;
}

/* ------------------------------------------------------------- sections */

enum { SEC_TEXT, SEC_GEN, SEC_JOINT, SEC_IDS };

struct section {
	int type;
	const char *text;            /* SEC_TEXT */
	size_t len;                  /* SEC_TEXT: bytes; SEC_IDS: ids */
	const int64_t *ids;          /* SEC_IDS: pre-tokenized text */
	int uncond;                  /* becomes <cfg> tokens in the uncond row */
	int ratio;                   /* image sections: the bucket index */
	int h, w;                    /* SEC_GEN grid; SEC_JOINT: the VAE grid */
	int vit_h, vit_w;            /* SEC_JOINT: the ViT grid */
};

struct seclist {
	struct section *s;
	int n, cap;
	char *owned[8];              /* texts built here */
	int n_owned;
};

static int add(struct seclist *l, struct section s, hi3_error *err)
{
	if (l->n == l->cap) {
		int cap = l->cap ? 2 * l->cap : 32;
		struct section *ns = realloc(l->s, (size_t)cap * sizeof(*ns));
		if (!ns)
			return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		l->s = ns;
		l->cap = cap;
	}
	l->s[l->n++] = s;
	return 0;
}

static int add_text(struct seclist *l, const char *text, size_t len, int uncond, hi3_error *err)
{
	struct section s = {.type = SEC_TEXT, .text = text, .len = len, .uncond = uncond};

	return add(l, s, err);
}

/* A text built here (owned by the list), added as one section. */
static int add_owned(struct seclist *l, char *text, int uncond, hi3_error *err)
{
	if (!text)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	HI3_ASSERT(l->n_owned < (int)HI3_ARRAY_SIZE(l->owned));
	l->owned[l->n_owned++] = text;
	return add_text(l, text, strlen(text), uncond, err);
}

/* Python's s.split(sep)[k]: the text between the k-th and (k+1)-th sep. */
static void split_piece(const char *s, size_t n, const char *sep, int k, const char **p, size_t *len)
{
	size_t m = strlen(sep);
	const char *end = s + n, *q;

	for (; k > 0; k--) {
		q = memmem(s, (size_t)(end - s), sep, m);
		s = q ? q + m : end;
	}
	q = memmem(s, (size_t)(end - s), sep, m);
	*p = s;
	*len = (size_t)((q ? q : end) - s);
}

static int contains(const char *s, size_t n, const char *sub)
{
	return memmem(s, n, sub, strlen(sub)) != NULL;
}

/* Chain-of-thought text: <think>...</think> and <recaption>...</recaption>
 * pairs become their own sections (the think one dropped with drop_think);
 * the rest is plain text. */
static int cot_sections(struct seclist *l, const char *s, size_t n, int drop_think, hi3_error *err)
{
	static const char *const tags[2][2] = {{"<think>", "</think>"}, {"<recaption>", "</recaption>"}};

	if (n == 0)
		return 0;
	for (int k = 0; k < 2; k++) {
		const char *open = tags[k][0], *close = tags[k][1], *p;
		size_t len, inner_len;
		const char *inner;

		if (!contains(s, n, open) || !contains(s, n, close))
			continue;
		split_piece(s, n, open, 0, &p, &len);                 /* before */
		if (cot_sections(l, p, len, drop_think, err) != 0)
			return -1;
		if (!(k == 0 && drop_think)) {
			split_piece(s, n, open, 1, &p, &len);
			split_piece(p, len, close, 0, &inner, &inner_len);
			if (add_text(l, open, strlen(open), 0, err) || add_text(l, inner, inner_len, 1, err) ||
			    add_text(l, close, strlen(close), 0, err))
				return -1;
		}
		split_piece(s, n, close, 1, &p, &len);                /* after */
		return cot_sections(l, p, len, drop_think, err);
	}
	return add_text(l, s, n, 1, err);
}

static int cot_has_pair(const char *s, size_t n)
{
	return (contains(s, n, "<recaption>") && contains(s, n, "</recaption>")) ||
	       (contains(s, n, "<think>") && contains(s, n, "</think>"));
}

/* Python's str.strip(): white space off both ends (ASCII white space and
 * the Unicode spaces Python strips). */
static void py_strip(const char **s, size_t *n)
{
	static const char *const uspace[] = {"\xc2\x85", "\xc2\xa0", "\xe1\x9a\x80", "\xe2\x80\x80", "\xe2\x80\x81",
	                                     "\xe2\x80\x82", "\xe2\x80\x83", "\xe2\x80\x84", "\xe2\x80\x85",
	                                     "\xe2\x80\x86", "\xe2\x80\x87", "\xe2\x80\x88", "\xe2\x80\x89",
	                                     "\xe2\x80\x8a", "\xe2\x80\xa8", "\xe2\x80\xa9", "\xe2\x80\xaf",
	                                     "\xe2\x81\x9f", "\xe3\x80\x80"};
	int again = 1;

	while (again && *n) {
		again = 0;
		if (strchr(" \t\n\r\v\f\x1c\x1d\x1e\x1f", (*s)[0])) {
			(*s)++;
			(*n)--;
			again = 1;
			continue;
		}
		for (size_t k = 0; k < HI3_ARRAY_SIZE(uspace); k++) {
			size_t m = strlen(uspace[k]);
			if (*n >= m && !memcmp(*s, uspace[k], m)) {
				*s += m;
				*n -= m;
				again = 1;
				break;
			}
		}
	}
	again = 1;
	while (again && *n) {
		again = 0;
		if (strchr(" \t\n\r\v\f\x1c\x1d\x1e\x1f", (*s)[*n - 1])) {
			(*n)--;
			again = 1;
			continue;
		}
		for (size_t k = 0; k < HI3_ARRAY_SIZE(uspace); k++) {
			size_t m = strlen(uspace[k]);
			if (*n >= m && !memcmp(*s + *n - m, uspace[k], m)) {
				*n -= m;
				again = 1;
				break;
			}
		}
	}
}

/* A system value that is one word (letters, digits, '_') names a prompt. */
static int is_prompt_name(const char *s, size_t n)
{
	if (n == 0 || n > 40)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') ||
		      s[i] == '_'))
			return 0;
	return 1;
}

/* The system prompt of request r: a name of system_prompt.py (the model's
 * use_system_prompt when the request has none) through get_system_prompt,
 * or the request's literal text; the Instruct code strips it (generate_image
 * does), unless the request says "strip_system": false (the en_recaption
 * prompt generate_image switches to with drop_think, which it does not). */
int hi3i_template_system(const hi3_template *t, const hi3_requests *rq, const struct hi3i_request *r,
                         const char **text, size_t *len, hi3_error *err)
{
	const char *name = t->gen.use_system_prompt, *custom = NULL;
	int strip_nl;
	char nm[48];

	*text = NULL;
	*len = 0;
	if (r->system && !is_prompt_name(r->system, r->system_len)) {
		*text = r->system;
		*len = r->system_len;
	} else {
		if (r->system) {
			memcpy(nm, r->system, r->system_len);
			nm[r->system_len] = 0;
			name = nm;
		}
		if (hi3i_system_prompt(name, hi3i_template_bot_task(t, r), custom, text, &strip_nl) != 0)
			return hi3_error_set(err, HI3_ERR_INPUT, "%s:%d: field 'system': unknown system prompt name '%s' "
			                     "(expected None, dynamic, custom, en_vanilla, en_recaption, en_think_recaption "
			                     "or en_unified; a literal prompt has more than one word)", rq->name, r->line, name);
		*len = *text ? strlen(*text) : 0;
		while (strip_nl && *len && (*text)[0] == '\n') {
			(*text)++;
			(*len)--;
		}
		while (strip_nl && *len && (*text)[*len - 1] == '\n')
			(*len)--;
	}
	if (t->instruct_code && *text && r->strip_system != 0)
		py_strip(text, len);
	return 0;
}

/* The generated image of request r: its bucket and token grid. */
static int gen_image_section(const hi3_template *t, const hi3_requests *rq, const struct hi3i_request *r,
                             struct section *s, hi3_error *err)
{
	int64_t h = r->size_h, w = r->size_w;
	int b;

	if (r->size_kind == 2) {
		h = t->reso[r->ratio_index][0];
		w = t->reso[r->ratio_index][1];
	} else if (r->size_colon && t->instruct_code) {
		/* image_processor.py: "A:B" is width:height */
		h = r->size_w;
		w = r->size_h;
	}
	b = bucket_of(t, h, w);
	s->type = SEC_GEN;
	s->h = t->reso[b][0] / (t->down_h * t->patch);
	s->w = t->reso[b][1] / (t->down_w * t->patch);
	s->ratio = b;
	if (r->size_kind == 1 && !r->size_colon && t->image_size != HI3_SIZE_BUCKET &&
	    (h != t->reso[b][0] || w != t->reso[b][1])) {
		const int fh = t->down_h * t->patch, fw = t->down_w * t->patch;
		if (t->image_size == HI3_SIZE_STRICT)
			return hi3_error_set(err, HI3_ERR_INPUT, "%s:%d: field 'image_size': %lldx%lld is not a bucket of "
			                     "this model (the nearest is %dx%d; --strict-size)", rq->name, r->line,
			                     (long long)h, (long long)w, t->reso[b][0], t->reso[b][1]);
		if (h % fh || w % fw)
			return hi3_error_set(err, HI3_ERR_INPUT, "%s:%d: field 'image_size': %lldx%lld is not a multiple of "
			                     "the latent factor %dx%d (--exact-size)", rq->name, r->line, (long long)h,
			                     (long long)w, fh, fw);
		s->h = (int)(h / fh);
		s->w = (int)(w / fw);
	}
	if (s->h < 1 || s->w < 1)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s:%d: field 'image_size': bucket %dx%d gives no image tokens "
		                     "(vae_downsample_factor x patch_size is larger)", rq->name, r->line, t->reso[b][0],
		                     t->reso[b][1]);
	return 0;
}

void hi3i_template_cond_geometry(const hi3_template *t, const struct hi3i_request *r, int k, int *bh, int *bw,
                                 int *gh, int *gw)
{
	int b;

	if (r->cond_grid) {
		/* continued from conditions: the views as the text stage had them */
		*bh = r->cond_grid[k][0];
		*bw = r->cond_grid[k][1];
		*gh = r->cond_grid[k][2];
		*gw = r->cond_grid[k][3];
		return;
	}
	b = bucket_of(t, r->cond[k][0], r->cond[k][1]);
	*bh = t->reso[b][0];
	*bw = t->reso[b][1];
	hi3i_vit_grid(r->cond[k][0], r->cond[k][1], t->vit_patch, t->vit_max, gh, gw);
}

/* The sections of request r (hi3-batching(7); upstream apply_chat_template with one
 * system, user and assistant turn). A gen_image request with image_size
 * "auto" gives its text stage: a gen_text row with the first task's prefix
 * (generate_image), or img_ratio's. */
static int build_sections(const hi3_template *t, const hi3_requests *rq, const struct hi3i_request *r,
                          struct seclist *l, hi3_error *err)
{
	int instruct = !strcmp(t->name, "instruct"), final_assistant = 0, task = hi3i_template_row_task(t, r);
	int mode = hi3i_request_row_mode(r);
	const char *sys_suffix = instruct ? "\n\n" : "", *user_prefix = instruct ? "User: " : "";
	const char *bot_prefix = instruct ? "Assistant: " : "", *sep = sys_suffix;
	const char *ans_open = instruct ? "<answer>" : "", *ans_close = instruct ? "</answer>" : "";
	const char *sys;
	size_t sys_len;

	if (hi3i_template_system(t, rq, r, &sys, &sys_len, err) != 0)
		return -1;
	if (sys && sys_len) {
		if (add_text(l, sys, sys_len, 0, err) || add_text(l, sys_suffix, strlen(sys_suffix), 0, err))
			return -1;
	}
	if (add_text(l, user_prefix, strlen(user_prefix), 0, err))
		return -1;
	for (int i = 0; i < r->n_cond; i++) {
		struct section s = {.type = SEC_JOINT};
		int bh, bw;
		hi3i_template_cond_geometry(t, r, i, &bh, &bw, &s.vit_h, &s.vit_w);
		if (!t->cond_vae_vit)
			return hi3_error_set(err, HI3_ERR_INPUT, "%s:%d: field 'cond_images': config.json's cond_image_type "
			                     "is not vae_vit; hi3 builds joint (VAE and ViT) cond images only", rq->name,
			                     r->line);
		s.h = bh / (t->down_h * t->patch);
		s.w = bw / (t->down_w * t->patch);
		s.ratio = bucket_of(t, bh, bw);
		if (add(l, s, err))
			return -1;
	}
	if (r->tokens) {
		/* a pre-tokenized gen_image prompt body: its ids, <cfg> in the uncond row */
		struct section s = {.type = SEC_IDS, .ids = r->tokens, .len = r->n_tokens, .uncond = 1};
		if (add(l, s, err))
			return -1;
	} else if (add_text(l, r->prompt, r->prompt_len, 1, err)) {
		return -1;
	}
	if (add_text(l, sep, strlen(sep), 0, err))
		return -1;
	if (r->cot || mode == HI3I_GEN_IMAGE) {
		final_assistant = 1;
		if (add_text(l, bot_prefix, strlen(bot_prefix), 0, err))
			return -1;
		if (r->cot && cot_has_pair(r->cot, r->cot_len)) {
			if (cot_sections(l, r->cot, r->cot_len, t->drop_think, err) != 0)
				return -1;
		} else if (r->cot && t->instruct_code && instruct) {
			/* the Instruct code answers a plain assistant text: one text */
			if (add_owned(l, hi3i_asprintf("%s%.*s%s", ans_open, (int)r->cot_len, r->cot, ans_close), 1, err))
				return -1;
		} else if (r->cot && add_text(l, r->cot, r->cot_len, 1, err)) {
			return -1;
		}
		if (mode == HI3I_GEN_IMAGE) {
			struct section s;
			if (gen_image_section(t, rq, r, &s, err) || add_text(l, ans_open, strlen(ans_open), 0, err) ||
			    add(l, s, err) || add_text(l, ans_close, strlen(ans_close), 0, err))
				return -1;
		}
		if (add_text(l, sep, strlen(sep), 0, err))
			return -1;
	}
	if (mode == HI3I_GEN_TEXT) {
		/* the assistant prefix by bot_task */
		const char *bp = bot_prefix;
		char *text;
		if (final_assistant) {
			bp = "";
			if (l->n && l->s[l->n - 1].type == SEC_TEXT && l->s[l->n - 1].len == strlen(sep) &&
			    !memcmp(l->s[l->n - 1].text, sep, strlen(sep)))
				l->n--;
		}
		switch (task) {
		case HI3I_BOT_IMAGE: text = hi3i_strdup(""); break;
		case HI3I_BOT_THINK:
		case HI3I_BOT_THINK_RECAPTION: text = hi3i_asprintf("%s<think>", bp); break;
		case HI3I_BOT_RECAPTION: text = hi3i_asprintf("%s<recaption>", bp); break;
		case HI3I_BOT_IMG_RATIO: text = hi3i_asprintf("%s%s<boi><img_size_%d>", bp, ans_open, t->base_size); break;
		default: text = hi3i_strdup(bp); break;
		}
		if (add_owned(l, text, 0, err))
			return -1;
	}
	return 0;
}

/* ------------------------------------------------------------- encoding */

/* A growing row. */
struct rowbuf {
	hi3_cond_row *row;
	size_t cap;
	int runs;                    /* image runs for RoPE */
	int64_t (*run)[3];           /* (runs, 3) start, h, w */
};

static int grow(struct rowbuf *rb, size_t extra, hi3_error *err)
{
	hi3_cond_row *r = rb->row;
	size_t need = (size_t)r->n + extra, cap = rb->cap;
	int64_t *ids;
	uint8_t *m[3];

	if (need <= cap)
		return 0;
	while (cap < need)
		cap = cap ? 2 * cap : 256;
	if (!(ids = realloc(r->ids, cap * sizeof(int64_t))))
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	r->ids = ids;
	m[0] = r->gen_image_mask;
	m[1] = r->cond_vit_mask;
	m[2] = r->cond_vae_mask;
	for (int i = 0; i < 3; i++) {
		uint8_t *nm;
		if (!m[i])
			continue;
		if (!(nm = realloc(m[i], cap)))
			return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		memset(nm + rb->cap, 0, cap - rb->cap);
		m[i] = nm;
	}
	r->gen_image_mask = m[0];
	r->cond_vit_mask = m[1];
	r->cond_vae_mask = m[2];
	rb->cap = cap;
	return 0;
}

static int push(struct rowbuf *rb, int64_t id, int64_t count, hi3_error *err)
{
	if (grow(rb, (size_t)count, err) != 0)
		return -1;
	for (int64_t i = 0; i < count; i++)
		rb->row->ids[rb->row->n++] = id;
	return 0;
}

/* Mark [start, start + n) in *mask (allocated on first use). */
static int mark(struct rowbuf *rb, uint8_t **mask, int64_t start, int64_t n, hi3_error *err)
{
	if (!*mask && !(*mask = hi3i_calloc(rb->cap ? rb->cap : 1, 1, err)))
		return -1;
	memset(*mask + start, 1, (size_t)n);
	return 0;
}

static int add_run(struct rowbuf *rb, int64_t start, int h, int w, hi3_error *err)
{
	int64_t (*nr)[3] = realloc(rb->run, (size_t)(rb->runs + 1) * sizeof(*nr));

	if (!nr)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	rb->run = nr;
	rb->run[rb->runs][0] = start;
	rb->run[rb->runs][1] = h;
	rb->run[rb->runs][2] = w;
	rb->runs++;
	return 0;
}

static int add_block(hi3_cond_row *r, int64_t start, int64_t stop, hi3_error *err)
{
	int32_t *nb = realloc(r->blocks, (size_t)(r->n_blocks + 1) * 2 * sizeof(int32_t));

	if (!nb)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	r->blocks = nb;
	r->blocks[2 * r->n_blocks] = (int32_t)start;
	r->blocks[2 * r->n_blocks + 1] = (int32_t)stop;
	r->n_blocks++;
	return 0;
}

int hi3i_list_add(int64_t **v, int *n, int64_t x, hi3_error *err)
{
	int64_t *nv = realloc(*v, (size_t)(*n + 1) * sizeof(int64_t));

	if (!nv)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	*v = nv;
	nv[(*n)++] = x;
	return 0;
}

int hi3i_template_special(const hi3_template *t, const hi3_requests *rq, int i, const char *name, int64_t *id,
                          hi3_error *err)
{
	if ((*id = hi3_tok_id(t->tok, name)) < 0)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s:%d: the tokenizer %s has no token '%s'", rq->name,
		                     rq->r[i].line, t->tok_path, name);
	return 0;
}

/* <boi> <img_size_B> <img_ratio_R> <timestep>, the start of every image;
 * a generated image of a Distil model adds <guidance> and <timestep_r>. */
static int image_head(const hi3_template *t, const hi3_requests *rq, int i, struct rowbuf *rb, int ratio, int gen,
                      hi3_error *err)
{
	char size_name[32], ratio_name[32];
	int64_t boi, size, rt, ts, id;

	snprintf(size_name, sizeof(size_name), "<img_size_%d>", t->base_size);
	snprintf(ratio_name, sizeof(ratio_name), "<img_ratio_%d>", ratio);
	if (hi3i_template_special(t, rq, i, "<boi>", &boi, err) || hi3i_template_special(t, rq, i, size_name, &size, err) ||
	    hi3i_template_special(t, rq, i, ratio_name, &rt, err) || hi3i_template_special(t, rq, i, "<timestep>", &ts, err))
		return -1;
	if (push(rb, boi, 1, err) || push(rb, size, 1, err) || push(rb, rt, 1, err) ||
	    hi3i_list_add(&rb->row->timestep_index, &rb->row->n_ts, rb->row->n, err) || push(rb, ts, 1, err))
		return -1;
	if (gen && t->guidance_token && (hi3i_template_special(t, rq, i, "<guidance>", &id, err) || push(rb, id, 1, err)))
		return -1;
	if (gen && t->timestep_r_token && (hi3i_template_special(t, rq, i, "<timestep_r>", &id, err) || push(rb, id, 1, err)))
		return -1;
	return 0;
}

static int encode_text(const hi3_template *t, const hi3_requests *rq, int i, struct rowbuf *rb,
                       const struct section *s, int uncond, hi3_error *err)
{
	int64_t *ids = NULL, cfg;
	size_t n = 0;

	if (s->len == 0)
		return 0;
	if (s->type == SEC_IDS) {
		if (!(ids = hi3i_malloc(s->len * sizeof(int64_t), err)))
			return -1;
		memcpy(ids, s->ids, s->len * sizeof(int64_t));
		n = s->len;
	} else if (hi3_tok_encode(t->tok, s->text, s->len, HI3_TOK_SPECIAL, &ids, &n, err) != 0) {
		return hi3_error_prefix(err, "%s:%d", rq->name, rq->r[i].line);
	}
	if (uncond && s->uncond) {
		if (hi3i_template_special(t, rq, i, "<cfg>", &cfg, err) != 0) {
			free(ids);
			return -1;
		}
		for (size_t k = 0; k < n; k++)
			ids[k] = cfg;
	}
	if (grow(rb, n, err) != 0) {
		free(ids);
		return -1;
	}
	if (n)
		memcpy(rb->row->ids + rb->row->n, ids, n * sizeof(int64_t));
	rb->row->n += (int64_t)n;
	free(ids);
	return 0;
}

/* An image block. Full attention: the generated image; a joint cond image
 * by cond_token_attn_type (the base code: one block over VAE, separator and
 * ViT tokens, as joint_full); 2-D RoPE likewise (none with rope_type
 * default). */
static int encode_image(const hi3_template *t, const hi3_requests *rq, int i, struct rowbuf *rb,
                        const struct section *s, hi3_error *err)
{
	hi3_cond_row *r = rb->row;
	int64_t img, eoi, sep, start, vit;

	if (hi3i_template_special(t, rq, i, "<img>", &img, err) || hi3i_template_special(t, rq, i, "<eoi>", &eoi, err) ||
	    image_head(t, rq, i, rb, s->ratio, s->type == SEC_GEN, err))
		return -1;
	start = r->n;
	if (push(rb, img, (int64_t)s->h * s->w, err))
		return -1;
	if (s->type == SEC_GEN) {
		r->gen_h = s->h;
		r->gen_w = s->w;
		if ((t->rope_2d && add_run(rb, start, s->h, s->w, err)) ||
		    mark(rb, &r->gen_image_mask, start, r->n - start, err) || add_block(r, start, r->n, err))
			return -1;
		return push(rb, eoi, 1, err);
	}
	if (mark(rb, &r->cond_vae_mask, start, r->n - start, err) || hi3i_template_special(t, rq, i, "<joint_img_sep>", &sep, err))
		return -1;
	if (t->attn == ATTN_FULL || t->attn == ATTN_FULL_CAUSAL)
		if (add_block(r, start, r->n, err))
			return -1;
	if (t->rope_2d && t->attn != ATTN_CAUSAL && add_run(rb, start, s->h, s->w, err))
		return -1;
	if (push(rb, sep, 1, err))
		return -1;
	vit = r->n;
	if (push(rb, img, t->vit_max, err) || mark(rb, &r->cond_vit_mask, vit, t->vit_max, err))
		return -1;
	if (t->rope_2d && (t->attn == ATTN_FULL || t->attn == ATTN_JOINT_FULL) && add_run(rb, vit, s->vit_h, s->vit_w, err))
		return -1;
	if ((t->attn == ATTN_JOINT_FULL && add_block(r, start, r->n, err)) || (t->attn == ATTN_FULL && add_block(r, vit, r->n, err)))
		return -1;
	return push(rb, eoi, 1, err);
}

/* RoPE: (t, t) for every column, then each image run of h x w starting at
 * index L gets, for its token (i, j), y = L + i + floor(h(w-1)/2) and
 * x = L + j + floor(w(h-1)/2) (hi3-batching(7), RoPE). */
static int rope_positions(struct rowbuf *rb, hi3_error *err)
{
	hi3_cond_row *r = rb->row;

	if (!(r->rope = hi3i_malloc((size_t)HI3_MAX(r->n, 1) * 2 * sizeof(int32_t), err)))
		return -1;
	for (int64_t p = 0; p < r->n; p++)
		r->rope[2 * p] = r->rope[2 * p + 1] = (int32_t)p;
	for (int k = 0; k < rb->runs; k++) {
		int64_t L = rb->run[k][0], h = rb->run[k][1], w = rb->run[k][2];
		for (int64_t y = 0; y < h; y++)
			for (int64_t x = 0; x < w; x++) {
				int64_t p = L + y * w + x;
				r->rope[2 * p] = (int32_t)(L + y + h * (w - 1) / 2);
				r->rope[2 * p + 1] = (int32_t)(L + x + w * (h - 1) / 2);
			}
	}
	return 0;
}

int hi3_template_encode(const hi3_template *t, const hi3_requests *rq, int i, int uncond, hi3_cond_row *row,
                        hi3_error *err)
{
	const struct hi3i_request *r = &rq->r[i];
	struct rowbuf rb = {.row = row};
	struct seclist l = {0};
	int rc = -1;

	memset(row, 0, sizeof(*row));
	if (r->tokens && !hi3i_request_body(r)) {
		if (!(row->ids = hi3i_malloc(r->n_tokens * sizeof(int64_t), err)))
			goto out;
		memcpy(row->ids, r->tokens, r->n_tokens * sizeof(int64_t));
		row->n = (int64_t)r->n_tokens;
	} else {
		if (!t->tok) {
			hi3_error_set(err, HI3_ERR_USAGE, "%s:%d: a prompt needs a tokenizer", rq->name, r->line);
			goto out;
		}
		if (r->size_kind == 2 && r->ratio_index >= t->n_reso) {
			hi3_error_set(err, HI3_ERR_INPUT, "%s:%d: field 'image_size': <img_ratio_%d> maps to no bucket: the %s "
			              "model has %d (0 to %d)", rq->name, r->line, r->ratio_index, hi3_variant_name(t->variant),
			              t->n_reso, t->n_reso - 1);
			goto out;
		}
		if (hi3i_template_bot_task(t, r) == HI3I_BOT_THINK_RECAPTION && !t->instruct_code) {
			hi3_error_set(err, HI3_ERR_INPUT, "%s:%d: field 'bot_task': think_recaption is the Instruct code's; "
			              "the base model's code knows auto, image, think, recaption and img_ratio (%s)", rq->name,
			              r->line, t->variant_why);
			goto out;
		}
		if (hi3i_request_text_stage(r) && !t->instruct_code) {
			hi3_error_set(err, HI3_ERR_INPUT, "%s:%d: field 'image_size': auto in mode gen_image is the Instruct "
			              "code's text stage (generate_image); the base model's code is another (%s): give a size",
			              rq->name, r->line, t->variant_why);
			goto out;
		}
		if (hi3i_request_text_stage(r) && r->cot && hi3i_template_row_task(t, r) != HI3I_BOT_IMG_RATIO) {
			hi3_error_set(err, HI3_ERR_INPUT, "%s:%d: field 'cot': with image_size auto, bot_task %s generates the "
			              "cot (upstream's generate_image ignores a given one); give a size to use this cot",
			              rq->name, r->line, hi3i_bot_task_names[hi3i_template_bot_task(t, r)]);
			goto out;
		}
		if (t->bos_id < 0) {
			hi3_error_set(err, HI3_ERR_INPUT, "%s:%d: no begin-of-sequence token: the model names no bos_token "
			              "(tokenizer_config.json) or bos_token_id (config.json)", rq->name, r->line);
			goto out;
		}
		if (build_sections(t, rq, r, &l, err) != 0 || push(&rb, t->bos_id, 1, err) != 0)
			goto out;
		for (int k = 0; k < l.n; k++)
			if ((l.s[k].type == SEC_TEXT || l.s[k].type == SEC_IDS ? encode_text(t, rq, i, &rb, &l.s[k], uncond, err)
			                             : encode_image(t, rq, i, &rb, &l.s[k], err)) != 0)
				goto out;
	}
	if (row->n > INT32_MAX) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s:%d: the row has %lld tokens, more than a conditions file holds",
		              rq->name, r->line, (long long)row->n);
		goto out;
	}
	if (rope_positions(&rb, err) != 0 || hi3i_template_stops(t, rq, i, row, err) != 0)
		goto out;
	rc = 0;
out:
	for (int k = 0; k < l.n_owned; k++)
		free(l.owned[k]);
	free(l.s);
	free(rb.run);
	if (rc)
		hi3_cond_row_release(row);
	return rc;
}
