/*
 * format.h -- what the format modules share, and what they offer the
 * layers above beyond hi3.h (internal).
 */
#ifndef HI3_FORMAT_H
#define HI3_FORMAT_H

#include "core/internal.h"
#include "format/hi3-format.h"

/* What a stage file records of the model that made it, and the sizes of
 * the model it is laid out by: plain values, which the model fills
 * (hi3i_model_facts, model/model.h) and the stages hand down, so that a
 * format module never needs the model itself. */
struct hi3i_model_facts {
	char fingerprint[17];     /* hi3_fingerprint: 16 hex digits */
	const char *dir;          /* the model's directory, for messages */
	int vocab;                /* V */
	int n_layers, n_kv, d;    /* the KV cache: (B, n_kv, C, d) per layer */
	int n_moe, k;             /* routing records: MoE layers, experts per token (0 0: none) */
};

/* ------------------------------------------------------------ codec.c */

/*
 * A stage file format as one table (llama.cpp's LLM_KV_NAMES habit): its
 * tensors, each with its dtype and its shape in the format's letters, and
 * its metadata keys. hi3i_codec_open and hi3i_codec_write read and write
 * every format by its table; the module adds the checks a table cannot
 * say. hi3-files(5) documents each table's names (tests/test-formats.c
 * checks it does).
 */
struct hi3i_ftensor {
	const char *name;         /* the tensor; "k.l": one per layer l < letter "layers", its field
	                           * an array of one data pointer per layer */
	const char *dtype;        /* "I64", or a choice "F32 BF16" */
	const char *shape;        /* letters of the format's dims, "+N", numbers: "B,T+1,2" */
	int group;                /* 0: required; g > 0: optional, the first tensor of the group deciding
	                           * for the rest; HI3I_FT_LATER: read by the module (hi3i_codec_get)
	                           * once it knows the letters, written as an optional one;
	                           * HI3I_FT_MODULE: named here, read and written by the module */
	int field;                /* offsetof the data pointer in the format's struct; -1: none */
	int dtype_field;          /* offsetof a hi3_dtype field for a choice of dtypes; -1: none */
};
#define HI3I_FT_MODULE (-1)
#define HI3I_FT_LATER (-2)

struct hi3i_fmeta {
	const char *key;
	const char *type;         /* "text", "int", "number", or the values "a|b|c" */
	int required;
	int field;                /* offsetof a const char * field in the format's struct; -1: none */
};

struct hi3i_format {
	const char *name;         /* HI3_FORMAT_*, the metadata format */
	const char *man;          /* its section of hi3-files(5) */
	const char *const *dims;  /* the shape letters, NULL-terminated */
	const struct hi3i_ftensor *t;  /* NULL name last */
	const struct hi3i_fmeta *m;    /* NULL key last; format and format_version are every format's */
	int open_meta;            /* 1: keys beyond the table (a file of another tool) are kept and
	                           * written back; hi3's own are the table's */
	int in_place;             /* 1: hi3 updates the file in place, a few bytes a step, each step
	                           * committed (the KV file, the diffusion checkpoint): written so
	                           * that its page cache is in pages, not huge folios (safetensors.c) */
};

/* The tables, one per format (a replay file of a trajectory, and the
 * --noise file diffusion-capture reads, have their own), and all of them,
 * NULL-terminated. */
extern const struct hi3i_format hi3i_format_conditions, hi3i_format_kv, hi3i_format_segment, hi3i_format_replay,
	hi3i_format_replay_sde, hi3i_format_trace, hi3i_format_trajectory, hi3i_format_diffusion_checkpoint,
	hi3i_format_noise;
extern const struct hi3i_format *const hi3i_formats[];

/* Open path (hi3_st_open flags) as a file of format f: the format and
 * version, then each tensor of the table in order, present (a group's
 * others only when its first is), of its dtype, of its shape, its letters
 * bound by the first tensor that has them (dims, one per letter of f: a
 * value >= 0 given, -1 found here); then the metadata, each of its type,
 * a required key present. Data pointers, dtypes and metadata values go to
 * obj at the fields of the table. The errors name the file and the tensor
 * or key. */
int hi3i_codec_open(const struct hi3i_format *f, const char *path, int flags, void *obj, int64_t *dims, hi3_st **st,
                    hi3_error *err);
