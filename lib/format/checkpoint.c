/*
 * checkpoint.c -- a model's weights as published: one model.safetensors, or
 * shards named by model.safetensors.index.json ("weight_map": tensor name
 * -> shard file), every tensor looked up by name across the shards.
 */
#include <jansson.h>
#include <string.h>
#include <unistd.h>
#include "format/format.h"

struct ck_entry {
	const hi3_tensor *t;
	int file;
};

struct hi3_ckpt {
	char *dir;
	hi3_st **files;
	char **file_names;
	int n_files;
	struct ck_entry *e;   /* sorted by name */
	int n;
};

static int ck_cmp(const void *a, const void *b)
{
	return strcmp(((const struct ck_entry *)a)->t->name, ((const struct ck_entry *)b)->t->name);
}

static int ck_add_file(hi3_ckpt *ck, const char *fname, hi3_error *err)
{
	char *p = hi3i_asprintf("%s/%s", ck->dir, fname);
	hi3_st *st;

	if (!p)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	if (hi3_st_open(&st, p, HI3_ST_READ, err) != 0) {
		free(p);
		return -1;
	}
	free(p);
	ck->files[ck->n_files] = st;
	ck->file_names[ck->n_files] = strdup(fname);
	ck->n_files++;
	return 0;
}

static int ck_open_index(hi3_ckpt *ck, const char *index, hi3_error *err)
{
	json_error_t jerr;
	json_t *root = json_load_file(index, 0, &jerr), *map;
	const char *name;
	json_t *v;
	int rc = -1;
	size_t nshards = 0;

	if (!root)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s:%d: not valid JSON: %s", index, jerr.line, jerr.text);
	map = json_object_get(root, "weight_map");
	if (!json_is_object(map)) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: no \"weight_map\" object", index);
		goto out;
	}
	ck->files = calloc(json_object_size(map) + 1, sizeof(hi3_st *));
	ck->file_names = calloc(json_object_size(map) + 1, sizeof(char *));
	ck->e = calloc(json_object_size(map) + 1, sizeof(struct ck_entry));
	if (!ck->files || !ck->file_names || !ck->e) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		goto out;
	}
	json_object_foreach(map, name, v) {
		int f;

		if (!json_is_string(v) || strchr(json_string_value(v), '/')) {
			hi3_error_set(err, HI3_ERR_INPUT, "%s: weight_map entry '%s' is not a shard file name", index, name);
			goto out;
		}
		for (f = 0; f < ck->n_files; f++)
			if (!strcmp(ck->file_names[f], json_string_value(v)))
				break;
		if (f == ck->n_files) {
			if (ck_add_file(ck, json_string_value(v), err) != 0) {
				hi3_error_prefix(err, "%s: shard '%s' (named for tensor '%s')", index,
				                 json_string_value(v), name);
				err->status = HI3_ERR_INPUT;
				goto out;
			}
			nshards++;
		}
		ck->e[ck->n].t = hi3_st_find(ck->files[f], name);
		ck->e[ck->n].file = f;
		if (!ck->e[ck->n].t) {
			hi3_error_set(err, HI3_ERR_INPUT, "%s: tensor '%s' is mapped to shard '%s', which does not hold it",
			              index, name, json_string_value(v));
			goto out;
		}
		ck->n++;
	}
	rc = 0;
out:
	json_decref(root);
	return rc;
}

int hi3_ckpt_open(hi3_ckpt **out, const char *dir, hi3_error *err)
{
	hi3_ckpt *ck = calloc(1, sizeof(*ck));
	char *index = NULL;
	int rc = -1;

	*out = NULL;
	if (!ck)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	ck->dir = strdup(dir);
	index = hi3i_asprintf("%s/model.safetensors.index.json", dir);
	if (!ck->dir || !index) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		goto out;
	}
	if (access(index, F_OK) == 0) {
		if (ck_open_index(ck, index, err) != 0)
			goto out;
	} else {
		ck->files = calloc(1, sizeof(hi3_st *));
		ck->file_names = calloc(1, sizeof(char *));
		if (!ck->files || !ck->file_names) {
			hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
			goto out;
		}
		if (ck_add_file(ck, "model.safetensors", err) != 0) {
			hi3_error_prefix(err, "%s: no model.safetensors.index.json, and model.safetensors", dir);
			goto out;
		}
		ck->e = calloc((size_t)hi3_st_count(ck->files[0]) + 1, sizeof(struct ck_entry));
		if (!ck->e) {
			hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
			goto out;
		}
		for (int i = 0; i < hi3_st_count(ck->files[0]); i++) {
			ck->e[i].t = hi3_st_at(ck->files[0], i);
			ck->e[i].file = 0;
		}
		ck->n = hi3_st_count(ck->files[0]);
	}
	if (ck->n > 1)
		qsort(ck->e, (size_t)ck->n, sizeof(*ck->e), ck_cmp);
	*out = ck;
	rc = 0;
out:
	free(index);
	if (rc)
		hi3_ckpt_close(ck);
	return rc;
}

void hi3_ckpt_close(hi3_ckpt *ck)
{
	if (!ck)
		return;
	for (int i = 0; i < ck->n_files; i++) {
		hi3_st_close(ck->files[i]);
		free(ck->file_names[i]);
	}
	free(ck->files);
	free(ck->file_names);
	free(ck->e);
	free(ck->dir);
	free(ck);
}

static const struct ck_entry *ck_lookup(const hi3_ckpt *ck, const char *name)
{
	int lo = 0, hi = ck->n - 1;

	while (lo <= hi) {
		int mid = (lo + hi) / 2, c = strcmp(name, ck->e[mid].t->name);

		if (!c)
			return &ck->e[mid];
		if (c < 0)
			hi = mid - 1;
		else
			lo = mid + 1;
	}
	return NULL;
}

const hi3_tensor *hi3_ckpt_find(const hi3_ckpt *ck, const char *name)
{
	const struct ck_entry *e = ck_lookup(ck, name);

	return e ? e->t : NULL;
}

int hi3_ckpt_count(const hi3_ckpt *ck) { return ck->n; }

const hi3_tensor *hi3_ckpt_at(const hi3_ckpt *ck, int i)
{
	return i >= 0 && i < ck->n ? ck->e[i].t : NULL;
}

size_t hi3_ckpt_file_bytes(const hi3_ckpt *ck, int *n_files)
{
	size_t total = 0;

	for (int i = 0; i < ck->n_files; i++)
		total += hi3_st_file_size(ck->files[i]);
	if (n_files)
		*n_files = ck->n_files;
	return total;
}

const char *hi3_ckpt_file_of(const hi3_ckpt *ck, const char *name)
{
	const struct ck_entry *e = ck_lookup(ck, name);

	return e ? hi3_st_path(ck->files[e->file]) : NULL;
}
