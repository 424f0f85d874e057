#!/usr/bin/env python3
"""check_interop.py -- safetensors interoperability between hi3 and Python's
`safetensors` package (issue 2, hi3-files(5)), run by `make check-ref`.

  HI3=bin/hi3 python3 tests/ref/check_interop.py --out tests/fixtures \
      --hi3-written FILE [--stage FILE]...

Checks, failing with a message and exit status 1:
 1. A model.safetensors written by `hi3 init-model` (f32 and bf16, same seed)
    loads with `safetensors`; its header is padded with spaces so that the
    data starts 64-byte aligned; the bf16 checkpoint holds exactly the
    round-to-nearest-even bf16 of the f32 checkpoint's values (converted by
    torch, not by hi3), and the fp32 router is identical in both.
 2. FILE, written by `tests/test-interop --write FILE` (hi3's writer),
    loads with `safetensors` and holds exactly the values of TABLE below
    (every dtype hi3 writes, bit for bit) and its metadata.
 3. Every --stage FILE (any hi3 stage file) loads, and its values equal a
    plain reading of the raw bytes with numpy.
 4. It writes tests/fixtures/python-written.safetensors with `safetensors`:
    the same TABLE, which tests/test-interop.c opens with hi3_st_open and
    checks bit for bit in `make check`.

TABLE is the contract shared with tests/test-interop.c: change both together.
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hi3ref  # noqa: E402

F32, F64, F16, BF16 = torch.float32, torch.float64, torch.float16, torch.bfloat16


def thirds(n, scale):
    """(i - 2) / 3 * scale in double, i < n."""
    return [(i - 2) / 3.0 * scale for i in range(n)]


def f32_then(values, dt):
    """Round each double to float32 first, then (RNE) to dt: what C does with
    hi3_f32_to_bf16((float)x) / hi3_f32_to_f16((float)x)."""
    return torch.tensor(values, dtype=F64).to(F32).to(dt)


# name -> tensor; see tests/test-interop.c for the same table in C
TABLE = {
    "f32": torch.tensor(thirds(6, 1.0), dtype=F64).to(F32).reshape(2, 3),
    "f64": torch.tensor(thirds(4, 1.0), dtype=F64),
    "bf16": f32_then(thirds(6, 7.0), BF16).reshape(3, 2),
    "f16": f32_then(thirds(5, 1000.0), F16),
    "bf16_special": f32_then([3.3895313892515355e38, -0.0, float("inf"), 2.0 ** -133], BF16),
    "f16_special": f32_then([65504.0, -65504.0, 2.0 ** -14, 2.0 ** -24, -0.0, float("inf")], F16),
    "i64": torch.tensor([-1, 0, 1 << 40, -(1 << 62) + 5, (1 << 63) - 1], dtype=torch.int64),
    "i32": torch.tensor([-(1 << 31), -1, 0, (1 << 31) - 1], dtype=torch.int32).reshape(2, 2),
    "i16": torch.tensor([-32768, 7, 32767], dtype=torch.int16),
    "i8": torch.tensor([-128, 0, 127], dtype=torch.int8),
    "u8": torch.tensor([0, 1, 128, 255], dtype=torch.uint8).reshape(2, 2),
    "bool": torch.tensor([True, False, False, True, True]),
    "scalar": torch.tensor(2.5, dtype=F32),
    "empty": torch.zeros(0, 3, dtype=F32),
}
META = {"format": "hi3.test.interop", "format_version": "1", "text": "h\u00e9llo \u2713 \"quoted\" \\ end"}

failures = []


def check(cond, what):
    print("%s: %s" % ("ok" if cond else "FAIL", what))
    if not cond:
        failures.append(what)
    return cond


def bits(t):
    """A tensor's raw bytes, so -0.0 and every NaN payload compare exactly."""
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def same_tensor(a, b):
    return a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape) and bits(a) == bits(b)


def raw_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        text = f.read(n)
    return n, text


NP_DT = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
         "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_, "U16": np.uint16, "U32": np.uint32,
         "U64": np.uint64, "BF16": np.uint16}


def check_raw_agrees(path):
    """safetensors' reading of every tensor equals numpy's reading of the
    raw bytes at the header's offsets."""
    n, text = raw_header(path)
    hdr = json.loads(text)
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    loaded = load_file(path)
    bad = []
    for name, info in hdr.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = np.frombuffer(data[a:b].tobytes(), dtype=NP_DT[info["dtype"]]).reshape(info["shape"])
        t = loaded[name]
        got = t.view(torch.int16).numpy().view(np.uint16) if t.dtype == BF16 else t.numpy()
        if got.shape != raw.shape or got.tobytes() != raw.tobytes():
            bad.append(name)
    return len(hdr) - ("__metadata__" in hdr), bad


