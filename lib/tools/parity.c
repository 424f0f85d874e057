/*
 * parity.c -- prove a batch equals its rows run alone (hi3-batching(7), rules 8, 9).
 *
 * For a set of requests, the whole pipeline (prefill, then decode) runs on
 * each batched construction -- the batch encoded at once, the rows encoded
 * alone and concatenated, and each row as a right-padded B = 1 -- and on
 * each row alone (B = 1, unpadded). Per row it compares the generated
 * tokens, their log-probs, and the prefill KV of the row's valid slots
 * (slot 0 reported on its own: the position-padding defect shows there).
 * Every stage file is kept in the work directory for hi3 inspect / diff.
 *
 * With an ablation, the batched constructions run with one upstream defect
 * restored while the rows alone stay correct; the defect must then break
 * parity in every case.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <errno.h>
#include "format/kv.h"
#include "format/provenance.h"
#include "model/model.h"
#include "tools/tools.h"

const char *hi3_parity_ablation_name(int a)
{
	return hi3_ablation_name(a);
}

int hi3_parity_ablation_parse(const char *s)
{
	return hi3_ablation_of(s);
}

struct run {
	char *cond, *kv, *seg;
};

static void run_free(struct run *r)
{
	free(r->cond);
	free(r->kv);
	free(r->seg);
	memset(r, 0, sizeof(*r));
}

/* Write c, prefill it and decode to completion; file names from tag. */
static int pipeline(hi3_model *m, const hi3_cond *c, const char *dir, const char *tag, int max_new,
                    const hi3_decode_opts *dopt, const hi3_parity_opts *po, struct run *r, hi3_error *err)
{
	hi3_prefill_opts pre = {.max_new = max_new, .kv_dtype = po->kv_dtype};
	hi3_decode_stats st;
	hi3_cond *onfile = NULL;
	int rc = -1;

	r->cond = hi3i_asprintf("%s/%s.cond", dir, tag);
	r->kv = hi3i_asprintf("%s/%s.kv", dir, tag);
	r->seg = hi3i_asprintf("%s/%s.seg", dir, tag);
	if (!r->cond || !r->kv || !r->seg)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	/* through the file, as the stages would see it */
	if (hi3_cond_write(c, r->cond, err) != 0 || hi3_cond_open(&onfile, r->cond, err) != 0)
		goto out;
	if (hi3_prefill(m, onfile, r->cond, &pre, r->kv, err) != 0 ||
	    hi3_decode(m, onfile, r->kv, dopt, r->seg, &st, err) != 0)
		goto out;
	rc = 0;
out:
	hi3_cond_close(onfile);
	if (rc)
		hi3_error_prefix(err, "parity: %s", tag);
	return rc;
}

static double kv_elem(const hi3_tensor *t, size_t i)
{
	return t->dtype == HI3_BF16 ? hi3_bf16_to_f32(((const uint16_t *)t->data)[i]) : ((const float *)t->data)[i];
}

