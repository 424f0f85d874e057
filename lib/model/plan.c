/*
 * plan.c -- what a rank of a layout holds, from config.json alone (hi3.h,
 * hi3-plan(1)), so that a user can choose a layout before downloading a
 * checkpoint, and hi3_model_open can refuse one that cannot fit before
 * it reads a weight.
 *
 * The counts follow what model/weights.c and model/shard.c load: norm
 * vectors as f32, the router f32, the embedding whole on every rank,
 * qkv_proj by the rank's kv heads, the other products by output rows
 * (the largest slice when a split is uneven), experts E / ep per group.
 * Activations follow forward.c's work_reserve for M tokens. With cuda,
 * what one GPU holds: the same weights (bf16 matrices stay bf16), the
 * rank's kv heads of the cache, the device buffers.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "model/config-internal.h"

/* the largest part of n split in k */
static uint64_t part(int64_t n, int k)
{
	return (uint64_t)((n + k - 1) / k);
}

const char *hi3_plan_quant_name(int q)
{
	static const char *const names[] = {"none", "fp8", "int8", "nf4", "nvfp4-mixed"};

	return q >= 0 && q < (int)HI3_ARRAY_SIZE(names) ? names[q] : "unknown";
}

/* Bytes of a (N, K) layer matrix stored as o asks (expert: a routed expert's). */
static uint64_t mat(const hi3_plan_opts *o, int expert, uint64_t N, uint64_t K)
{
	const uint64_t n = N * K, b = (n + 63) / 64;

	switch (o->quant) {
	case HI3_PLAN_Q_FP8:
	case HI3_PLAN_Q_INT8:
		return n + 4 * N;
	case HI3_PLAN_Q_NF4:
		return (n + 1) / 2 + b + 4 * ((b + 255) / 256) + 4 * (16 + 256);
	case HI3_PLAN_Q_NVFP4_MIXED:
		return expert ? n / 2 + n / 16 + 8 : n + 8;
	default:
		return n * hi3_dtype_size(o->dtype);
	}
}

