#!/usr/bin/env python3
"""check_quantized.py -- an independent reader of what `hi3 quantize` writes:

    check_quantized.py SOURCE_DIR OUT_DIR

reads OUT_DIR as compressed-tensors (fp8, naive-quantized, per channel) or
transformers' bitsandbytes int8 layout says it is (config fields, tensor
names, dtypes, shapes), dequantizes every quantized weight as those
libraries do (fp8: q.float() * weight_scale; int8: q * SCB / 127) and
checks it against SOURCE_DIR: fp8 within one e4m3 rounding of source /
scale (half an e4m3 step there, times the scale), int8 within half a step
(SCB / 127 / 2, plus the fp16 rounding of the row maximum). Every other
tensor must be byte-equal to the source's. Exits 1 on any mismatch."""
import json
import math
import os
import sys

import torch
from safetensors import safe_open


def tensors(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) else ["model.safetensors"]
    out = {}
    for f in files:
        with safe_open(os.path.join(d, f), "pt") as h:
            for k in h.keys():
                out[k] = h.get_tensor(k)
    return out


def e4m3_half_step(a):
    """half the e4m3 spacing at |a| (a float tensor)"""
    a = a.abs().clamp(min=2.0 ** -6)
    return torch.pow(2.0, torch.floor(torch.log2(a)) - 3) / 2


def main():
    src, out = sys.argv[1], sys.argv[2]
    cfg = json.load(open(os.path.join(out, "config.json")))
    qc = cfg["quantization_config"]
    S, O = tensors(src), tensors(out)
    bad = 0
    worst = 0.0
    nq = 0
    if qc["quant_method"] == "compressed-tensors":
        g = qc["config_groups"]["group_0"]["weights"]
        assert qc["format"] == "naive-quantized" and g["type"] == "float" and g["num_bits"] == 8
        assert g["strategy"] == "channel" and g["symmetric"] and not g["dynamic"]
        for k, t in O.items():
            if t.dtype == torch.float8_e4m3fn:
                s = O[k[:-len("weight")] + "weight_scale"]
                assert s.shape == (t.shape[0], 1) and s.dtype == torch.float32, k
                w = S[k].float()
                deq = t.float() * s
                # plus the f32 roundings of w / s and q * s (a tie lands on the bound)
                tol = e4m3_half_step(w / s) * s * (1 + 1e-6) + 4 * w.abs() * 2.0 ** -24 + 1e-30
                d = (deq - w).abs()
                worst = max(worst, float((d / tol).max()))
                bad += int((d > tol).sum())
                nq += 1
                assert k[:-len(".weight")] not in qc["ignore"], k
    else:
        assert qc["quant_method"] == "bitsandbytes" and qc["load_in_8bit"] and not qc["load_in_4bit"]
        for k, t in O.items():
            if t.dtype == torch.int8:
                b = k[:-len("weight")]
                scb = O[b + "SCB"]
                assert scb.shape == (t.shape[0],) and scb.dtype == torch.float32, k
                assert int(O[b + "weight_format"]) == 0
                w = S[k].float()
                deq = t.float() * scb[:, None] / 127
                tol = scb[:, None] / 127 / 2 * (1 + 1e-3) + 1e-30
                d = (deq - w).abs()
                worst = max(worst, float((d / tol).max()))
                bad += int((d > tol).sum())
                nq += 1
    for k, t in O.items():
        if k in S and S[k].dtype == t.dtype and not torch.equal(S[k].view(torch.uint8), t.view(torch.uint8)):
            print("changed:", k)
            bad += 1
    missing = [k for k in S if k not in O]
    print(f"{qc['quant_method']}: {nq} quantized weights, worst error {worst:.3f} of the bound, "
          f"{bad} over, {len(missing)} source tensors missing")
    sys.exit(1 if bad or missing or not nq else 0)


if __name__ == "__main__":
    main()