/* Compare row `ra` of run a with row 0 of the row-alone run b. */
static int compare_row(const struct run *a, int ra, const struct run *b, int64_t n, hi3_parity_row *out,
                       hi3_error *err)
{
	hi3_segment *sa = NULL, *sb = NULL;
	hi3_st *ka = NULL, *kb = NULL;
	int rc = -1;

	memset(out, 0, sizeof(*out));
	out->row = ra;
	out->n = n;
	out->first_diff = -1;
	if (hi3_segment_open(&sa, a->seg, err) || hi3_segment_open(&sb, b->seg, err) ||
	    hi3_st_open(&ka, a->kv, HI3_ST_READ, err) || hi3_st_open(&kb, b->kv, HI3_ST_READ, err))
		goto out;
	{
		int64_t oa = sa->cu_seqlens[ra], la = sa->cu_seqlens[ra + 1] - oa;
		int64_t ob = sb->cu_seqlens[0], lb = sb->cu_seqlens[1] - ob, k = HI3_MIN(la, lb);

		out->len_batched = la;
		out->len_alone = lb;
		out->tokens_equal = la == lb;
		for (int64_t j = 0; j < k; j++) {
			double d = fabs((double)sa->logprobs[oa + j] - (double)sb->logprobs[ob + j]);
			if (sa->tokens[oa + j] != sb->tokens[ob + j] && out->first_diff < 0) {
				out->tokens_equal = 0;
				out->first_diff = j;
			}
			if (!(d <= out->logp_max))
				out->logp_max = d;
		}
		if (la != lb && out->first_diff < 0)
			out->first_diff = k;
	}
	for (int i = 0; i < hi3_st_count(ka); i++) {
		const hi3_tensor *ta = hi3_st_at(ka, i), *tb;
		if (strncmp(ta->name, "k.", 2) && strncmp(ta->name, "v.", 2))
			continue;
		tb = hi3_st_find(kb, ta->name);
		if (!tb || tb->ndim != 4 || ta->ndim != 4 || ta->shape[1] != tb->shape[1] || ta->shape[3] != tb->shape[3]) {
			hi3_error_set(err, HI3_ERR_RUNTIME, "parity: %s and %s: tensor '%s' does not match", a->kv, b->kv,
			              ta->name);
			goto out;
		}
		for (int64_t h = 0; h < ta->shape[1]; h++)
			for (int64_t s = 0; s < n; s++)
				for (int64_t x = 0; x < ta->shape[3]; x++) {
					size_t ia = (size_t)(((ra * ta->shape[1] + h) * ta->shape[2] + s) * ta->shape[3] + x);
					size_t ib = (size_t)((h * tb->shape[2] + s) * tb->shape[3] + x);
					double d = fabs(kv_elem(ta, ia) - kv_elem(tb, ib));
					double *slot = s == 0 ? &out->kv_slot0_max : &out->kv_rest_max;
					if (!(d <= *slot))
						*slot = d;
				}
	}
	out->kv_max = fmax(out->kv_slot0_max, out->kv_rest_max);
	rc = 0;
out:
	hi3_segment_close(sa);
	hi3_segment_close(sb);
	hi3_st_close(ka);
	hi3_st_close(kb);
	return rc;
}

static void case_totals(hi3_parity_case *pc, double tol)
{
	pc->tokens_equal = 1;
	pc->logp_max = pc->kv_max = pc->kv_slot0_max = pc->kv_rest_max = 0.0;
	for (int i = 0; i < pc->n_rows; i++) {
		const hi3_parity_row *r = &pc->rows[i];
		pc->tokens_equal &= r->tokens_equal;
		pc->logp_max = fmax(pc->logp_max, r->logp_max);
		pc->kv_max = fmax(pc->kv_max, r->kv_max);
		pc->kv_slot0_max = fmax(pc->kv_slot0_max, r->kv_slot0_max);
		pc->kv_rest_max = fmax(pc->kv_rest_max, r->kv_rest_max);
	}
	pc->pass = pc->tokens_equal && pc->logp_max <= tol && pc->kv_max <= tol;
}

static int add_case(hi3_parity_report *rep, hi3_error *err)
{
	hi3_parity_case *nc = realloc(rep->cases, sizeof(*nc) * (size_t)(rep->n + 1));

	if (!nc)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	rep->cases = nc;
	memset(&nc[rep->n], 0, sizeof(nc[0]));
	rep->n++;
	return 0;
}

/* ------------------------------------------------------------ diffusion */

/* Capture c's trajectory into dir/tag.traj (the conditions beside it). */
static int diffusion_run(hi3_model *m, const hi3_cond *c, const char *dir, const char *tag, int steps, int sde,
                         int ablate, char **traj, hi3_error *err)
{
	hi3_diffusion_opts d = {.steps = steps, .sampler = sde ? HI3_SAMPLER_SDE : HI3_SAMPLER_EULER, .eta = 1.0,
	                        .latent_dtype = HI3_F32, .cfg_dtype = HI3_F32, .ablate = ablate};
	hi3_diffusion_stats st;
	hi3_cond *onfile = NULL;
	char *cond = hi3i_asprintf("%s/%s.cond", dir, tag);
	int rc = -1;

	*traj = hi3i_asprintf("%s/%s.traj", dir, tag);
	if (!cond || !*traj) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		goto out;
	}
	if (hi3_cond_write(c, cond, err) || hi3_cond_open(&onfile, cond, err) ||
	    hi3_diffusion_capture(m, onfile, &d, *traj, &st, err))
		goto out;
	rc = 0;
