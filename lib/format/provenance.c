/*
 * provenance.c -- which model and which conditions a stage file was made
 * from: the model fingerprint and the conditions hash every stage file
 * carries in its metadata, and the checks that refuse a foreign file.
 */
#include <string.h>
#include "format/provenance.h"

void hi3i_cond_hash(const hi3_cond *c, char out[17])
{
	uint64_t h = HI3_HASH_INIT;
	int32_t dims[3] = {c->B, c->L, c->S};

	h = hi3i_hash(h, dims, sizeof(dims));
	h = hi3i_hash(h, c->input_ids, sizeof(int64_t) * (size_t)c->B * (size_t)c->L);
	h = hi3i_hash(h, c->position_ids, sizeof(int64_t) * (size_t)c->B * (size_t)c->L);
	h = hi3i_hash(h, c->real_pos, sizeof(int64_t) * (size_t)c->B);
	h = hi3i_hash(h, c->rope_pos, sizeof(int32_t) * 2 * (size_t)c->B * (size_t)c->L);
	h = hi3i_hash(h, c->image_blocks, sizeof(int32_t) * 2 * (size_t)c->B * (size_t)c->S);
	snprintf(out, 17, "%016llx", (unsigned long long)h);
}

int hi3i_check_made_by(const char *path, const char *fp, const struct hi3i_model_facts *m, hi3_error *err)
{
	if (!fp || strcmp(fp, m->fingerprint))
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: made by model fingerprint %s, but the model %s has %s", path,
		                     fp ? fp : "(none)", m->dir, m->fingerprint);
	return 0;
}

int hi3i_check_made_from(const char *path, const char *hash, const hi3_cond *c, hi3_error *err)
{
	char want[17];

	hi3i_cond_hash(c, want);
	if (!hash || strcmp(hash, want))
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: made from other conditions (conditions_hash %s; %s hashes "
		                     "to %s)", path, hash ? hash : "(none)", c->st ? hi3_st_path(c->st) : "the conditions",
		                     want);
	return 0;
}