/* The table's entry of a metadata key; NULL when the format has none. */
const struct hi3i_fmeta *hi3i_codec_meta(const struct hi3i_format *f, const char *key);
/* hi3i_codec_open of a file already open (and checked for its format). */
int hi3i_codec_read(const struct hi3i_format *f, const hi3_st *st, void *obj, int64_t *dims, hi3_error *err);
/* One tensor t of the table, checked as hi3i_codec_open does. */
int hi3i_codec_get(const struct hi3i_format *f, const hi3_st *st, const struct hi3i_ftensor *t, int64_t *dims,
                   const hi3_tensor **out, hi3_error *err);
/* A writer of obj as format f: format, format_version and the n_meta
 * (key, value) pairs whose value is not NULL, in that order, each a key of
 * the table (unless f->open_meta; path is for messages); then the tensors
 * of the table in order, shaped by dims, an optional one left out where
 * its data pointer is NULL (data are borrowed until written). NULL and err
 * set when a key is not the table's or out of memory. The module may add
 * more tensors before hi3_stw_write. */
hi3_st_writer *hi3i_codec_writer(const struct hi3i_format *f, const void *obj, const int64_t *dims,
                                 const char *const (*meta)[2], size_t n_meta, const char *path, hi3_error *err);
/* A data pointer that writes zeros where an optional tensor's data would be NULL. */
extern const char hi3i_codec_zeros[1];
#define HI3I_ZEROS ((const void *)hi3i_codec_zeros)
/* The writer of hi3i_codec_writer, written at path atomically. */
int hi3i_codec_write(const struct hi3i_format *f, const void *obj, const int64_t *dims, const char *const (*meta)[2],
                     size_t n_meta, const char *path, hi3_error *err);

/* ------------------------------------------------------- safetensors.c */

/* Take an exclusive lock on an open file (released when it is closed);
 * fails at once when another process holds it. */
int hi3i_st_lock(hi3_st *st, hi3_error *err);
/* A writer for a stage file of this format: "format", "format_version" and
 * the n (key, value) pairs of meta whose value is not NULL; NULL when out
 * of memory. */
hi3_st_writer *hi3i_stw_format(const char *format, const char *const (*meta)[2], size_t n);
/* The file w writes will be updated in place (hi3i_format.in_place): its
 * bytes go out a page a write and its zeros stay holes, so that the kernel
 * caches it in pages (see hi3_stw_write). */
void hi3i_stw_in_place(hi3_st_writer *w);

/* ---------------------------------------------------------- segment.c */

/* A segment built in memory (decode, import-rollout): the buffers of B
 * rows of lens[i] tokens each, routing (T, n_moe, k) when n_moe > 0, and
 * s pointing into them, cu_seqlens filled; the caller fills the rows
 * (row i at cu_seqlens[i]) and the metadata of s, then writes s. */
struct hi3i_segbuf {
	hi3_segment s;
	int64_t *tokens, *cu_seqlens;       /* (T), (B + 1) */
	float *logprobs;                    /* (T) */
	uint8_t *stop_reason;               /* (B) */
	int16_t *route_ids;                 /* (T, n_moe, k) or NULL */
	float *route_w;                     /* (T, n_moe, k) or NULL */
};
int hi3i_segbuf_init(struct hi3i_segbuf *b, int B, const int64_t *lens, int n_moe, int k, hi3_error *err);
void hi3i_segbuf_release(struct hi3i_segbuf *b);

/* ------------------------------------------- trajectory.c and replay.c */

/* A --noise file (trajectory.c): x_T (B, C, h, w) and, with K > 0,
 * sde_noise (B, K, C, h, w), F32, copied out; the error names the file and
 * the tensor (status 3). */
int hi3i_noise_read(const char *path, int B, int C, int h, int w, int K, float *x_T, float *sde_noise,
                    hi3_error *err);

/* The replay file of a diffusion replay (replay.c, format hi3.replay):
 * sde_logp (B, K) F32 and sde_steps (K) I64, written atomically. */
int hi3i_replay_sde_write(const char *path, int B, int K, const float *sde_logp, const int64_t *sde_steps,
                          const char *fingerprint, const char *conditions_hash, const char *traj_file, hi3_error *err);

#endif