out:
	if (rc)
		hi3_error_prefix(err, "parity: %s", tag);
	hi3_cond_close(onfile);
	free(cond);
	return rc;
}

/* Row ra of trajectory a against row 0 of the row-alone trajectory b. */
static int diffusion_compare(const char *a, int ra, const char *b, double tol, hi3_parity_row *out, hi3_error *err)
{
	hi3_trajectory *ta = NULL, *tb = NULL;
	int rc = -1;

	out->first_step = -1;
	if (hi3_trajectory_open(&ta, a, err) || hi3_trajectory_open(&tb, b, err))
		goto out;
	if (ta->T != tb->T || ta->K != tb->K || ta->C != tb->C || ta->h != tb->h || ta->w != tb->w || ra >= ta->B) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "parity: %s and %s: trajectories of other shapes", a, b);
		goto out;
	}
	{
		const size_t n = (size_t)ta->C * ta->h * ta->w;
		for (int s = 0; s <= ta->T; s++) {
			double mx = 0.0;
			for (size_t e = 0; e < n; e++) {
				double d = fabs((double)hi3_trajectory_latent(ta, ((size_t)ra * (ta->T + 1) + s) * n + e) -
				                (double)hi3_trajectory_latent(tb, (size_t)s * n + e));
				if (!(d <= mx))
					mx = d;
			}
			if (!(mx <= tol) && out->first_step < 0)
				out->first_step = s;
			if (!(mx <= out->latent_max))
				out->latent_max = mx;
		}
		for (int k = 0; k < ta->K; k++) {
			double d = fabs((double)ta->sde_logp[(size_t)ra * ta->K + k] - (double)tb->sde_logp[k]);
			if (!(d <= out->sde_logp_max))
				out->sde_logp_max = d;
		}
	}
	rc = 0;
out:
	hi3_trajectory_close(ta);
	hi3_trajectory_close(tb);
	return rc;
}

/* hi3-batching(7), DIFFUSION: each request of a gen_image batch gives the
 * trajectory it gives alone. cons: the batched constructions (the defect
 * of a pad ablation built in); the other diffusion ablations are restored
 * in the batched captures only. */