def check_model_files(hi3, tmp):
    dirs = {}
    for dt in ("f32", "bf16"):
        d = os.path.join(tmp, "model-" + dt)
        subprocess.run([hi3, "init-model", "--preset", "tiny-moe", "--seed", "3", "--dtype", dt, "-o", d],
                       check=True, stdout=subprocess.DEVNULL)
        dirs[dt] = os.path.join(d, "model.safetensors")
    for dt, path in dirs.items():
        n, text = raw_header(path)
        check((8 + n) % 64 == 0 and text.decode().rstrip(" ") == text.decode().rstrip(),
              "init-model %s: header padded with spaces, data at %d (64-byte aligned)" % (dt, 8 + n))
        with safe_open(path, framework="pt") as f:
            check(len(list(f.keys())) > 0, "init-model %s: safetensors opens it (%d tensors, metadata %s)"
                  % (dt, len(list(f.keys())), f.metadata()))
        count, bad = check_raw_agrees(path)
        check(not bad, "init-model %s: safetensors' values of all %d tensors equal the raw bytes%s"
              % (dt, count, (" (differ: %s)" % bad) if bad else ""))
    a, b = load_file(dirs["f32"]), load_file(dirs["bf16"])
    check(sorted(a) == sorted(b), "init-model f32 and bf16 hold the same tensor names")
    bad = []
    for name, t in a.items():
        u = b[name]
        if name.endswith("mlp.gate.wg.weight"):
            ok_ = u.dtype == F32 and same_tensor(u, t)
        else:
            ok_ = t.dtype == F32 and u.dtype == BF16 and same_tensor(u, t.to(BF16))
        if not ok_:
            bad.append(name)
    check(not bad, "init-model bf16 = torch's bf16 rounding of init-model f32 for %d tensors, routers kept f32%s"
          % (len(a), (" (differ: %s)" % bad[:5]) if bad else ""))


def check_hi3_written(path):
    with safe_open(path, framework="pt") as f:
        meta = f.metadata() or {}
        names = sorted(f.keys())
    check(names == sorted(TABLE), "%s: tensor names %s" % (path, names))
    check(all(meta.get(k) == v for k, v in META.items()), "%s: metadata %r" % (path, meta))
    got = load_file(path)
    for name, want in TABLE.items():
        if name in got:
            check(same_tensor(got[name], want), "%s: '%s' %s %s bit for bit" % (
                path, name, str(want.dtype).replace("torch.", ""), tuple(want.shape)))
    n, _ = raw_header(path)
    check((8 + n) % 64 == 0, "%s: data starts 64-byte aligned (at %d)" % (path, 8 + n))


def check_stage(path):
    with safe_open(path, framework="pt") as f:
        meta = f.metadata() or {}
    count, bad = check_raw_agrees(path)
    check(not bad, "%s (format %s): safetensors' values of all %d tensors equal the raw bytes%s"
          % (path, meta.get("format", "?"), count, (" (differ: %s)" % bad) if bad else ""))


def write_python_fixture(out_dir):
    path = os.path.join(out_dir, "python-written.safetensors")
    meta = dict(META)
    meta["writer"] = "python safetensors (tests/ref/check_interop.py)"
    hi3ref.save_sorted({k: v.contiguous() for k, v in TABLE.items()}, path, meta)
    back = load_file(path)
    check(all(same_tensor(back[k], v) for k, v in TABLE.items()), "%s written and read back" % path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="fixture directory (tests/fixtures)")
    ap.add_argument("--hi3", default=os.environ.get("HI3"), help="the hi3 binary (default: $HI3)")
    ap.add_argument("--hi3-written", required=True, help="file written by tests/test-interop --write")
    ap.add_argument("--stage", action="append", default=[], help="an hi3 stage file to read (repeatable)")
    a = ap.parse_args()
    if not a.hi3:
        ap.error("set HI3 to the built hi3 binary (or pass --hi3)")
    with tempfile.TemporaryDirectory(prefix="hi3-interop.") as tmp:
        check_model_files(a.hi3, tmp)
    check_hi3_written(a.hi3_written)
    for s in a.stage:
        check_stage(s)
    write_python_fixture(a.out)
    if failures:
        print("check_interop: %d check(s) failed" % len(failures), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
