/* commands.h -- the subcommands, one per bin/cmd-<name>.c. */
#ifndef HI3_COMMANDS_H
#define HI3_COMMANDS_H

#define DECLARE_CMD(name) int cmd_##name(int argc, char **argv); extern const char cmd_##name##_help[];
DECLARE_CMD(init_model)
DECLARE_CMD(prefill)
DECLARE_CMD(decode)
DECLARE_CMD(replay)
DECLARE_CMD(bench)
DECLARE_CMD(parity)
DECLARE_CMD(inspect)
DECLARE_CMD(diff)
DECLARE_CMD(tokenize)
DECLARE_CMD(tokenize_concat)

#endif
