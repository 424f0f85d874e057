#!/usr/bin/env python3
"""hi3ref -- an independent PyTorch reference of the HunyuanImage-3.0 decoder
forward pass (hi3-batching(7), MODEL), for golden fixtures and speed comparisons.

Written from hi3-batching(7), MODEL, and the facts of the upstream model source, not
from hi3's C code. Everything is computed in fp32; bf16 checkpoints are
widened to fp32 on load (as hi3's CPU backend does).

Shape letters: B rows, T tokens per row in one call, C cache slots per row,
H hidden, n_h query heads, n_kv key/value heads, g = n_h / n_kv, d head dim,
V vocabulary, E experts, k experts per token.

Attention rule (the one hi3_forward uses): each query token t of row b has
an index q[b,t] (its column, or its cache slot) and a bound hi[b,t]; it
attends key j when j <= hi[b,t], or when q[b,t] and j lie in one
full-attention block [start, stop) of the row. A query admitting no key
outputs zeros.

Usage:
  python3 tests/ref/hi3ref.py bench --model DIR --batch B --prompt-len P --new N [--threads N]
"""
import argparse
import json
import math
import os
import struct
import sys
import time

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

F32_EPS = torch.finfo(torch.float32).eps


def per_layer(value, n_layers):
    """A config field that may be an int or a per-layer list."""
    if isinstance(value, list):
        if len(value) != n_layers:
            raise ValueError("per-layer list of %d entries for %d layers" % (len(value), n_layers))
        return [int(v) for v in value]
    return [int(value)] * n_layers


class Config:
    def __init__(self, path):
        with open(path) as f:
            c = json.load(f)
        self.raw = c
        self.V = c["vocab_size"]
        self.H = c["hidden_size"]
        self.I = c["intermediate_size"]
        self.n_layers = c["num_hidden_layers"]
        self.n_h = c["num_attention_heads"]
        self.n_kv = c.get("num_key_value_heads") or self.n_h
        self.d = c.get("attention_head_dim") or self.H // self.n_h
        self.g = self.n_h // self.n_kv
        self.eps = float(c["rms_norm_eps"])
        self.rope_theta = float(c.get("rope_theta", 10000.0))
        self.qk_norm = bool(c.get("use_qk_norm", False))
        self.mixed = bool(c.get("use_mixed_mlp_moe", False))
        self.skip = int(c.get("moe_layer_num_skipped", 0))
        self.norm_topk = bool(c.get("norm_topk_prob", True))
        self.scaling = float(c.get("routed_scaling_factor", 1.0))
        self.tie = bool(c.get("tie_word_embeddings", False))
        L = self.n_layers
        self.E = per_layer(c.get("num_experts", 1), L)
        self.topk = per_layer(c.get("moe_topk", 1), L)
        self.moe_I = per_layer(c.get("moe_intermediate_size", self.I), L)
        self.n_shared = per_layer(c.get("num_shared_expert", 1), L)
        if c.get("hidden_act", "silu") != "silu":
            raise ValueError("only hidden_act silu is supported")
        # upstream: every layer from moe_layer_num_skipped on is MoE when any
        # layer has more than one expert
        any_moe = max(self.E) > 1
        self.is_moe = [any_moe and i >= self.skip for i in range(L)]
        self.moe_layers = [i for i in range(L) if self.is_moe[i]]


