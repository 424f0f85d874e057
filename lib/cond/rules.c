/*
 * rules.c -- how a row of the sequence template ends (hi3-batching(7)):
 * its stop tokens by bot_task, the base code's (hunyuan.py) or the
 * Instruct code's (modeling_hunyuan_image_3.py), and the decoding rules of
 * the Instruct code's text stage (generate_image): tokens forced after a
 * trigger, a ratio token chosen greedily among the buckets'.
 */
#include <string.h>
#include "cond/template.h"

/* A rule record (trigger, k, ids...) onto a row's list. */
static int add_rule(int64_t **v, int *n, int64_t trigger, const int64_t *ids, int k, hi3_error *err)
{
	if (hi3i_list_add(v, n, trigger, err) || hi3i_list_add(v, n, k, err))
		return -1;
	for (int j = 0; j < k; j++)
		if (hi3i_list_add(v, n, ids[j], err))
			return -1;
	return 0;
}

/* The <img_ratio_*> ids of every bucket. */
static int ratio_ids(const hi3_template *t, const hi3_requests *rq, int i, int64_t *ids, hi3_error *err)
{
	for (int k = 0; k < t->n_reso; k++) {
		char name[32];
		snprintf(name, sizeof(name), "<img_ratio_%d>", k);
		if (hi3i_template_special(t, rq, i, name, &ids[k], err))
			return -1;
	}
	return 0;
}

/* Stop tokens by bot_task, the base code's (hunyuan.py prepare_model_inputs):
 * auto: end of sequence and, with image_size "auto", every <img_ratio_*>
 * (else <boi>); image: end of sequence; think and recaption: </recaption>,
 * </answer>, end of sequence; img_ratio: the ratio tokens (or <boi>). */
static int stops_base(const hi3_template *t, const hi3_requests *rq, int i, int task, hi3_cond_row *row,
                      hi3_error *err)
{
	const struct hi3i_request *r = &rq->r[i];
	int64_t id, ratios[MAX_RESO];

	switch (task) {
	case HI3I_BOT_THINK:
	case HI3I_BOT_RECAPTION:
		if (hi3i_template_special(t, rq, i, "</recaption>", &id, err) || hi3i_list_add(&row->stop_tokens, &row->n_stop, id, err) ||
		    hi3i_template_special(t, rq, i, "</answer>", &id, err) || hi3i_list_add(&row->stop_tokens, &row->n_stop, id, err))
			return -1;
		/* fall through */
	case HI3I_BOT_IMAGE:
		return hi3i_list_add(&row->stop_tokens, &row->n_stop, t->eos_id, err);
	case HI3I_BOT_AUTO:
		if (hi3i_list_add(&row->stop_tokens, &row->n_stop, t->eos_id, err))
			return -1;
		break;
	default:
		break;
	}
	if (r->size_kind != 0)
		return hi3i_template_special(t, rq, i, "<boi>", &id, err) || hi3i_list_add(&row->stop_tokens, &row->n_stop, id, err);
	if (ratio_ids(t, rq, i, ratios, err))
		return -1;
	for (int k = 0; k < t->n_reso; k++)
		if (hi3i_list_add(&row->stop_tokens, &row->n_stop, ratios[k], err))
			return -1;
	return 0;
}

/* The Instruct code (modeling_hunyuan_image_3.py). auto and image end at
 * the end of sequence (image has no stop tokens upstream: a KeyError), and
 * so does a gen_image row (it is not decoded). img_ratio ends at a ratio
 * token, chosen greedily among the 37 after <img_size_B> (generate_image
 * predicts the ratio whatever image_size says). think, recaption and
 * think_recaption follow generate_image's text stage: think_recaption
 * forces <recaption> after </think>; with image_size "auto" (or absent) the
 * end of the CoT (</think>, or </recaption> with recaption) forces
 * [<answer>] <boi> <img_size_B>, the ratio token after it is the greedy
 * choice, and it ends the row; with a given size the row ends at
 * </recaption> (recaption, think_recaption) or at </think> or </recaption>
 * (think). A row that continues a given cot is prepare_model_inputs' (the
 * CoT stage never has one): it ends at </think> or </recaption> (think,
 * think_recaption) or </recaption> (recaption), without rules. The text
 * stage of a gen_image request with image_size "auto" comes here as a
 * gen_text row of its row task (hi3i_template_row_task). */
