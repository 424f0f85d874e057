/* test-st.c -- safetensors reader/writer: round trip, alignment, and every
 * malformed file the reader must refuse with a message naming file and tensor. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "hi3.h"
#include "core/internal.h"
#include "format/format.h"
#include "tap.h"
#include "testdir.h"

static char *dir;

static char *path_of(const char *name)
{
	static char buf[512];
	snprintf(buf, sizeof(buf), "%s/%s", dir, name);
	return buf;
}

/* Write a raw file: 8-byte header length, header text, then data bytes. */
static void write_raw(const char *name, uint64_t hlen_field, const char *hdr, size_t data_len)
{
	FILE *f = fopen(path_of(name), "wb");
	fwrite(&hlen_field, 8, 1, f);
	fwrite(hdr, 1, strlen(hdr), f);
	for (size_t i = 0; i < data_len; i++)
		fputc((int)(i & 0xff), f);
	fclose(f);
}

static void expect_bad(const char *name, const char *hdr, size_t data_len, const char *needle)
{
	hi3_st *st = NULL;
	hi3_error err = {0};
	int rc;

	write_raw(name, strlen(hdr), hdr, data_len);
	rc = hi3_st_open(&st, path_of(name), HI3_ST_READ, &err);
	ok(rc == -1 && err.status == HI3_ERR_INPUT && strstr(err.msg, needle) && strstr(err.msg, name),
	   "%s refused: %s", name, err.msg);
	hi3_st_close(st);
}

/* Whether this process's map of path carries a flag: 1 when its VmFlags
 * in /proc/self/smaps name it (" hg": MADV_HUGEPAGE; " rr": MADV_RANDOM),
 * 0 when not, -1 when the map is not found there (or /proc cannot say). */
static int map_flag(const char *path, const char *flag)
{
	char real[PATH_MAX], line[PATH_MAX + 128];
	FILE *f;
	int in = 0, found = -1;

	if (!realpath(path, real) || !(f = fopen("/proc/self/smaps", "r")))
		return -1;
	while (fgets(line, sizeof line, f)) {
		const char *p = strchr(line, '/');
		unsigned long lo, hi;
		size_t n = strlen(line);
		if (n && line[n - 1] == '\n')
			line[--n] = 0;
		if (strncmp(line, "VmFlags:", 8) == 0) {
			if (in)
				found = strstr(line, flag) != NULL;
			in = 0;
		} else if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) {
			in = p && strcmp(p, real) == 0;   /* a map's first line: "lo-hi perms ... path" */
		}
	}
	fclose(f);
	return found;
}

/* A read-only map of a file of 2 MiB or more asks for huge pages, a
 * smaller one does not: checked where the kernel takes the advice for
 * anonymous memory (else skipped). */
static void huge_map_advice(void)
{
	const size_t big = 2u << 20;
	int64_t shape[1] = {(int64_t)(big / sizeof(float))};
	void *probe = NULL;
	int can;

	can = posix_memalign(&probe, big, big) == 0;
#ifdef MADV_HUGEPAGE
	can = can && madvise(probe, big, MADV_HUGEPAGE) == 0;
#else
	can = 0;
#endif
	free(probe);
	if (!can || map_flag("/proc/self/exe", " hg") < 0) {
		diag("skipped: huge-page advice (no MADV_HUGEPAGE or no /proc/self/smaps here)");
		return;
	}
	for (int large = 0; large < 2; large++) {
		const char *name = large ? "huge.safetensors" : "small.safetensors";
		hi3_st_writer *w = hi3_stw_new();
		hi3_st *st = NULL;
		hi3_error err = {0};
		int got;

		shape[0] = large ? (int64_t)(big / sizeof(float)) : 1024;
		hi3_stw_add(w, "x", HI3_F32, 1, shape, NULL);
		ok(hi3_stw_write(w, path_of(name), &err) == 0 && hi3_st_open(&st, path_of(name), HI3_ST_READ, &err) == 0,
		   "%s written and mapped: %s", name, err.msg);
		got = map_flag(path_of(name), " hg");
		ok(got == large, "a read-only map of %s %s huge pages (smaps: %d)", large ? "2 MiB and more" : "4 KiB",
		   large ? "asks for" : "does not ask for", got);
		hi3_st_close(st);
		hi3_stw_free(w);
	}
}

