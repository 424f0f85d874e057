/* cmd-diffusion-capture.c -- hi3 diffusion-capture: text-to-image by flow
 * matching, the trajectory for RL, and the VAE decode to PNG. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cli.h"
#include "commands.h"

static const struct cli_help help = {
	.usage = {"hi3 diffusion-capture -m MODEL [options] [--trace FILE [--trace-step S]] [--resume] COND -o TRAJ "
	          "[--png DIR]",
	          "hi3 diffusion-capture -m MODEL --decode TRAJ --png DIR"},
	.description =
	"Generate the image of every gen_image row of the conditions file COND by flow\n"
	"matching (hi3-batching(7), DIFFUSION) and write the trajectory TRAJ (format\n"
	"hi3.trajectory): the latents of every step (x_T first), the schedule, the\n"
	"noise used, and the log-prob of every SDE step, for replay and training.\n"
	"Step 0 runs the whole sequence into a KV cache of L slots per row; later\n"
	"steps feed only <timestep> (and <guidance>, <timestep_r>) and the image\n"
	"tokens. Classifier-free guidance combines the cond and uncond rows,\n"
	"v = v_u + g (v_c - v_u), when g > 1. x_T and the SDE noise come from each\n"
	"request's seed through the counter-based generator, or from --noise FILE.\n"
	"An SDE step scores its sample with a trainer's kernel (--sde-kernel:\n"
	"flow-grpo, cps, dance-grpo; hi3-diffusion-capture(1), SDE KERNELS), recorded\n"
	"in the trajectory with eta and the reduction. --ablate restores one of\n"
	"upstream's batching defects at every step and records it.\n"
	"Every completed step is committed to TRAJ.partial (removed at the end):\n"
	"after a kill at any point, --resume continues from there and writes the\n"
	"same trajectory and PNGs as an uninterrupted run.\n"
	"Steps, guidance and shift default to the model's generation_config.json.\n"
	"With --png DIR the final latents are decoded by the model's VAE into\n"
	"DIR/row-<i>.png; --decode TRAJ does that for an existing trajectory.\n"
	"With --trace FILE the forward pass of one step (--trace-step, default 0) is\n"
	"recorded for the chosen rows (the conditions' rows: cond, then uncond) and\n"
	"positions (columns); the trace's metadata names the stage diffusion-capture\n"
	"and the step.\n",
	.operands = NULL,
};

static const struct cli_choice samplers[] = {{"euler", HI3_SAMPLER_EULER, NULL}, {"sde", HI3_SAMPLER_SDE, NULL},
                                             {NULL, 0, NULL}};
static const struct cli_choice kernels[] = {{"flow-grpo", HI3_SDE_FLOW_GRPO, NULL}, {"cps", HI3_SDE_CPS, NULL},
                                            {"dance-grpo", HI3_SDE_DANCE_GRPO, NULL}, {NULL, 0, NULL}};
static const struct cli_choice reductions[] = {{"mean", HI3_LOGP_MEAN, NULL}, {"sum", HI3_LOGP_SUM, NULL},
                                               {NULL, 0, NULL}};
static const struct cli_choice defects[] = {
	{"pos-pad", HI3_ABLATE_POS_PAD, "--ablate pos-pad: pad columns write their K/V at cache slot 0, over the row's "
	 "first token, as upstream's zero-padded position ids did; the trajectory records it"},
	{"rope-pad", HI3_ABLATE_ROPE_PAD, "--ablate rope-pad: pad columns take position 0 and a zero RoPE table, as "
	 "UniRL's ragged concat did; the trajectory records it"},
	{"rope-1d", HI3_ABLATE_ROPE_1D, "--ablate rope-1d: image tokens take 1-D RoPE, as UniRL's replay did before its "
	 "ROPE-FIX; the trajectory records it"},
	{"eoi", HI3_ABLATE_EOI, "--ablate eoi: every token after row 0's <timestep> attends every key, <eoi> too, as "
	 "upstream's flash-attention branch does; the trajectory records it"},
	{NULL, 0, NULL},
};
static const struct cli_choice dtypes[] = {{"f32", HI3_F32, NULL}, {"bf16", HI3_BF16, NULL}, {"f16", HI3_F16, NULL},
                                           {NULL, 0, NULL}};

static int decode_png(const char *traj_path, const char *dir)
{
	hi3_trajectory *t = NULL;
	hi3_model *m = NULL;
	hi3_error err = {0};
	int rc = -1;

	if (hi3_trajectory_open(&t, traj_path, &err) || cli_open_model(&m, &err))
		goto out;
	if (!t->model_fingerprint || strcmp(t->model_fingerprint, hi3_model_fingerprint(m))) {
		hi3_error_set(&err, HI3_ERR_INPUT, "%s: made by model fingerprint %s, but the model %s has %s", traj_path,
		              t->model_fingerprint ? t->model_fingerprint : "(none)", hi3_model_dir(m),
		              hi3_model_fingerprint(m));
		goto out;
	}
	if (hi3_trajectory_png(m, t, dir, &err))
		goto out;
	cli_info("%d images of %d x %d latents into %s/row-<i>.png", t->B, t->h, t->w, dir);
	rc = 0;
out:
	cli_close_model(m);
	hi3_trajectory_close(t);
	return rc ? cli_fail(&err) : 0;
}

int cmd_diffusion_capture(int argc, char **argv)
{
	hi3_diffusion_opts o = {.progress = cli_progress_fn, .progress_ctx = "diffusion steps"};
	hi3_diffusion_stats st;
	int64_t sde[4096];
	int n_sde = 0, latent = HI3_F32, cfg_dt = HI3_F32, n_eta = 0, json = 0, n_kernel = 0, n_reduce = 0;
	const char *out = NULL, *png = NULL, *decode = NULL;
	hi3_model *m = NULL;
	hi3_cond *c = NULL;
	hi3_error err = {0};
	struct cli_trace trace = {0};
	int rc, n_tstep = 0, no_ckpt = 0, captured;
	char *ckpt = NULL;
	struct cli_option options[] = {
		OPT_STRING('m', "model", &cli.model_dir, "DIR", "model directory"),
		OPT_GROUP("sampling:"),
		OPT_INT(0, "steps", &o.steps, 1, 100000, "T", "denoising steps (default: generation_config's "
		        "diff_infer_steps)"),
		OPT_DOUBLE(0, "guidance", &o.guidance, -1e6, 1e6, "G", "classifier-free guidance scale, v = v_u + G (v_c - "
		           "v_u) when G > 1, the cond rows alone otherwise; a cfg-distilled model embeds it in <guidance> "
		           "(default: diff_guidance_scale)", .given = &o.have_guidance),
		OPT_DOUBLE(0, "flow-shift", &o.flow_shift, 0.0, 1e6, "S", "the schedule's shift, sigma = S s / (1 + "
		           "(S - 1) s) (default: flow_shift)", .flags = CLI_OPT_LO_OPEN, .given = &o.have_flow_shift),
		OPT_CHOICE(0, "sampler", &o.sampler, samplers, "euler (default, upstream's) or sde (a log-prob per SDE "
		           "step)"),
		OPT_CHOICE(0, "sde-kernel", &o.sde_kernel, kernels, "the SDE step and log-prob, as the trainer computes "
		           "it: flow-grpo (default; Flow-GRPO's and UniRL's), cps (coefficients-preserving sampling) or "
		           "dance-grpo (DanceGRPO's)", .given = &n_kernel),
		OPT_DOUBLE(0, "eta", &o.eta, 0.0, 1e6, "E", "the SDE's noise scale (default: the kernel's, 1 for "
		           "flow-grpo, 0.7 for cps, 0.3 for dance-grpo)", .given = &n_eta),
		OPT_CHOICE(0, "logprob-reduce", &o.logprob_reduce, reductions, "how a step's log-densities become its "
		           "log-prob: mean (every kernel's own) or sum over the latent's elements", .given = &n_reduce),
		OPT_INT_LIST(0, "sde-steps", sde, &n_sde, 0, 99999, "LIST", "the steps taken by the SDE, e.g. 2,3,4 (a "
		             "window); the others are Euler (default: every step)"),
		OPT_CHOICE(0, "latent-dtype", &latent, dtypes, "how latents are stored and read back before each "
		           "log-prob and step: f32 (default), bf16 or f16"),
		OPT_CHOICE(0, "cfg-dtype", &cfg_dt, dtypes, "the dtype of the guidance combination: f32 (default, "
		           "upstream's pipeline), f16 or bf16 (a trainer that casts the predictions first)"),
		OPT_FLAG(0, "no-kv-reuse", &o.no_kv_reuse, "run the whole sequence at every step"),
		OPT_STRING(0, "noise", &o.noise, "FILE", "x_T (B, C, h, w) and sde_noise (B, K, C, h, w) from this "
		           "safetensors file (a trajectory is one) instead of the rows' seeds"),
		OPT_FLAG(0, "capture-velocity", &o.capture_velocity, "store every row's prediction (velocity, T x R)"),
		OPT_GROUP_DEFECTS(),
		OPT_CHOICE(0, "ablate", &o.ablate, defects, "restore one upstream defect in every step and record it in "
		           "the trajectory: pos-pad, rope-pad, rope-1d or eoi (hi3-batching(7))"),
		OPT_GROUP("output:"),
		OPT_STRING('o', "output", &out, "TRAJ", "the trajectory to write (atomically)"),
		OPT_STRING(0, "png", &png, "DIR", "decode the final latents with the VAE into DIR/row-<i>.png"),
		OPT_STRING(0, "decode", &decode, "TRAJ", "decode this trajectory (with --png) instead of generating"),
		OPT_FLAG(0, "resume", &o.resume, "continue a killed capture from TRAJ.partial, its last committed step "
		         "(the same options; without the file: from the start)"),
		OPT_FLAG(0, "no-checkpoint", &no_ckpt, "keep no TRAJ.partial (a killed capture then starts again)"),
		OPT_JSON(&json, "print a JSON summary on standard output"),
		OPT_TRACE(&trace),
		OPT_INT(0, "trace-step", &o.trace_step, 0, 99999, "S", "trace the forward pass of denoising step S "
		        "(default 0, the whole sequence; a later step with KV reuse runs only the special and image "
		        "tokens)", .given = &n_tstep),
		OPT_GLOBALS(),
		OPT_END(),
	};

	if ((argc = cli_parse_options(argc, argv, options, &help, 0)) < 0)
		return CLI_PARSE_STATUS(argc);
	if (decode) {
		if (!png)
			return cli_usage_error("--decode needs --png DIR");
		if (argc || out)
			return cli_usage_error("--decode takes no conditions file and no -o");
		if (trace.path || trace.given || n_tstep)
			return cli_usage_error("--decode runs no denoising step: it takes no --trace");
		return decode_png(decode, png);
	}
	if (argc != 1)
		return cli_usage_error("expected one conditions file COND");
	if (!out)
		return cli_usage_error("-o TRAJ is required");
	if (n_sde && o.sampler != HI3_SAMPLER_SDE)
		return cli_usage_error("--sde-steps needs --sampler sde");
	if ((n_eta || n_kernel || n_reduce) && o.sampler != HI3_SAMPLER_SDE)
		return cli_usage_error("--%s needs --sampler sde", n_eta ? "eta" : n_kernel ? "sde-kernel" : "logprob-reduce");
	if (!n_eta)
		o.eta = hi3_sde_kernel_eta(o.sde_kernel);
	o.sde_steps = n_sde ? sde : NULL;
	o.n_sde_steps = n_sde;
	o.latent_dtype = (hi3_dtype)latent;
	o.cfg_dtype = (hi3_dtype)cfg_dt;
	if (n_tstep && !trace.path)
		return cli_usage_error("--trace-step needs --trace FILE");
	if (o.resume && (no_ckpt || trace.path))
		return cli_usage_error("--resume takes %s", no_ckpt ? "the checkpoint (not --no-checkpoint)" : "no --trace "
		                       "(the traced step may be done already)");
	if (!no_ckpt && strcmp(out, "-")) {
		if (!(ckpt = malloc(strlen(out) + 9)))
			return cli_fail(&(hi3_error){HI3_ERR_RUNTIME, "out of memory"});
		sprintf(ckpt, "%s.partial", out);
		o.checkpoint = ckpt;
	}
	if (cli_open_cond_model(argv[0], &c, &m, &err)) {
		free(ckpt);
		return cli_fail(&err);
	}
	rc = cli_trace_open(&trace, m, (const char *[]){argv[0], out, o.noise, ckpt, NULL}, &o.trace, &err);
	if (rc == 0)
		rc = hi3_diffusion_capture(m, c, &o, out, &st, &err);
	captured = rc == 0;
	cli_progress_end();
	if (rc == 0)
		rc = cli_trace_write(&trace, o.trace, &err);
	if (rc == 0) {
		if (st.cond_images)
			cli_info("%d cond images encoded in %.3f s", st.cond_images, st.encode_seconds);
		if (o.resume && st.checkpoint_found)
			cli_info("resumed from %s at step %d of %d", ckpt, st.resumed_from, st.T);
		else if (o.resume)
			cli_info("no checkpoint %s: from step 0", ckpt);
		cli_info("%d requests (%d rows, L %d), %d x %d latent tokens, %d steps (%d SDE) in %.3f s: step 0 %.3f s, "
		         "later steps %.3f s each (%s), checkpoint %.3f s, into %s", st.B, st.R, (int)st.L, st.h, st.w, st.T,
		         st.K, st.seconds, st.step0_seconds, st.step_seconds, o.no_kv_reuse ? "whole sequence" : "KV reuse",
		         st.checkpoint_seconds, out);
		if (json)
			printf("{\"requests\": %d, \"rows\": %d, \"L\": %lld, \"image_tokens\": %lld, \"steps\": %d, "
			       "\"sde_steps\": %d, \"kv_reuse\": %s, \"seconds\": %.6f, \"step0_s\": %.6f, \"step_s\": %.6f, "
			       "\"cond_images\": %d, \"encode_s\": %.6f, \"resumed_from\": %d, \"checkpoint_s\": %.6f}\n",
			       st.B, st.R, (long long)st.L, (long long)st.image_tokens, st.T, st.K,
			       o.no_kv_reuse ? "false" : "true", st.seconds, st.step0_seconds, st.step_seconds, st.cond_images,
			       st.encode_seconds, st.resumed_from, st.checkpoint_seconds);
	}
	hi3_cond_close(c);
	c = NULL;
	if (rc == 0 && png && cli_rank() == 0) {
		hi3_trajectory *t = NULL;
		if (hi3_trajectory_open(&t, out, &err) || hi3_trajectory_png(m, t, png, &err)) {
			hi3_error_prefix(&err, "no PNG (the trajectory %s is written)", out);
			rc = -1;
		} else {
			cli_info("%d images into %s/row-<i>.png", t->B, png);
		}
		hi3_trajectory_close(t);
	}
	/* the trajectory is written (and its PNGs, or why not): the checkpoint has served */
	if (captured && ckpt && cli_rank() == 0 && unlink(ckpt) != 0 && errno != ENOENT)
		cli_warn("%s: cannot remove: %s", ckpt, strerror(errno));
	free(ckpt);
	hi3_trace_free(o.trace);
	cli_close_model(m);
	return rc ? cli_fail(&err) : 0;
}