static int stops_instruct(const hi3_template *t, const hi3_requests *rq, int i, int task, hi3_cond_row *row,
                          hi3_error *err)
{
	const struct hi3i_request *r = &rq->r[i];
	int64_t ratios[MAX_RESO], end_think, end_rec, rec, boi, size, ans, seq[3];
	int need_ratio = r->size_kind == 0 || task == HI3I_BOT_IMG_RATIO, n = 0;
	char size_name[32];

	snprintf(size_name, sizeof(size_name), "<img_size_%d>", t->base_size);
	if (task == HI3I_BOT_AUTO || task == HI3I_BOT_IMAGE || hi3i_request_row_mode(r) == HI3I_GEN_IMAGE)
		return hi3i_list_add(&row->stop_tokens, &row->n_stop, t->eos_id, err);
	if (hi3i_template_special(t, rq, i, "</think>", &end_think, err) || hi3i_template_special(t, rq, i, "</recaption>", &end_rec, err) ||
	    hi3i_template_special(t, rq, i, "<recaption>", &rec, err) || hi3i_template_special(t, rq, i, "<boi>", &boi, err) ||
	    hi3i_template_special(t, rq, i, size_name, &size, err) || ratio_ids(t, rq, i, ratios, err))
		return -1;
	if (r->cot && task != HI3I_BOT_IMG_RATIO) {
		if (task != HI3I_BOT_RECAPTION && hi3i_list_add(&row->stop_tokens, &row->n_stop, end_think, err))
			return -1;
		return hi3i_list_add(&row->stop_tokens, &row->n_stop, end_rec, err);
	}
	if (task == HI3I_BOT_THINK_RECAPTION && add_rule(&row->forced_after, &row->n_forced, end_think, &rec, 1, err))
		return -1;
	if (need_ratio) {
		if (task != HI3I_BOT_IMG_RATIO) {
			if (!strcmp(t->name, "instruct")) {
				if (hi3i_template_special(t, rq, i, "<answer>", &ans, err))
					return -1;
				seq[n++] = ans;
			}
			seq[n++] = boi;
			seq[n++] = size;
			if (add_rule(&row->forced_after, &row->n_forced, task == HI3I_BOT_THINK ? end_think : end_rec, seq, n,
			             err))
				return -1;
		}
		if (add_rule(&row->greedy_among, &row->n_greedy, size, ratios, t->n_reso, err))
			return -1;
		for (int k = 0; k < t->n_reso; k++)
			if (hi3i_list_add(&row->stop_tokens, &row->n_stop, ratios[k], err))
				return -1;
		return 0;
	}
	if (task == HI3I_BOT_THINK && hi3i_list_add(&row->stop_tokens, &row->n_stop, end_think, err))
		return -1;
	return hi3i_list_add(&row->stop_tokens, &row->n_stop, end_rec, err);
}

int hi3i_template_stops(const hi3_template *t, const hi3_requests *rq, int i, hi3_cond_row *row, hi3_error *err)
{
	const struct hi3i_request *r = &rq->r[i];
	int task = hi3i_template_row_task(t, r);

	if (!t->tok) {
		/* pre-tokenized, no tokenizer: the end of sequence when known */
		for (int k = 0; !r->has_stops && k < t->gen.n_eos; k++)
			if (hi3i_list_add(&row->stop_tokens, &row->n_stop, t->gen.eos_token_id[k], err))
				return -1;
		if (!r->has_stops && !t->gen.n_eos && t->eos_id >= 0 &&
		    hi3i_list_add(&row->stop_tokens, &row->n_stop, t->eos_id, err))
			return -1;
	} else if (t->eos_id >= 0) {
		if ((t->instruct_code ? stops_instruct : stops_base)(t, rq, i, task, row, err) != 0)
			return -1;
	} else if (!r->has_stops) {
		return hi3_error_set(err, HI3_ERR_INPUT, "%s:%d: no end-of-sequence token: the model names no "
		                     "eos_token (tokenizer_config.json) or eos_token_id (config.json)", rq->name, r->line);
	}
	if (r->has_stops) {
		/* the request's own stop tokens replace the task's (its rules stay);
		 * none at all: the row ends at its length */
		row->n_stop = 0;
		for (int k = 0; k < r->n_stops; k++)
			if (hi3i_list_add(&row->stop_tokens, &row->n_stop, r->stops[k], err))
				return -1;
	}
	return 0;
}