static int parity_diffusion(hi3_model *m, const hi3_cond *good, hi3_cond *const cons[2], const hi3_parity_opts *o,
                            hi3_parity_report *rep, hi3_error *err)
{
	static const char *const cons_names[3] = {"batch", "per-row+concat", "padded B=1"};
	const int f = hi3_cond_cfg_factor(good), R = good->B / f;
	const int bad = o->ablate == HI3_ABLATE_ROPE_PAD || o->ablate == HI3_ABLATE_ROPE_1D ||
	                o->ablate == HI3_ABLATE_EOI ? o->ablate : HI3_ABLATE_NONE;
	char **ar = hi3i_calloc((size_t)R, sizeof(char *), err), *br = NULL;
	int *sel = hi3i_malloc(sizeof(int) * (size_t)f, err);
	int rc = -1;

	if (o->ablate == HI3_ABLATE_DECODE_MASK || o->ablate == HI3_ABLATE_TOKEN_PLACEMENT) {
		hi3_error_set(err, HI3_ERR_USAGE, "parity: --ablate %s is a decode defect; gen_image requests take pos-pad, "
		              "rope-pad, rope-1d or eoi", hi3_parity_ablation_name(o->ablate));
		goto out;
	}
	if (!ar || !sel)
		goto out;
	rep->B = R;
	for (int sm = 0; sm < 2; sm++) {
		const char *smn = sm ? "sde" : "euler";
		if ((sm == 0 && !o->greedy) || (sm == 1 && !o->sampled))
			continue;
		for (int si = 0; si < o->n_steps; si++) {
			const int steps = (int)o->steps[si];

			for (int i = 0; i < R; i++) {
				hi3_cond *one = NULL;
				char tag[96];
				for (int g = 0; g < f; g++)
					sel[g] = i + g * R;
				snprintf(tag, sizeof(tag), "alone-row%d-%s-%d", i, smn, steps);
				free(ar[i]);
				ar[i] = NULL;
				rc = hi3_cond_select(&one, good, sel, f, 0, err) ? -1
				     : diffusion_run(m, one, o->workdir, tag, steps, sm, HI3_ABLATE_NONE, &ar[i], err);
				hi3_cond_close(one);
				if (rc)
					goto out;
				rc = -1;
			}
			for (int k = 0; k < 3; k++) {
				hi3_parity_case *pc;
				char tag[96];

				if (add_case(rep, err) != 0)
					goto out;
				pc = &rep->cases[rep->n - 1];
				pc->construction = cons_names[k];
				pc->diffusion = 1;
				pc->sampled = sm;
				pc->steps = steps;
				if (!(pc->rows = hi3i_calloc((size_t)R, sizeof(*pc->rows), err)))
					goto out;
				pc->n_rows = R;
				pc->pass = 1;
				for (int i = 0; i < R; i++) {
					hi3_parity_row *r = &pc->rows[i];
					int ra = i;

					if (k == 2 || i == 0) {
						hi3_cond *one = NULL;
						const hi3_cond *c = cons[k == 1];
						free(br);
						br = NULL;
						if (k == 2) {
							/* request i as a right-padded B = 1 */
							for (int g = 0; g < f; g++)
								sel[g] = i + g * R;
							snprintf(tag, sizeof(tag), "padded-row%d-%s-%d", i, smn, steps);
							if (hi3_cond_select(&one, cons[0], sel, f, cons[0]->L, err))
								goto out;
							c = one;
						} else {
							snprintf(tag, sizeof(tag), "%s-%s-%d", k == 0 ? "batch" : "concat", smn, steps);
						}
						pc->L = c->L;
						rc = diffusion_run(m, c, o->workdir, tag, steps, sm, bad, &br, err);
						hi3_cond_close(one);
						if (rc)
							goto out;
						rc = -1;
					}
					if (k == 2)
						ra = 0;
					r->row = i;
					r->n = good->real_pos[i];
					if (diffusion_compare(br, ra, ar[i], o->tol, r, err))
						goto out;
					r->tokens_equal = r->first_step < 0;
					pc->latent_max = fmax(pc->latent_max, r->latent_max);
					pc->sde_logp_max = fmax(pc->sde_logp_max, r->sde_logp_max);
					pc->pass &= r->latent_max <= o->tol && r->sde_logp_max <= o->tol;
				}
				pc->tokens_equal = pc->pass;
				if (o->progress)
					o->progress(o->progress_ctx, rep->n, (int64_t)o->n_steps * 3 * (o->greedy + o->sampled));
			}
		}
	}
	rc = 0;
out:
	for (int i = 0; ar && i < R; i++)
		free(ar[i]);
	free(ar);
	free(br);
	free(sel);
	return rc;
}

