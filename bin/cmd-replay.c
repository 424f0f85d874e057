/* cmd-replay.c -- hi3 replay: teacher-forced log-probs and the ratio report. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "commands.h"

static const struct cli_help help = {
	.usage = {"hi3 replay -m MODEL [options] COND SEG -o REPLAY",
	          "hi3 replay -m MODEL [--threshold X] [--as-captured] COND TRAJ -o REPLAY"},
	.description =
	"Recompute, teacher-forced, the log-prob of every response token of the segment\n"
	"SEG (made by 'hi3 decode' from COND): for each row one causal forward over its\n"
	"true prompt (its first n_i tokens, no padding) and its response; token j is\n"
	"scored by the logits at index n_i - 1 + j at temperature 1. Writes REPLAY\n"
	"(format hi3.replay: logprobs aligned with the segment, and each token's gap\n"
	"dlogp with its row and position) and prints a JSON report on standard output:\n"
	"per row and overall the token count, mean and max |replay - rollout| log-prob,\n"
	"the ratio exp(replay - rollout) mean/min/max, the worst token, and under\n"
	"\"mismatch\" the metrics RL trainers log, named as verl names them (k3 KL,\n"
	"chi2, importance weights at the token and sequence level, effective sample\n"
	"size, log-ppl difference; hi3-replay(1) defines each). Rows with empty\n"
	"responses are reported as such.\n"
	"\n"
	"With a trajectory TRAJ (made by 'hi3 diffusion-capture' from gen_image\n"
	"conditions COND), recompute for every SDE step i, as a trainer does, the\n"
	"velocity at the recorded x_i by a stateless forward over the whole sequence,\n"
	"the transition mean and the log-prob of the recorded x_{i+1}; REPLAY holds\n"
	"sde_logp (B, K), and the report gives per row and overall the mean and max\n"
	"|replay - rollout| log-prob. The step uses the trajectory's SDE kernel, eta\n"
	"and reduction. A trajectory captured with an upstream defect restored\n"
	"(diffusion-capture --ablate) is replayed with the same defect, and the report\n"
	"says so: a defect that acts through the KV cache (pos-pad, rope-pad, eoi)\n"
	"then shows its own rollout/replay gap; --as-captured follows the capture's\n"
	"path instead (its step 0 over the whole sequence into the cache, then KV\n"
	"reuse) and reproduces the captured log-probs.\n",
	.operands = "COND and SEG", .min_operands = 2, .max_operands = 2,
};

static const struct cli_choice routings[] = {{"free", 0, NULL}, {"recorded", 1, NULL}, {NULL, 0, NULL}};
static const struct cli_choice weights[] = {{"router", 0, NULL}, {"recorded", 1, NULL}, {NULL, 0, NULL}};

/* The format of a stage file, "" when it has none (NULL when unreadable). */
static char *format_of(const char *path, hi3_error *err)
{
	hi3_st *st = NULL;
	char *f;

	if (hi3_st_open(&st, path, HI3_ST_READ, err))
		return NULL;
	f = strdup(hi3_st_meta(st, "format") ? hi3_st_meta(st, "format") : "");
	hi3_st_close(st);
	return f;
}

