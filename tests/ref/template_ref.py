#!/usr/bin/env python3
"""Reference of the HunyuanImage-3.0 sequence template (hi3-batching(7)), for the
fixtures of tests/test-template.

Written from the facts of upstream tokenizer_wrapper.py (apply_chat_template
-> apply_general_template -> encode_general / encode_sequence), hunyuan.py
(stop tokens, 2-D RoPE, attention blocks) and image_processor.py (buckets,
ViT grid): a request becomes a message list (system, user cond images and
text, assistant cot and generated image), messages become sections by role,
each text section is encoded alone with the Hugging Face `tokenizers`
library, images become token blocks.

Writes into --out (tests/fixtures/template):
  tokenizer.json, tokenizer_config.json, config.json   a small model: a BPE
      tokenizer trained here, image_base_size 256, vae_downsample_factor 32,
      ViT max_num_patches 16 (so images are a few dozen tokens)
  full/config.json   the released image geometry (base 1024, factor 16, 1024
      ViT patches), no tokenizer_config.json (ids from config.json)
  cases.txt          one line per case: NAME MODEL_SUBDIR TEMPLATE DROP_THINK
  NAME.jsonl         the requests of the case
  NAME.safetensors   the expected conditions (batch, right padded)

Needs: numpy, tokenizers (the files are written here, byte for byte
reproducible; any safetensors reader opens them).
"""
import argparse
import json
import math
import os

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIALS = (["<|startoftext|>", "<|endoftext|>", "<pad>", "<boi>", "<eoi>", "<img>", "<cfg>", "<joint_img_sep>",
             "<timestep>", "<guidance>", "<answer>", "</answer>", "<think>", "</think>", "<recaption>",
             "</recaption>"] + ["<img_size_%d>" % s for s in (256, 512, 1024)] +
            ["<img_ratio_%d>" % i for i in range(33)])
SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")

CORPUS = [
    "A cat sitting on a red chair in the sunlight, photographed from above.",
    "Two dogs running along the beach at sunset; waves crash behind them.",
    "User: draw me a lighthouse. Assistant: Here is a lighthouse on a cliff.",
    "The quick brown fox jumps over the lazy dog 1234567890 times.",
    "You are a helpful assistant that writes detailed image descriptions.",
    "Think step by step about the composition, the colours and the light.",
    "一只猫坐在红色的椅子上。阳光明媚，天空很蓝。",
    "A watercolor painting of a mountain village with snow on the roofs.",
    "Recaption: a small boat on a calm lake, morning mist, soft light.",
    "It's a portrait of an old man with a beard; he's smiling, isn't he?",
]


def train_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=len(SPECIALS) + 256 + 400, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS * 20, trainer=trainer)
    return tok


# ---------------------------------------------------------------- geometry

