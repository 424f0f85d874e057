#!/usr/bin/env python3
"""Write tests/fixtures/tools/python.safetensors with the `safetensors`
package (as any PyTorch user would) and python.expect: what numpy says
about each tensor, for tests/t3000-inspect.sh to hold `hi3 inspect` to.

    python3 tests/ref/tools_fixture.py tests/fixtures/tools

expect lines:
    stat NAME DTYPE NUMEL MIN MAX MEAN NAN INF   (min/max/mean over finite elements)
    slice NAME SPEC V1 V2 ...                    (the selection, row major)
"""
import os
import sys

import numpy as np
import torch
from safetensors.torch import save_file


def main(out):
    rng = np.random.default_rng(20240531)
    f32 = rng.standard_normal((3, 4, 5)).astype(np.float32)
    f32[0, 1, 2] = np.nan
    f32[2, 3, 4] = np.inf
    f32[1, 0, 0] = -np.inf
    f16 = (rng.standard_normal(7) * 100).astype(np.float16)
    f16[3] = np.nan
    tensors = {
        "f32": torch.from_numpy(f32),
        "bf16": torch.from_numpy(rng.standard_normal((2, 6)).astype(np.float32)).to(torch.bfloat16),
        "f16": torch.from_numpy(f16),
        "f64": torch.from_numpy(rng.standard_normal((2, 2))),
        "i64": torch.from_numpy(rng.integers(-10**12, 10**12, size=(2, 3), dtype=np.int64)),
        "i32": torch.from_numpy(rng.integers(-1000, 1000, size=(4,), dtype=np.int32)),
        "u8": torch.from_numpy(rng.integers(0, 256, size=(5,), dtype=np.uint8)),
        "bool": torch.tensor([True, False, True]),
        "layers.10.w": torch.zeros(2),
        "layers.2.w": torch.ones(2),
    }
    os.makedirs(out, exist_ok=True)
    save_file(tensors, os.path.join(out, "python.safetensors"),
              metadata={"format": "py.test", "note": "written by the safetensors package"})
    lines = []
    for name in sorted(tensors):
        t = tensors[name]
        a = t.to(torch.float64).numpy()
        fin = a[np.isfinite(a)]
        dt = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.float64: "F64",
              torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8", torch.bool: "BOOL"}[t.dtype]
        lines.append("stat %s %s %d %r %r %r %d %d" % (
            name, dt, a.size, float(fin.min()), float(fin.max()), float(fin.mean()),
            int(np.isnan(a).sum()), int(np.isinf(a).sum())))
    sel = f32[1, :, 2:5]
    lines.append("slice f32 1,:,2:5 " + " ".join(repr(float(v)) for v in sel.reshape(-1)))
    sel = tensors["i64"].numpy()[:, ::2]
    lines.append("slice i64 :,::2 " + " ".join(str(int(v)) for v in sel.reshape(-1)))
    with open(os.path.join(out, "python.expect"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/tools")
