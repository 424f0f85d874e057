/*
 * files.c -- what the stages do with their files that needs the model
 * they run: the conditions checked against it, the KV file opened on
 * every rank of its layout, the metadata a stage gives its trace. The
 * format modules below check plain values (struct hi3i_model_facts).
 */
#include "format/conditions.h"
#include "model/model.h"
#include "stage/files.h"
#include "stage/vocab.h"

json_t *hi3i_stage_part_json(const hi3_cond *c, const hi3_segment *s)
{
	const char *next = hi3_cond_meta(c, "next_stage"), *tc = hi3_cond_meta(c, "text_conditions_hash");
	json_t *part;
	char hash[17];

	if (((!next || !s) && !tc) || !(part = json_object()))
		return NULL;
	if (next && s) {
		hi3_segment_hash(s, hash);
		json_object_set_new(part, "part", json_string("text"));
		json_object_set_new(part, "next_stage", json_string(next));
		json_object_set_new(part, "conditions_hash", json_string(s->conditions_hash));
		json_object_set_new(part, "segment_hash", json_string(hash));
	} else {
		json_object_set_new(part, "part", json_string("image"));
		json_object_set_new(part, "text_conditions_hash", json_string(tc));
		json_object_set_new(part, "text_segment_hash", json_string(hi3_cond_meta(c, "text_segment_hash")));
		json_object_set_new(part, "text_rows", json_loads(hi3_cond_meta(c, "text_rows"), 0, NULL));
	}
	return part;
}

int hi3_cond_check_model(const hi3_cond *c, const hi3_model *m, hi3_error *err)
{
	return hi3i_cond_check_facts(c, hi3i_model_facts(m), err);
}

int hi3i_kv_open_ranks(hi3_kvfile *kv, const char *path, const hi3_model *m, const hi3_cond *c, hi3_error *err)
{
	const struct hi3i_model_facts *f = hi3i_model_facts(m);
	hi3_comm *comm = hi3i_model_comm(m);
	hi3_error mine = {0};
	hi3i_vocab vs;

	if (!comm)
		return hi3i_kv_open(kv, path, f, c, 1, err);
	hi3i_model_vocab(m, &vs);
	/* rank 0 first (it takes the lock), then the others; each step agreed */
	for (int turn = 0; turn < 2; turn++) {
		if ((turn == 0) == (comm->rank == 0) &&
		    (hi3i_kv_open(kv, path, f, c, comm->rank == 0, &mine) != 0 ||
		     (comm->rank && hi3i_kv_privatize(kv, vs.comm && comm->rank < vs.tp, &mine) != 0)))
			if (kv->st)
				hi3i_kv_close(kv);
		if (hi3_comm_agree(comm, &mine, err) != 0) {
			if (kv->st)
				hi3i_kv_close(kv);
			return -1;
		}
	}
	/* the logits columns this rank computes, and writes */
	kv->v0 = vs.v0;
	kv->nv = vs.nv;
	return 0;
}

int hi3i_trace_stage_meta(hi3_trace *t, const char *stage, const hi3_cond *c, hi3_error *err)
{
	char hash[17], rows[16], L[16];
	const char *pad = hi3_cond_meta(c, "pad_positions");

	hi3i_cond_hash(c, hash);
	snprintf(rows, sizeof(rows), "%d", c->B);
	snprintf(L, sizeof(L), "%d", c->L);
	if (hi3_trace_set_meta(t, "stage", stage, err) || hi3_trace_set_meta(t, "conditions_hash", hash, err) ||
	    hi3_trace_set_meta(t, "rows", rows, err) || hi3_trace_set_meta(t, "L", L, err) ||
	    (pad && hi3_trace_set_meta(t, "pad_positions", pad, err)))
		return -1;
	return 0;
}