/* A read-write map (a file hi3 updates in place: the KV file) is advised
 * MADV_RANDOM, so that a fault does not cache the pages about it in large
 * folios that each step's commit would write back whole; a read-only map
 * is not (safetensors.c, map_file). */
static void in_place_map_advice(void)
{
	int64_t shape[1] = {3 << 20};
	hi3_st_writer *w = hi3_stw_new();
	hi3_error err = {0};

	hi3i_stw_in_place(w);
	hi3_stw_add(w, "x", HI3_U8, 1, shape, NULL);
	ok(hi3_stw_write(w, path_of("in-place.safetensors"), &err) == 0, "a file updated in place written: %s", err.msg);
	hi3_stw_free(w);
	for (int wr = 0; wr < 2; wr++) {
		hi3_st *st = NULL;
		int got;
		ok(hi3_st_open(&st, path_of("in-place.safetensors"), wr ? HI3_ST_RDWR : HI3_ST_READ, &err) == 0,
		   "opened %s: %s", wr ? "read-write" : "read-only", err.msg);
		got = map_flag(path_of("in-place.safetensors"), " rr");
		if (got < 0)
			diag("skipped: the map's advice (no /proc/self/smaps here)");
		else
			ok(got == wr, "a %s map %s MADV_RANDOM (smaps: %d)", wr ? "read-write" : "read-only",
			   wr ? "is advised" : "is not advised", got);
		hi3_st_close(st);
	}
}

/* The writer sends its bytes in 2 MiB blocks, whole blocks straight from
 * a tensor and the rest through a buffer (t0300-write-blocks.sh checks the
 * writes): tensors that start and end inside blocks, span several, fill
 * one exactly, and zeros (holes in a file) among them, read back byte for
 * byte, in a file and on standard output; and a page a write for a file
 * updated in place (hi3i_stw_in_place), the same bytes. */
static void block_round_trip(void)
{
	const size_t MiB = 1u << 20;
	const size_t len[] = {3 * MiB + 5, 5 * MiB, 2 * MiB - 100, 7, 4 * MiB + 13, 2 * MiB, 3 * MiB - 1};
	const int zeros[] = {0, 1, 0, 0, 0, 1, 1};
	enum { NT = sizeof(len) / sizeof(len[0]) };
	unsigned char *buf[NT] = {0};
	hi3_st_writer *w = hi3_stw_new();
	hi3_st *st = NULL;
	hi3_error err = {0};
	int good = 1;

	for (int i = 0; i < NT; i++) {
		char name[16];
		int64_t shape[1] = {(int64_t)len[i]};
		if (!zeros[i]) {
			buf[i] = malloc(len[i]);
			for (size_t k = 0; k < len[i]; k++)
				buf[i][k] = (unsigned char)(k * 131 + (size_t)i * 7 + (k >> 16));
		}
		snprintf(name, sizeof name, "t%d", i);
		hi3_stw_add(w, name, HI3_U8, 1, shape, buf[i]);
	}
	ok(hi3_stw_write(w, path_of("blocks.safetensors"), &err) == 0, "written in blocks: %s", err.msg);
	ok(hi3_st_open(&st, path_of("blocks.safetensors"), HI3_ST_READ, &err) == 0, "read back: %s", err.msg);
	for (int i = 0; st && i < NT; i++) {
		const hi3_tensor *t = hi3_st_at(st, i);
		const unsigned char *d = t->data;
		for (size_t k = 0; k < len[i] && good; k++)
			good = d[k] == (zeros[i] ? 0 : buf[i][k]);
	}
	ok(st && good, "%d tensors of 7 bytes to 5 MiB, zeros among them, read back byte for byte", NT);
	hi3_st_close(st);
	{
		/* standard output: the same bytes */
		FILE *f = fopen(path_of("blocks-stdout.safetensors"), "wb");
		int saved = dup(STDOUT_FILENO), same = 0, rc;
		fflush(stdout);
		dup2(fileno(f), STDOUT_FILENO);
		rc = hi3_stw_write(w, "-", &err);
		fflush(stdout);
		dup2(saved, STDOUT_FILENO);
		close(saved);
		fclose(f);
		if (rc == 0) {
			char *a = NULL, *b = NULL;
			size_t na = 0, nb = 0;
			same = hi3i_read_file(path_of("blocks.safetensors"), &a, &na, &err) == 0 &&
			       hi3i_read_file(path_of("blocks-stdout.safetensors"), &b, &nb, &err) == 0 && na == nb &&
			       memcmp(a, b, na) == 0;
			free(a);
			free(b);
		}
		ok(rc == 0 && same, "the same bytes written on standard output: %s", err.msg);
	}
	{
		/* a page a write, for a file updated in place: the same bytes */
		char *a = NULL, *b = NULL;
		size_t na = 0, nb = 0;
		int same;
		hi3i_stw_in_place(w);
		ok(hi3_stw_write(w, path_of("blocks-pages.safetensors"), &err) == 0, "written a page a write: %s",
		   err.msg);
		same = hi3i_read_file(path_of("blocks.safetensors"), &a, &na, &err) == 0 &&
		       hi3i_read_file(path_of("blocks-pages.safetensors"), &b, &nb, &err) == 0 && na == nb &&
		       memcmp(a, b, na) == 0;
		free(a);
		free(b);
		ok(same, "the same bytes as in 2 MiB blocks");
	}
	hi3_stw_free(w);
	for (int i = 0; i < NT; i++)
		free(buf[i]);
}

