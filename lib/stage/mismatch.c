/*
 * mismatch.c -- the rollout/replay mismatch metrics RL trainers log, as
 * verl's rollout correction computes them (rollout_corr_helper.py:
 * compute_offpolicy_metrics, compute_is_metrics with rollout_is = token
 * and sequence), over the rows of a segment; hi3-replay(1), MISMATCH
 * METRICS, defines each.
 *
 * r_t = replay_t - rollout_t, per token, in double from the f32 log-probs;
 * S_i = sum of row i's r_t. Weights are exp of a log ratio clamped to
 * [-20, 20] (verl's SAFETY_BOUND), except k3_kl, which takes exp(r_t)
 * unclamped, and the sequence level's min, exp(min S) unclamped below.
 * Means over tokens weigh every token once; means over rows every row with
 * tokens once; rows without tokens are left out. Standard deviations are
 * taken in two passes, about the mean (verl's E[w^2] - E[w]^2 is the same
 * value but for its rounding, of order 1e-8 in the std).
 */
#include <math.h>
#include <string.h>
#include "core/internal.h"
#include "stage/hi3-stage.h"

#define BOUND 20.0

static double clampd(double v, double lo, double hi)
{
	return v < lo ? lo : v > hi ? hi : v;
}

/* Accumulates the importance weights w of tokens (a row's tokens share a
 * weight at the sequence level) and of rows (their mean weight). */
struct acc {
	double cap;
	int64_t n;                     /* tokens */
	double sum, min, max, high, low;
	double sum_c, sum_c2;          /* of w clamped to [1/C, C] */
	int rows;
	double row_sum, row_min, row_max, row_dev, row_high, row_low;
};

static void acc_init(struct acc *a, double cap)
{
	memset(a, 0, sizeof(*a));
	a->cap = cap;
	a->min = a->row_min = INFINITY;
	a->max = a->row_max = -INFINITY;
}

static void acc_token(struct acc *a, double w)
{
	double wc = clampd(w, 1.0 / a->cap, a->cap);

	a->n++;
	a->sum += w;
	a->min = fmin(a->min, w);
	a->max = fmax(a->max, w);
	a->high += w > a->cap;
	a->low += w < 1.0 / a->cap;
	a->sum_c += wc;
	a->sum_c2 += wc * wc;
}

static void acc_row(struct acc *a, double mean_w)
{
	a->rows++;
	a->row_sum += mean_w;
	a->row_min = fmin(a->row_min, mean_w);
	a->row_max = fmax(a->row_max, mean_w);
	a->row_dev = fmax(a->row_dev, fabs(mean_w - 1.0));
	a->row_high += mean_w > a->cap;
	a->row_low += mean_w < 1.0 / a->cap;
}

/* mean of ((wc / (m + 1e-8))^2) = E[wc^2] / (m + 1e-8)^2; the stds come
 * from the second pass (dev_c: sum of (wc - mean wc)^2 over tokens, dev_r:
 * of (row mean - seq_mean)^2 over rows). */
static void acc_finish(const struct acc *a, double dev_c, double dev_r, hi3_mismatch_is *o)
{
	double n = (double)a->n, m = a->sum_c / n;

	o->mean = a->sum / n;
	o->min = a->min;
	o->max = a->max;
	o->fraction_high = a->high / n;
	o->fraction_low = a->low / n;
	o->std = a->n > 1 ? sqrt(dev_c / n) : 0.0;
	o->eff_sample_size = 1.0 / ((a->sum_c2 / n) / ((m + 1e-8) * (m + 1e-8)));
	o->seq_mean = a->row_sum / a->rows;
	o->seq_std = a->rows > 1 ? sqrt(dev_r / (a->rows - 1)) : 0.0;     /* torch's std: unbiased */
	o->seq_min = a->row_min;
	o->seq_max = a->row_max;
	o->seq_max_deviation = a->row_dev;
	o->seq_fraction_high = a->row_high / a->rows;
	o->seq_fraction_low = a->row_low / a->rows;
}

static void set_nan(hi3_mismatch *m, double cap)
{
	const hi3_mismatch_is n = {NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN};

	m->kl = m->k3_kl = m->chi2_token = m->chi2_seq = NAN;
	m->training_ppl = m->training_log_ppl = m->rollout_ppl = m->rollout_log_ppl = NAN;
	m->log_ppl_diff = m->log_ppl_abs_diff = m->log_ppl_diff_max = m->log_ppl_diff_min = m->ppl_ratio = NAN;
	m->log_ratio_sum = NAN;
	m->cap = cap;
	m->token = m->sequence = n;
}

