/*
 * test-formats.c -- the stage file formats' tables (lib/format/format.h)
 * against their manual, hi3-files(5): every tensor a table names, with its
 * dtypes, is in the format's section, every metadata key in the section's
 * metadata, and every tensor the section's entries list is in a table of
 * the section; the check finds a name taken out of the manual; and a
 * writer refuses a metadata key its table does not have.
 */
#include <string.h>
#include <unistd.h>
#include "hi3.h"
#include "format/format.h"
#include "tap.h"
#include "testdir.h"

/* The manual's text without font changes: "\fBk.\fR\fIl\fR" reads "k.l". */
static char *plain(const char *s)
{
	char *out = malloc(strlen(s) + 1), *o = out;

	while (*s) {
		if (s[0] == '\\' && s[1] == 'f' && s[2]) {
			s += 3;
		} else if (s[0] == '\\' && s[1] == '-') {
			*o++ = '-';
			s += 2;
		} else if (s[0] == '\\' && s[1] == '(' && s[2] && s[3]) {
			*o++ = ' ';
			s += 4;
		} else {
			*o++ = *s++;
		}
	}
	*o = 0;
	return out;
}

static int word_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* word appears in [s, end) with no name character or dot on either side. */
static int has_word(const char *s, const char *end, const char *word)
{
	size_t n = strlen(word);

	for (const char *p = s; p && p + n <= end; p = strstr(p + 1, word)) {
		p = strstr(p, word);
		if (!p || p + n > end)
			return 0;
		if ((p == s || (!word_char(p[-1]) && p[-1] != '.')) && !word_char(p[n]) && !(p[n] == '.' && word_char(p[n + 1])))
			return 1;
	}
	return 0;
}

/* The section ".SH NAME ..." of the manual: [*s, *e). */
static int section(const char *man, const char *name, const char **s, const char **e)
{
	char head[64];
	const char *p;

	snprintf(head, sizeof(head), "\n.SH %s ", name);
	if (!(p = strstr(man, head)))
		return -1;
	*s = p + 1;
	*e = strstr(*s + 1, "\n.SH ");
	if (!*e)
		*e = *s + strlen(*s);
	return 0;
}

/* How many names of format f its section of man lacks (each reported). */
static int missing(const char *man, const struct hi3i_format *f, int quiet)
{
	const char *s, *e, *meta;
	int n = 0;

	if (section(man, f->man, &s, &e) != 0) {
		if (!quiet)
			diag("%s: no section %s", f->name ? f->name : "noise", f->man);
		return 1;
	}
	for (const struct hi3i_ftensor *t = f->t; t->name; t++) {
		char dt[16];
		if (!has_word(s, e, t->name) && ++n && !quiet)
			diag("%s: tensor '%s' is not in section %s", f->name, t->name, f->man);
		for (const char *p = t->dtype; *p; p += strcspn(p, " "), p += *p == ' ') {
			snprintf(dt, sizeof(dt), "%.*s", (int)strcspn(p, " "), p);
			if (!has_word(s, e, dt) && ++n && !quiet)
				diag("%s: dtype %s of '%s' is not in section %s", f->name, dt, t->name, f->man);
		}
	}
	meta = strstr(s, "etadata");
	for (const struct hi3i_fmeta *m = f->m; m->key; m++)
		if ((!meta || meta > e || !has_word(meta, e, m->key)) && ++n && !quiet)
			diag("%s: metadata key '%s' is not in the metadata of section %s", f->name, m->key, f->man);
	return n;
}

static int in_tables(const char *section_name, const char *name)
{
	for (int i = 0; hi3i_formats[i]; i++)
		for (const struct hi3i_ftensor *t = hi3i_formats[i]->t; t->name; t++)
			if (!strcmp(hi3i_formats[i]->man, section_name) && !strcmp(t->name, name))
				return 1;
	return 0;
}

/* The tensors a section's entries (.TP) list, as NAME (...): each in a
 * table of the section. */