static int parity_in(hi3_model *m, const hi3_template *t, const hi3_requests *rq, const hi3_parity_opts *o,
                     hi3_parity_report *rep, hi3_error *err)
{
	hi3_cond *good = NULL, *cons[3] = {NULL, NULL, NULL};
	hi3_cond **alone = NULL;
	struct run *ar = NULL;
	static const char *const cons_names[3] = {"batch", "per-row+concat", "padded B=1"};
	int B = 0, rc = -1, ablate_pad = o->ablate == HI3_ABLATE_POS_PAD || o->ablate == HI3_ABLATE_ROPE_PAD;
	hi3_cond_build_opts bo = {.seed_base = o->seed_base, .vit_kernel = o->vit_kernel,
	                          .vae_sample = o->vae_sample};

	memset(rep, 0, sizeof(*rep));
	if (mkdir(o->workdir, 0777) != 0 && errno != EEXIST)
		return hi3_error_set(err, HI3_ERR_RUNTIME, "%s: cannot create the work directory: %s", o->workdir,
		                     strerror(errno));
	/* the reference rows: built correctly, then each row alone */
	if (hi3_cond_build(&good, t, rq, &bo, err) != 0)
		goto out;
	B = good->B;
	bo.pad_zero = ablate_pad;
	if (hi3_cond_build(&cons[0], t, rq, &bo, err) != 0)
		goto out;
	bo.per_row = 1;
	if (hi3_cond_build(&cons[1], t, rq, &bo, err) != 0)
		goto out;
	if (!strcmp(good->mode, "gen_image")) {
		if (o->pad_to > 0) {
			hi3_error_set(err, HI3_ERR_USAGE, "parity: --pad-to is for gen_text requests");
			goto out;
		}
		if ((rc = parity_diffusion(m, good, cons, o, rep, err)) != 0)
			goto out;
		rc = -1;
		B = 0;
		goto report;
	}
	if (o->ablate == HI3_ABLATE_ROPE_PAD || o->ablate == HI3_ABLATE_ROPE_1D || o->ablate == HI3_ABLATE_EOI) {
		hi3_error_set(err, HI3_ERR_USAGE, "parity: --ablate %s is a diffusion defect (gen_image requests)",
		              hi3_parity_ablation_name(o->ablate));
		goto out;
	}
	alone = hi3i_calloc((size_t)B, sizeof(*alone), err);
	ar = hi3i_calloc((size_t)B, sizeof(*ar), err);
	if (!alone || !ar)
		goto out;
	for (int i = 0; i < B; i++)
		if (hi3_cond_select(&alone[i], good, &i, 1, 0, err) != 0)
			goto out;
	if (o->pad_to > 0) {
		/* every batched construction padded to at least pad_to columns */
		for (int k = 0; k < 2; k++) {
			hi3_cond *p = NULL;
			int *all = hi3i_malloc(sizeof(int) * (size_t)B, err);
			if (!all)
				goto out;
			for (int i = 0; i < B; i++)
				all[i] = i;
			rc = hi3_cond_select(&p, cons[k], all, B, o->pad_to, err);
			free(all);
			if (rc != 0)
				goto out;
			rc = -1;
			hi3_cond_close(cons[k]);
			cons[k] = p;
		}
	}
	rep->B = B;
	for (int sm = 0; sm < 2; sm++) {
		hi3_decode_opts dref = {0}, dbad;
		if ((sm == 0 && !o->greedy) || (sm == 1 && !o->sampled))
			continue;
		dref.sampler = sm == 0 ? (hi3_sampler){.greedy = 1, .temperature = 1.0, .top_p = 1.0} : o->sampler;
		dref.no_fsync = 1;
		dbad = dref;
		dbad.decode_mask = o->ablate == HI3_ABLATE_DECODE_MASK ? HI3_MASK_NONE : HI3_MASK_CAUSAL;
		dbad.placement = o->ablate == HI3_ABLATE_TOKEN_PLACEMENT ? HI3_PLACE_TAIL : HI3_PLACE_INDEX;
		for (int si = 0; si < o->n_steps; si++) {
			int steps = (int)o->steps[si];
			const char *smn = sm == 0 ? "greedy" : "sampled";

			for (int i = 0; i < B; i++) {
				char tag[96];
				run_free(&ar[i]);
				snprintf(tag, sizeof(tag), "alone-row%d-%s-%d", i, smn, steps);
				if (pipeline(m, alone[i], o->workdir, tag, steps, &dref, o, &ar[i], err) != 0)
					goto out;
			}
			for (int k = 0; k < 3; k++) {
				hi3_parity_case *pc;
				struct run br = {0};
				char tag[96];

				if (add_case(rep, err) != 0)
					goto out;
				pc = &rep->cases[rep->n - 1];
				pc->construction = cons_names[k];
				pc->sampled = sm;
				pc->steps = steps;
				pc->rows = hi3i_calloc((size_t)B, sizeof(*pc->rows), err);
				if (!pc->rows)
					goto out;
				pc->n_rows = B;
				for (int i = 0; i < B; i++) {
					if (k == 2) {
						/* row i as a right-padded B = 1 */
						hi3_cond *p1 = NULL;
						int L = HI3_MAX(cons[0]->L, o->pad_to);
						snprintf(tag, sizeof(tag), "padded-row%d-%s-%d", i, smn, steps);
						if (hi3_cond_select(&p1, cons[0], &i, 1, L, err) != 0)
							goto out;
						rc = pipeline(m, p1, o->workdir, tag, steps, &dbad, o, &br, err);
						hi3_cond_close(p1);
						if (rc != 0)
							goto out;
						rc = -1;
						pc->L = L;
						if (compare_row(&br, 0, &ar[i], good->real_pos[i], &pc->rows[i], err) != 0) {
							run_free(&br);
							goto out;
						}
						pc->rows[i].row = i;
						run_free(&br);
						continue;
					}
					if (i == 0) {
						snprintf(tag, sizeof(tag), "%s-%s-%d", k == 0 ? "batch" : "concat", smn, steps);
						if (pipeline(m, cons[k], o->workdir, tag, steps, &dbad, o, &br, err) != 0)
							goto out;
						pc->L = cons[k]->L;
					}
					if (compare_row(&br, i, &ar[i], good->real_pos[i], &pc->rows[i], err) != 0) {
						run_free(&br);
						goto out;
					}
					if (i == B - 1)
						run_free(&br);
				}
				case_totals(pc, o->tol);
				if (o->progress)
					o->progress(o->progress_ctx, rep->n, (int64_t)o->n_steps * 3 * (o->greedy + o->sampled));
			}
		}
	}
report:
	rep->real_pos = hi3i_malloc(sizeof(int64_t) * (size_t)rep->B, err);
	if (!rep->real_pos)
		goto out;
	memcpy(rep->real_pos, good->real_pos, sizeof(int64_t) * (size_t)rep->B);
	rep->pass = 1;
	for (int i = 0; i < rep->n; i++)
		rep->pass &= o->ablate ? !rep->cases[i].pass : rep->cases[i].pass;
	rc = 0;
out:
	for (int i = 0; ar && i < B; i++)
		run_free(&ar[i]);
	free(ar);
	for (int i = 0; alone && i < B; i++)
		hi3_cond_close(alone[i]);
	free(alone);
	for (int k = 0; k < 3; k++)
		hi3_cond_close(cons[k]);
	hi3_cond_close(good);
	return rc;
}

