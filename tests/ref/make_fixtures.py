#!/usr/bin/env python3
"""make_fixtures.py -- regenerate tests/fixtures/forward-*.safetensors with the
PyTorch reference (hi3ref.py), for tests/test-forward.c.

Run by `make check-ref` with HI3 set to the built hi3 binary:
  HI3=bin/hi3 python3 tests/ref/make_fixtures.py --out tests/fixtures

For each fixture it makes the model with `hi3 init-model` (preset, seed 1,
dtype), builds one batch of B = 3 right-padded rows, runs the reference and
writes the inputs and what hi3_forward must reproduce:

  ids (B, T) i64, rope (B, T, 2) i32, hi (B, T) i32, blocks (B, S, 2) i32,
  lengths (B) i64 real length of each row,
  hidden (n_layers + 1, B, T, H) f32: the input of each layer, then the ln_f input,
  k.<l>, v.<l> (B, n_kv, T, d) f32: K after RoPE and qk-norm, and V, as stored
    in a cache whose slot of column t is t,
  logits (B, T, V) f32 at every position,
  route_ids (B, T, n_moe, k) i32 and route_w (B, T, n_moe, k) f32 (MoE models).

The rows: 0 is full length with an image of 2 x 3 tokens (2-D RoPE, one
full-attention block); 1 is text, right padded, its pads continuing its own
indices and attending causally; 2 holds an image of 2 x 2 tokens and pads
that continue its indices but admit no key (they must output zeros, not NaN).

Expert choice has a discontinuity, so the inputs are chosen so that every
routing decision is clear: for every token and MoE layer the sorted router
probabilities differ by at least ROUTE_MARGIN between consecutive ranks up
to rank k. The script tries input seeds from 1 on and refuses to write a
fixture whose margin is smaller.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hi3ref  # noqa: E402

FIXTURES = [  # (file stem, preset, dtype)
    ("forward-tiny", "tiny", "f32"),
    ("forward-tiny-moe", "tiny-moe", "f32"),
    ("forward-tiny-moe-bf16", "tiny-moe", "bf16"),
]
MODEL_SEED = 1
T = 16
# fp32 noise on router probabilities between two implementations is ~1e-7;
# a margin a thousand times larger makes expert choice deterministic.
ROUTE_MARGIN = 1e-4
# The decode path (prefill + one token at a time through a static cache)
# must give the logits of the one-call forward.
DECODE_TOL = 1e-5


def special_ids(model_dir):
    with open(os.path.join(model_dir, "tokenizer.json")) as f:
        tok = json.load(f)
    return {t["content"]: t["id"] for t in tok["added_tokens"]}


def image_rope(L, h, w):
    """hi3-batching(7), RoPE: token (r, c) of an h x w image starting at index L has
    y = trunc(L + (w h - h) / 2 + r), x = trunc(L + (w h - w) / 2 + c).
    Upstream builds the same grid as an fp32 linspace from beta to beta + n
    (n + 1 points, the last dropped) cast to long; check that they agree."""
    spec = [(math.trunc(L + (w * h - h) / 2 + r), math.trunc(L + (w * h - w) / 2 + c))
            for r in range(h) for c in range(w)]
    by, bx = L + (w * h - h) / 2, L + (w * h - w) / 2
    gy = torch.linspace(by, by + h, h + 1, dtype=torch.float32)[:h]
    gx = torch.linspace(bx, bx + w, w + 1, dtype=torch.float32)[:w]
    grid = torch.stack(torch.meshgrid(gy, gx, indexing="ij")).reshape(2, -1).long()
    assert [tuple(p) for p in grid.t().tolist()] == spec, \
        "the image RoPE rule of hi3-batching(7) disagrees with the fp32 grid"
    return spec


def build_inputs(sp, gen):
    """The three rows described above: (ids, rope, hi, blocks, lengths)."""
    bos, pad, boi, eoi = sp["<|startoftext|>"], sp["<pad>"], sp["<boi>"], sp["<eoi>"]

    def text(n):
        return torch.randint(0, 256, (n,), generator=gen).tolist()

    rows = []
    # row 0: bos, 3 text, boi, image 2 x 3 at index 5, eoi, 4 text = 16 tokens
    ids = [bos] + text(3) + [boi] + text(6) + [eoi] + text(4)
    rope = [(t, t) for t in range(5)] + image_rope(5, 2, 3) + [(t, t) for t in range(11, 16)]
    rows.append((ids, rope, list(range(16)), (5, 11), 16))
    # row 1: bos, 10 text; pads continue the row's indices and attend causally
    ids = [bos] + text(10) + [pad] * 5
    rows.append((ids, [(t, t) for t in range(16)], list(range(16)), (0, 0), 11))
    # row 2: bos, 1 text, boi, image 2 x 2 at index 3, eoi, 1 text; pads admit no key
    ids = [bos] + text(1) + [boi] + text(4) + [eoi] + text(1) + [pad] * 7
    rope = [(t, t) for t in range(3)] + image_rope(3, 2, 2) + [(t, t) for t in range(7, 16)]
    rows.append((ids, rope, list(range(9)) + [-1] * 7, (3, 7), 9))
    for r in rows:
        assert len(r[0]) == T and len(r[1]) == T and len(r[2]) == T
    ids = torch.tensor([r[0] for r in rows], dtype=torch.int64)
    rope = torch.tensor([r[1] for r in rows], dtype=torch.int32)
    hi = torch.tensor([r[2] for r in rows], dtype=torch.int32)
    blocks = torch.tensor([[r[3]] for r in rows], dtype=torch.int32)
    lengths = torch.tensor([r[4] for r in rows], dtype=torch.int64)
    return ids, rope, hi, blocks, lengths


def route_margin(out, k_of):
    """Smallest gap between consecutive sorted router probabilities up to
    rank k, over every token and MoE layer (inf for a dense model)."""
    margin = math.inf
    for p, k in zip(out["route_p"], k_of):
        s = torch.sort(p, dim=-1, descending=True).values
        gaps = s[..., :k] - s[..., 1:k + 1]
        margin = min(margin, gaps.min().item())
    return margin


def rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def check_decode(m, ids, rope, blocks, lengths, logits):
    """Each row alone: prefill all but its last two real tokens, decode those
    two one at a time; the logits must match the batched forward's."""
    worst = 0.0
    for b in range(ids.shape[0]):
        n = int(lengths[b])
        n0 = n - 2
        assert blocks[b, 0, 1] <= n0, "image block must lie in the prefilled part"
        cache = hi3ref.StaticCache(m.cfg, 1, n)
        lg = m.prefill(cache, ids[b:b + 1, :n0], lengths[b:b + 1] * 0 + n0, rope[b:b + 1, :n0], blocks[b:b + 1])
        worst = max(worst, rel_err(lg[0], logits[b, n0 - 1]))
        for p in range(n0, n):
            assert tuple(rope[b, p].tolist()) == (p, p)
            lg = m.decode(cache, ids[b, p:p + 1], torch.tensor([p]))
            worst = max(worst, rel_err(lg[0], logits[b, p]))
    return worst


