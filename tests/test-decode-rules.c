/* test-decode-rules.c -- decode applies a row's decoding rules (conditions
 * forced_after and greedy_among, hi3-files(5)) as upstream's
 * _StageTransitionLogitsProcessor and _ConditionalSliceVocabLogitsProcessor
 * do: the prompt's last token counts as produced; a trigger forces its ids
 * once, and a forced sequence's last token may trigger the next record;
 * after a greedy trigger the token is the argmax of the unmodified logits
 * among the ids; the recorded log-probs are those of the unmodified logits;
 * a decode resumed step by step gives the same tokens; rows without rules
 * decode as before. */
#include <math.h>
#include <string.h>
#include "hi3.h"
#include "format/conditions.h"
#include "tap.h"
#include "testdir.h"

enum { T1 = 70, A = 71, T2 = 72, B = 73, X = 80, Y = 81 };

/* Three pre-tokenized rows ending with T1. Row 0: T1 -> A T2, T2 -> B (the
 * last forced token triggers the next record), greedy among X, Y after B.
 * Row 1: T1 -> A T1 (the second T1 does not fire again), greedy among X, Y
 * after T1. Row 2: no rules. */
static const int64_t forced[2][7] = {{T1, 2, A, T2, T2, 1, B}, {T1, 2, A, T1, -1, -1, -1}};
static const int64_t greedy[2][4] = {{B, 2, X, Y}, {T1, 2, X, Y}};

static hi3_cond *build(hi3_error *err)
{
	static const char jsonl[] = "{\"tokens\": [1, 2, 3, 70], \"stop_tokens\": [511], \"seed\": 5}\n"
	                            "{\"tokens\": [1, 2, 70], \"stop_tokens\": [511], \"seed\": 6}\n"
	                            "{\"tokens\": [1, 70], \"stop_tokens\": [511], \"seed\": 7}\n";
	hi3_template_opts to = {.pad_id = 2};
	hi3_cond_build_opts bo = {0};
	hi3_requests *rq = NULL;
	hi3_template *t = NULL;
	hi3_cond *c = NULL;
	struct hi3i_cond *ci;
	int64_t *f, *g;

	if (hi3_requests_parse(&rq, jsonl, strlen(jsonl), "rules.jsonl", err) || hi3_template_open(&t, &to, err) ||
	    hi3_cond_build(&c, t, rq, &bo, err))
		goto out;
	ci = HI3I_COND(c);
	f = malloc(3 * 7 * sizeof(int64_t));
	g = malloc(3 * 4 * sizeof(int64_t));
	for (int r = 0; r < 3; r++) {
		for (int k = 0; k < 7; k++)
			f[r * 7 + k] = r < 2 ? forced[r][k] : -1;
		for (int k = 0; k < 4; k++)
			g[r * 4 + k] = r < 2 ? greedy[r][k] : -1;
	}
	ci->buf[T_FORCED] = f;
	ci->buf[T_GREEDY] = g;
	c->forced_after = f;
	c->NF = 7;
	c->greedy_among = g;
	c->NG = 4;
out:
	hi3_template_free(t);
	hi3_requests_free(rq);
	return c;
}

/* Row r of a segment: its tokens and log-probs. */
static int row_of(const hi3_segment *s, int r, const int64_t **tok, const float **lp)
{
	*tok = s->tokens + s->cu_seqlens[r];
	*lp = s->logprobs + s->cu_seqlens[r];
	return (int)(s->cu_seqlens[r + 1] - s->cu_seqlens[r]);
}

static int run(hi3_model *m, const char *cond, const char *kv, const char *seg, int steps_per_call, int sampled,
               hi3_error *err)
{
	hi3_prefill_opts po = {.max_new = 8, .kv_dtype = HI3_F32};
	hi3_decode_opts o = {.sampler = {.greedy = !sampled, .temperature = 1.7, .top_k = 0, .top_p = 1.0},
	                     .no_fsync = 1};
	hi3_decode_stats st;
	hi3_cond *c = NULL;
	int rc = -1;

	if (hi3_cond_open(&c, cond, err) || hi3_prefill(m, c, cond, &po, kv, err))
		goto out;
	o.steps = steps_per_call;
	do {
		if (hi3_decode(m, c, kv, &o, seg, &st, err))
			goto out;
	} while (steps_per_call > 0 && st.steps > 0);
	rc = 0;
out:
	hi3_cond_close(c);
	return rc;
}

/* Replay s with token at (segment index) swapped for other: the other's
 * log-prob there under the unmodified logits. */
static float logprob_of(hi3_model *m, const hi3_cond *c, const hi3_segment *s, int64_t at, int64_t other,
                        hi3_error *err)
{
	int64_t *tok = malloc(sizeof(int64_t) * (size_t)s->T);
	float *rl = calloc((size_t)s->T, sizeof(float)), v = NAN;
	hi3_segment alt = *s;
	hi3_replay_opts ro = {0};
	hi3_replay_report rep = {0};

	memcpy(tok, s->tokens, sizeof(int64_t) * (size_t)s->T);
	tok[at] = other;
	alt.tokens = tok;
	alt.st = NULL;
	if (hi3_replay(m, c, &alt, &ro, rl, &rep, err) == 0)
		v = rl[at];
	hi3_replay_report_release(&rep);
	free(tok);
	free(rl);
	return v;
}