int hi3_parity(hi3_model *m, const hi3_template *t, const hi3_requests *rq, const hi3_parity_opts *o,
               hi3_parity_report *rep, hi3_error *err)
{
	hi3_parity_opts ow = *o;
	char *tmp = NULL;
	int rc;
	hi3_comm *comm = hi3i_model_comm(m);
	char path[4096] = {0};

	memset(rep, 0, sizeof(*rep));
	if (!o->workdir) {
		/* the ranks of a layout share rank 0's work directory (their stage files are one set) */
		hi3_error mine = {0};
		if (hi3i_model_writes_files(m) && (tmp = hi3i_mkdtemp("hi3-parity", &mine)))
			snprintf(path, sizeof(path), "%s", tmp);
		if (!comm && !tmp) {
			*err = mine;
			return -1;
		}
		if (comm && (hi3_comm_agree(comm, &mine, err) != 0 || hi3_comm_bcast(comm, path, sizeof(path), 0, err)))
			return -1;
		ow.workdir = tmp ? tmp : path;
	}
	rc = parity_in(m, t, rq, &ow, rep, err);
	if (comm && rc == 0)
		rc = hi3_comm_barrier(comm, err);
	if (tmp) {
		if (hi3i_rmtree(tmp) != 0)
			hi3_log(HI3_LOG_WARN, "%s: could not remove the work directory: %s", tmp, strerror(errno));
		free(tmp);
	}
	return rc;
}

void hi3_parity_report_release(hi3_parity_report *rep)
{
	for (int i = 0; i < rep->n; i++)
		free(rep->cases[i].rows);
	free(rep->cases);
	free(rep->real_pos);
	memset(rep, 0, sizeof(*rep));
}

/* ---------------------------------------------------------------- report */

static const char *num_str(char *buf, size_t n, double v)
{
	if (v == 0.0)
		snprintf(buf, n, "0");
	else
		snprintf(buf, n, "%.3g", v);
	return buf;
}