class Geometry:
    """Image settings of config.json and the shapes they give."""

    def __init__(self, cfg):
        self.base = cfg.get("image_base_size", 1024)
        f = cfg.get("vae_downsample_factor", [16, 16])
        self.down = (f, f) if isinstance(f, int) else (f[0], f[-1])
        self.patch = cfg.get("patch_size", 1)
        vit = cfg.get("vit_processor") or {}
        self.vit_patch = vit.get("patch_size", 16)
        self.vit_max = vit.get("max_num_patches", 1024)
        self.buckets = self._buckets()

    def _buckets(self):
        # (B, B), then heights up by B/16 to 2B while widths go down to B/2,
        # and the other way round; sorted by H/W.
        b, step = self.base, self.base // 16
        out = [(b, b)]
        for grow_h in (True, False):
            h = w = b
            while not ((h >= 2 * b and w <= b // 2) if grow_h else (h <= b // 2 and w >= 2 * b)):
                if grow_h:
                    h, w = min(h + step, 2 * b), max(w - step, b // 2)
                else:
                    h, w = max(h - step, b // 2), min(w + step, 2 * b)
                out.append((h, w))
        return sorted(out, key=lambda hw: hw[0] / hw[1])

    def bucket_of(self, h, w):
        ratios = np.array([bh / bw for bh, bw in self.buckets])
        return int(np.argmin(np.abs(ratios - h / w)))

    def grid(self, bucket):
        bh, bw = self.buckets[bucket]
        return bh // (self.down[0] * self.patch), bw // (self.down[1] * self.patch)

    def vit_grid(self, h, w):
        p, eps = self.vit_patch, 1e-5

        def side(scale, n):
            return max(p, int(math.ceil(n * scale / p) * p))

        lo, hi = eps / 10, 100.0
        while hi - lo >= eps:
            mid = (lo + hi) / 2
            if (side(mid, h) / p) * (side(mid, w) / p) <= self.vit_max:
                lo = mid
            else:
                hi = mid
        return side(lo, h) // p, side(lo, w) // p


# ---------------------------------------------------------------- template

class Template:
    def __init__(self, model_dir, tokenizer_path, name, drop_think):
        with open(os.path.join(model_dir, "config.json")) as f:
            self.cfg = json.load(f)
        tcfg_path = os.path.join(model_dir, "tokenizer_config.json")
        tcfg = json.load(open(tcfg_path)) if os.path.exists(tcfg_path) else {}
        self.tok = Tokenizer.from_file(tokenizer_path)
        self.geo = Geometry(self.cfg)
        self.name = name
        self.drop_think = drop_think

        def by_name(key, cfg_key):
            if key in tcfg:
                return self.tok.token_to_id(tcfg[key])
            return self.cfg[cfg_key]

        self.bos = by_name("bos_token", "bos_token_id")
        self.eos = by_name("eos_token", "eos_token_id")
        self.pad = by_name("pad_token", "pad_token_id")

    def sid(self, name):
        i = self.tok.token_to_id(name)
        assert i is not None, name
        return i

    # -- request -> messages -> sections

    def messages(self, req):
        msgs = []
        if req.get("system"):
            msgs.append(("system", "text", req["system"]))
        for hw in req.get("cond_images", []):
            msgs.append(("user", "joint_image", hw))
        msgs.append(("user", "text", req["prompt"]))
        if "cot" in req:
            msgs.append(("assistant", "text", req["cot"]))
        if req.get("mode") == "gen_image":
            msgs.append(("assistant", "gen_image", req["image_size"]))
        return msgs

    def cot(self, text):
        """Sections of a chain of thought: think / recaption pairs alone."""
        if not text:
            return []
        for tag, droppable in (("think", True), ("recaption", False)):
            op, cl = "<%s>" % tag, "</%s>" % tag
            if op in text and cl in text:
                before = text.split(op)[0]
                after = text.split(cl)[1]
                inner = text.split(op)[1].split(cl)[0]
                mid = [] if (droppable and self.drop_think) else [
                    ("text", op, False), ("text", inner, True), ("text", cl, False)]
                return self.cot(before) + mid + self.cot(after)
        return [("text", text, True)]

    def gen_section(self, size):
        g = self.geo
        if isinstance(size, str) and size.startswith("<img_ratio_"):
            h, w = g.buckets[int(size[len("<img_ratio_"):-1])]
        elif isinstance(size, str):
            h, w = (int(v) for v in size.replace(":", "x").split("x"))
        else:
            h, w = size
        b = g.bucket_of(h, w)
        gh, gw = g.grid(b)
        return ("gen", gh, gw, b)

    def joint_section(self, hw):
        g = self.geo
        b = g.bucket_of(hw[0], hw[1])
        gh, gw = g.grid(b)
        ratio = g.bucket_of(*g.buckets[b])
        vh, vw = g.vit_grid(hw[0], hw[1])
        return ("joint", gh, gw, ratio, vh, vw)

    def sections(self, req):
        instruct = self.name == "instruct"
        sep = "\n\n" if instruct else ""
        ans = ("<answer>", "</answer>") if instruct else ("", "")
        roles = {"system": ("", sep), "user": ("User: " if instruct else "", sep),
                 "assistant": ("Assistant: " if instruct else "", sep)}
        msgs = self.messages(req)
        out, k, last_role = [], 0, None
        while k < len(msgs):
            for role in ("system", "user", "assistant"):
                group = []
                while k < len(msgs) and msgs[k][0] == role:
                    _, kind, content = msgs[k]
                    if kind == "text" and role == "system":
                        group.append(("text", content, False))
                    elif kind == "text" and role == "assistant":
                        pair = any("<%s>" % t in content and "</%s>" % t in content for t in ("think", "recaption"))
                        group += self.cot(content) if pair else [("text", content, True)]
                    elif kind == "text":
                        group.append(("text", content, True))
                    elif kind == "gen_image":
                        group += [("text", ans[0], False), self.gen_section(content), ("text", ans[1], False)]
                    else:
                        group.append(self.joint_section(content))
                    k += 1
                if group:
                    out += [("text", roles[role][0], False)] + group + [("text", roles[role][1], False)]
                    last_role = role
        if req.get("mode", "gen_text") != "gen_image":
            prefix = roles["assistant"][0]
            if last_role == "assistant":
                prefix = ""
                if out and out[-1][0] == "text" and out[-1][1] == roles["assistant"][1]:
                    out = out[:-1]
            task = req.get("bot_task", "auto")
            out.append(("text", {"auto": prefix, "image": "", "think": prefix + "<think>",
                                 "recaption": prefix + "<recaption>",
                                 "img_ratio": prefix + ans[0] + "<boi><img_size_%d>" % self.geo.base}[task],
                        False))
        return out

    # -- sections -> one row

    def encode(self, req, uncond):
        if "tokens" in req:
            ids = list(req["tokens"])
            return dict(ids=ids, rope=[(t, t) for t in range(len(ids))], blocks=[], ts=[],
                        masks={}, stops=self.stops(req))
        ids, runs, blocks, ts = [self.bos], [], [], []
        masks = {}

        def mark(name, a, b):
            masks.setdefault(name, set()).update(range(a, b))

        for sec in self.sections(req):
            if sec[0] == "text":
                t = self.tok.encode(sec[1], add_special_tokens=False).ids if sec[1] else []
                ids += [self.sid("<cfg>")] * len(t) if (uncond and sec[2]) else t
                continue
            ids += [self.sid("<boi>"), self.sid("<img_size_%d>" % self.geo.base),
                    self.sid("<img_ratio_%d>" % sec[3])]
            ts.append(len(ids))
            ids.append(self.sid("<timestep>"))
            start = len(ids)
            ids += [self.sid("<img>")] * (sec[1] * sec[2])
            runs.append((start, sec[1], sec[2]))
            if sec[0] == "gen":
                mark("gen_image_mask", start, len(ids))
            else:
                mark("cond_vae_mask", start, len(ids))
                ids.append(self.sid("<joint_img_sep>"))
                vit = len(ids)
                ids += [self.sid("<img>")] * self.geo.vit_max
                runs.append((vit, sec[4], sec[5]))
                mark("cond_vit_mask", vit, len(ids))
            blocks.append((start, len(ids)))
            ids.append(self.sid("<eoi>"))
        return dict(ids=ids, rope=rope_2d(len(ids), runs), blocks=blocks, ts=ts, masks=masks,
                    stops=self.stops(req))

    def stops(self, req):
        if "stop_tokens" in req:
            return list(req["stop_tokens"])
        size = req.get("image_size", "auto")
        extra = ([self.sid("<img_ratio_%d>" % i) for i in range(len(self.geo.buckets))] if size == "auto"
                 else [self.sid("<boi>")])
        ends = [self.sid("</recaption>"), self.sid("</answer>"), self.eos]
        return {"auto": [self.eos] + extra, "image": [self.eos], "think": ends, "recaption": ends,
                "img_ratio": extra}[req.get("bot_task", "auto")]


def rope_2d(n, runs):
    """(y, x) per position: 1-D for text, the centred 2-D grid for images
    (float32 grid, truncated, as upstream computes it)."""
    pos = np.stack([np.arange(n), np.arange(n)], axis=1).astype(np.int64)
    for start, h, w in runs:
        by = np.float32(start + (w * h - h) / 2)
        bx = np.float32(start + (w * h - w) / 2)
        ys = (by + np.arange(h, dtype=np.float32)).astype(np.int64)
        xs = (bx + np.arange(w, dtype=np.float32)).astype(np.int64)
        yy, xx = np.meshgrid(ys, xs, indexing="ij")
        pos[start:start + h * w, 0] = yy.reshape(-1)
        pos[start:start + h * w, 1] = xx.reshape(-1)
    return pos


# ---------------------------------------------------------------- batches

def conditions(tpl, reqs, template_name, seed_base=0):
    """The padded batch of hi3-batching(7), rule 1, and hi3-files(5) as a dict of arrays + metadata."""
    cfg_factor = 2 if reqs[0].get("mode") == "gen_image" else 1
    rows = []
    for g in range(cfg_factor):
        for i, req in enumerate(reqs):
            row = tpl.encode(req, uncond=g > 0)
            row["seed"] = req.get("seed", seed_base + i)
            rows.append(row)
    B, L = len(rows), max(len(r["ids"]) for r in rows)
    S = max([1] + [len(r["blocks"]) for r in rows])
    NS = max([1] + [len(r["stops"]) for r in rows])
    K = max([0] + [len(r["ts"]) for r in rows])
    t = {
        "input_ids": np.full((B, L), tpl.pad, np.int64),
        "position_ids": np.tile(np.arange(L, dtype=np.int64), (B, 1)),
        "real_pos": np.array([len(r["ids"]) for r in rows], np.int64),
        "rope_pos": np.stack([np.arange(L), np.arange(L)], 1)[None].repeat(B, 0).astype(np.int32),
        "image_blocks": np.zeros((B, S, 2), np.int32),
        "seeds": np.array([r["seed"] for r in rows], np.int64),
        "stop_tokens": np.full((B, NS), -1, np.int64),
    }
    for name in ("gen_image_mask", "cond_vit_mask", "cond_vae_mask"):
        if any(name in r["masks"] for r in rows):
            t[name] = np.zeros((B, L), np.uint8)
    if K:
        t["timestep_index"] = np.full((B, K), -1, np.int64)
    for b, r in enumerate(rows):
        n = len(r["ids"])
        t["input_ids"][b, :n] = r["ids"]
        t["rope_pos"][b, :n] = r["rope"]
        for k, blk in enumerate(r["blocks"]):
            t["image_blocks"][b, k] = blk
        t["stop_tokens"][b, :len(r["stops"])] = r["stops"]
        for name, cols in r["masks"].items():
            t[name][b, sorted(cols)] = 1
        if K:
            t["timestep_index"][b, :len(r["ts"])] = r["ts"]
    tasks = {q.get("bot_task", "auto") for q in reqs}
    meta = {
        "format": "hi3.conditions", "format_version": "1",
        "mode": reqs[0].get("mode", "gen_text"),
        "bot_task": tasks.pop() if len(tasks) == 1 else "mixed",
        "template": template_name if any("tokens" not in q for q in reqs) else "none",
        "tokenizer_hash": "", "model_fingerprint": "",
        "cfg_factor": str(cfg_factor), "pad_id": str(tpl.pad), "pad_positions": "continue",
        "requests": json.dumps(reqs, separators=(",", ":")),
    }
    return t, meta


def save_safetensors(path, tensors, meta):
    """A safetensors file with a sorted header padded to 64 bytes and the data
    ordered by element size, then name (so every tensor is aligned)."""
    dtypes = {np.dtype(np.int64): "I64", np.dtype(np.int32): "I32", np.dtype(np.uint8): "U8"}
    names = sorted(tensors, key=lambda k: (-tensors[k].dtype.itemsize, k))
    header, off = {"__metadata__": meta}, 0
    for k in names:
        a = tensors[k]
        header[k] = {"dtype": dtypes[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 64)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        for k in names:
            f.write(np.ascontiguousarray(tensors[k]).astype(tensors[k].dtype.newbyteorder("<")).tobytes())


# ---------------------------------------------------------------- cases

SYSTEMS = [None, "You are a helpful assistant that writes detailed image descriptions."]
COTS = [None, "", "The fox is quick.",
        "<think>colours: red and blue</think>Draw it big.",
        "Plan: <recaption>a red cat on a blue chair</recaption> done",
        "a</think>b<think>c <think>d</think> e</think>f"]
TASKS = ["auto", "image", "think", "recaption", "img_ratio"]
PROMPTS = ["A cat sitting on a red chair.", "一只猫坐在椅子上", "Two dogs' race at 3pm!\n", ""]


def cases():
    """(name, model_subdir, template, drop_think, requests)."""
    out = []
    for name in ("pretrain", "instruct"):
        text, cond, image = [], [], []
        k = 0
        for system in SYSTEMS:
            for cot in COTS:
                for task in TASKS:
                    req = {"prompt": PROMPTS[k % len(PROMPTS)], "bot_task": task, "seed": k}
                    if system:
                        req["system"] = system
                    if cot is not None:
                        req["cot"] = cot
                    if k % 11 == 5:
                        req["image_size"] = "1024x1024"
                    text.append(req)
                    k += 1
                img = {"prompt": PROMPTS[k % len(PROMPTS)], "mode": "gen_image",
                       "bot_task": TASKS[k % len(TASKS)],
                       "image_size": ["1024x768", [512, 2048], "16:9", "<img_ratio_31>", [100, 100]][k % 5]}
                if system:
                    img["system"] = system
                if cot is not None:
                    img["cot"] = cot
                if k % 3 == 0:
                    img["cond_images"] = [[300, 200], [64, 4000]][: 1 + k % 2]
                image.append(img)
                k += 1
        for j, task in enumerate(TASKS):
            req = {"prompt": PROMPTS[j % len(PROMPTS)], "bot_task": task,
                   "cond_images": [[1080, 1920], [500, 500], [4000, 50]][: 1 + j % 3]}
            if j % 2:
                req["system"] = SYSTEMS[1]
            if j % 3 == 1:
                req["cot"] = COTS[3 + j % 2]
            cond.append(req)
        out.append(("%s-gen_text" % name, ".", name, 0, text))
        out.append(("%s-i2t" % name, ".", name, 0, cond))
        out.append(("%s-gen_image" % name, ".", name, 0, image))
    out.append(("instruct-drop_think", ".", "instruct", 1,
                [{"prompt": "x", "cot": c, "bot_task": t} for c in COTS if c is not None for t in ("auto", "think")]))
    out.append(("instruct-drop_think-image", ".", "instruct", 1,
                [{"prompt": "y", "cot": c, "mode": "gen_image", "image_size": "1:1"} for c in COTS[3:]]))
    out.append(("pretrain-pretokenized", ".", "pretrain", 0,
                [{"tokens": [5, 6, 7]}, {"prompt": "hello", "bot_task": "think"},
                 {"tokens": [9], "stop_tokens": [3, 4], "seed": 77}]))
    out.append(("full-i2t", "full", "instruct", 0,
                [{"prompt": "What is in the picture?", "cond_images": [[1080, 1920]], "bot_task": "auto"}]))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = args.out
    os.makedirs(os.path.join(out, "full"), exist_ok=True)
    tok = train_tokenizer()
    tok.save(os.path.join(out, "tokenizer.json"), pretty=False)
    ids = {s: tok.token_to_id(s) for s in ("<|startoftext|>", "<|endoftext|>", "<pad>")}
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<pad>",
                   "add_bos_token": False, "add_eos_token": False}, f, indent=2)
        f.write("\n")
    small = {"vocab_size": tok.get_vocab_size(), "bos_token_id": ids["<|startoftext|>"],
             "eos_token_id": ids["<|endoftext|>"], "pad_token_id": ids["<pad>"], "image_base_size": 256,
             "vae_downsample_factor": [32, 32], "patch_size": 1,
             "vit_processor": {"patch_size": 16, "max_num_patches": 16}}
    full = {"vocab_size": tok.get_vocab_size(), "bos_token_id": ids["<|startoftext|>"],
            "eos_token_id": ids["<|endoftext|>"], "pad_token_id": ids["<pad>"]}
    for d, cfg in ((".", small), ("full", full)):
        with open(os.path.join(out, d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
            f.write("\n")
    lines = []
    for name, sub, tname, drop, reqs in cases():
        tpl = Template(os.path.join(out, sub), os.path.join(out, "tokenizer.json"), tname, drop)
        tensors, meta = conditions(tpl, reqs, tname)
        with open(os.path.join(out, name + ".jsonl"), "w") as f:
            for q in reqs:
                f.write(json.dumps(q, ensure_ascii=False) + "\n")
        save_safetensors(os.path.join(out, name + ".safetensors"), tensors, meta)
        lines.append("%s %s %s %d" % (name, sub, tname, drop))
        print("%-24s B %3d  L %5d" % (name, tensors["input_ids"].shape[0], tensors["input_ids"].shape[1]))
    with open(os.path.join(out, "cases.txt"), "w") as f:
        f.write("# NAME MODEL_SUBDIR TEMPLATE DROP_THINK (made by tests/ref/template_ref.py)\n")
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
