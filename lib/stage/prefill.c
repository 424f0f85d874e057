/*
 * prefill.c -- the prompt batch into a new KV file: the batching contract
 * of hi3-batching(7), with one code path for every B.
 *
 * The B x L prompt batch runs in one (or a few, by rows) forward calls in
 * self-attention mode: query column t attends key columns j <= t and its
 * image block; K/V go to cache slot position_ids[i, t] (rules 1, 2); each
 * row's first logits come from column n_i - 1 (rule 5). The file is built
 * under a temporary name and renamed into place when complete. Rows with
 * cond images take their encoders' outputs at the image columns (VAE
 * tokens, <timestep>, ViT tokens: stage/images.c), computed here, on the
 * prefill pass only.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "format/conditions.h"
#include "stage/files.h"
#include "stage/images.h"
#include "format/trace.h"
#include "model/model.h"

int hi3_prefill(hi3_model *m, const hi3_cond *c, const char *cond_path, const hi3_prefill_opts *o,
                const char *kv_path, hi3_error *err)
{
	const int L = c->L, V = hi3_model_config(m)->vocab_size;
	int rows_per = 0, rc = -1, created = 0;
	int64_t C;
	hi3_kvfile kv = {0};
	char *tmp = NULL;
	int32_t *hi = NULL, *at = NULL, *crow = NULL;
	int *rows = NULL;
	int64_t *tpos = NULL;     /* (rows_per, L) traced positions: the column, -1 on pads */
	float *logits = NULL;
	struct hi3i_image_enc *enc = NULL;
	struct hi3i_image_embeds emb = {0};
	hi3_comm *comm = hi3i_model_comm(m);
	const int lead = hi3i_model_writes_files(m);  /* rank 0 writes all but the others' kv heads and logits columns */
	int64_t pid;
	hi3_error lost = {0};

	if (o->max_new < 0 || (o->kv_dtype != HI3_F32 && o->kv_dtype != HI3_BF16))
		return hi3_error_set(err, HI3_ERR_USAGE, "prefill: max_new must be >= 0 and the cache F32 or BF16");
	if (hi3_cond_check_model(c, m, err) != 0 || hi3i_cond_require_text(c, "prefilled", err) != 0)
		return -1;
	if (hi3i_add_size(L, o->max_new, INT32_MAX / 2, &C) != 0)
		return hi3_error_set(err, HI3_ERR_USAGE, "prefill: L + max_new = %lld slots is too large (at most %d)",
		                     (long long)L + o->max_new, INT32_MAX / 2);
	if (C > hi3_model_config(m)->max_position_embeddings)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: L %d + max_new %d = %lld positions, more than the model's "
		                     "max_position_embeddings %d (%s/config.json)", cond_path ? cond_path : "conditions", L,
		                     o->max_new, (long long)C, hi3_model_config(m)->max_position_embeddings,
		                     hi3_model_dir(m));
	rows_per = (o->max_tokens > 0 ? o->max_tokens : 8192) / L;
	if (rows_per < 1)
		rows_per = 1;
	if (rows_per > c->B)
		rows_per = c->B;
	if (hi3i_par_check_cond(m, c, err) != 0)
		return -1;
	/* the cond images' encoders, on every rank (each needs the rows): a
	 * model without them fails alike on all of them, before any collective */
	if (hi3i_image_enc_open(&enc, m, c, cond_path, err))
		return -1;
	/* one file for every rank: the temporary name is rank 0's */
	pid = (int64_t)getpid();
	if (comm && hi3_comm_bcast(comm, &pid, sizeof(pid), 0, err) != 0) {
		hi3i_image_enc_close(enc);
		return -1;
	}
	tmp = hi3i_asprintf("%s.prefill-%lld", kv_path, (long long)pid);
	hi = hi3i_malloc(sizeof(int32_t) * (size_t)rows_per * L, err);
	at = hi3i_malloc(sizeof(int32_t) * 2 * (size_t)rows_per, err);
	crow = hi3i_malloc(sizeof(int32_t) * (size_t)rows_per, err);
	logits = hi3i_malloc(sizeof(float) * (size_t)rows_per * V, err);
	rows = hi3i_malloc(sizeof(int) * (size_t)rows_per, err);
	if (o->trace)
		tpos = hi3i_malloc(sizeof(int64_t) * (size_t)rows_per * L, err);
	if (!tmp || !hi || !at || !crow || !logits || !rows || (o->trace && !tpos)) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		goto out;
	}
	if (o->trace) {
		char dt[8];
		snprintf(dt, sizeof(dt), "%s", hi3_dtype_name(o->kv_dtype));
		if (hi3i_trace_stage_meta(o->trace, "prefill", c, err) || hi3_trace_set_meta(o->trace, "kv_dtype", dt, err))
			goto out;
	}
	if (lead) {
		if (hi3i_kv_create(tmp, hi3i_model_facts(m), c, cond_path, o->max_new, o->kv_dtype, o->record_routing, err) != 0) {
			if (!comm)
				goto out;
			lost = *err;
		} else {
			created = 1;
		}
	}
	/* the other ranks open the file once rank 0 has made it (or fail with it) */
	if (comm && hi3_comm_agree(comm, &lost, err) != 0)
		goto out;
	if (hi3i_kv_open_ranks(&kv, tmp, m, c, err) != 0)
		goto out;
	for (int r0 = 0; r0 < c->B; r0 += rows_per) {
		int nb = HI3_MIN(rows_per, c->B - r0);
		hi3_batch b = {
			.B = nb, .T = L, .mode = HI3_ATTN_SELF,
			.ids = c->input_ids + (size_t)r0 * L,
			.rope = c->rope_pos + (size_t)r0 * L * 2,
			.hi = hi,
			.blocks = c->image_blocks + (size_t)r0 * c->S * 2, .S = c->S,
			.slot = c->position_ids + (size_t)r0 * L,
			.cache_row = crow,
			.n_logits = nb, .logit_at = at, .logits = logits, .vocab_slice = 1,
			.trace = o->trace, .trace_row = crow, .trace_pos = tpos,
		};
		if (kv.prompt_route_ids) {
			/* rows r0 .. r0 + nb of (B, L, n_moe, k) are this chunk's */
			size_t per = (size_t)L * kv.n_moe * kv.k_route;
			b.route_ids = kv.prompt_route_ids + (size_t)r0 * per;
			b.route_w = kv.prompt_route_w + (size_t)r0 * per;
		}
		for (int r = 0; r < nb; r++) {
			for (int t = 0; t < L; t++)
				hi[(size_t)r * L + t] = t;
			crow[r] = r0 + r;
			at[2 * r] = r;
			at[2 * r + 1] = (int32_t)c->real_pos[r0 + r] - 1;
			rows[r] = r0 + r;
			for (int t = 0; tpos && t < L; t++)
				tpos[(size_t)r * L + t] = t < c->real_pos[r0 + r] ? t : -1;
		}
		if (hi3i_image_embeds(enc, c, rows, nb, &emb, err))
			goto out;
		b.n_host_embed = emb.n;
		b.host_embed_at = emb.at;
		b.host_embed_rows = emb.rows;
		if (hi3_forward(m, &kv.cache, &b, err) != 0)
			goto out;
		hi3i_image_embeds_release(&emb);
		/* each tensor slot its vocabulary columns (all of them in one process) */
		for (int r = 0; r < nb; r++)
			memcpy(kv.next_logits + (size_t)(r0 + r) * V + kv.v0, logits + (size_t)r * V + kv.v0,
			       sizeof(float) * (size_t)kv.nv);
		if (o->progress)
			o->progress(o->progress_ctx, r0 + nb, c->B);
	}
	if (hi3_kv_sync_host(m, &kv.cache, err) != 0 || hi3i_kv_flush(&kv, err) != 0)
		goto out;
	hi3_model_drop_cache(m, &kv.cache);
	hi3i_kv_close(&kv);
	/* renamed into place once every rank's heads are durable */
	if (comm && hi3_comm_barrier(comm, err) != 0)
		goto out;
	if (lead && rename(tmp, kv_path) != 0) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "%s: cannot rename the finished cache into place", kv_path);
		goto out;
	}
	created = 0;
	if (comm && hi3_comm_barrier(comm, err) != 0)
		goto out;
	rc = 0;
out:
	if (kv.st) {
		hi3_model_drop_cache(m, &kv.cache);
		hi3i_kv_close(&kv);
	}
	if (created)
		unlink(tmp);
	free(tmp);
	free(hi);
	free(at);
	free(crow);
	free(rows);
	free(tpos);
	free(logits);
	hi3i_image_embeds_release(&emb);
	hi3i_image_enc_close(enc);
	return rc;
}