static void print_case(FILE *f, const hi3_parity_report *rep, const hi3_parity_case *pc,
                       const hi3_parity_opts *o, int rows)
{
	char a[32], b[32], c[32], d[32], lens[256];
	int equal = 1, off = 0;

	for (int i = 0; i < rep->B; i++) {
		equal &= rep->real_pos[i] == rep->real_pos[0];
		off += snprintf(lens + off, sizeof(lens) - (size_t)off, "%s%lld", i ? "," : "",
		                (long long)rep->real_pos[i]);
		if (off >= (int)sizeof(lens) - 16) {
			snprintf(lens + off, sizeof(lens) - (size_t)off, ",...");
			break;
		}
	}
	if (pc->diffusion) {
		fprintf(f, "[%s] %s, B=%d %s real_pos [%s], L=%d, %d diffusion steps, %s%s%s: latents max|d|=%s sde logp "
		        "max|d|=%s%s\n", pc->pass ? "PASS" : "FAIL", pc->construction, rep->B, equal ? "equal" : "unequal",
		        lens, pc->L, pc->steps, pc->sampled ? "sde" : "euler", o->ablate ? ", --ablate " : "",
		        o->ablate ? hi3_parity_ablation_name(o->ablate) : "", num_str(a, sizeof(a), pc->latent_max),
		        num_str(b, sizeof(b), pc->sde_logp_max), o->ablate ? (pc->pass ? " -> expect FAIL: NOT BROKEN" :
		                                                                   " -> expect FAIL") : "");
		for (int i = 0; i < pc->n_rows; i++) {
			const hi3_parity_row *r = &pc->rows[i];
			if (!rows && r->first_step < 0 && r->sde_logp_max <= o->tol)
				continue;
			fprintf(f, "    request %d (n=%lld): latents %s", r->row, (long long)r->n,
			        r->first_step < 0 ? "equal" : "differ");
			if (r->first_step >= 0)
				fprintf(f, " from step %lld (latents[:, %lld])", (long long)r->first_step - 1,
				        (long long)r->first_step);
			fprintf(f, ", max|d|=%s; sde logp max|d|=%s\n", num_str(a, sizeof(a), r->latent_max),
			        num_str(b, sizeof(b), r->sde_logp_max));
		}
		return;
	}
	fprintf(f, "[%s] %s, B=%d %s real_pos [%s], L=%d, %d decode steps, %s%s%s: tokens equal=%s logp max|d|=%s "
	       "prefill-KV max|d|=%s (cache slot 0 max|d|=%s, other slots %s)%s\n",
	       pc->pass ? "PASS" : "FAIL", pc->construction, rep->B, equal ? "equal" : "unequal", lens, pc->L,
	       pc->steps, pc->sampled ? "sampled" : "greedy", o->ablate ? ", --ablate " : "",
	       o->ablate ? hi3_parity_ablation_name(o->ablate) : "", pc->tokens_equal ? "True" : "False",
	       num_str(a, sizeof(a), pc->logp_max), num_str(b, sizeof(b), pc->kv_max), num_str(c, sizeof(c), pc->kv_slot0_max),
	       num_str(d, sizeof(d), pc->kv_rest_max), o->ablate ? (pc->pass ? " -> expect FAIL: NOT BROKEN" :
	                                                                   " -> expect FAIL") : "");
	for (int i = 0; i < pc->n_rows; i++) {
		const hi3_parity_row *r = &pc->rows[i];
		int bad = !r->tokens_equal || r->logp_max > o->tol || r->kv_max > o->tol;
		if (!rows && !bad)
			continue;
		fprintf(f, "    row %d (n=%lld): tokens %s", r->row, (long long)r->n, r->tokens_equal ? "equal" : "differ");
		if (!r->tokens_equal)
			fprintf(f, " from token %lld (lengths %lld batched, %lld alone)", (long long)r->first_diff,
			       (long long)r->len_batched, (long long)r->len_alone);
		fprintf(f, "; logp max|d|=%s; prefill KV slot 0 max|d|=%s, slots 1..%lld max|d|=%s\n",
		       num_str(a, sizeof(a), r->logp_max), num_str(b, sizeof(b), r->kv_slot0_max), (long long)r->n - 1,
		       num_str(c, sizeof(c), r->kv_rest_max));
	}
}

