#!/usr/bin/env python3
"""make_trace_fixture.py -- regenerate tests/fixtures/trace/hf-tiny-moe.trace:
the trace scripts/hf-trace.py records on the upstream PyTorch classes
(modeling_hunyuan_image_3.py) for the tiny-moe preset (hi3 init-model,
seed 1) and one row of TOKENS, which tests/t3210-hf-trace.sh holds hi3's
prefill trace of the same row to with hi3 diff --first --tol.

    HI3=bin/hi3 python3 tests/ref/make_trace_fixture.py --code UPSTREAM --out tests/fixtures/trace

UPSTREAM is a directory holding the upstream package hunyuan_image_3 (a
checkout of github.com/Tencent-Hunyuan/HunyuanImage-3.0, or the files of a
checkpoint's remote code), which the tree does not carry: so this is not
part of make check-ref. Needs torch, numpy, safetensors, transformers (and
what the upstream module imports: diffusers, einops, PIL).

Expert choice has a discontinuity: the script refuses tokens for which two
router probabilities of a token are closer than ROUTE_MARGIN at ranks up to
k + 1, trying seeded token rows until one is clear.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
from safetensors.numpy import load_file

ROUTE_MARGIN = 1e-4
N_TOKENS = 8


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--code", required=True)
    ap.add_argument("--out", default="tests/fixtures/trace")
    args = ap.parse_args()
    hi3 = os.environ.get("HI3", "bin/hi3")
    here = os.path.dirname(os.path.abspath(__file__))
    script = os.path.join(here, "..", "..", "scripts", "hf-trace.py")
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "tm")
        subprocess.run([hi3, "-q", "init-model", "--preset", "tiny-moe", "--seed", "1", "-o", model], check=True)
        for seed in range(1, 100):
            rng = np.random.default_rng(seed)
            tokens = [int(t) for t in rng.integers(0, 256, N_TOKENS)]
            out = os.path.join(tmp, "hf.trace")
            subprocess.run([sys.executable, script, "--model", model, "--code", args.code, "--tokens",
                            ",".join(map(str, tokens)), "-o", out], check=True)
            t = load_file(out)
            margin = np.inf
            for name, v in t.items():
                if name.endswith("router_logits"):
                    p = np.exp(v - v.max(-1, keepdims=True))
                    p = np.sort(p / p.sum(-1, keepdims=True), axis=-1)[:, ::-1]
                    margin = min(margin, float(np.diff(-p[:, :3], axis=-1).min()))
            if margin >= ROUTE_MARGIN:
                break
            print("make_trace_fixture: seed %d: router margin %.2g, trying another" % (seed, margin), file=sys.stderr)
        else:
            raise SystemExit("make_trace_fixture: no clear routing in 99 tries")
        dst = os.path.join(args.out, "hf-tiny-moe.trace")
        os.replace(out, dst)
        with open(os.path.join(args.out, "hf-tiny-moe.tokens"), "w") as f:
            f.write(",".join(map(str, tokens)) + "\n")
        print("make_trace_fixture: %s, tokens %s, router margin %.2g" % (dst, tokens, margin), file=sys.stderr)


if __name__ == "__main__":
    main()
