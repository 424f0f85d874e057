#!/usr/bin/env python3
"""The rollout/replay mismatch metrics, computed with numpy the way verl's
rollout correction computes them (verl/trainer/ppo/rollout_corr_helper.py:
compute_offpolicy_metrics, and compute_is_metrics with rollout_is = "token"
and "sequence"), on padded (B, T) arrays with a response mask, as verl
holds them. Written from verl's definitions, not from hi3's C code.

    python3 tests/ref/mismatch_ref.py tests/fixtures/mismatch.json

writes cases of (replay, rollout, cu_seqlens, cap) and the expected metrics
of all rows and of each row alone, for tests/test-mismatch to hold
hi3_mismatch_compute to. Inputs are float32 (printed exactly); metrics are
float64 (repr). Rows without tokens are left out of every mean, as hi3
does (verl would give NaN for a sequence with no valid token).
"""
import json
import sys

import numpy as np

BOUND = 20.0


def masked_mean(x, m, axis=None):
    return (x * m).sum(axis=axis) / m.sum(axis=axis)


def is_metrics(log_ratio, mask, level, cap):
    """compute_rollout_correction_weights + compute_is_metrics."""
    lo = 1.0 / cap
    if level == "token":
        for_metrics = log_ratio
        w = np.exp(np.clip(log_ratio, -BOUND, BOUND))
    else:
        s = (log_ratio * mask).sum(axis=-1, keepdims=True)
        for_metrics = s
        w = np.broadcast_to(np.exp(np.clip(s, -BOUND, BOUND)), log_ratio.shape)
    w = w * mask
    out = {}
    if level == "sequence":
        out["max"] = float(np.exp(min(for_metrics.max(), BOUND)))
        out["min"] = float(np.exp(for_metrics.min()))
        out["mean"] = float(masked_mean(w, mask))
        out["fraction_high"] = float((for_metrics > np.log(cap)).mean())
        out["fraction_low"] = float((for_metrics < np.log(lo)).mean())
    else:
        out["mean"] = float(masked_mean(w, mask))
        out["fraction_high"] = float(masked_mean((w > cap).astype(float), mask))
        out["fraction_low"] = float(masked_mean((w < lo).astype(float), mask))
        out["max"] = float(np.where(mask > 0, w, -np.inf).max())
        out["min"] = float(np.where(mask > 0, w, np.inf).min())
    if mask.sum() > 1:
        wc = np.clip(w, lo, cap)
        m = masked_mean(wc, mask)
        out["std"] = float(np.sqrt(max(masked_mean(wc * wc, mask) - m * m, 0.0)))
    else:
        out["std"] = 0.0
    wc = np.clip(w, lo, cap)
    m = masked_mean(wc, mask)
    out["eff_sample_size"] = float(1.0 / masked_mean((wc / (m + 1e-8)) ** 2, mask))
    seq = masked_mean(w, mask, axis=-1)
    out["seq_mean"] = float(seq.mean())
    out["seq_std"] = float(seq.std(ddof=1)) if seq.size > 1 else 0.0
    out["seq_max"] = float(seq.max())
    out["seq_min"] = float(seq.min())
    out["seq_max_deviation"] = float(np.abs(seq - 1.0).max())
    out["seq_fraction_high"] = float((seq > cap).mean())
    out["seq_fraction_low"] = float((seq < lo).mean())
    return out


def offpolicy(train, rollout, mask):
    """compute_offpolicy_metrics; train is the replay, rollout the engine's."""
    out = {}
    mt = masked_mean(train, mask, axis=-1)
    out["training_ppl"] = float(np.exp(-mt).mean())
    out["training_log_ppl"] = float((-mt).mean())
    out["kl"] = float(masked_mean(rollout - train, mask))
    lr = train - rollout
    out["k3_kl"] = float(masked_mean(np.exp(lr) - lr - 1, mask))
    mr = masked_mean(rollout, mask, axis=-1)
    out["rollout_ppl"] = float(np.exp(-mr).mean())
    out["rollout_log_ppl"] = float((-mr).mean())
    d = mr - mt
    out["log_ppl_diff"] = float(d.mean())
    out["log_ppl_abs_diff"] = float(np.abs(d).mean())
    out["log_ppl_diff_max"] = float(d.max())
    out["log_ppl_diff_min"] = float(d.min())
    out["ppl_ratio"] = float(np.exp(d).mean())
    rho = np.exp(np.clip(lr, -BOUND, BOUND))
    out["chi2_token"] = float(masked_mean(rho * rho, mask) - 1.0)
    s = (lr * mask).sum(axis=-1)
    out["chi2_seq"] = float(np.exp(2.0 * np.clip(s, -BOUND, BOUND)).mean() - 1.0)
    out["log_ratio_sum"] = float(s.sum())
    return out


def metrics(replay, rollout, cu, rows, cap):
    """The rows (non-empty) of the packed arrays as verl's padded batch."""
    rows = [i for i in rows if cu[i + 1] > cu[i]]
    T = max(cu[i + 1] - cu[i] for i in rows)
    B = len(rows)
    tr = np.zeros((B, T))
    ro = np.zeros((B, T))
    mask = np.zeros((B, T))
    for b, i in enumerate(rows):
        n = cu[i + 1] - cu[i]
        tr[b, :n] = replay[cu[i]:cu[i + 1]].astype(np.float64)
        ro[b, :n] = rollout[cu[i]:cu[i + 1]].astype(np.float64)
        mask[b, :n] = 1.0
    out = offpolicy(tr, ro, mask)
    out["tokens"] = int(mask.sum())
    out["rows"] = B
    out["token"] = is_metrics(tr - ro, mask, "token", cap)
    out["sequence"] = is_metrics(tr - ro, mask, "sequence", cap)
    return out


def case(name, rng, lens, scale, cap, extreme=False):
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    T = int(cu[-1])
    rollout = (-rng.gamma(1.5, 1.0, T)).astype(np.float32)
    gap = rng.standard_normal(T) * scale
    if extreme:
        gap[: T // 4] *= 8.0          # ratios far beyond the cap, both ways
        gap[cu[1]:cu[2]] = 1.3        # a row whose sum passes +20
        gap[cu[2]:cu[3]] = -1.4       # and one below -20
    replay = (rollout + gap).astype(np.float32)
    rows_all = list(range(len(lens)))
    return {
        "name": name, "cap": cap, "cu": cu.tolist(),
        "replay": [float(x) for x in replay], "rollout": [float(x) for x in rollout],
        "all": metrics(replay, rollout, cu, rows_all, cap),
        "rows": [metrics(replay, rollout, cu, [i], cap) if lens[i] else None for i in rows_all],
    }


def main(out):
    rng = np.random.default_rng(20261201)
    cases = [
        case("small gaps, ragged rows, an empty row", rng, [7, 19, 0, 33, 1], 0.05, 2.0),
        case("gaps past the cap and the clamp", rng, [40, 18, 17, 25], 0.6, 2.0, extreme=True),
        case("another cap", rng, [12, 30, 9], 0.3, 1.5),
        case("one token", rng, [1], 0.2, 2.0),
        case("equal log-probs", rng, [5, 6], 0.0, 2.0),
    ]
    with open(out, "w") as f:
        json.dump({"generator": "tests/ref/mismatch_ref.py", "cases": cases}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/mismatch.json")