static json_t *report_json(const hi3_parity_report *rep, const hi3_parity_opts *o)
{
	json_t *root = json_object(), *cases = json_array(), *rp = json_array();

	for (int i = 0; i < rep->B; i++)
		json_array_append_new(rp, json_integer(rep->real_pos[i]));
	for (int k = 0; k < rep->n; k++) {
		const hi3_parity_case *pc = &rep->cases[k];
		json_t *rows = json_array();
		for (int i = 0; i < pc->n_rows; i++) {
			const hi3_parity_row *r = &pc->rows[i];
			json_array_append_new(rows, json_pack("{s:i, s:I, s:b, s:I, s:I, s:I, s:f, s:f, s:f, s:f}", "row", r->row,
			                                      "n", (json_int_t)r->n, "tokens_equal", r->tokens_equal,
			                                      "first_diff", (json_int_t)r->first_diff, "len_batched",
			                                      (json_int_t)r->len_batched, "len_alone",
			                                      (json_int_t)r->len_alone, "logp_max_abs", r->logp_max,
			                                      "kv_max_abs", r->kv_max, "kv_slot0_max_abs", r->kv_slot0_max,
			                                      "kv_other_slots_max_abs", r->kv_rest_max));
		}
		if (pc->diffusion) {
			json_t *drows = json_array();
			for (int i = 0; i < pc->n_rows; i++) {
				const hi3_parity_row *r = &pc->rows[i];
				json_array_append_new(drows, json_pack("{s:i, s:I, s:b, s:I, s:f, s:f}", "request", r->row, "n",
				                                       (json_int_t)r->n, "latents_equal", r->first_step < 0,
				                                       "first_step", (json_int_t)r->first_step, "latent_max_abs",
				                                       r->latent_max, "sde_logp_max_abs", r->sde_logp_max));
			}
			json_decref(rows);
			json_array_append_new(cases, json_pack("{s:s, s:s, s:i, s:i, s:b, s:f, s:f, s:o}", "construction",
			                                       pc->construction, "sampler", pc->sampled ? "sde" : "euler",
			                                       "steps", pc->steps, "L", pc->L, "pass", pc->pass,
			                                       "latent_max_abs", pc->latent_max, "sde_logp_max_abs",
			                                       pc->sde_logp_max, "rows", drows));
			continue;
		}
		json_array_append_new(cases, json_pack("{s:s, s:s, s:i, s:i, s:b, s:b, s:f, s:f, s:f, s:f, s:o}",
		                                       "construction", pc->construction, "decoding",
		                                       pc->sampled ? "sampled" : "greedy", "steps", pc->steps, "L", pc->L,
		                                       "pass", pc->pass, "tokens_equal", pc->tokens_equal, "logp_max_abs",
		                                       pc->logp_max, "kv_max_abs", pc->kv_max, "kv_slot0_max_abs",
		                                       pc->kv_slot0_max, "kv_other_slots_max_abs", pc->kv_rest_max,
		                                       "rows", rows));
	}
	json_object_set_new(root, "ablate", json_string(hi3_parity_ablation_name(o->ablate)));
	json_object_set_new(root, "tolerance", json_real(o->tol));
	json_object_set_new(root, "B", json_integer(rep->B));
	json_object_set_new(root, "real_pos", rp);
	json_object_set_new(root, "cases", cases);
	json_object_set_new(root, "ok", json_boolean(rep->pass));
	return root;
}

int hi3_parity_report_render(const hi3_parity_report *rep, const hi3_parity_opts *o, int json, int rows,
                             char **text, size_t *len, hi3_error *err)
{
	FILE *f;

	*text = NULL;
	if (json)
		return hi3i_json_text(report_json(rep, o), JSON_INDENT(2), text, len, err);
	if (!(f = open_memstream(text, len)))
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	for (int k = 0; k < rep->n; k++)
		print_case(f, rep, &rep->cases[k], o, rows);
	if (fclose(f) != 0) {
		free(*text);
		*text = NULL;
		return hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
	}
	return 0;
}
