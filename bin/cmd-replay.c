/* cmd-replay.c -- hi3 replay: teacher-forced log-probs and the ratio report. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "cli.h"
#include "commands.h"

static const struct cli_help help = {
	.usage = {"hi3 replay -m MODEL [options] COND SEG -o REPLAY"},
	.description =
	"Recompute, teacher-forced, the log-prob of every response token of the segment\n"
	"SEG (made by 'hi3 decode' from COND): for each row one causal forward over its\n"
	"true prompt (its first n_i tokens, no padding) and its response; token j is\n"
	"scored by the logits at index n_i - 1 + j at temperature 1. Writes REPLAY\n"
	"(format hi3.replay: logprobs aligned with the segment) and prints a JSON report\n"
	"on standard output: per row and overall the token count, mean and max\n"
	"|replay - rollout| log-prob, the ratio exp(replay - rollout) mean/min/max and\n"
	"the worst token. Rows with empty responses are reported as such.\n",
	.operands = "COND and SEG", .min_operands = 2, .max_operands = 2,
};

static const struct cli_choice routings[] = {{"free", 0, NULL}, {"recorded", 1, NULL}, {NULL, 0, NULL}};
static const struct cli_choice weights[] = {{"router", 0, NULL}, {"recorded", 1, NULL}, {NULL, 0, NULL}};

static json_t *num(double v)
{
	return isfinite(v) ? json_real(v) : json_null();
}

static json_t *row_json(const hi3_replay_row *r, int i, int routed, int have_routes)
{
	json_t *o = json_object();

	if (i >= 0)
		json_object_set_new(o, "row", json_integer(i));
	json_object_set_new(o, "tokens", json_integer(r->tokens));
	if (r->tokens == 0) {
		json_object_set_new(o, "empty", json_true());
		return o;
	}
	json_object_set_new(o, "mean_abs_dlogp", num(r->mean_abs));
	json_object_set_new(o, "max_abs_dlogp", num(r->max_abs));
	json_object_set_new(o, "ratio", json_pack("{s:o, s:o, s:o}", "mean", num(r->ratio_mean), "min",
	                                          num(r->ratio_min), "max", num(r->ratio_max)));
	json_object_set_new(o, "worst_token", json_integer(r->worst));
	if (routed) {
		json_object_set_new(o, "max_abs_dlogp_free_routing", num(r->max_abs_free));
		json_object_set_new(o, "mean_abs_dlogp_free_routing", num(r->mean_abs_free));
	}
	if (have_routes) {
		json_object_set_new(o, "routing_flips", json_integer(r->routing_flips));
		json_object_set_new(o, "routing_tokens", json_integer(r->routing_tokens));
	}
	return o;
}

static int write_replay(const char *path, const hi3_model *m, const hi3_cond *c, const hi3_segment *s,
                        const float *lp, const char *seg_path, const hi3_replay_opts *o, hi3_error *err)
{
	hi3_replay_file r = {
		.T = s->T, .logprobs = lp, .n_moe = hi3_model_n_moe_layers(m), .k = hi3_model_max_topk(m),
		.route_ids = o->rec_ids, .route_w = o->rec_w, .B = c->B, .prompt_route_ids = o->rec_prompt_ids,
		.prompt_route_w = o->rec_prompt_w, .model_fingerprint = hi3_model_fingerprint(m),
		.conditions_hash = s->conditions_hash ? s->conditions_hash : "", .segment_file = seg_path,
		.mode = o->batched ? "batched" : "per-row",
		.routing = o->routing_recorded ? (o->weights_recorded ? "recorded+weights" : "recorded") : "free",
	};
	int64_t *pcu = NULL;
	int rc;

	if (o->rec_ids) {
		if (!(pcu = calloc((size_t)c->B + 1, sizeof(int64_t))))
			return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		for (int i = 0; i < c->B; i++)
			pcu[i + 1] = pcu[i] + c->real_pos[i];
		r.prompt_cu_seqlens = pcu;
	}
	rc = hi3_replay_file_write(&r, path, err);
	free(pcu);
	return rc;
}

int cmd_replay(int argc, char **argv)
{
	hi3_replay_opts o = {.progress = cli_progress_fn, .progress_ctx = "replay rows"};
	hi3_replay_report rep = {0};
	const char *out = NULL;
	double threshold = -1;
	hi3_model *m = NULL;
	hi3_cond *c = NULL;
	hi3_segment *s = NULL;
	hi3_error err = {0};
	float *lp = NULL;
	int rc, weights_given = 0, record = 0;
	int16_t *ri = NULL, *pri = NULL;
	float *rw = NULL, *prw = NULL;
	int64_t P = 0;
	struct cli_option options[] = {
		OPT_GLOBALS(),
		OPT_FLAG(0, "batched", &o.batched, "right-pad the rows into batches (same log-probs)"),
		OPT_CHUNK_TOKENS(&o.max_tokens, "token budget of a batched forward (default 8192)"),
		OPT_CHOICE(0, "routing", &o.routing_recorded, routings, "recorded: force the experts the segment "
		           "recorded (decode --record-routing); the report then shows the gap with and without routing "
		           "replay (default free)"),
		OPT_CHOICE(0, "routing-weights", &o.weights_recorded, weights, "with --routing=recorded: recompute the "
		           "expert weights from the router (default) or use the recorded ones",
		           .given = &weights_given),
		OPT_DOUBLE(0, "threshold", &threshold, 0.0, 1e30, "X", "exit 1 when the max |gap| exceeds X"),
		OPT_RECORD_ROUTING(&record, "MoE: store the replay's experts and weights of every response and prompt "
		                   "token in REPLAY"),
		OPT_OUTPUT(&out, "REPLAY", "the replay file to write (atomically)"),
		OPT_END(),
	};

	if ((argc = cli_parse_options(argc, argv, options, &help, 0)) < 0)
		return CLI_PARSE_STATUS(argc);
	if (weights_given && !o.routing_recorded)
		return cli_usage_error("--routing-weights needs --routing=recorded");
	if (hi3_cond_open(&c, argv[0], &err) != 0 || hi3_segment_open(&s, argv[1], &err) != 0 ||
	    cli_open_model(&m, &err) != 0) {
		rc = cli_fail(&err);
		goto out;
	}
	lp = calloc((size_t)s->T + 1, sizeof(float));
	if (!lp) {
		hi3_error_set(&err, HI3_ERR_RUNTIME, "out of memory");
		rc = cli_fail(&err);
		goto out;
	}
	if (record && hi3_model_n_moe_layers(m) > 0) {
		size_t nmk = (size_t)hi3_model_n_moe_layers(m) * (size_t)hi3_model_max_topk(m);
		for (int i = 0; i < c->B; i++)
			P += c->real_pos[i];
		ri = calloc(((size_t)s->T + 1) * nmk, sizeof(int16_t));
		rw = calloc(((size_t)s->T + 1) * nmk, sizeof(float));
		pri = calloc(((size_t)P + 1) * nmk, sizeof(int16_t));
		prw = calloc(((size_t)P + 1) * nmk, sizeof(float));
		if (!ri || !rw || !pri || !prw) {
			hi3_error_set(&err, HI3_ERR_RUNTIME, "out of memory");
			rc = cli_fail(&err);
			goto out;
		}
		o.rec_ids = ri;
		o.rec_w = rw;
		o.rec_prompt_ids = pri;
		o.rec_prompt_w = prw;
	} else if (record) {
		cli_warn("--record-routing: the model has no MoE layers; nothing to record");
	}
	rc = hi3_replay(m, c, s, &o, lp, &rep, &err);
	cli_progress_end();
	if (rc == 0)
		rc = write_replay(out, m, c, s, lp, argv[1], &o, &err);
	if (rc != 0) {
		rc = cli_fail(&err);
		goto out;
	}
	{
		json_t *root = json_object(), *rows = json_array();
		hi3_replay_row all = {
			.tokens = rep.tokens, .mean_abs = rep.mean_abs, .max_abs = rep.max_abs,
			.ratio_mean = rep.ratio_mean, .ratio_min = rep.ratio_min, .ratio_max = rep.ratio_max,
			.worst = rep.worst, .mean_abs_free = rep.mean_abs_free, .max_abs_free = rep.max_abs_free,
			.routing_flips = rep.routing_flips, .routing_tokens = rep.routing_tokens,
		};
		int have_routes = s->route_ids != NULL && hi3_model_n_moe_layers(m) > 0;
		json_t *ov;

		for (int i = 0; i < rep.B; i++)
			json_array_append_new(rows, row_json(&rep.rows[i], i, o.routing_recorded, have_routes));
		ov = row_json(&all, -1, o.routing_recorded, have_routes);
		if (rep.tokens) {
			int64_t worst_row = 0;
			while (worst_row + 1 < s->B && s->cu_seqlens[worst_row + 1] <= rep.worst)
				worst_row++;
			json_object_set_new(ov, "worst_row", json_integer(worst_row));
			json_object_set_new(ov, "worst_token", json_integer(rep.worst - s->cu_seqlens[worst_row]));
		}
		json_object_set_new(ov, "empty_rows", json_integer(rep.empty_rows));
		json_object_set_new(root, "mode", json_string(o.batched ? "batched" : "per-row"));
		json_object_set_new(root, "routing", json_string(o.routing_recorded ? "recorded" : "free"));
		json_object_set_new(root, "rows", rows);
		json_object_set_new(root, "overall", ov);
		json_object_set_new(root, "seconds", json_real(rep.seconds));
		json_object_set_new(root, "tokens_per_s",
		                    json_real(rep.seconds > 0 ? (double)rep.tokens / rep.seconds : 0.0));
		json_dumpf(root, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
		fputc('\n', stdout);
		json_decref(root);
	}
	if (threshold >= 0 && !(rep.max_abs <= threshold)) {
		cli_warn("max |replay - rollout| log-prob %.3g exceeds --threshold %.3g", rep.max_abs, threshold);
		rc = HI3_ERR_RUNTIME;
	}
out:
	free(lp);
	free(ri);
	free(rw);
	free(pri);
	free(prw);
	hi3_replay_report_release(&rep);
	hi3_model_close(m);
	hi3_segment_close(s);
	hi3_cond_close(c);
	return rc;
}
