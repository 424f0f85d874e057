/*
 * inspect-model.c -- what `hi3 inspect DIR` says about a checkpoint's model:
 * the variant and why, the config.json fields by what hi3 does with them
 * (hi3_config_field_role), the warnings the values give, the generation
 * defaults and the resolution buckets. One JSON object; the text report is
 * printed from it.
 */
#include <string.h>
#include "cond/cond-internal.h"
#include "model/quant.h"
#include "tools/tools.h"

static void set_str(json_t *o, const char *k, const char *v)
{
	json_object_set_new(o, k, json_string(v));
}

static json_t *gen_json(const hi3_gen_defaults *g)
{
	json_t *o = json_object(), *eos = json_array();

	json_object_set_new(o, "file", json_boolean(g->present));
	set_str(o, "sequence_template", g->sequence_template[0] ? g->sequence_template : "(none)");
	set_str(o, "bot_task", g->bot_task);
	set_str(o, "use_system_prompt", g->use_system_prompt);
	json_object_set_new(o, "drop_think", json_boolean(g->drop_think));
	json_object_set_new(o, "do_sample", json_boolean(g->do_sample));
	json_object_set_new(o, "temperature", json_real(g->temperature));
	json_object_set_new(o, "top_k", json_integer(g->top_k));
	json_object_set_new(o, "top_p", json_real(g->top_p));
	json_object_set_new(o, "max_length", g->max_length > 0 ? json_integer(g->max_length) : json_null());
	for (int i = 0; i < g->n_eos; i++)
		json_array_append_new(eos, json_integer(g->eos_token_id[i]));
	json_object_set_new(o, "eos_token_id", eos);
	json_object_set_new(o, "diff_infer_steps", json_integer(g->diff_infer_steps));
	json_object_set_new(o, "diff_guidance_scale", json_real(g->diff_guidance_scale));
	json_object_set_new(o, "flow_shift", json_real(g->flow_shift));
	return o;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

json_t *hi3i_inspect_model(const char *dir)
{
	char *path = hi3i_asprintf("%s/config.json", dir), why[200];
	json_t *o = json_object(), *raw = NULL, *roles = json_object(), *warn = json_array(), *b = json_array(), *v;
	hi3_config c = {0};
	hi3_gen_defaults g;
	hi3_error e = {0};
	int reso[64][2], n, variant;
	const char *key;
	FILE *f;

	if (!path || !o) {
		free(path);
		json_decref(o);
		return NULL;
	}
	if (!(f = fopen(path, "r"))) {
		json_decref(o);
		o = NULL;
		goto out;
	}
	fclose(f);
	if (hi3_config_load(&c, path, &e) != 0) {
		set_str(o, "error", e.msg);
		goto out;
	}
	if (hi3_gen_defaults_load(&g, dir, &e) != 0) {
		set_str(o, "error", e.msg);
		goto out;
	}
	variant = hi3_variant_of(&c, &g, why, sizeof(why));
	set_str(o, "variant", hi3_variant_name(variant));
	set_str(o, "variant_why", why);
	raw = json_loads(c.json, 0, NULL);
	json_object_foreach(raw, key, v) {
		const char *role = hi3_config_field_role(key);
		json_t *list;
		if (!role)
			role = "unknown";
		if (!(list = json_object_get(roles, role)))
			json_object_set_new(roles, role, list = json_array());
		json_array_append_new(list, json_string(key));
	}
	json_object_foreach(roles, key, v) {
		/* names in order: a sorted copy of each list */
		size_t k = json_array_size(v);
		const char **names = calloc(k + 1, sizeof(*names));
		json_t *sorted = json_array();
		for (size_t i = 0; names && i < k; i++)
			names[i] = json_string_value(json_array_get(v, i));
		if (names)
			qsort(names, k, sizeof(*names), cmp_str);
		for (size_t i = 0; names && i < k; i++)
			json_array_append_new(sorted, json_string(names[i]));
		free(names);
		json_object_set_new(roles, key, sorted);
	}
	json_object_set_new(o, "fields", roles);
	for (int i = 0; i < c.n_warnings; i++)
		json_array_append_new(warn, json_string(c.warnings[i]));
	json_object_set_new(o, "warnings", warn);
	json_object_set_new(o, "generation", gen_json(&g));
	n = hi3i_buckets_variant(variant, c.image_base_size, reso, 64);
	for (int i = 0; i < n; i++)
		json_array_append_new(b, json_pack("[i, i]", reso[i][0], reso[i][1]));
	json_object_set_new(o, "buckets", b);
	b = NULL;
	json_object_set_new(o, "max_position_embeddings", json_integer(c.max_position_embeddings));
	json_object_set_new(o, "image_base_size", json_integer(c.image_base_size));
	json_object_set_new(o, "quantization", hi3i_quant_summary(dir, c.json));
	warn = roles = NULL;
out:
	json_decref(raw);
	json_decref(roles);
	json_decref(warn);
	json_decref(b);
	hi3_config_release(&c);
	free(path);
	return o;
}

/* The quantization lines (hi3-quant(7)). */
static void quant_text(FILE *f, json_t *q)
{
	const char *k, *h;
	json_t *v, *n;
	char b[32];

	if (!q)
		return;
	if (json_object_get(q, "error")) {
		fprintf(f, "  quantization: refused: %s\n", json_string_value(json_object_get(q, "error")));
		return;
	}
	if (!strcmp(json_string_value(json_object_get(q, "method")), "none")) {
		fprintf(f, "  quantization: none\n");
		return;
	}
	fprintf(f, "  quantization: %s (%s); hi3 computes weight-only; %s fewer than bf16\n",
	        json_string_value(json_object_get(q, "method")), json_string_value(json_object_get(q, "file")),
	        hi3_format_bytes((uint64_t)json_integer_value(json_object_get(q, "bytes_saved_vs_bf16")), b));
	if (json_string_length(json_object_get(q, "activations_asked")))
		fprintf(f, "    activations: the checkpoint asks for %s; not applied (they stay f32)\n",
		        json_string_value(json_object_get(q, "activations_asked")));
	json_object_foreach(json_object_get(q, "kinds"), k, v) {
		int first = 1;
		fprintf(f, "    %s:", k);
		json_object_foreach(v, h, n) {
			fprintf(f, "%s %lld %s", first ? "" : ",", (long long)json_integer_value(n), h);
			first = 0;
		}
		fputc('\n', f);
	}
}

/* The text form: a few lines, every field named once. */
void hi3i_inspect_model_text(FILE *f, json_t *m)
{
	static const char *const order[] = {"model", "image", "variant", "checked", "ignored", "unknown"};
	static const char *const what[] = {"used by the text model", "kept for image generation and input",
	                                   "decide the variant", ("checked (refused when set to what hi3 does not "
	                                   "compute)"), "ignored (upstream's model code does not read them)",
	                                   "not known to upstream (ignored)"};
	json_t *fields = json_object_get(m, "fields"), *g = json_object_get(m, "generation"), *v;
	char maxlen[32] = "none";
	size_t i;

	if (json_object_get(m, "error")) {
		fprintf(f, "model: config.json not usable: %s\n", json_string_value(json_object_get(m, "error")));
		return;
	}
	fprintf(f, "model: %s (%s)\n", json_string_value(json_object_get(m, "variant")),
	        json_string_value(json_object_get(m, "variant_why")));
	for (size_t k = 0; k < HI3_ARRAY_SIZE(order); k++) {
		json_t *list = json_object_get(fields, order[k]);
		int col;
		if (!list)
			continue;
		col = fprintf(f, "  config.json, %zu %s:", json_array_size(list), what[k]);
		json_array_foreach(list, i, v) {
			const char *name = json_string_value(v);
			if (col + (int)strlen(name) > 100) {
				fprintf(f, "\n   ");
				col = 3;
			}
			col += fprintf(f, " %s", name);
		}
		fputc('\n', f);
	}
	json_array_foreach(json_object_get(m, "warnings"), i, v)
		fprintf(f, "  warning: %s\n", json_string_value(v));
	if (json_is_integer(json_object_get(g, "max_length")))
		snprintf(maxlen, sizeof(maxlen), "%lld", (long long)json_integer_value(json_object_get(g, "max_length")));
	fprintf(f, "  generation_config.json%s: sequence_template %s, bot_task %s,\n"
	        "    use_system_prompt %s, drop_think %s, do_sample %s, temperature %g, top_k %lld, top_p %g,\n"
	        "    max_length %s, eos_token_id",
	        json_is_true(json_object_get(g, "file")) ? "" : " (absent: defaults)",
	        json_string_value(json_object_get(g, "sequence_template")), json_string_value(json_object_get(g, "bot_task")),
	        json_string_value(json_object_get(g, "use_system_prompt")),
	        json_is_true(json_object_get(g, "drop_think")) ? "true" : "false",
	        json_is_true(json_object_get(g, "do_sample")) ? "true" : "false",
	        json_real_value(json_object_get(g, "temperature")), (long long)json_integer_value(json_object_get(g, "top_k")),
	        json_real_value(json_object_get(g, "top_p")), maxlen);
	json_array_foreach(json_object_get(g, "eos_token_id"), i, v)
		fprintf(f, "%s%lld", i ? "," : " ", (long long)json_integer_value(v));
	if (!json_array_size(json_object_get(g, "eos_token_id")))
		fprintf(f, " none");
	fprintf(f, ", diff_infer_steps %lld, diff_guidance_scale %g, flow_shift %g\n",
	        (long long)json_integer_value(json_object_get(g, "diff_infer_steps")),
	        json_real_value(json_object_get(g, "diff_guidance_scale")), json_real_value(json_object_get(g, "flow_shift")));
	fprintf(f, "  positions: max_position_embeddings %lld (L + max_new)\n",
	        (long long)json_integer_value(json_object_get(m, "max_position_embeddings")));
	fprintf(f, "  resolution buckets (image_base_size %lld): %zu,", (long long)json_integer_value(json_object_get(m,
	        "image_base_size")), json_array_size(json_object_get(m, "buckets")));
	json_array_foreach(json_object_get(m, "buckets"), i, v)
		fprintf(f, "%s %lldx%lld", i && i % 8 == 0 ? "\n   " : "", (long long)json_integer_value(json_array_get(v, 0)),
		        (long long)json_integer_value(json_array_get(v, 1)));
	fputc('\n', f);
	quant_text(f, json_object_get(m, "quantization"));
}
