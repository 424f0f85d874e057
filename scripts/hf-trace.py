#!/usr/bin/env python3
"""hf-trace -- record hi3's trace points (hi3-files(5), TRACE) with forward
hooks on the upstream PyTorch model of HunyuanImage-3.0, so that
`hi3 diff --first hi3.trace hf.trace` finds where hi3 and the reference part.

    python3 scripts/hf-trace.py --model DIR --cond COND [--segment SEG] -o hf.trace
    python3 scripts/hf-trace.py --model DIR --tokens 1,17,99 -o hf.trace

The model is loaded with its remote code (AutoModelForCausalLM,
trust_remote_code=True: the checkpoint's own modeling_hunyuan_image_3.py),
on any device (--device, --dtype). With --code DIR, the upstream Python
package hunyuan_image_3 in DIR is imported instead and only the text
decoder is built from DIR/config.json and the checkpoint's model.* and
lm_head weights (no VAE, no ViT): what a random checkpoint of `hi3
init-model` holds, and enough for text.

Each traced row is run alone, as hi3 replay does: its true prompt (the
conditions' first n_i tokens) followed by its response from --segment,
one causal forward of B = 1 with the conditions' image blocks attended in
full. Positions are the indices in that sequence, as in hi3's traces.

Points: embed; per layer in (decoder layer input), in_norm
(input_layernorm), q, k (query_layernorm / key_layernorm outputs: after
RoPE and qk-norm), v (the value slice of qkv_proj), attn (o_proj's input),
attn_out (o_proj's output), mlp_in (post_attention_layernorm), and for MoE
layers router_logits (gate.wg), experts and expert_weights (from the
gate's combine weights, descending, ties to the lower id), expert_out (each
chosen expert's output for the token, from the expert modules and the
dispatch mask; not with moe_impl flashinfer), shared_out (shared_mlp),
mlp_out (the MLP or MoE output); final (the decoder's last hidden state),
final_norm (ln_f), and logits.topk / topk_ids / lse (of lm_head's output,
in float64). Activations are stored as float32 whatever the model's dtype.

Needs torch, numpy, safetensors (and transformers for the remote code).
"""
import argparse
import importlib
import json
import os
import sys

import numpy as np

KINDS = ["embed", "in", "in_norm", "q", "k", "v", "attn", "attn_out", "mlp_in", "router_logits", "experts",
         "expert_weights", "expert_out", "shared_out", "mlp_out", "final", "final_norm", "logits"]


def parse_ranges(s):
    out = []
    for item in s.split(","):
        if ":" in item:
            a, b = item.split(":")
            out.append((int(a), int(b)))
        else:
            out.append((int(item), int(item) + 1))
    return out


def load_decoder(code_dir, model_dir, dtype, device):
    """The upstream text decoder (HunyuanImage3Model), ln_f and lm_head from
    config.json and the weights: a stand-in for HunyuanImage3ForCausalMM in
    gen_text mode."""
    import torch
    from safetensors.torch import load_file

    sys.path.insert(0, code_dir)
    mod = importlib.import_module("hunyuan_image_3.modeling_hunyuan_image_3")
    cfg_mod = importlib.import_module("hunyuan_image_3.configuration_hunyuan_image_3")
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg_json = json.load(f)
    config = cfg_mod.HunyuanImage3Config(**cfg_json)
    config._attn_implementation = "sdpa"

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = mod.HunyuanImage3Model(config)
            self.lm_head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            self.cached_rope = mod.CachedRoPE(config)
            self.config = config

        def forward(self, input_ids, attention_mask, position_ids):
            cos, sin = self.cached_rope(config.max_position_embeddings, input_ids.device, rope_image_info=None,
                                        position_ids=position_ids)
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             inputs_embeds=self.model.wte(input_ids), use_cache=False, return_dict=True,
                             custom_pos_emb=(cos, sin), mode="gen_text", first_step=True)
            return self.lm_head(self.model.ln_f(out[0]))

    dec = Decoder()
    state = {}
    index = os.path.join(model_dir, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    for name in files:
        for k, v in load_file(os.path.join(model_dir, name)).items():
            if k.startswith("model.") or k == "lm_head.weight":
                state[k] = v
    if "lm_head.weight" not in state and cfg_json.get("tie_word_embeddings"):
        state["lm_head.weight"] = state["model.wte.weight"]
    missing, unexpected = dec.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("rotary_emb.inv_freq")]
    if missing:
        raise SystemExit("hf-trace: weights missing from %s: %s" % (model_dir, ", ".join(missing[:8])))
    return dec.to(device=device, dtype=dtype).eval(), config


