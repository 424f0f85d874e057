/*
 * testdir.h -- a scratch directory for a C test program (testdir.c, linked
 * into every test program by Makefile.am):
 *
 *   static char *dir;
 *   dir = testdir_new("st");            // $TMPDIR/hi3-st.XXXXXX, mode 0700
 *   ... files under dir ...
 *   testdir_done(dir);                  // removed with all it holds
 *
 * With HI3_KEEP=1 in the environment the directory is kept and named on
 * standard output as a TAP comment, as the shell tests do (tests/lib.sh).
 */
#ifndef HI3_TESTDIR_H
#define HI3_TESTDIR_H

/* Make a fresh directory $TMPDIR/hi3-NAME.XXXXXX (/tmp when TMPDIR is
 * unset or empty). Returns its path (malloc'd; testdir_done frees it), or
 * NULL after printing a TAP "Bail out!" line. */
char *testdir_new(const char *name);
/* Remove dir and everything under it (unless HI3_KEEP=1), then free it. */
void testdir_done(char *dir);
/* Remove path and everything under it, symbolic links not followed; a
 * missing path is not an error. 0, or -1 with a message on stderr. */
int testdir_rm(const char *path);
/* Make directory to (removed first if it exists) holding a copy of every
 * regular file of directory from (not recursive). 0, or -1 with a message
 * on stderr. */
int testdir_copy(const char *from, const char *to);

#endif