int main(void)
{
	hi3_st_writer *w = hi3_stw_new();
	hi3_st *st = NULL;
	hi3_error err = {0};
	const hi3_tensor *t;
	float a[6] = {1, 2, 3, 4, 5, 6};
	int64_t b[3] = {-1, 7, 1LL << 40};
	uint8_t c[5] = {1, 0, 1, 1, 0};
	uint16_t h[2] = {hi3_f32_to_bf16(1.5f), hi3_f32_to_bf16(-2.0f)};
	int64_t sa[2] = {2, 3}, sb[1] = {3}, sc[1] = {5}, sh[1] = {2}, sz[2] = {4, 1000};

	if (!(dir = testdir_new("test-st")))
		return 1;
	hi3_stw_meta(w, "format", "hi3.test");
	hi3_stw_meta(w, "format_version", HI3_FORMAT_VERSION);
	ok(hi3_stw_add(w, "u8", HI3_U8, 1, sc, c) == 0, "add u8");
	ok(hi3_stw_add(w, "a", HI3_F32, 2, sa, a) == 0, "add f32");
	ok(hi3_stw_add(w, "b", HI3_I64, 1, sb, b) == 0, "add i64");
	ok(hi3_stw_add(w, "h", HI3_BF16, 1, sh, h) == 0, "add bf16");
	ok(hi3_stw_add(w, "zeros", HI3_F32, 2, sz, NULL) == 0, "add zeros");
	ok(hi3_stw_add(w, "a", HI3_F32, 2, sa, a) == -1, "duplicate name refused");
	ok(hi3_stw_write(w, path_of("ok.safetensors"), &err) == 0, "write: %s", err.msg);
	hi3_stw_free(w);

	ok(hi3_st_open(&st, path_of("ok.safetensors"), HI3_ST_READ, &err) == 0, "read back: %s", err.msg);
	ok((8 + hi3_st_header_size(st)) % 64 == 0, "data area starts 64-byte aligned");
	ok(hi3_st_count(st) == 5, "5 tensors");
	ok(!strcmp(hi3_st_meta(st, "format"), "hi3.test"), "metadata format");
	ok(hi3_st_expect_format(st, "hi3.test", &err) == 0, "expect_format accepts");
	ok(hi3_st_expect_format(st, "hi3.kv", &err) == -1 && strstr(err.msg, "expected format 'hi3.kv'") &&
	   strstr(err.msg, "found 'hi3.test'"), "expect_format refuses: %s", err.msg);
	ok(hi3_st_get(st, "a", HI3_F32, 2, sa, &t, &err) == 0 && !memcmp(t->data, a, sizeof(a)), "f32 data");
	ok(hi3_st_get(st, "b", HI3_I64, 1, sb, &t, &err) == 0 && !memcmp(t->data, b, sizeof(b)), "i64 data");
	ok(hi3_st_get(st, "u8", HI3_U8, 1, sc, &t, &err) == 0 && !memcmp(t->data, c, sizeof(c)), "u8 data");
	ok(hi3_st_get(st, "h", HI3_BF16, 1, sh, &t, &err) == 0 && hi3_elem_f64(t->data, HI3_BF16, 0) == 1.5 &&
	   hi3_elem_f64(t->data, HI3_BF16, 1) == -2.0, "bf16 data");
	ok(hi3_st_get(st, "zeros", HI3_F32, 2, sz, &t, &err) == 0 && ((float *)t->data)[3999] == 0.0f,
	   "zeros tensor");
	ok(hi3_st_get(st, "a", HI3_F32, 2, sz, &t, &err) == -1 && strstr(err.msg, "expected shape (4, 1000)") &&
	   strstr(err.msg, "found (2, 3)"), "shape mismatch named: %s", err.msg);
	ok(hi3_st_get(st, "a", HI3_I64, 2, sa, &t, &err) == -1 && strstr(err.msg, "expected dtype I64"),
	   "dtype mismatch named: %s", err.msg);
	ok(hi3_st_get(st, "nope", -1, 0, NULL, &t, &err) == -1 && strstr(err.msg, "'nope' is missing"),
	   "missing tensor named: %s", err.msg);
	for (int i = 0; i < hi3_st_count(st); i++) {
		t = hi3_st_at(st, i);
		if ((uintptr_t)t->data % hi3_dtype_size(t->dtype))
			break;
		if (i == hi3_st_count(st) - 1)
			ok(1, "every tensor aligned to its dtype");
	}
	hi3_st_close(st);
	block_round_trip();

	/* bad files */
	write_raw("short.safetensors", 5, "", 0);
	{
		FILE *f = fopen(path_of("short.safetensors"), "wb");
		fwrite("abc", 1, 3, f);
		fclose(f);
		ok(hi3_st_open(&st, path_of("short.safetensors"), 0, &err) == -1 && err.status == 3 &&
		   strstr(err.msg, "truncated"), "3-byte file: %s", err.msg);
	}
	write_raw("hlen.safetensors", 1000, "{}", 0);
	ok(hi3_st_open(&st, path_of("hlen.safetensors"), 0, &err) == -1 && err.status == 3 &&
	   strstr(err.msg, "header length 1000"), "header length beyond file: %s", err.msg);
	expect_bad("notjson.safetensors", "{\"a\": [1, 2", 0, "not valid JSON");
	expect_bad("array.safetensors", "[1, 2]", 0, "not a JSON object");
	expect_bad("dtype.safetensors", "{\"x\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
	           "unknown dtype 'F33'");
	expect_bad("span.safetensors", "{\"x\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,12]}}", 12,
	           "does not match its byte span");
	expect_bad("overlap.safetensors",
	           "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
	           "\"y\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "overlaps");
	expect_bad("range.safetensors", "{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8,
	           "run past the data area");
	expect_bad("hole.safetensors",
	           "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
	           "\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12, "hole");
	expect_bad("trail.safetensors", "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 9,
	           "trailing");
	expect_bad("neg.safetensors", "{\"x\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
	           "shape entry 0");
	expect_bad("noname.safetensors", "{\"\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0,
	           "empty name");
	expect_bad("meta.safetensors", "{\"__metadata__\":{\"a\":1}}", 0, "is not a string");
	expect_bad("dup.safetensors",
	           "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
	           "\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "not valid JSON");
	expect_bad("ovf.safetensors",
	           "{\"x\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,4]}}", 4,
	           "INT64_MAX");
	/* issue 16: the size_t byte count of U8 (2^32, 2^31, 0) is 0, but the
	 * element count 2^63 overflows int64 in hi3_tensor_numel */
	expect_bad("numel.safetensors",
	           "{\"x\":{\"dtype\":\"U8\",\"shape\":[4294967296,2147483648,0],\"data_offsets\":[0,0]}}", 0,
	           "INT64_MAX");
	expect_bad("numel2.safetensors",
	           "{\"x\":{\"dtype\":\"F32\",\"shape\":[0,3037000500,3037000500],\"data_offsets\":[0,0]}}", 0,
	           "INT64_MAX");
	{
		int64_t r = 7, big[3] = {INT64_MAX, 1, 0}, neg[2] = {2, -1};
		ok(hi3i_mul_size(3, 4, INT64_MAX, &r) == 0 && r == 12 && hi3i_mul_size(1LL << 32, 1LL << 31, INT64_MAX, &r) == -1 &&
		   r == 12 && hi3i_mul_size(128, 16777216, 1 << 24, &r) == -1 && hi3i_mul_size(-1, 0, INT64_MAX, &r) == -1,
		   "hi3i_mul_size: products past the limit or of negatives refused, result untouched");
		ok(hi3i_add_size(INT64_MAX, 1, INT64_MAX, &r) == -1 && hi3i_add_size(5, 6, 11, &r) == 0 && r == 11 &&
		   hi3i_add_size(5, 7, 11, &r) == -1, "hi3i_add_size: sums past the limit refused");
		ok(hi3i_shape_bytes(3, big, 1, &r) == 0 && r == 0 && hi3i_shape_bytes(2, big, 2, &r) == -1 &&
		   hi3i_shape_bytes(2, neg, 4, &r) == -1 && hi3i_shape_bytes(0, big, 4, &r) == 0 && r == 4,
		   "hi3i_shape_bytes: zero dims give 0 bytes, the others must fit int64");
	}
	{
		/* NaN and Inf counted in each float format, in a row (no
		 * threads) and in a tensor of 2^20 and more (chunks of 2^16 on
		 * OpenMP's threads), with bad values at the edges of the blocks
		 * of 128 and of the chunks, then in every element */
		const size_t ns[2] = {1000, ((size_t)1 << 20) + 12345};
		const size_t at[7] = {0, 127, 128, 999, 65535, 65536, ((size_t)1 << 20) + 12344};
		const hi3_dtype dts[5] = {HI3_F32, HI3_BF16, HI3_F16, HI3_F8_E4M3, HI3_F8_E5M2};
		/* a NaN, an Inf (none in e4m3: its NaN again), a 1 and a max finite value of each */
		const uint32_t nan[5] = {0x7fc00000u, 0x7fc0, 0x7e00, 0x7f, 0x7e};
		const uint32_t inf[5] = {0xff800000u, 0xff80, 0xfc00, 0xff, 0xfc};
		const uint32_t one[5] = {0x3f800000u, 0x3f80, 0x3c00, 0x38, 0x3c};
		const uint32_t big[5] = {0x7f7fffffu, 0x7f7f, 0x7bff, 0x7e, 0x7b};
		unsigned char *buf = malloc(ns[1] * 4);
		int all = buf != NULL;

		for (int k = 0; k < 5 && all; k++)
			for (int s = 0; s < 2; s++) {
				const size_t n = ns[s], es = hi3_dtype_size(dts[k]);
				int64_t want = 0;
				for (size_t i = 0; i < n; i++) {
					const uint32_t v = i % 3 ? one[k] : big[k];
					memcpy(buf + i * es, &v, es);  /* little-endian: the low bytes */
				}
				for (int j = 0; j < 7; j++)
					if (at[j] < n) {
						memcpy(buf + at[j] * es, j % 2 ? &inf[k] : &nan[k], es);
						want++;
					}
				all &= hi3i_count_nonfinite(buf, dts[k], n) == want;
				/* every element bad: no count of a block wraps */
				for (size_t i = 0; i < n; i++)
					memcpy(buf + i * es, i % 2 ? &inf[k] : &nan[k], es);
				all &= hi3i_count_nonfinite(buf, dts[k], n) == (int64_t)n;
			}
		free(buf);
		ok(all, "hi3i_count_nonfinite: NaN and Inf of f32, bf16, f16 and both f8 found at block and chunk "
		   "edges and everywhere, in a row and in a tensor of 2^20 and more");
	}
	huge_map_advice();
	in_place_map_advice();
	/* Nothing writes over an existing file on failure: writing into a
	 * missing directory fails and leaves no temporary behind. */
	w = hi3_stw_new();
	ok(hi3_stw_write(w, "/nonexistent-dir/x.safetensors", &err) == -1 && err.status == HI3_ERR_RUNTIME,
	   "write into a missing directory fails: %s", err.msg);
	hi3_stw_free(w);
	testdir_done(dir);
	return done_testing();
}