int main(void)
{
	char *dir = testdir_new("decode-rules"), *mdir, *cond, *kv, *seg, *seg2;
	hi3_init_opts io = {.preset = "tiny", .seed = 3};
	hi3_model *m = NULL;
	hi3_cond *c = NULL;
	hi3_segment *s = NULL, *s2 = NULL;
	hi3_error err = {0};
	const int64_t *tok, *tok2;
	const float *lp, *lp2;
	int n, n2;

	if (!dir)
		return 1;
	mdir = hi3i_asprintf("%s/m", dir);
	cond = hi3i_asprintf("%s/c.st", dir);
	kv = hi3i_asprintf("%s/k.st", dir);
	seg = hi3i_asprintf("%s/s.st", dir);
	seg2 = hi3i_asprintf("%s/s2.st", dir);
	if (!ok(hi3_init_model(mdir, &io, &err) == 0 && hi3_model_open(&m, mdir, NULL, &err) == 0, "tiny model %s",
	        err.msg))
		goto out;
	if (!ok((c = build(&err)) != NULL && hi3_cond_write(c, cond, &err) == 0, "conditions with rules %s", err.msg))
		goto out;
	hi3_cond_close(c);
	c = NULL;
	for (int sampled = 0; sampled < 2; sampled++) {
		const char *how = sampled ? "sampled at temperature 1.7" : "greedy";
		hi3_cond *cc = NULL;
		float *rl = NULL;
		hi3_replay_opts ro = {0};
		hi3_replay_report rep = {0};
		int good;

		if (!ok(run(m, cond, kv, seg, 0, sampled, &err) == 0 && hi3_segment_open(&s, seg, &err) == 0 &&
		        hi3_cond_open(&cc, cond, &err) == 0, "%s: decode %s", how, err.msg))
			goto out;
		n = row_of(s, 0, &tok, &lp);
		ok(n == 8 && tok[0] == A && tok[1] == T2 && tok[2] == B && (tok[3] == X || tok[3] == Y),
		   "%s: after the prompt's T1, A T2 are forced; T2, the last of them, forces B; then X or Y", how);
		n2 = row_of(s, 1, &tok2, &lp2);
		ok(n2 == 8 && tok2[0] == A && tok2[1] == T1 && (tok2[2] == X || tok2[2] == Y),
		   "%s: T1 -> A T1: the second T1 does not fire again, the greedy rule after T1 takes over", how);
		n2 = row_of(s, 2, &tok2, &lp2);
		{
			/* row 2 has no rules; what it samples is its own business, but
			 * the same row decoded alone would give the same (parity) */
			ok(n2 == 8, "%s: a row without rules decodes its 8 tokens", how);
		}
		rl = calloc((size_t)s->T, sizeof(float));
		good = rl && hi3_replay(m, cc, s, &ro, rl, &rep, &err) == 0;
		for (int64_t k = 0; good && k < s->T; k++)
			good = fabsf(rl[k] - s->logprobs[k]) <= 1e-5f;
		ok(good, "%s: forced and chosen tokens too are recorded with the unmodified logits' log-probs (replay "
		   "agrees to 1e-5) %s", how, err.msg);
		{
			int64_t at0 = s->cu_seqlens[0] + 3, at1 = s->cu_seqlens[1] + 2;
			float o0 = logprob_of(m, cc, s, at0, s->tokens[at0] == X ? Y : X, &err);
			float o1 = logprob_of(m, cc, s, at1, s->tokens[at1] == X ? Y : X, &err);
			ok(good && rl[at0] >= o0 && rl[at1] >= o1, "%s: the chosen one of X, Y is the more likely (%.4f >= "
			   "%.4f, %.4f >= %.4f), whatever the sampler", how, rl[at0], o0, rl[at1], o1);
		}
		hi3_replay_report_release(&rep);
		free(rl);
		hi3_cond_close(cc);
		if (!ok(run(m, cond, kv, seg2, 1, sampled, &err) == 0 && hi3_segment_open(&s2, seg2, &err) == 0,
		        "%s: decode one step per call %s", how, err.msg))
			goto out;
		ok(s2->T == s->T && !memcmp(s2->tokens, s->tokens, sizeof(int64_t) * (size_t)s->T),
		   "%s: resumed step by step, the same tokens (the rules' state comes back from the history)", how);
		hi3_segment_close(s);
		hi3_segment_close(s2);
		s = s2 = NULL;
	}
out:
	hi3_segment_close(s);
	hi3_segment_close(s2);
	hi3_cond_close(c);
	hi3_model_close(m);
	free(mdir);
	free(cond);
	free(kv);
	free(seg);
	free(seg2);
	testdir_done(dir);
	return done_testing();
}
