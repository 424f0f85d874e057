#!/usr/bin/env python3
"""make_quant_fixtures.py -- quantized checkpoints in each published layout,
written from the formats' documented layouts (not with their libraries), for
tests/t2600-quant.sh; and, beside each, the same model with the quantized
matrices dequantized into plain F32, the reference hi3 must match.

    make_quant_fixtures.py BASE_DIR OUT_DIR

BASE_DIR is `hi3 init-model` output (the test makes it again, byte for byte:
see QUANT_MODEL in t2600). For every format F, OUT_DIR/F holds config.json
(with the format's quantization fields), hf_quant_config.json (ModelOpt),
model.safetensors.index.json mapping the unquantized tensors to
base.safetensors (the test links BASE_DIR/model.safetensors there) and the
quantized ones to quant.safetensors; OUT_DIR/F/ref holds the index of the
dequantized model (deq.safetensors, F32) and config.json without the
quantization fields.

Layouts (facts of the published tools):
- compressed-tensors (llm-compressor): config.json quantization_config
  {"quant_method": "compressed-tensors", "format": "float-quantized" (W8A8
  presets such as FP8_DYNAMIC) or "naive-quantized" (weight only),
  "config_groups": {"group_0": {"targets": ["Linear"], "weights": {num_bits 8,
  type float, strategy channel|tensor, symmetric, dynamic false}, ...}},
  "ignore": [...]}; tensors X.weight F8_E4M3 (N, K), X.weight_scale (N, 1) per
  channel or (1,) per tensor; value = q * scale in the scale's dtype.
- bitsandbytes (transformers' save of load_in_8bit / load_in_4bit models):
  int8: X.weight I8 (N, K), X.SCB F32 (N) = row absmax of the fp16 weight,
  X.weight_format U8 scalar 0 (row); value = q * SCB / 127. nf4: X.weight U8
  (ceil(N K / 2), 1), element 2i in the HIGH nibble of byte i over the flat
  tensor; X.weight.absmax per block of `blocksize` flat elements (F32, or U8
  codes of the nested 8-bit quantization with X.weight.nested_absmax F32 per
  nested block and X.weight.nested_quant_map F32 (256), offset = the mean
  subtracted), X.weight.quant_map F32 (16), and
  X.weight.quant_state.bitsandbytes__nf4: U8 bytes of the JSON {quant_type,
  blocksize, dtype, shape, [nested_blocksize, nested_dtype, nested_offset]};
  value = rounded to dtype (map[c] * absmax).
- NVIDIA ModelOpt: hf_quant_config.json {"producer": {...}, "quantization":
  {"quant_algo": "FP8" | "NVFP4" | "MIXED_PRECISION", "kv_cache_quant_algo",
  "exclude_modules", "quantized_layers": {module: {"quant_algo": ...,
  ["group_size": 16]}}}}; FP8: X.weight F8_E4M3, X.weight_scale F32 (),
  X.input_scale F32 (); NVFP4: X.weight U8 (N, K/2), element 2i in the LOW
  nibble, X.weight_scale F8_E4M3 (N, K/16), X.weight_scale_2 F32 (),
  X.input_scale F32 (); value = e2m1 * (scale * scale_2).
"""
import json
import os
import sys

import numpy as np
import torch
from safetensors.numpy import save_file as np_save
from safetensors.torch import load_file, save_file

# NF4 code values (QLoRA, Dettmers et al. 2023, table of the 16 levels)
NF4 = np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
                -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
                0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
                0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], dtype=np.float32)
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)


def dynamic_map():
    """A signed 8-bit dynamic (exponent + linear fraction) code of 256
    sorted values in [-1, 1], as bitsandbytes' nested quantization uses; hi3
    reads the map stored in the checkpoint, so only its layout matters."""
    vals = [0.0, 1.0]
    for e in range(7):
        n = 2 ** e
        base = 10.0 ** (-(6 - e))
        for i in range(n):
            vals.append(base * (0.1 + 0.9 * (i + 0.5) / n))
    pos = sorted(set(v for v in vals if v > 0))[:127]
    m = sorted([-v for v in pos] + [0.0] + pos)
    while len(m) < 256:
        m.append(1.0)
    return np.array(sorted(m), dtype=np.float32)


