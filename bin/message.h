/*
 * message.h -- how hi3 speaks on standard error (message.c): every message
 * starts with who speaks ("hi3 CMD: ", "hi3 run: line N: CMD: "); usage
 * errors end with where to find help. The option parser (parse-options.c)
 * and what the commands share (cli.c) both print through it.
 */
#ifndef HI3_MESSAGE_H
#define HI3_MESSAGE_H

#include <stdio.h>

/* Who speaks: set by hi3.c and cmd-run.c. */
struct cli_voice {
	const char *cmd;         /* the running command's name */
	const char *where;       /* hi3 run: "run: line N", printed before cmd in every message */
};
extern struct cli_voice cli_voice;

/* What every message starts with: "hi3 CMD: ", "hi3 run: line N: CMD: ". */
void cli_message_prefix(FILE *f);
/* Print a usage error naming the command; returns exit status 2. */
int cli_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void cli_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