def load_remote(model_dir, dtype, device):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, trust_remote_code=True, torch_dtype=dtype,
                                                 device_map=device if device != "cpu" else None)
    if device == "cpu":
        model = model.to(device)
    model.eval()

    def forward(input_ids, attention_mask, position_ids):
        return model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                     mode="gen_text", use_cache=False, return_dict=True).logits

    model.trace_forward = forward
    return model, model.config


class Recorder:
    """Forward hooks that keep each point of one forward (B = 1) as float32."""

    def __init__(self, model, config, kinds):
        self.kinds = kinds
        self.points = {}
        self.handles = []
        self.cfg = config
        self.expert_outputs = {}
        core = model.model
        self.hook(core.wte, "embed", -1, lambda m, a, o: o)
        for l, layer in enumerate(core.layers):
            self.layer_hooks(l, layer)
        self.hook(core, "final", -1, lambda m, a, o: o[0] if isinstance(o, (tuple, list)) else o.last_hidden_state)
        self.hook(core.ln_f, "final_norm", -1, lambda m, a, o: o)
        self.hook(model.lm_head, "logits", -1, lambda m, a, o: o)

    def keep(self, kind, layer, value):
        """value: (B, T, ...), or (B T, w) as the router flattens it."""
        if kind in self.kinds:
            v = value.detach()
            v = (v.float() if v.is_floating_point() else v).cpu().numpy()
            self.points[(kind, layer)] = v[None] if v.ndim == 2 else v

    def hook(self, module, kind, layer, get):
        def fn(m, a, o):
            self.keep(kind, layer, get(m, a, o))
        self.handles.append(module.register_forward_hook(fn))

    def layer_hooks(self, l, layer):
        import torch
        attn = layer.self_attn
        g, d, nkv = attn.num_key_value_groups, attn.head_dim, attn.num_key_value_heads

        def pre(m, args, kwargs):
            x = args[0] if args else kwargs["hidden_states"]
            self.keep("in", l, x)
        self.handles.append(layer.register_forward_pre_hook(pre, with_kwargs=True))
        self.hook(layer.input_layernorm, "in_norm", l, lambda m, a, o: o)
        # q, k: after RoPE and qk-norm, (B, heads, T, d) -> (B, T, heads d)
        if getattr(attn, "use_qk_norm", False):
            self.hook(attn.query_layernorm, "q", l, lambda m, a, o: o.transpose(1, 2).flatten(2))
            self.hook(attn.key_layernorm, "k", l, lambda m, a, o: o.transpose(1, 2).flatten(2))
        self.hook(attn.qkv_proj, "v", l,
                  lambda m, a, o: o.reshape(o.shape[0], o.shape[1], nkv, g + 2, d)[:, :, :, g + 1].flatten(2))
        self.handles.append(attn.o_proj.register_forward_pre_hook(lambda m, a: self.keep("attn", l, a[0])))
        self.hook(attn.o_proj, "attn_out", l, lambda m, a, o: o)
        self.hook(layer.post_attention_layernorm, "mlp_in", l, lambda m, a, o: o)
        mlp = layer.mlp
        if hasattr(mlp, "gate"):
            self.hook(mlp.gate.wg, "router_logits", l, lambda m, a, o: o)

            def gate_out(m, a, o):
                self.gate_output = o
            self.handles.append(mlp.gate.register_forward_hook(gate_out))
            for e, expert in enumerate(mlp.experts):
                def expert_out(m, a, o, e=e):
                    self.expert_outputs[e] = o.detach().float().cpu().reshape(-1, o.shape[-1])
                self.handles.append(expert.register_forward_hook(expert_out))
            if hasattr(mlp, "shared_mlp"):
                self.hook(mlp.shared_mlp, "shared_out", l, lambda m, a, o: o)

            def moe_out(m, a, o):
                self.moe_points(l, mlp)
                self.keep("mlp_out", l, o)
            self.handles.append(mlp.register_forward_hook(moe_out))
        else:
            self.hook(mlp, "mlp_out", l, lambda m, a, o: o)

    def moe_points(self, l, mlp):
        import torch
        go = self.gate_output
        k = mlp.gate.moe_topk
        if isinstance(go, (tuple, list)) and len(go) == 4:
            combine, dispatch = go[1].float(), go[2]             # (S, E, C)
            w = combine.sum(-1)                                  # (S, E)
            S, E = w.shape
            # descending weight, ties to the lower expert id
            order = torch.argsort(-w + torch.arange(E, device=w.device) * 1e-30, dim=-1, stable=True)[:, :k]
            ids = order
            wts = torch.gather(w, 1, order)
            if "expert_out" in self.kinds and self.expert_outputs:
                H = next(iter(self.expert_outputs.values())).shape[-1]
                out = torch.zeros(S, k, H)
                slot = dispatch.float().argmax(-1).cpu()         # (S, E): the capacity slot
                for s in range(S):
                    for j in range(k):
                        e = int(ids[s, j])
                        out[s, j] = self.expert_outputs[e][int(slot[s, e])]
                self.points[("expert_out", l)] = out.numpy()[None]
        else:                                                    # easy top-k: (weights, index)
            wts, ids = go[0].float(), go[1]
        self.keep("experts", l, ids.reshape(1, -1, k).to(torch.int16))
        self.keep("expert_weights", l, wts.reshape(1, -1, k))
        self.expert_outputs = {}

    def close(self):
        for h in self.handles:
            h.remove()