def make_fixture(hi3, out_dir, stem, preset, dtype, tmp):
    model_dir = os.path.join(tmp, stem)
    cmd = [hi3, "init-model", "--preset", preset, "--seed", str(MODEL_SEED), "--dtype", dtype, "-o", model_dir]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    m = hi3ref.Model(model_dir)
    c = m.cfg
    sp = special_ids(model_dir)
    k_of = [c.topk[l] for l in c.moe_layers]
    for input_seed in range(1, 200):
        gen = torch.Generator().manual_seed(input_seed)
        ids, rope, hi, blocks, lengths = build_inputs(sp, gen)
        out = m.forward(ids, rope, hi, blocks, record=True)
        margin = route_margin(out, k_of)
        if margin >= ROUTE_MARGIN:
            break
    else:
        raise SystemExit("%s: no input seed gives routing margins >= %g" % (stem, ROUTE_MARGIN))
    for name in ("logits", "hidden"):
        if not torch.isfinite(out[name]).all():
            raise SystemExit("%s: reference %s are not finite" % (stem, name))
    dec = check_decode(m, ids, rope, blocks, lengths, out["logits"])
    if dec > DECODE_TOL:
        raise SystemExit("%s: prefill + decode differs from the forward by %.3g (> %g)" % (stem, dec, DECODE_TOL))

    t = {"ids": ids, "rope": rope, "hi": hi, "blocks": blocks, "lengths": lengths,
         "hidden": out["hidden"], "logits": out["logits"]}
    for l in range(c.n_layers):
        t["k.%d" % l] = out["k"][l]
        t["v.%d" % l] = out["v"][l]
    if c.moe_layers:
        t["route_ids"] = torch.stack(out["route_ids"], dim=2).to(torch.int32)   # (B, T, n_moe, k)
        t["route_w"] = torch.stack(out["route_w"], dim=2)
    t = {k: v.contiguous() for k, v in t.items()}
    meta = {"format": "hi3.test.forward", "format_version": "1", "preset": preset, "seed": str(MODEL_SEED),
            "dtype": dtype, "input_seed": str(input_seed), "route_margin": "%.6g" % margin,
            "generator": "tests/ref/make_fixtures.py (torch %s)" % torch.__version__}
    path = os.path.join(out_dir, stem + ".safetensors")
    hi3ref.save_sorted(t, path, meta)
    size = os.path.getsize(path)
    print("%s: preset %s seed %d %s, input seed %d, route margin %s, decode vs forward %.3g, %d bytes"
          % (path, preset, MODEL_SEED, dtype, input_seed, meta["route_margin"], dec, size))
    if size > 512 * 1024:
        raise SystemExit("%s: %d bytes, over the 512 KiB budget of a fixture" % (path, size))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="fixture directory (tests/fixtures)")
    ap.add_argument("--hi3", default=os.environ.get("HI3"), help="the hi3 binary (default: $HI3)")
    a = ap.parse_args()
    if not a.hi3:
        ap.error("set HI3 to the built hi3 binary (or pass --hi3)")
    torch.set_grad_enabled(False)
    torch.set_num_threads(1)   # one summation order: regenerating gives the same bytes
    os.makedirs(a.out, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hi3-fixtures.") as tmp:
        for stem, preset, dtype in FIXTURES:
            make_fixture(a.hi3, a.out, stem, preset, dtype, tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