def bf16_round(x):
    """f32 -> nearest-even bf16, returned as f32."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16
    return u.astype(np.uint32).view(np.float32)


def e4m3(x):
    """f32 -> float8_e4m3fn codes (nearest even, saturated at 448)."""
    t = torch.from_numpy(np.clip(np.asarray(x, np.float32), -448, 448)).to(torch.float8_e4m3fn)
    return t


def e4m3_val(codes):
    return codes.to(torch.float32).numpy()


def matrices(names):
    """The matrices a tool quantizes here: attention, experts, shared MLP;
    kept: embeddings, norms, router gate, lm_head."""
    out = []
    for n in names:
        if not n.endswith(".weight") or not n.startswith("model.layers."):
            continue
        if any(s in n for s in ("qkv_proj", "o_proj", "gate_and_up_proj", "down_proj")):
            out.append(n)
    return out


def ct_fp8(w, per_channel, scale_dtype):
    amax = np.abs(w).max(axis=1, keepdims=True) if per_channel else np.abs(w).max().reshape(1)
    s = (amax / 448.0).astype(np.float32)
    s = np.where(s == 0, np.float32(1), s)
    st = torch.from_numpy(s).to(scale_dtype)
    sf = st.to(torch.float32).numpy()
    q = e4m3(w / sf)
    v = e4m3_val(q) * sf
    if scale_dtype == torch.bfloat16:
        v = bf16_round(v)
    return q, st, v.astype(np.float32)


def bnb_int8(w):
    scb = np.abs(w.astype(np.float16).astype(np.float32)).max(axis=1).astype(np.float32)
    scb = np.where(scb == 0, np.float32(1), scb)
    q = np.clip(np.round(w / scb[:, None] * 127), -127, 127).astype(np.int8)
    v = (q.astype(np.float32) * scb[:, None]) * np.float32(7.874015718698502e-3)
    return q, scb, v.astype(np.float32)


def bnb_nf4(w, blocksize, nested):
    N, K = w.shape
    flat = w.reshape(-1)
    nb = (flat.size + blocksize - 1) // blocksize
    pad = np.zeros(nb * blocksize, np.float32)
    pad[:flat.size] = flat
    absmax = np.abs(pad.reshape(nb, blocksize)).max(axis=1).astype(np.float32)
    absmax = np.where(absmax == 0, np.float32(1), absmax)
    norm = pad.reshape(nb, blocksize) / absmax[:, None]
    codes = np.abs(norm[..., None] - NF4[None, None, :]).argmin(axis=-1).reshape(-1)[:flat.size].astype(np.uint8)
    if codes.size % 2:
        codes = np.concatenate([codes, np.zeros(1, np.uint8)])
    packed = ((codes[0::2] << 4) | codes[1::2]).astype(np.uint8).reshape(-1, 1)
    t = {}
    state = {"quant_type": "nf4", "blocksize": blocksize, "dtype": "bfloat16", "shape": [N, K]}
    if nested:
        dmap = dynamic_map()
        offset = np.float32(absmax.mean())
        c = absmax - offset
        nn = 256
        nnb = (c.size + nn - 1) // nn
        cp = np.zeros(nnb * nn, np.float32)
        cp[:c.size] = c
        nabs = np.abs(cp.reshape(nnb, nn)).max(axis=1).astype(np.float32)
        nabs = np.where(nabs == 0, np.float32(1), nabs)
        a8 = np.abs((cp.reshape(nnb, nn) / nabs[:, None])[..., None] - dmap[None, None, :]).argmin(axis=-1)
        a8 = a8.reshape(-1)[:c.size].astype(np.uint8)
        absmax_used = (dmap[a8] * nabs[np.arange(c.size) // nn]).astype(np.float32) + offset
        t["absmax"] = a8
        t["nested_absmax"] = nabs
        t["nested_quant_map"] = dmap
        state.update({"nested_blocksize": nn, "nested_dtype": "float32", "nested_offset": float(offset)})
    else:
        absmax_used = absmax
        t["absmax"] = absmax
    t["quant_map"] = NF4.copy()
    t["quant_state.bitsandbytes__nf4"] = np.frombuffer(json.dumps(state).encode(), dtype=np.uint8).copy()
    idx = np.arange(flat.size)
    v = bf16_round(NF4[codes[:flat.size]] * absmax_used[idx // blocksize]).reshape(N, K)
    return packed, t, v.astype(np.float32)


def mo_fp8(w):
    s = np.float32(max(np.abs(w).max() / 448.0, 1e-12))
    q = e4m3(w / s)
    return q, s, (e4m3_val(q) * s).astype(np.float32)


def nvfp4(w):
    N, K = w.shape
    s2 = np.float32(max(np.abs(w).max() / (6.0 * 448.0), 1e-12))
    blk = w.reshape(N, K // 16, 16)
    bs = e4m3((np.abs(blk).max(axis=2) / 6.0 / s2).astype(np.float32))
    bsv = e4m3_val(bs)
    scale = (bsv * s2).astype(np.float32)
    safe = np.where(scale == 0, np.float32(1), scale)
    codes = np.abs((blk / safe[..., None])[..., None] - E2M1[None, None, None, :8]).argmin(axis=-1)
    codes = codes | np.where(blk < 0, 8, 0)
    codes = codes.reshape(N, K).astype(np.uint8)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    v = (E2M1[codes].reshape(N, K // 16, 16) * scale[..., None]).reshape(N, K)
    return packed, bs, s2, v.astype(np.float32)


def write_dir(out, name, cfg, base_names, qtensors, deq, extra_files=None, qcfg=None):
    d = os.path.join(out, name)
    os.makedirs(os.path.join(d, "ref"), exist_ok=True)
    wm = {n: "base.safetensors" for n in base_names}
    for k in qtensors:
        wm[k] = "quant.safetensors"
    save_file(qtensors, os.path.join(d, "quant.safetensors"))
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": dict(sorted(wm.items()))}, f, indent=1)
    c = dict(cfg)
    if qcfg is not None:
        c["quantization_config"] = qcfg
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(c, f, indent=1)
    for fn, obj in (extra_files or {}).items():
        with open(os.path.join(d, fn), "w") as f:
            json.dump(obj, f, indent=1)
    rm = {n: "base.safetensors" for n in base_names}
    for k in deq:
        rm[k] = "deq.safetensors"
    np_save({k: np.ascontiguousarray(v) for k, v in deq.items()}, os.path.join(d, "ref", "deq.safetensors"))
    with open(os.path.join(d, "ref", "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": dict(sorted(rm.items()))}, f, indent=1)
    with open(os.path.join(d, "ref", "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)


def main():
    base, out = sys.argv[1], sys.argv[2]
    cfg = json.load(open(os.path.join(base, "config.json")))
    sd = load_file(os.path.join(base, "model.safetensors"))
    names = sorted(sd)
    mats = matrices(names)
    plain = [n for n in names if n not in mats]
    W = {n: sd[n].to(torch.float32).numpy() for n in mats}
    experts = [n for n in mats if ".mlp.experts." in n]

    # compressed-tensors FP8: per-channel bf16 scales (FP8_DYNAMIC preset)
    for name, per_ch, sdt, fmt, acts in (("ct-fp8-channel", True, torch.bfloat16, "float-quantized", True),
                                         ("ct-fp8-tensor", False, torch.float32, "naive-quantized", False)):
        q, deq = {}, {}
        for n in mats:
            c, s, v = ct_fp8(W[n], per_ch, sdt)
            q[n] = c
            q[n[:-len(".weight")] + ".weight_scale"] = s
            deq[n] = v
        grp = {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "symmetric": True,
                                                   "group_size": None, "strategy": "channel" if per_ch else "tensor",
                                                   "block_structure": None, "dynamic": False, "actorder": None,
                                                   "observer": "minmax", "observer_kwargs": {}},
               "input_activations": {"num_bits": 8, "type": "float", "symmetric": True, "group_size": None,
                                     "strategy": "token", "block_structure": None, "dynamic": True,
                                     "actorder": None, "observer": None, "observer_kwargs": {}} if acts else None,
               "output_activations": None, "format": fmt}
        qc = {"quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
              "config_groups": {"group_0": grp}, "ignore": ["lm_head", "re:.*mlp.gate.wg$"],
              "kv_cache_scheme": None, "global_compression_ratio": None, "sparsity_config": {}, "version": "0.9.4"}
        qc["sparsity_config"] = None
        write_dir(out, name, cfg, plain, q, deq, qcfg=qc)

    # bitsandbytes int8
    q, deq = {}, {}
    for n in mats:
        c, scb, v = bnb_int8(W[n])
        b = n[:-len(".weight")]
        q[n] = torch.from_numpy(c)
        q[b + ".SCB"] = torch.from_numpy(scb)
        q[b + ".weight_format"] = torch.tensor(0, dtype=torch.uint8)
        deq[n] = v
    bnb = {"quant_method": "bitsandbytes", "_load_in_8bit": True, "_load_in_4bit": False,
           "load_in_8bit": True, "load_in_4bit": False, "llm_int8_threshold": 6.0,
           "llm_int8_skip_modules": ["lm_head", "wte", "gate", "ln_f"], "llm_int8_enable_fp32_cpu_offload": False,
           "llm_int8_has_fp16_weight": False, "bnb_4bit_quant_type": "fp4", "bnb_4bit_use_double_quant": False,
           "bnb_4bit_compute_dtype": "float32", "bnb_4bit_quant_storage": "uint8"}
    write_dir(out, "bnb-int8", cfg, plain, q, deq, qcfg=bnb)

    # bitsandbytes nf4, plain and with double quantization
    for name, nested in (("bnb-nf4", False), ("bnb-nf4-dq", True)):
        q, deq = {}, {}
        for n in mats:
            packed, t, v = bnb_nf4(W[n], 64, nested)
            q[n] = torch.from_numpy(packed)
            for k, a in t.items():
                q[n + "." + k] = torch.from_numpy(a)
            deq[n] = v
        c4 = dict(bnb, _load_in_8bit=False, _load_in_4bit=True, load_in_8bit=False, load_in_4bit=True,
                  bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=nested, bnb_4bit_compute_dtype="bfloat16")
        write_dir(out, name, cfg, plain, q, deq, qcfg=c4)

    # ModelOpt FP8 (per tensor), and the mixed form: FP8 attention/shared, NVFP4 routed experts
    for name, mixed in (("modelopt-fp8", False), ("modelopt-mixed", True)):
        q, deq, layers = {}, {}, {}
        for n in mats:
            b = n[:-len(".weight")]
            if mixed and n in experts:
                p, bs, s2, v = nvfp4(W[n])
                q[n] = torch.from_numpy(p)
                q[b + ".weight_scale"] = bs
                q[b + ".weight_scale_2"] = torch.tensor(s2)
                layers[b] = {"quant_algo": "NVFP4", "group_size": 16}
            else:
                c, s, v = mo_fp8(W[n])
                q[n] = c
                q[b + ".weight_scale"] = torch.tensor(s)
                layers[b] = {"quant_algo": "FP8"}
            q[b + ".input_scale"] = torch.tensor(np.float32(0.02))
            deq[n] = v
        quant = {"quant_algo": "MIXED_PRECISION" if mixed else "FP8", "kv_cache_quant_algo": None,
                 "exclude_modules": ["lm_head", "model.wte", "*mlp.gate.wg*"]}
        if mixed:
            quant["quantized_layers"] = layers
        hq = {"producer": {"name": "modelopt", "version": "0.37.0"}, "quantization": quant}
        write_dir(out, name, cfg, plain, q, deq, extra_files={"hf_quant_config.json": hq})


if __name__ == "__main__":
    main()