def name_of(kind, layer):
    return "layer.%d.%s" % (layer, kind) if layer >= 0 else kind


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="the checkpoint directory")
    ap.add_argument("--code", help="a directory holding the upstream package hunyuan_image_3 (decoder only)")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--cond", help="a hi3 conditions file: the rows' prompts")
    src.add_argument("--tokens", help="one row of token ids, comma separated")
    ap.add_argument("--segment", help="a hi3 segment: each row's response, after its prompt")
    ap.add_argument("--rows", default="0", help="rows of --cond to trace (default 0)")
    ap.add_argument("--positions", help="positions to trace: P or A:B, comma separated (default all)")
    ap.add_argument("--points", help="kinds of point to record (default all): " + ",".join(KINDS))
    ap.add_argument("--topk", type=int, default=16, help="logits kept per token (default 16)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    ap.add_argument("-o", "--output", required=True, help="the trace file to write")
    args = ap.parse_args()

    import torch
    from safetensors.numpy import load_file, save_file

    # The upstream MoE calls torch.cuda.set_device(x.device.index) and
    # torch.cuda.nvtx.range: make both harmless off CUDA.
    set_device = torch.cuda.set_device
    torch.cuda.set_device = lambda d: None if d is None else set_device(d)
    if not torch.cuda.is_available():
        import contextlib
        torch.cuda.nvtx.range = lambda *a, **k: contextlib.nullcontext()

    kinds = set(args.points.split(",")) if args.points else set(KINDS)
    bad = kinds - set(KINDS)
    if bad:
        ap.error("--points: not a point: " + ",".join(sorted(bad)))
    ranges = parse_ranges(args.positions) if args.positions else None
    cfg_json = json.load(open(os.path.join(args.model, "config.json")))
    if args.dtype == "auto":
        dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(cfg_json.get("torch_dtype"), torch.float32)
    else:
        dtype = getattr(torch, args.dtype)
    meta = {"format": "hi3.trace", "format_version": "1", "stage": "hf-trace", "backend": "torch:" + args.device,
            "batch_invariant": "n/a", "weight_dtype": {torch.float32: "F32", torch.bfloat16: "BF16",
                                                         torch.float16: "F16"}[dtype],
            "n_layers": str(cfg_json["num_hidden_layers"]), "topk": str(args.topk), "points": ",".join(
                k for k in KINDS if k in kinds)}

    # the rows: (row, token ids, image blocks)
    rows = []
    if args.tokens:
        rows.append((0, [int(t) for t in args.tokens.split(",")], []))
    else:
        c = load_file(args.cond)
        seg = load_file(args.segment) if args.segment else None
        from safetensors import safe_open
        with safe_open(args.cond, "np") as f:
            cmeta = f.metadata() or {}
        if cmeta.get("model_fingerprint"):
            meta["model_fingerprint"] = cmeta["model_fingerprint"]
        meta["rows"] = str(c["input_ids"].shape[0])
        for r in [int(x) for x in args.rows.split(",")]:
            n = int(c["real_pos"][r])
            ids = [int(t) for t in c["input_ids"][r, :n]]
            if seg is not None:
                cu = seg["cu_seqlens"]
                ids += [int(t) for t in seg["tokens"][cu[r]:cu[r + 1]]]
            blocks = [(int(a), int(b)) for a, b in c["image_blocks"][r] if b > a]
            rows.append((r, ids, blocks))

    if args.code:
        model, config = load_decoder(args.code, args.model, dtype, args.device)
        forward = model.forward
    else:
        model, config = load_remote(args.model, dtype, args.device)
        forward = model.trace_forward
    rec = Recorder(model, config, kinds)

    out = {}
    index = {"rows": [], "positions": [], "tokens": []}
    for r, ids, blocks in rows:
        T = len(ids)
        keep = [p for p in range(T) if ranges is None or any(a <= p < b for a, b in ranges)]
        if not keep:
            continue
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        for a, b in blocks:
            mask[a:b, a:b] = True
        x = torch.tensor([ids], device=args.device)
        pos = torch.arange(T, device=args.device)[None]
        rec.points = {}
        with torch.no_grad():
            forward(x, mask[None, None].to(args.device), pos)
        for (kind, layer), v in rec.points.items():
            v = v[0][keep]
            if kind == "logits":
                v64 = v.astype(np.float64)
                mx = v64.max(-1, keepdims=True)
                lse = (mx[:, 0] + np.log(np.exp(v64 - mx).sum(-1))).astype(np.float32)
                order = np.lexsort((np.arange(v.shape[1])[None].repeat(len(v), 0), -v), axis=-1)[:, :args.topk]
                for name, val in (("logits.topk", np.take_along_axis(v, order, -1).astype(np.float32)),
                                  ("logits.topk_ids", order.astype(np.int32)), ("logits.lse", lse)):
                    out.setdefault(name, []).append(val)
            else:
                dt = np.int16 if kind == "experts" else np.float32
                out.setdefault(name_of(kind, layer), []).append(v.astype(dt))
        index["rows"] += [r] * len(keep)
        index["positions"] += keep
        index["tokens"] += [ids[p] for p in keep]
    rec.close()
    tensors = {k: np.ascontiguousarray(np.concatenate(v)) for k, v in out.items()}
    tensors["rows"] = np.array(index["rows"], dtype=np.int32)
    tensors["positions"] = np.array(index["positions"], dtype=np.int64)
    tensors["tokens"] = np.array(index["tokens"], dtype=np.int64)
    save_file(tensors, args.output, metadata=meta)
    print("hf-trace: %d tokens of %d rows, %d points into %s" % (len(index["rows"]), len(rows), len(out),
                                                                  args.output), file=sys.stderr)


if __name__ == "__main__":
    main()