static int replay_trajectory(const char *cond, const char *traj, const char *out, double threshold, int text_opts,
                             int as_captured)
{
	hi3_diffusion_replay_opts o = {.as_captured = as_captured, .progress = cli_progress_fn,
	                               .progress_ctx = "replay SDE steps"};
	hi3_diffusion_replay_report rep = {0};
	hi3_trajectory *t = NULL;
	hi3_model *m = NULL;
	hi3_cond *c = NULL;
	hi3_error err = {0};
	char *report = NULL;
	size_t len = 0;
	int rc;

	if (text_opts)
		return cli_usage_error("a trajectory replay takes only --threshold, --as-captured and -o (the other "
		                       "options are for segments)");
	if (hi3_cond_open(&c, cond, &err) || hi3_trajectory_open(&t, traj, &err) || cli_open_model(&m, &err) ||
	    hi3_diffusion_replay_to_file(m, c, t, traj, &o, out, &rep, &err) ||
	    hi3_diffusion_replay_report_json(&rep, c, &report, &len, &err)) {
		cli_progress_end();
		rc = cli_fail(&err);
		goto out;
	}
	cli_progress_end();
	if (rep.ablate)
		cli_warn("%s was captured with the %s defect restored (diffusion-capture --ablate %s): replayed with it "
		         "too, %s", traj, hi3_ablation_name(rep.ablate), hi3_ablation_name(rep.ablate), as_captured ?
		         "along the capture's path" : rep.ablate == HI3_ABLATE_ROPE_1D ? "statelessly (this defect acts "
		         "alike with and without the KV cache)" : "statelessly: a gap is the defect's own rollout/replay "
		         "mismatch (--as-captured follows the capture's path)");
	rc = fwrite(report, 1, len, stdout) == len ? 0 : HI3_ERR_RUNTIME;
	if (threshold >= 0 && !(rep.max_abs <= threshold)) {
		cli_warn("max |replay - rollout| SDE log-prob %.3g exceeds --threshold %.3g", rep.max_abs, threshold);
		rc = HI3_ERR_RUNTIME;
	}
out:
	free(report);
	hi3_diffusion_replay_report_release(&rep);
	cli_close_model(m);
	hi3_trajectory_close(t);
	hi3_cond_close(c);
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
	struct cli_trace trace = {0};
	char *report = NULL;
	size_t len = 0;
	int rc, weights_given = 0, record = 0, text_opts = 0, as_captured = 0;
	char *format;
	struct cli_option options[] = {
		OPT_GLOBALS(),
		OPT_FLAG(0, "batched", &o.batched, "right-pad the rows into batches (same log-probs)",
		         .given = &text_opts),
		OPT_CHUNK_TOKENS(&o.max_tokens, "token budget of a batched forward (default 8192)", .given = &text_opts),
		OPT_CHOICE(0, "routing", &o.routing_recorded, routings, "recorded: force the experts the segment "
		           "recorded (decode --record-routing); the report then shows the gap with and without routing "
		           "replay (default free)", .given = &text_opts),
		OPT_CHOICE(0, "routing-weights", &o.weights_recorded, weights, "with --routing=recorded: recompute the "
		           "expert weights from the router (default) or use the recorded ones",
		           .given = &weights_given),
		OPT_DOUBLE(0, "threshold", &threshold, 0.0, 1e30, "X", "exit 1 when the max |gap| exceeds X"),
		OPT_FLAG(0, "as-captured", &as_captured, "a trajectory: follow the capture's path (step 0 over the whole "
		         "sequence, then KV reuse) instead of a stateless forward per SDE step"),
		OPT_DOUBLE(0, "is-cap", &o.is_cap, 1.0, 1e30, "C", "the importance-ratio cap of the mismatch metrics: "
		           "the shares of ratios above C and below 1/C, and the clamp of std and ESS (default 2, as TIS "
		           "uses)", .flags = CLI_OPT_LO_OPEN),
		OPT_RECORD_ROUTING(&record, "MoE: store the replay's experts and weights of every response and prompt "
		                   "token in REPLAY", .given = &text_opts),
		OPT_OUTPUT(&out, "REPLAY", "the replay file to write (atomically)"),
		OPT_TRACE(&trace),
		OPT_END(),
	};

	if ((argc = cli_parse_options(argc, argv, options, &help, 0)) < 0)
		return CLI_PARSE_STATUS(argc);
	if (weights_given && !o.routing_recorded)
		return cli_usage_error("--routing-weights needs --routing=recorded");
	if (!(format = format_of(argv[1], &err)))
		return cli_fail(&err);
	if (!strcmp(format, HI3_FORMAT_TRAJECTORY)) {
		free(format);
		return replay_trajectory(argv[0], argv[1], out, threshold, text_opts + weights_given, as_captured);
	}
	free(format);
	if (as_captured)
		return cli_usage_error("--as-captured is for a trajectory (SEG is a segment)");
	if (hi3_cond_open(&c, argv[0], &err) != 0 || hi3_segment_open(&s, argv[1], &err) != 0 ||
	    cli_open_model(&m, &err) != 0 ||
	    cli_trace_open(&trace, m, (const char *[]){argv[0], argv[1], out, NULL}, &o.trace, &err) != 0) {
		rc = cli_fail(&err);
		goto out;
	}
	rc = hi3_replay_to_file(m, c, s, argv[1], &o, record, out, &rep, &err);
	cli_progress_end();
	if (rc != 0 || cli_trace_write(&trace, o.trace, &err) != 0 ||
	    hi3_replay_report_json(&rep, c, s, &report, &len, &err) != 0) {
		rc = cli_fail(&err);
		goto out;
	}
	rc = fwrite(report, 1, len, stdout) == len ? 0 : HI3_ERR_RUNTIME;
	if (threshold >= 0 && !(rep.max_abs <= threshold)) {
		cli_warn("max |replay - rollout| log-prob %.3g exceeds --threshold %.3g", rep.max_abs, threshold);
		rc = HI3_ERR_RUNTIME;
	}
out:
	free(report);
	hi3_replay_report_release(&rep);
	hi3_trace_free(o.trace);
	cli_close_model(m);
	hi3_segment_close(s);
	hi3_cond_close(c);
	return rc;
}