static int unlisted(const char *man, const char *section_name)
{
	const char *s, *e;
	int n = 0;

	if (section(man, section_name, &s, &e) != 0)
		return 1;
	for (const char *p = strstr(s, "\n.TP\n"); p && p < e; p = strstr(p + 1, "\n.TP\n")) {
		const char *line = p + 5, *end = strchr(line, '\n');
		for (const char *q = line; q && q < end; q = strstr(q + 1, " (")) {
			const char *w;
			char name[64];
			q = strstr(q, " (");
			if (!q || q > end)
				break;
			for (w = q; w > line && (word_char(w[-1]) || w[-1] == '.'); w--)
				;
			if (w == q || q - w >= (long)sizeof(name))
				continue;
			snprintf(name, sizeof(name), "%.*s", (int)(q - w), w);
			if (!in_tables(section_name, name) && ++n)
				diag("section %s lists '%s', which no table of it has", section_name, name);
		}
	}
	return n;
}

int main(void)
{
	const char *srcdir = getenv("SRCDIR") ? getenv("SRCDIR") : ".";
	char *path = hi3i_asprintf("%s/man/hi3-files.5", srcdir), *raw = NULL, *man, *cut;
	size_t len;
	hi3_error err = {0};
	char *td;
	int n;

	if (!ok(hi3i_read_file(path, &raw, &len, &err) == 0, "read %s", path))
		return done_testing();
	man = plain(raw);
	for (int i = 0; hi3i_formats[i]; i++) {
		const struct hi3i_format *f = hi3i_formats[i];
		int nt = 0, nm = 0;
		for (const struct hi3i_ftensor *t = f->t; t->name; t++)
			nt++;
		for (const struct hi3i_fmeta *m = f->m; m->key; m++)
			nm++;
		ok(missing(man, f, 0) == 0, "%s: its %d tensors and %d metadata keys are in hi3-files(5), %s",
		   f->name ? f->name : "the --noise file", nt, nm, f->man);
	}
	for (int i = 0; hi3i_formats[i]; i++)
		if (!i || strcmp(hi3i_formats[i]->man, hi3i_formats[i - 1]->man))
			ok(unlisted(man, hi3i_formats[i]->man) == 0, "every tensor section %s lists is in its tables",
			   hi3i_formats[i]->man);

	/* the check can fail: a name and a key taken out of the manual */
	cut = strdup(man);
	{
		char *t = strstr(cut, "gen_image_hw ("), *k = strstr(cut, "token_placement,\nrouting_weights");
		if (t)
			memcpy(t, "xxxxxxxxxxxx", 12);
		n = missing(cut, &hi3i_format_conditions, 1);
		if (k)
			memcpy(k, "xxxxxxxxxxxxxxx", 15);
		ok(t && k && n == 1 && missing(cut, &hi3i_format_segment, 1) == 1,
		   "a tensor and a metadata key taken out of the manual are found missing");
	}
	free(cut);

	/* a writer writes only its table's keys */
	td = testdir_new("formats");
	{
		const int64_t tok[2] = {5, 6}, cu[2] = {0, 2};
		const float lp[2] = {-1.0f, -2.0f};
		const uint8_t sr[1] = {1};
		hi3_segment s = {.B = 1, .T = 2, .tokens = tok, .logprobs = lp, .cu_seqlens = cu, .stop_reason = sr};
		const int64_t dims[4] = {2, 1, 0, 0};
		const char *good[][2] = {{"sampler", "greedy"}}, *bad[][2] = {{"sampler", "greedy"}, {"speed", "fast"}};
		char *out = hi3i_asprintf("%s/s.st", td);

		ok(hi3i_codec_write(&hi3i_format_segment, &s, dims, good, 1, out, &err) == 0 && access(out, F_OK) == 0,
		   "a segment with its table's keys is written");
		unlink(out);
		ok(hi3i_codec_write(&hi3i_format_segment, &s, dims, bad, 2, out, &err) == -1 &&
		   err.status == HI3_ERR_USAGE && strstr(err.msg, "'speed' is not a metadata key of hi3.segment") &&
		   access(out, F_OK) != 0, "a key the table lacks is refused, nothing written: %s", err.msg);
		free(out);
	}
	testdir_done(td);
	free(man);
	free(raw);
	free(path);
	return done_testing();
}
