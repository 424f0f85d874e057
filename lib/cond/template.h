/*
 * template.h -- what the sequence template's files share (internal):
 * template.c (loading, sections, encoding) and rules.c (stop tokens and
 * the decoding rules of the Instruct text stage).
 */
#ifndef HI3_COND_TEMPLATE_H
#define HI3_COND_TEMPLATE_H

#include "cond/cond-internal.h"

#define MAX_RESO 128

/* cond_token_attn_type: which parts of a joint cond image attend in full. */
enum { ATTN_FULL, ATTN_FULL_CAUSAL, ATTN_CAUSAL, ATTN_JOINT_FULL };

struct hi3_template {
	char name[16];               /* pretrain or instruct */
	int drop_think;
	int image_size;              /* enum hi3_image_size */
	int variant;                 /* enum hi3_variant */
	int instruct_code;           /* the Instruct code's rules (Instruct and Distil) */
	char variant_why[160];
	hi3_gen_defaults gen;        /* generation_config.json */
	hi3_tok *tok;                /* NULL when not loaded */
	int clean_up;                /* tokenizer_config.json clean_up_tokenization_spaces (decoding) */
	char *tok_path;
	int64_t vocab;               /* 0 when unknown */
	int64_t pad_id, bos_id, eos_id;  /* -1 when unknown */
	/* image settings of config.json */
	int base_size;               /* image_base_size */
	int down_h, down_w;          /* vae_downsample_factor */
	int patch;                   /* patch_size */
	int vit_patch, vit_max;      /* vit_processor patch_size, max_num_patches */
	int rope_2d;                 /* rope_type 2d (default: 1-D everywhere) */
	int attn;                    /* cond_token_attn_type (the base code: joint) */
	int cond_vae_vit;            /* cond_image_type vae_vit */
	int guidance_token, timestep_r_token;   /* cfg_distilled, use_meanflow */
	int n_reso;
	int reso[MAX_RESO][2];       /* buckets (H, W): sorted by H/W, then the extras */
	char fingerprint[17];
};

/* The id of a special token by name; the error names the request line. */
int hi3i_template_special(const hi3_template *t, const hi3_requests *rq, int i, const char *name, int64_t *id,
                          hi3_error *err);
/* Append x to the list (*v, *n). */
int hi3i_list_add(int64_t **v, int *n, int64_t x, hi3_error *err);
/* The task that ends request r's row: its bot_task, or for the text stage
 * of a gen_image request with image_size "auto" the one generate_image
 * runs (think, recaption, think_recaption, else img_ratio). */
int hi3i_template_row_task(const hi3_template *t, const struct hi3i_request *r);
/* The system prompt of request r as its row has it (NULL: none): a name
 * of system_prompt.py through get_system_prompt, or the request's text;
 * stripped by the Instruct code unless "strip_system" is false. */
int hi3i_template_system(const hi3_template *t, const hi3_requests *rq, const struct hi3i_request *r,
                         const char **text, size_t *len, hi3_error *err);
/* Request i's stop tokens and decoding rules into row (rules.c): by its
 * bot_task and the variant's code, or the request's own stop tokens. */
int hi3i_template_stops(const hi3_template *t, const hi3_requests *rq, int i, hi3_cond_row *row, hi3_error *err);

#endif