def save_sorted(tensors, path, metadata):
    """safetensors.torch.save_file to path (through a temporary name), then
    list __metadata__ in sorted key order: the package writes it in hash
    order, and regenerated fixtures should be byte-identical."""
    tmp = path + ".tmp"
    save_file(tensors, tmp, metadata=metadata)
    with open(tmp, "r+b") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        text = f.read(n).decode("utf-8")
        hdr = json.loads(text)
        hdr["__metadata__"] = dict(sorted(hdr["__metadata__"].items()))
        new = json.dumps(hdr, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        if len(new) > n or json.loads(new) != json.loads(text):
            raise RuntimeError("%s: cannot reorder the header's metadata" % tmp)
        f.seek(8)
        f.write(new + b" " * (n - len(new)))
    os.replace(tmp, path)


def load_weights(model_dir):
    """All tensors of a checkpoint dir (single file or index.json shards)."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    w = {}
    for name in files:
        w.update(load_file(os.path.join(model_dir, name)))
    return w


def rms_norm(x, weight, eps):
    """HunyuanRMSNorm: normalise in fp32, then scale by the weight."""
    x32 = x.float()
    var = x32.pow(2).mean(-1, keepdim=True)
    return weight * (x32 * torch.rsqrt(var + eps)).to(x.dtype)


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def attention_mask(q_index, hi, blocks, n_keys):
    """(B, T, n_keys) bool: key j admitted for query t of row b.

    q_index (B, T) index of each query on the key axis; hi (B, T) last
    admitted key (-1: none by the causal rule); blocks (B, S, 2) [start, stop)
    full-attention blocks, or None."""
    j = torch.arange(n_keys).view(1, 1, n_keys)
    mask = j <= hi.long().unsqueeze(-1)
    if blocks is not None:
        for s in range(blocks.shape[1]):
            lo = blocks[:, s, 0].long().view(-1, 1, 1)
            up = blocks[:, s, 1].long().view(-1, 1, 1)
            q_in = (q_index.long().unsqueeze(-1) >= lo) & (q_index.long().unsqueeze(-1) < up)
            k_in = (j >= lo) & (j < up)
            mask = mask | (q_in & k_in)
    return mask


class Model:
    def __init__(self, model_dir):
        self.dir = model_dir
        self.cfg = Config(os.path.join(model_dir, "config.json"))
        raw = load_weights(model_dir)
        self.w = {}
        for k, v in raw.items():
            t = v.float().contiguous()
            # own the memory: load time, not the first forward, pays for reading the file
            self.w[k] = t.clone() if t.data_ptr() == v.data_ptr() else t
        c = self.cfg
        if "lm_head.weight" not in self.w:
            self.w["lm_head.weight"] = self.w["model.wte.weight"]
        # theta_m = rope_theta^(-2m/d), computed in fp32 as upstream does
        self.theta = 1.0 / (c.rope_theta ** (torch.arange(0, c.d, 2).float() / c.d))  # (d/2)

    # ------------------------------------------------------------ pieces

    def rope_cos_sin(self, rope):
        """cos, sin (B, T, d) for RoPE positions rope (B, T, 2) = (y, x).

        Element m < d/2 turns by y*theta_m for even m and x*theta_m for odd
        m; element m + d/2 repeats element m."""
        d = self.cfg.d
        which = torch.arange(d // 2) % 2                       # 0: y, 1: x
        pos = rope.long()[..., which].float()                 # (B, T, d/2)
        ang = pos * self.theta
        ang = torch.cat((ang, ang), dim=-1)                   # (B, T, d)
        return torch.cos(ang), torch.sin(ang)

    def mlp(self, prefix, x):
        """SwiGLU: [a | b] = gate_and_up_proj(x); down_proj(a * silu(b))."""
        ab = x @ self.w[prefix + ".gate_and_up_proj.weight"].t()
        a, b = ab.chunk(2, dim=-1)
        return (a * F.silu(b)) @ self.w[prefix + ".down_proj.weight"].t()

    def route(self, layer, x):
        """fp32 router, softmax, top-k; (ids (M, k), weights (M, k), p (M, E))."""
        c = self.cfg
        k = c.topk[layer]
        logits = x.float() @ self.w["model.layers.%d.mlp.gate.wg.weight" % layer].t()
        p = torch.softmax(logits, dim=-1)
        top_p, top_i = torch.topk(p, k, dim=-1)             # sorted, largest first
        if c.norm_topk and k > 1:
            top_w = top_p / torch.clamp(top_p.sum(-1, keepdim=True), min=F32_EPS)
        else:
            top_w = top_p * c.scaling
        return top_i, top_w, p

    def moe(self, layer, x):
        """x (M, H) -> (out (M, H), ids (M, k), weights (M, k), p (M, E))."""
        pre = "model.layers.%d.mlp" % layer
        ids, wts, p = self.route(layer, x)
        out = torch.zeros_like(x)
        for e in range(self.cfg.E[layer]):
            tok, slot = (ids == e).nonzero(as_tuple=True)
            if tok.numel() == 0:
                continue
            y = self.mlp("%s.experts.%d" % (pre, e), x[tok])
            out.index_add_(0, tok, y * wts[tok, slot].unsqueeze(-1))
        if self.cfg.mixed and self.cfg.n_shared[layer] > 0:
            out = out + self.mlp(pre + ".shared_mlp", x)
        return out, ids, wts, p

    def attend(self, q, k, v, mask):
        """q (B, n_h, T, d), k/v (B, n_kv, K, d), mask (B, T, K) -> (B, T, n_h d)."""
        c = self.cfg
        B, _, T, d = q.shape
        k = k.repeat_interleave(c.g, dim=1)                   # query head h reads kv head h // g
        v = v.repeat_interleave(c.g, dim=1)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(d)           # (B, n_h, T, K)
        m = mask.unsqueeze(1)
        s = s.masked_fill(~m, float("-inf"))
        pr = torch.softmax(s, dim=-1)
        pr = torch.where(m.any(-1, keepdim=True), pr, torch.zeros_like(pr))  # no key: zeros
        o = pr @ v                                             # (B, n_h, T, d)
        return o.transpose(1, 2).reshape(B, T, c.n_h * d)

    # ----------------------------------------------------------- forward

    def forward(self, ids, rope, hi, blocks=None, cache=None, slots=None, record=False, embeds=None, logits=True):
        """One forward call over B rows x T tokens.

        ids (B, T) token ids; rope (B, T, 2) RoPE (y, x); hi (B, T) last
        admitted key; blocks (B, S, 2) or None.
        Without a cache the keys are this call's own T tokens by column.
        With a cache (a StaticCache), K/V of the T tokens are first written
        to slots (B, T) (-1: not written) and the queries attend cache
        slots, the query index being its slot.
        embeds (B, T, H), when given, is the input instead of wte[ids] (the
        image and timestep rows of a diffusion call); logits=False skips
        ln_f and lm_head (image generation reads only "last").
        Returns a dict: logits (B, T, V), last (B, T, H) the last layer's
        output before ln_f, and with record=True also hidden
        (n_layers + 1, B, T, H), k/v per layer (B, n_kv, T, d), route ids /
        weights / probabilities per MoE layer (B, T, k) / (B, T, E)."""
        c = self.cfg
        B, T = ids.shape
        d, g = c.d, c.g
        ids = ids.long()
        cos, sin = self.rope_cos_sin(rope)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)         # (B, 1, T, d)
        if cache is None:
            mask = attention_mask(torch.arange(T).expand(B, T), hi, blocks, T)
        else:
            mask = attention_mask(slots, hi, blocks, cache.C)
        x = self.w["model.wte.weight"][ids] if embeds is None else embeds.float()   # (B, T, H)
        rec = {"hidden": [], "k": [], "v": [], "route_ids": [], "route_w": [], "route_p": []}
        for l in range(c.n_layers):
            pre = "model.layers.%d" % l
            if record:
                rec["hidden"].append(x.clone())
            h = rms_norm(x, self.w[pre + ".input_layernorm.weight"], c.eps)
            qkv = h @ self.w[pre + ".self_attn.qkv_proj.weight"].t()
            # per token: n_kv blocks of g query heads, one key head, one value head
            qkv = qkv.view(B, T, c.n_kv, g + 2, d)
            q = qkv[:, :, :, :g].reshape(B, T, c.n_h, d).transpose(1, 2)   # (B, n_h, T, d)
            k = qkv[:, :, :, g].transpose(1, 2)                          # (B, n_kv, T, d)
            v = qkv[:, :, :, g + 1].transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            if c.qk_norm:                                     # after RoPE
                q = rms_norm(q, self.w[pre + ".self_attn.query_layernorm.weight"], c.eps)
                k = rms_norm(k, self.w[pre + ".self_attn.key_layernorm.weight"], c.eps)
            if record:
                rec["k"].append(k.contiguous())
                rec["v"].append(v.contiguous())
            if cache is None:
                a = self.attend(q, k, v, mask)
            else:
                cache.store(l, k, v, slots)
                a = self.attend(q, cache.k[l], cache.v[l], mask)
            x = x + a @ self.w[pre + ".self_attn.o_proj.weight"].t()
            h = rms_norm(x, self.w[pre + ".post_attention_layernorm.weight"], c.eps)
            if c.is_moe[l]:
                y, ri, rw, rp = self.moe(l, h.reshape(B * T, c.H))
                y = y.view(B, T, c.H)
                if record:
                    rec["route_ids"].append(ri.view(B, T, -1))
                    rec["route_w"].append(rw.view(B, T, -1))
                    rec["route_p"].append(rp.view(B, T, -1))
            else:
                y = self.mlp(pre + ".mlp", h)
            x = x + y
        if record:
            rec["hidden"].append(x.clone())
        out = {"last": x}
        if logits:
            out["logits"] = (rms_norm(x, self.w["model.ln_f.weight"], c.eps) @ self.w["lm_head.weight"].t()).float()
        if record:
            out["hidden"] = torch.stack(rec["hidden"])
            for key in ("k", "v", "route_ids", "route_w", "route_p"):
                out[key] = rec[key]
        return out

    # -------------------------------------------------- prefill and decode

    def prefill(self, cache, ids, lengths, rope=None, blocks=None):
        """Prefill (hi3-batching(7), rules 1, 2, 5) of right-padded rows ids (B, L) with real lengths
        (B): position ids are the column indices (pads extend each row's own
        indices), K/V are written to slot = position id, query p attends
        slots <= p (and its image block); no query admits a slot >= L.
        Returns the logits (B, V) at each row's last real token."""
        B, L = ids.shape
        pos = torch.arange(L).expand(B, L)
        if rope is None:
            rope = pos.unsqueeze(-1).expand(B, L, 2)
        hi = pos.clone()
        out = self.forward(ids, rope, hi, blocks, cache=cache, slots=pos)
        last = (lengths.long() - 1).clamp(min=0)
        return out["logits"][torch.arange(B), last]

    def decode(self, cache, tok, p):
        """Decode step (hi3-batching(7), rules 3, 4): token tok (B) of each row at sequence index p
        (B), text RoPE (p, p), K/V written to slot p, attending slots [0, p].
        Returns the logits (B, V)."""
        B = tok.shape[0]
        p = p.long().view(B, 1)
        rope = p.unsqueeze(-1).expand(B, 1, 2)
        out = self.forward(tok.view(B, 1), rope, p, None, cache=cache, slots=p)
        return out["logits"][:, 0]


class StaticCache:
    """Per layer K and V of shape (B, n_kv, C, d), fp32."""

    def __init__(self, cfg, B, C):
        self.C = C
        self.k = [torch.zeros(B, cfg.n_kv, C, cfg.d) for _ in range(cfg.n_layers)]
        self.v = [torch.zeros(B, cfg.n_kv, C, cfg.d) for _ in range(cfg.n_layers)]

    def store(self, layer, k, v, slots):
        """k, v (B, n_kv, T, d) written at slots (B, T); -1 skips."""
        B, T = slots.shape
        for b in range(B):
            keep = slots[b] >= 0
            s = slots[b][keep].long()
            self.k[layer][b][:, s] = k[b][:, keep]
            self.v[layer][b][:, s] = v[b][:, keep]


# ------------------------------------------------------------------ bench

def cmd_bench(argv):
    ap = argparse.ArgumentParser(prog="hi3ref.py bench",
                                 description="prefill and greedy decode speed of the PyTorch reference")
    ap.add_argument("--model", required=True, help="checkpoint directory (config.json + model.safetensors)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch default)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random prompt tokens")
    a = ap.parse_args(argv)
    if a.batch < 1 or a.prompt_len < 1 or a.new < 0:
        ap.error("--batch and --prompt-len must be >= 1, --new >= 0")
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.set_grad_enabled(False)
    t0 = time.perf_counter()
    m = Model(a.model)
    t_load = time.perf_counter() - t0
    gen = torch.Generator().manual_seed(a.seed)
    ids = torch.randint(0, m.cfg.V, (a.batch, a.prompt_len), generator=gen)
    lengths = torch.full((a.batch,), a.prompt_len)
    cache = StaticCache(m.cfg, a.batch, a.prompt_len + a.new)
    t0 = time.perf_counter()
    logits = m.prefill(cache, ids, lengths)
    t_prefill = time.perf_counter() - t0
    p = lengths.clone()
    t0 = time.perf_counter()
    for _ in range(a.new):
        tok = logits.argmax(-1)
        logits = m.decode(cache, tok, p)
        p += 1
    t_decode = time.perf_counter() - t0
    res = {
        "impl": "torch-ref", "torch": torch.__version__, "threads": torch.get_num_threads(),
        "model": a.model, "batch": a.batch, "prompt_len": a.prompt_len, "new": a.new,
        "load_s": round(t_load, 4), "prefill_s": round(t_prefill, 4), "decode_s": round(t_decode, 4),
        "prefill_tok_s": round(a.batch * a.prompt_len / t_prefill, 2) if t_prefill > 0 else None,
        "decode_tok_s": round(a.batch * a.new / t_decode, 2) if a.new and t_decode > 0 else None,
    }
    print(json.dumps(res))
    return 0


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(argv) >= 2 else 2
    if argv[1] == "bench":
        return cmd_bench(argv[2:])
    print("hi3ref.py: unknown command '%s' (expected bench)" % argv[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
