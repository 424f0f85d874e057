/*
 * config-internal.h -- what config.c offers the rest of libhi3 beyond
 * model/hi3-model.h (internal).
 */
#ifndef HI3_MODEL_CONFIG_INTERNAL_H
#define HI3_MODEL_CONFIG_INTERNAL_H

#include "core/internal.h"
#include "model/hi3-model.h"

/* The widest MLP hi3 accepts (intermediate_size, per-layer widths). */
#define HI3_MAX_WIDTH (1 << 24)
/* Layer l's shared-expert MLP width, moe_intermediate_size x
 * num_shared_expert, or -1 when it exceeds HI3_MAX_WIDTH (a config that
 * hi3_config_parse accepts never does). */
int hi3i_config_shared_width(const hi3_config *cfg, int layer);

/* config.json as the sequence template reads it: the token ids, the
 * position bound, the image geometry and the variant, without requiring the
 * text model's dimensions; every field present is checked as by
 * hi3_config_load. */
int hi3i_config_load_partial(hi3_config *cfg, const char *path, hi3_error *err);
/* The "vae" block of a parsed config.json object root, typed as
 * hi3_config_load reads it (b->present 0 when absent). */
struct json_t;
int hi3i_config_vae_block(hi3_vae_config *b, struct json_t *root, const char *name, hi3_error *err);

#endif