/* Rows [r0, r1) into *o. */
static void compute(const float *replay, const float *rollout, const int64_t *cu, int r0, int r1, double cap,
                    hi3_mismatch *o)
{
	struct acc tok, seq;
	double kl = 0, k3 = 0, chi2 = 0, chi2_seq = 0, lsum = 0, tr_ppl = 0, tr_lppl = 0, ro_ppl = 0, ro_lppl = 0,
	       d_sum = 0, d_abs = 0, d_max = -INFINITY, d_min = INFINITY, ppl_ratio = 0, max_s = -INFINITY,
	       min_s = INFINITY, high = 0, low = 0;

	memset(o, 0, sizeof(*o));
	set_nan(o, cap);
	acc_init(&tok, cap);
	acc_init(&seq, cap);
	for (int i = r0; i < r1; i++) {
		int64_t n = cu[i + 1] - cu[i];
		double s = 0, sum_rep = 0, sum_rol = 0, sum_w = 0, w_seq, d;

		if (n <= 0)
			continue;
		for (int64_t j = cu[i]; j < cu[i + 1]; j++) {
			double r = (double)replay[j] - (double)rollout[j], w = exp(clampd(r, -BOUND, BOUND));
			s += r;
			sum_rep += replay[j];
			sum_rol += rollout[j];
			kl += -r;
			k3 += exp(r) - r - 1.0;
			chi2 += w * w;
			sum_w += w;
			acc_token(&tok, w);
		}
		acc_row(&tok, sum_w / (double)n);
		w_seq = exp(clampd(s, -BOUND, BOUND));
		for (int64_t j = 0; j < n; j++)
			acc_token(&seq, w_seq);
		acc_row(&seq, w_seq);
		max_s = fmax(max_s, s);
		min_s = fmin(min_s, s);
		high += s > log(cap);
		low += s < log(1.0 / cap);
		chi2_seq += exp(2.0 * clampd(s, -BOUND, BOUND));
		lsum += s;
		tr_lppl += -sum_rep / (double)n;
		tr_ppl += exp(-sum_rep / (double)n);
		ro_lppl += -sum_rol / (double)n;
		ro_ppl += exp(-sum_rol / (double)n);
		d = sum_rol / (double)n - sum_rep / (double)n;
		d_sum += d;
		d_abs += fabs(d);
		d_max = fmax(d_max, d);
		d_min = fmin(d_min, d);
		ppl_ratio += exp(d);
		o->tokens += n;
		o->rows++;
	}
	if (!o->tokens)
		return;
	{
		/* the second pass: deviations from the means of the first */
		double mt = tok.sum_c / (double)tok.n, ms = seq.sum_c / (double)seq.n, lo = 1.0 / cap;
		double rt = tok.row_sum / tok.rows, rs = seq.row_sum / seq.rows;
		double dev_t = 0, dev_s = 0, dev_rt = 0, dev_rs = 0;

		for (int i = r0; i < r1; i++) {
			int64_t n = cu[i + 1] - cu[i];
			double sum = 0, sum_w = 0, ws, wsc;
			if (n <= 0)
				continue;
			for (int64_t j = cu[i]; j < cu[i + 1]; j++) {
				double r = (double)replay[j] - (double)rollout[j], w = exp(clampd(r, -BOUND, BOUND));
				double wc = clampd(w, lo, cap) - mt;
				dev_t += wc * wc;
				sum += r;
				sum_w += w;
			}
			ws = exp(clampd(sum, -BOUND, BOUND));
			wsc = clampd(ws, lo, cap) - ms;
			dev_s += (double)n * wsc * wsc;
			dev_rt += (sum_w / (double)n - rt) * (sum_w / (double)n - rt);
			dev_rs += (ws - rs) * (ws - rs);
		}
		acc_finish(&tok, dev_t, dev_rt, &o->token);
		acc_finish(&seq, dev_s, dev_rs, &o->sequence);
	}
	{
		double nt = (double)o->tokens, nr = (double)o->rows;

		o->kl = kl / nt;
		o->k3_kl = k3 / nt;
		o->chi2_token = chi2 / nt - 1.0;
		o->chi2_seq = chi2_seq / nr - 1.0;
		o->training_ppl = tr_ppl / nr;
		o->training_log_ppl = tr_lppl / nr;
		o->rollout_ppl = ro_ppl / nr;
		o->rollout_log_ppl = ro_lppl / nr;
		o->log_ppl_diff = d_sum / nr;
		o->log_ppl_abs_diff = d_abs / nr;
		o->log_ppl_diff_max = d_max;
		o->log_ppl_diff_min = d_min;
		o->ppl_ratio = ppl_ratio / nr;
		o->log_ratio_sum = lsum;
		/* the sequence level takes its extremes and fractions from S in
		 * log space: max clamped above, min not clamped; shares of rows */
		o->sequence.max = exp(fmin(max_s, BOUND));
		o->sequence.min = exp(min_s);
		o->sequence.fraction_high = high / nr;
		o->sequence.fraction_low = low / nr;
	}
}

int hi3_mismatch_compute(const float *replay, const float *rollout, const int64_t *cu, int B, double cap,
                         hi3_mismatch *all, hi3_mismatch *rows, hi3_error *err)
{
	if (B < 0 || !(cap > 1.0) || !isfinite(cap))
		return hi3_error_set(err, HI3_ERR_USAGE, "mismatch: %d rows, cap %g (the cap must be above 1)", B, cap);
	compute(replay, rollout, cu, 0, B, cap, all);
	for (int i = 0; rows && i < B; i++)
		compute(replay, rollout, cu, i, i + 1, cap, &rows[i]);
	return 0;
}
