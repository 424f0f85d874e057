/* message.c -- how hi3 speaks on standard error (message.h). */
#include <stdarg.h>
#include <stdio.h>
#include "hi3.h"
#include "message.h"

struct cli_voice cli_voice;

void cli_message_prefix(FILE *f)
{
	fputs("hi3", f);
	if (cli_voice.where)
		fprintf(f, " %s", cli_voice.where);
	if (cli_voice.cmd)
		fprintf(f, "%s%s", cli_voice.where ? ": " : " ", cli_voice.cmd);
	fputs(": ", f);
}

int cli_usage_error(const char *fmt, ...)
{
	va_list ap;

	cli_message_prefix(stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n(see 'hi3%s%s --help')\n", cli_voice.cmd ? " " : "", cli_voice.cmd ? cli_voice.cmd : "");
	return HI3_ERR_USAGE;
}

void cli_warn(const char *fmt, ...)
{
	va_list ap;

	cli_message_prefix(stderr);
	fputs("warning: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}
