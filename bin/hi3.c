/*
 * hi3.c -- the hi3 program: global options, then one subcommand.
 *
 *   hi3 [global options] <command> [options] [args]
 *
 * The command table below is the whole list; each command lives in
 * bin/cmd-<name>.c and only parses options, calls libhi3 and writes files.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cli.h"
#include "config.h"

#include "commands.h"

#define CMD(str, name, summary) {str, cmd_##name, summary}
static const struct cli_command commands[] = {
	CMD("init-model", init_model, "write a deterministic random-init checkpoint"),
	CMD("tokenize", tokenize, "text lines to token id arrays with a tokenizer.json, and back"),
	CMD("tokenize-concat", tokenize_concat, "encode requests into a conditions file, or merge conditions"),
	CMD("prefill", prefill, "run a prompt batch and write its KV cache file"),
	CMD("decode", decode, "decode new tokens into the KV file and write a segment"),
	CMD("replay", replay, "teacher-forced log-probs of a segment and the rollout/replay report"),
	CMD("import-rollout", import_rollout, "another engine's rollout (vLLM, SGLang JSONL) into conditions and a segment"),
	CMD("diffusion-capture", diffusion_capture, "generate images by flow matching: a trajectory, and PNGs"),
	CMD("parity", parity, "prove a batch equals its rows run alone, or show where not"),
	CMD("inspect", inspect, "show a safetensors file: format, metadata, tensors, values, PNG"),
	CMD("diff", diff, "compare two safetensors files tensor by tensor"),
	CMD("plan", plan, "per-rank memory of a parallel layout from config.json, and whether it fits"),
	CMD("quantize", quantize, "write a checkpoint quantized weight-only: fp8 (compressed-tensors) or int8"),
	CMD("bench", bench, "measure bandwidth, GEMMs, prefill and decode side by side"),
	CMD("run", run, "run stage commands from a file or standard input, the model opened once"),
};

static int cmd_help(int argc, char **argv);
static const struct cli_command help_cmd = {"help", cmd_help, "show help for a command"};

const struct cli_command *cli_find_command(const char *name)
{
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (!strcmp(commands[i].name, name))
			return &commands[i];
	if (!strcmp(name, "help"))
		return &help_cmd;
	return NULL;
}

static void list_commands(FILE *f)
{
	fputs("\ncommands:\n", f);
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		fprintf(f, "  %-18s %s\n", commands[i].name, commands[i].summary);
}

static const struct cli_help main_help = {
	.usage = {"hi3 [-m DIR] [--backend cpu|cuda] [-t N] [--parallel tp=T,ep=E] [-q|-v] <command> [options] [args]"},
	.description = "hi3 runs the HunyuanImage-3.0 transformer stage by stage, in batches, over\n"
	               "memory-mapped safetensors stage files (see hi3(1), hi3-files(5)).\n",
	.more = list_commands,
};

static int show_version;
static const struct cli_option main_options[] = {
	OPT_INCLUDE(cli_global_options),
	OPT_FLAG(0, "version", &show_version, "print the version"),
	OPT_END(),
};

static const struct cli_help help_help = {
	.usage = {"hi3 help [COMMAND]"},
	.description = "Show the help of hi3, or of COMMAND (what 'hi3 COMMAND --help' shows).\n",
	.operands = "at most one COMMAND", .max_operands = 1,
};

static int cmd_help(int argc, char **argv)
{
	static const struct cli_option options[] = {OPT_GLOBALS(), OPT_END()};
	char help_opt[] = "--help", *run_argv[3] = {NULL, help_opt, NULL};
	const struct cli_command *c;

	if ((argc = cli_parse_options(argc, argv, options, &help_help, 0)) < 0)
		return CLI_PARSE_STATUS(argc);
	if (argc == 0) {
		cli_usage_with_options(stdout, &main_help, main_options);
		return 0;
	}
	c = cli_find_command(argv[0]);
	if (!c) {
		fprintf(stderr, "hi3 help: unknown command '%s' (see 'hi3 --help')\n", argv[0]);
		return HI3_ERR_USAGE;
	}
	cli_voice.cmd = c->name;
	run_argv[0] = argv[0];
	return c->run(2, run_argv);
}

/*
 * OpenMP worker threads that spin while waiting (libgomp's default) starve
 * each other when the cores are shared: measured on a loaded 2-core
 * machine, a decode step took 20x longer with spinning than with sleeping
 * workers. libgomp reads OMP_WAIT_POLICY before main runs, so when the
 * user has not chosen a policy we choose passive and re-execute once.
 */
static void choose_wait_policy(char **argv)
{
	if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT") || getenv("HI3_REEXEC"))
		return;
	setenv("OMP_WAIT_POLICY", "passive", 1);
	setenv("HI3_REEXEC", "1", 1);
	execv("/proc/self/exe", argv);
	/* no /proc: carry on with the default policy */
}

int main(int argc, char **argv)
{
	const struct cli_command *c;
	int rc;

	choose_wait_policy(argv);
	if ((argc = cli_parse_options(argc, argv, main_options, &main_help, CLI_PARSE_STOP_AT_NON_OPTION)) < 0)
		return CLI_PARSE_STATUS(argc);
	if (show_version) {
		printf("hi3 %s\n", PACKAGE_VERSION);
		return 0;
	}
	if (argc == 0) {
		cli_print_usage(stderr, &main_help);
		fputs("(see 'hi3 --help' for the commands)\n", stderr);
		return HI3_ERR_USAGE;
	}
	c = cli_find_command(argv[0]);
	if (!c) {
		fprintf(stderr, "hi3: '%s' is not a command (see 'hi3 --help')\n", argv[0]);
		return HI3_ERR_USAGE;
	}
	cli_voice.cmd = c->name;
	rc = cli_parallel_end(c->run(argc, argv));
	if (fflush(stdout) != 0 || ferror(stdout) || fclose(stdout) != 0) {
		fprintf(stderr, "hi3 %s: error: standard output: %s\n", c->name, strerror(errno));
		return rc ? rc : HI3_ERR_RUNTIME;
	}
	return rc;
}
