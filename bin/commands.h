/* commands.h -- the subcommands, one per bin/cmd-<name>.c. */
#ifndef HI3_COMMANDS_H
#define HI3_COMMANDS_H

int cmd_init_model(int argc, char **argv);
int cmd_prefill(int argc, char **argv);
int cmd_decode(int argc, char **argv);
int cmd_replay(int argc, char **argv);
int cmd_import_rollout(int argc, char **argv);
int cmd_diffusion_capture(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_parity(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_diff(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_tokenize_concat(int argc, char **argv);
int cmd_run(int argc, char **argv);

/* The command named name (hi3.c's table, help included), or NULL. */
struct cli_command;
const struct cli_command *cli_find_command(const char *name);

#endif