int hi3_plan_compute(const hi3_config *c, const hi3_plan_opts *o, hi3_plan *p, hi3_error *err)
{
	const int tp = o->tp > 0 ? o->tp : 1, ep = o->ep > 0 ? o->ep : 1;
	const uint64_t s = hi3_dtype_size(o->dtype), ks = hi3_dtype_size(o->kv_dtype);
	const int64_t H = c->hidden_size, d = c->attention_head_dim, n_h = c->num_attention_heads;
	const int64_t n_kv = c->num_key_value_heads, V = c->vocab_size, g = n_h / (n_kv ? n_kv : 1);
	int64_t M, max_I = c->intermediate_size, max_E = 1, max_k = 1;
	uint64_t split = 0, rep = 0, all = 0;

	memset(p, 0, sizeof(*p));
	if (!s || !ks || o->batch < 1 || o->max_len < 1)
		return hi3_error_set(err, HI3_ERR_USAGE, "plan: batch and max_len must be >= 1, dtypes f32/bf16/f16");
	if (n_kv % tp)
		return hi3_error_set(err, HI3_ERR_USAGE, "plan: tp=%d does not divide num_key_value_heads %lld", tp,
		                     (long long)n_kv);
	/* embedding (replicated), final norm, lm_head split on the vocabulary */
	rep += (uint64_t)V * H * s + (uint64_t)H * 4;
	all += (uint64_t)V * H * s + (uint64_t)H * 4;
	if (!c->tie_word_embeddings) {
		split += part(V, tp) * H * s;
		all += (uint64_t)V * H * s;
	}
	for (int l = 0; l < c->num_hidden_layers; l++) {
		int64_t qkv = (n_h + 2 * n_kv) * d * H;
		rep += (uint64_t)2 * H * 4 + (c->use_qk_norm ? (uint64_t)2 * d * 4 : 0);
		all += (uint64_t)2 * H * 4 + (c->use_qk_norm ? (uint64_t)2 * d * 4 : 0);
		split += mat(o, 0, (uint64_t)(n_kv / tp) * (g + 2) * d, H) + mat(o, 0, part(H, tp), n_h * d);
		all += mat(o, 0, qkv / H, H) + mat(o, 0, H, n_h * d);
		if (!hi3_config_is_moe_layer(c, l)) {
			int64_t I = c->intermediate_size;
			split += mat(o, 0, part(2 * I, tp), H) + mat(o, 0, part(H, tp), I);
			all += mat(o, 0, 2 * I, H) + mat(o, 0, H, I);
			continue;
		}
		{
			int64_t E = c->num_experts[l], Ie = c->moe_intermediate_size[l];
			if (E % ep)
				return hi3_error_set(err, HI3_ERR_USAGE, "plan: ep=%d does not divide num_experts %lld of layer "
				                     "%d", ep, (long long)E, l);
			rep += (uint64_t)E * H * 4;
			all += (uint64_t)E * H * 4;
			split += (uint64_t)(E / ep) * (mat(o, 1, part(2 * Ie, tp), H) + mat(o, 1, part(H, tp), Ie));
			all += (uint64_t)E * (mat(o, 1, 2 * Ie, H) + mat(o, 1, H, Ie));
			max_I = HI3_MAX(max_I, Ie);
			max_E = HI3_MAX(max_E, E);
			max_k = HI3_MAX(max_k, c->moe_topk[l]);
			if (c->use_mixed_mlp_moe && c->num_shared_expert[l] > 0) {
				int64_t Is = hi3i_config_shared_width(c, l);
				split += mat(o, 0, part(2 * Is, tp), H) + mat(o, 0, part(H, tp), Is);
				all += mat(o, 0, 2 * Is, H) + mat(o, 0, H, Is);
				max_I = HI3_MAX(max_I, Is);
			}
		}
	}
	p->weights_split = split;
	p->weights_replicated = rep;
	p->weights = split + rep;
	p->weights_all = all;
	/* the cache: this rank's kv heads of every row and slot, and the
	 * decode record (two logit buffers per row) */
	p->kv = (uint64_t)c->num_hidden_layers * 2 * (uint64_t)o->batch * (uint64_t)(n_kv / tp) * (uint64_t)o->max_len *
	        (uint64_t)d * ks + (o->cuda ? 0 : (uint64_t)o->batch * (uint64_t)V * 4 * 2);
	/* forward.c's scratch for M tokens of a prefill chunk */
	M = o->chunk_tokens > 0 ? o->chunk_tokens : 8192;
	if ((int64_t)o->batch * o->max_len < M)
		M = (int64_t)o->batch * o->max_len;
	{
		const uint64_t W = (uint64_t)(n_h + 2 * n_kv) * d, nl = (uint64_t)HI3_MIN(o->batch, M);
		uint64_t per = 4 * (5 * (uint64_t)H + W + (uint64_t)n_h * d + (uint64_t)max_k * (3 * max_I + 2 * H) +
		                    3 * (uint64_t)max_I + (uint64_t)max_E) + 40 + 8 * (uint64_t)max_k;
		uint64_t act = (uint64_t)M * per + nl * (uint64_t)(H + V) * 4;
		if (tp * ep > 1) {
			/* shard.c: a device block and three host buffers of the largest
			 * gathered product; on cuda (NCCL) a device block and the
			 * device buffer the gather receives in */
			uint64_t big = HI3_MAX((uint64_t)M * max_k * 2 * max_I, HI3_MAX((uint64_t)M * H * max_k, nl * V));
			act += (o->cuda ? 2 : 4) * big * 4;
		}
		if (o->cuda)    /* cuda.c: the bf16 copy of a GEMM's input (M rows of the widest K) */
			act += (uint64_t)M * HI3_MAX((uint64_t)H, HI3_MAX((uint64_t)max_I, (uint64_t)n_h * d)) * 2;
		p->activations = act;
	}
	p->total = p->weights + p->kv + p->activations;
	p->fits = !o->mem || p->total <= o->mem;
	return 0;
}

int hi3_parse_bytes(const char *s, uint64_t *out)
{
	char *end;
	double v, mul = 1;

	if (!s || !*s)
		return -1;
	errno = 0;
	v = strtod(s, &end);
	if (end == s || errno || !isfinite(v) || v < 0)
		return -1;
	switch (*end) {
	case 'K': case 'k': mul = 1024.0; end++; break;
	case 'M': case 'm': mul = 1024.0 * 1024; end++; break;
	case 'G': case 'g': mul = 1024.0 * 1024 * 1024; end++; break;
	case 'T': case 't': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
	default: break;
	}
	if (mul > 1 && (!strcmp(end, "iB") || !strcmp(end, "B")))
		end += strlen(end);
	if (*end || v * mul > 1.8e19)
		return -1;
	*out = (uint64_t)(v * mul);
	return 0;
}

const char *hi3_format_bytes(uint64_t b, char *buf)
{
	static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	double v = (double)b;
	int u = 0;

	while (v >= 1024 && u < 4) {
		v /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(buf, 32, "%llu B", (unsigned long long)b);
	else
		snprintf(buf, 32, "%.2f %s", v, unit[u]);
	return buf;
}
