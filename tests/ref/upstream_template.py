#!/usr/bin/env python3
"""What the upstream Instruct code makes of hi3's requests, for tests/test-upstream.

The code is upstream's own, not a port: hunyuan_image_3/ of the public mirror
suryatmodulus/HunyuanImage-3.0 at commit 1201fe8 ("Add support for
hunyuanimage-3.0-Instruct & hunyuanimage-3.0-Instruct-Distil"), extracted
with `git show` into a temporary directory and imported from there. Its
tokenizer (tokenization_hunyuan_image_3.py) runs on our tokenizer.json
through transformers and `tokenizers`; the model's input preparation
(modeling_hunyuan_image_3.py: generate_image, prepare_model_inputs,
preprocess_inputs, build_batch_rope_image_info) and the image processor
(image_processor.py: buckets, cond images, full-attention slices) run on an
object that has the model's configuration but no weights: the calls that
would run the network (generate, the VAE and ViT encoders, the static
cache) are replaced by ones that record their arguments. So each case gives:

  rows            the token ids of every row (cond, then uncond for CFG), as
                  [id, count] runs
  rope            each row's 2-D RoPE positions (build_2d_rope, all_pos)
                  where they are not (t, t), as runs [t, y, x, n]: columns
                  t .. t+n-1 at (y, x), (y, x+1), ...
  blocks          each row's full-attention slices (prepare_full_attn_slices)
  timestep_index  the <timestep> positions (cond images and generated image)
  masks           gen_image / cond VAE / cond ViT token runs
  stops           the stop tokens generate would be called with (null when
                  upstream has none: bot_task image in gen_text is a KeyError
                  there)
  forced_after    generate_image's stage transitions (trigger, forced ids)
  greedy_among    the ratio-slice logits processor (trigger, the ids it
                  keeps, greedy)

The base model runs the code before the Instruct release (the mirror
Tencent-Hunyuan/HunyuanImage-3.0 at 1d011c8: tokenizer_wrapper.py, hunyuan.py,
image_processor.py), extracted the same way: its prepare_model_inputs gives
the base sets (text and gen_image requests; its prompt path has no cond
images).

Case sets (--out tests/fixtures/upstream):
  tiny-instruct, tiny-distil   the presets of `hi3 init-model` (made here with
                               $HI3), their own files
  tensors-PRESET.txt           the names and shapes of upstream's model class
                               built with each preset's config.json
  tiny-release, released-base  the base code on the tiny-release preset and on
                               tests/fixtures/released (the released files
                               verbatim, the release-id tokenizer)
  released-instruct            tests/fixtures/released/instruct: the released
                               config.json made Instruct, and a tokenizer.json
                               with the release's special-token ids (written
                               here from the tiny-release one: <img_ratio_33>
                               is 130103)

Needs: a Python with (torch 2.8, torchvision 0.23, transformers
4.56.2, tokenizers, pillow, numpy, diffusers, einops) and git.
"""
import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import types

# UPSTREAM_MIRRORS: the folder of the git mirrors, one OWNER+NAME/repo each
MIRRORS = os.environ.get("UPSTREAM_MIRRORS", "")
MIRROR = os.path.join(MIRRORS, "suryatmodulus+HunyuanImage-3.0", "repo")
COMMIT = "1201fe8"
# the base model's code: Tencent-Hunyuan/HunyuanImage-3.0 before the Instruct
# release (tokenizer_wrapper.py, hunyuan.py)
BASE_MIRROR = os.path.join(MIRRORS, "Tencent-Hunyuan+HunyuanImage-3.0", "repo")
BASE_COMMIT = "1d011c8"
BASE_FILES = ["tokenizer_wrapper", "configuration_hunyuan", "hunyuan", "image_processor", "system_prompt",
              "autoencoder_kl_3d", "hunyuan_image_3_pipeline", "siglip2"]
FILES = ["tokenization_hunyuan_image_3", "configuration_hunyuan_image_3", "modeling_hunyuan_image_3",
         "image_processor", "system_prompt", "autoencoder_kl_3d", "hunyuan_image_3_pipeline", "siglip2",
         "cache_utils"]


def extract(mirror, commit, dest, files=FILES, package="hunyuan_image_3"):
    pkg = os.path.join(dest, package)
    os.makedirs(pkg)
    for f in files:
        src = subprocess.run(["git", "-C", mirror, "show", "%s:hunyuan_image_3/%s.py" % (commit, f)],
                             check=True, capture_output=True).stdout
        with open(os.path.join(pkg, f + ".py"), "wb") as fh:
            fh.write(src)
    # a package of just these modules (upstream's __init__ imports the rest)
    open(os.path.join(pkg, "__init__.py"), "w").close()


def import_upstream(dest):
    # transformers 4.56.2 refuses, at import, the huggingface-hub 2.x that the
    # venv's diffusers needs; nothing here uses the hub, so skip the check.
    stub = types.ModuleType("transformers.dependency_versions_check")
    stub.dep_version_check = lambda *a, **k: None
    sys.modules["transformers.dependency_versions_check"] = stub
    sys.path.insert(0, dest)
    import torch
    empty = torch.empty

    def empty_off_cuda(*a, **k):   # the VAE class allocates on "cuda" at import of an instance
        if k.get("device") == "cuda":
            k["device"] = "cpu"
        return empty(*a, **k)
    torch.empty = empty_off_cuda
    import hunyuan_image_3.modeling_hunyuan_image_3 as M
    import hunyuan_image_3.tokenization_hunyuan_image_3 as T
    import hunyuan_image_3.image_processor as IP
    import hunyuan_image_3.system_prompt as SP
    from hunyuan_image_3.configuration_hunyuan_image_3 import HunyuanImage3Config
    return M, T, IP, SP, HunyuanImage3Config


def import_base():
    """The base code, as the package hunyuan_image_3_base (extracted beside)."""
    import hunyuan_image_3_base.hunyuan as M
    import hunyuan_image_3_base.tokenizer_wrapper as TW
    import hunyuan_image_3_base.image_processor as IP
    import hunyuan_image_3_base.system_prompt as SP
    from hunyuan_image_3_base.configuration_hunyuan import HunyuanImage3Config
    return M, TW, IP, SP, HunyuanImage3Config


def rope_runs(pos):
    runs = []
    for t, (y, x) in enumerate(pos):
        if (y, x) == (t, t):
            continue
        r = runs[-1] if runs else None
        if r and r[0] + r[3] == t and r[1] == y and r[2] + r[3] == x:
            r[3] += 1
        else:
            runs.append([t, y, x, 1])
    return runs


class Captured(Exception):
    def __init__(self, kwargs):
        super().__init__("generate called")
        self.kwargs = kwargs


def load(path):
    with open(path) as f:
        return json.load(f)


class Upstream:
    """The model's input preparation without the network, for one model dir."""

    def load_model(self, mods, model_dir):
        """The model directory's config (upstream's class), generation
        config and tokenizer_config."""
        from transformers import GenerationConfig
        self.M, self.SP = mods[0], mods[3]
        gen = load(os.path.join(model_dir, "generation_config.json"))
        self.config = mods[4](**load(os.path.join(model_dir, "config.json")))
        self.config._attn_implementation = "sdpa"
        self.gen = GenerationConfig(**gen)
        return gen, load(os.path.join(model_dir, "tokenizer_config.json"))

    def __init__(self, mods, model_dir, tokenizer_path, moved_layout):
        M, T, IP = mods[0], mods[1], mods[2]
        import torch
        gen, tcfg = self.load_model(mods, model_dir)
        tok = T.HunyuanImage3TokenizerFast(
            tokenizer_file=tokenizer_path, bos_token=tcfg["bos_token"], eos_token=tcfg["eos_token"],
            pad_token=tcfg["pad_token"], model_version=self.config.model_version,
            sequence_template=gen.get("sequence_template", "instruct"))
        if moved_layout:
            # the conversation's stop id is the release's <|endoftext|> (127957),
            # written as a number upstream; with the moved ids it is that token's
            tok.conversation.stop_token_ids = [tok.eos_token_id]
        self.tok = tok
        self.ip = IP.HunyuanImage3ImageProcessor(self.config)

        class Fake(M.HunyuanImage3ForCausalMM):
            device = torch.device("cpu")
            dtype = torch.float32

            def __init__(self):
                pass

            def _encode_cond_image(self, *a, **k):
                return None, None, None

            def _prepare_vit_image_kwargs(self, *a, **k):
                return None

            def generate(self, *a, **k):
                raise Captured(k)

        fake = Fake.__new__(Fake)
        for k, v in (("config", self.config), ("generation_config", self.gen), ("_tokenizer", tok),
                     ("image_processor", self.ip)):
            object.__setattr__(fake, k, v)
        self.fake = fake
        M.HunyuanStaticCache = lambda **k: None

    # ---------------------------------------------------------------- helpers

    def images(self, req):
        from PIL import Image
        return [Image.new("RGB", (w, h), (128, 64, 32)) for h, w in req.get("cond_images", [])] or None

    def system(self, req, bot_task):
        s = req.get("system")
        if s is None:
            name, custom = self.gen.use_system_prompt, None
        elif s.replace("_", "").isalnum() and " " not in s:
            name, custom = s, None
        else:
            name, custom = "custom", s
        return name, custom

    def rows_of(self, out, rope_info):
        """Rows of a tokenizer output: ids, rope, blocks, timesteps, masks."""
        M = self.M
        tokens = out.tokens
        R, L = tokens.shape
        d = self.config.attention_head_dim
        if rope_info is None:
            rope_info = [None] * R
        rows = []
        for i in range(R):
            _, _, all_pos = M.build_batch_2d_rope(seq_len=L, n_elem=d, image_infos=[rope_info[i]],
                                                 return_all_pos=True)
            pos = all_pos[0].reshape(L, 2).tolist()
            slices = self.ip.prepare_full_attn_slices(out, i)
            ts = []
            for key in ("cond_timestep_scatter_index", "gen_timestep_scatter_index"):
                v = out[key] if key in out and out[key] is not None else None
                if v is not None:
                    ts += [int(x) for x in v[i].reshape(-1).tolist()]

            def runs(mask):
                if mask is None:
                    return []
                m, res, start = mask[i].tolist(), [], None
                for t, on in enumerate(m + [False]):
                    if on and start is None:
                        start = t
                    elif not on and start is not None:
                        res.append([start, t])
                        start = None
                return res
            ids, rle = [int(x) for x in tokens[i].tolist()], []
            for x in ids:
                if rle and rle[-1][0] == x:
                    rle[-1][1] += 1
                else:
                    rle.append([x, 1])
            rows.append({
                "input_ids": rle,
                "rope": rope_runs(pos),
                "blocks": [[s.start, s.stop] for s in slices],
                "timestep_index": sorted(ts),
                "gen_image_mask": runs(out.gen_image_mask),
                "cond_vae_mask": runs(out.vae_image_mask),
                "cond_vit_mask": runs(out.vit_image_mask),
            })
        return rows

    def ids_list(self, v):
        if v is None:
            return None
        return [int(x) for x in (v if isinstance(v, (list, tuple)) else [v])]

    def rules(self, k):
        forced, greedy = [], []
        for trigger, ids in k.get("stage_transitions") or []:
            forced.append([int(trigger), [int(x) for x in ids]])
        procs = k.get("logits_processor") or []
        for p in procs:
            name = type(p).__name__
            if name == "_ConditionalSliceVocabLogitsProcessor":
                keep = list(range(p.vocab_start, p.vocab_end))
                for a, b in p.other_slices:
                    keep += list(range(a, b))
                assert p.force_greedy
                for trig in sorted(p.trigger_token_ids):
                    greedy.append([int(trig), keep])
            elif name == "SliceVocabLogitsProcessor":
                keep = list(range(p.vocab_start, p.vocab_end))
                for a, b in p.other_slices:
                    keep += list(range(a, b))
                # every step, here only the first (max_new_tokens=1): the
                # token after the prompt's last, <img_size_B>
                greedy.append([int(k["input_ids"][0, -1]), keep])
        return forced, greedy

    # ------------------------------------------------------------------ cases

    def case(self, req):
        """Upstream's rows, stops and rules for one hi3 request."""
        mode = req.get("mode", "gen_text")
        bot_task = req.get("bot_task", self.gen.bot_task)
        image_size = req.get("image_size", "auto")
        if isinstance(image_size, list):
            image_size = tuple(image_size)
        elif isinstance(image_size, int) or (isinstance(image_size, str) and image_size.isdigit()):
            image_size = "<img_ratio_%d>" % int(image_size)
        name, custom = self.system(req, bot_task)
        kw = dict(prompt=req["prompt"], image=self.images(req), cot_text=req.get("cot"))
        fake = self.fake
        result = {"stops": None, "forced_after": [], "greedy_among": []}
        if mode == "gen_image" or bot_task == "image":
            # generate_image's last stage (gen_image), or the sequence a
            # gen_text "image" task gets (preprocess_inputs; upstream has no
            # stop tokens for it)
            sp = self.SP.get_system_prompt(name, bot_task, custom)
            sp = sp.strip() if sp is not None else ""
            if mode == "gen_image":
                mi = fake.prepare_model_inputs(**kw, system_prompt=sp, image_size=image_size, mode="gen_image",
                                               bot_task="auto")
                result["rows"] = self.rows_of(mi["tokenizer_output"], mi["rope_image_info"])
            else:
                res = fake.preprocess_inputs(**kw, system_prompt=sp, image_size=image_size, mode="gen_text",
                                             bot_task="image", cfg_factor=1)
                out = res["output"]
                result["rows"] = self.rows_of(out, fake.build_batch_rope_image_info(out, res["sections"]))
            return result
        if bot_task == "auto":
            sp = self.SP.get_system_prompt(name, bot_task, custom)
            sp = sp.strip() if sp is not None else ""
            mi = fake.prepare_model_inputs(**kw, system_prompt=sp, image_size=image_size, mode="gen_text",
                                           bot_task="auto")
            result["stops"] = self.ids_list(mi["eos_token_id"])
            result["rows"] = self.rows_of(mi["tokenizer_output"], mi["rope_image_info"])
            return result
        if req.get("cot") is not None and bot_task != "img_ratio":
            # continuing a given cot: prepare_model_inputs (generate_image's
            # CoT stage never has one); think_recaption starts as think
            sp = self.SP.get_system_prompt(name, bot_task, custom)
            sp = sp.strip() if sp is not None else ""
            mi = fake.prepare_model_inputs(**kw, system_prompt=sp, image_size=image_size, mode="gen_text",
                                           bot_task=bot_task.split("_")[0])
            result["stops"] = self.ids_list(mi["eos_token_id"])
            result["rows"] = self.rows_of(mi["tokenizer_output"], mi["rope_image_info"])
            return result
        # think, recaption, think_recaption, img_ratio: generate_image's text stage
        try:
            fake.generate_image(prompt=req["prompt"], image=kw["image"], cot_text=req.get("cot"),
                                image_size=image_size, use_system_prompt=name, system_prompt=custom,
                                bot_task=bot_task, seed=0)
            raise AssertionError("generate_image did not call generate")
        except Captured as c:
            k = c.kwargs
        stops = k.get("final_stop_tokens") if k.get("stage_transitions") else k.get("eos_token_id")
        result["stops"] = self.ids_list(stops)
        result["forced_after"], result["greedy_among"] = self.rules(k)
        result["rows"] = self.rows_of(k["tokenizer_output"], k["rope_image_info"])
        return result

    def buckets(self):
        g = self.ip.vae_reso_group
        return [[r.h, r.w] for r in g.data]


class BaseUpstream(Upstream):
    """The base model's code: TokenizerWrapper and hunyuan.py's
    prepare_model_inputs (its prompt path has no cond images, a TODO
    upstream)."""

    def __init__(self, mods, model_dir, tokenizer_path):
        M, TW, IP = mods[0], mods[1], mods[2]
        import torch
        from transformers import PreTrainedTokenizerFast
        _, tcfg = self.load_model(mods, model_dir)
        tok = PreTrainedTokenizerFast(tokenizer_file=tokenizer_path, bos_token=tcfg["bos_token"],
                                      eos_token=tcfg["eos_token"], pad_token=tcfg["pad_token"])
        self.tkw = TW.TokenizerWrapper(tok)
        self.ip = IP.HunyuanImage3ImageProcessor(self.config)
        seen = {}
        outer_tkw = self.tkw

        class Recording:
            """The wrapper, keeping what apply_chat_template gave."""
            def __getattr__(self, name):
                return getattr(outer_tkw, name)

            def apply_chat_template(self, *a, **k):
                out = outer_tkw.apply_chat_template(*a, **k)
                seen["out"] = out
                return out

        class Fake(M.HunyuanImage3ForCausalMM):
            device = torch.device("cpu")
            dtype = torch.float32

            def __init__(self):
                pass

        fake = Fake.__new__(Fake)
        for k, v in (("config", self.config), ("generation_config", self.gen), ("_tkwrapper", Recording()),
                     ("image_processor", self.ip)):
            object.__setattr__(fake, k, v)
        self.fake, self.seen = fake, seen
        M.HunyuanStaticCache = lambda **k: None

    def case(self, req):
        mode = req.get("mode", "gen_text")
        bot_task = req.get("bot_task", self.gen.bot_task)
        image_size = req.get("image_size", "auto")
        if isinstance(image_size, int) or (isinstance(image_size, str) and image_size.isdigit()):
            image_size = "<img_ratio_%d>" % int(image_size)
        name, custom = self.system(req, bot_task)
        sp = self.SP.get_system_prompt(name, bot_task, custom)     # the base code does not strip it
        mi = self.fake.prepare_model_inputs(prompt=req["prompt"], cot_text=req.get("cot"), system_prompt=sp,
                                            image_size=image_size, mode=mode, bot_task=bot_task)
        out = self.seen["out"]["output"]
        rope_info = self.fake.build_batch_rope_image_info(out, self.seen["out"]["sections"])
        return {"stops": self.ids_list(mi["eos_token_id"]) if mode == "gen_text" else None,
                "forced_after": [], "greedy_among": [], "rows": self.base_rows(out, rope_info)}

    def base_rows(self, out, rope_info):
        rows = self.rows_of(out, rope_info)
        # the base code's full-attention blocks are its image slices (the
        # attention mask of _prepare_attention_mask_for_generation)
        for i, row in enumerate(rows):
            row["blocks"] = [[s.start, s.stop] for s in out.all_image_slices[i]]
        return rows

    def rows_of(self, out, rope_info):
        # TokenizerWrapper's outputs under the Instruct code's names
        class View(dict):
            pass
        v = View(out)
        v.tokens = out.tokens
        v.gen_image_mask = out.gen_image_mask
        v.vae_image_mask = out.get("cond_vae_image_mask")
        v.vit_image_mask = out.get("cond_vit_image_mask")
        saved, self.ip.prepare_full_attn_slices = getattr(self.ip, "prepare_full_attn_slices", None), \
            lambda o, i: []
        try:
            return Upstream.rows_of(self, v, rope_info)
        finally:
            if saved is None:
                del self.ip.prepare_full_attn_slices
            else:
                self.ip.prepare_full_attn_slices = saved

    def buckets(self):
        return [[r.h, r.w] for r in self.ip.reso_group.data]


def base_requests():
    return [
        ("auto", {"prompt": "A cat on a mat.", "bot_task": "auto", "system": "None"}),
        ("auto-size", {"prompt": "A cat on a mat.", "bot_task": "auto", "image_size": "1024x768"}),
        ("auto-sys-text", {"prompt": "Two dogs by the sea.", "bot_task": "auto",
                           "system": "  You are a painter of the sea.\n"}),
        ("image", {"prompt": "a red boat", "bot_task": "image", "system": "en_vanilla"}),
        ("image-dynamic", {"prompt": "a red boat", "bot_task": "image", "system": "dynamic"}),
        ("img_ratio", {"prompt": "A tall lighthouse at dusk.", "bot_task": "img_ratio", "system": "None"}),
        ("think", {"prompt": "A cat in a hat.", "bot_task": "think", "system": "None"}),
        ("recaption", {"prompt": "the moon over hills", "bot_task": "recaption", "system": "en_recaption"}),
        ("think-cot", {"prompt": "A bird.", "bot_task": "think", "system": "None",
                       "cot": "<think>It flies.</think>"}),
        ("default-task", {"prompt": "A fox in the snow, 1990s film photo."}),
        ("gen_image-16:9", {"prompt": "A road.", "mode": "gen_image", "image_size": "16:9", "system": "None"}),
        ("gen_image-ratio5", {"prompt": "A tree.", "mode": "gen_image", "image_size": "<img_ratio_5>",
                              "system": "None"}),
        ("gen_image-cot", {"prompt": "A ship.", "mode": "gen_image", "image_size": "512x512", "system": "None",
                           "cot": "<think>Sails up.</think><recaption>A tall ship, sails up.</recaption>"}),
        ("gen_image-plain-cot", {"prompt": "A ship.", "mode": "gen_image", "image_size": "384x640",
                                 "system": "None", "cot": "A tall ship at sea."}),
    ]


# -------------------------------------------------------------------- requests

def requests(big_system):
    cond = [[200, 300]]
    r = [
        ("auto", {"prompt": "A cat on a mat.", "bot_task": "auto", "system": "None"}),
        ("auto-sys-text", {"prompt": "Two dogs by the sea.", "bot_task": "auto",
                           "system": "  You are a painter of the sea.\n"}),
        ("auto-i2t", {"prompt": "What is in the picture?", "bot_task": "auto", "system": "None",
                      "cond_images": cond}),
        ("image", {"prompt": "a red boat", "bot_task": "image", "system": "None"}),
        ("img_ratio", {"prompt": "A tall lighthouse at dusk.", "bot_task": "img_ratio", "system": "None"}),
        ("think", {"prompt": "A cat in a hat.", "bot_task": "think", "system": "None"}),
        ("think-size", {"prompt": "A cat in a hat.", "bot_task": "think", "image_size": "1024x768",
                        "system": "dynamic"}),
        ("recaption", {"prompt": "the moon over hills", "bot_task": "recaption", "system": "en_recaption"}),
        ("recaption-size", {"prompt": "the moon over hills", "bot_task": "recaption", "image_size": "16:9",
                            "system": "None"}),
        ("think_recaption", {"prompt": "A fox in the snow, 1990s film photo.", "system": "en_vanilla"}),
        ("think_recaption-size", {"prompt": "A fox in the snow.", "bot_task": "think_recaption",
                                  "image_size": "<img_ratio_34>", "system": "None"}),
        ("think_recaption-i2t", {"prompt": "Make it night.", "bot_task": "think_recaption", "system": "None",
                                 "cond_images": [[256, 256], [300, 200]]}),
        ("think-cot", {"prompt": "A bird.", "bot_task": "think", "system": "None",
                       "cot": "<think>It flies.</think>"}),
        ("recaption-cot", {"prompt": "A bird.", "bot_task": "recaption", "system": "None",
                           "cot": "Some words first."}),
        ("img_ratio-cot", {"prompt": "A bird.", "bot_task": "img_ratio", "system": "None", "image_size": "512x512",
                           "cot": "<think>Wide.</think><recaption>A bird, wide.</recaption>"}),
        ("gen_image-1024x768", {"prompt": "A house.", "mode": "gen_image", "image_size": "1024x768",
                                "system": "None"}),
        ("gen_image-16:9", {"prompt": "A road.", "mode": "gen_image", "image_size": "16:9", "system": "None"}),
        ("gen_image-ratio36", {"prompt": "A tree.", "mode": "gen_image", "image_size": 36, "system": "None"}),
        ("gen_image-cot", {"prompt": "A ship.", "mode": "gen_image", "image_size": "256x256", "system": "None",
                           "cot": "<think>Sails up.</think><recaption>A tall ship, sails up.</recaption>"}),
        ("gen_image-plain-cot", {"prompt": "A ship.", "mode": "gen_image", "image_size": "192x320",
                                 "system": "None", "cot": "A tall ship at sea."}),
        ("gen_image-it2i", {"prompt": "Same, in winter.", "mode": "gen_image", "image_size": "<img_ratio_16>",
                            "system": "None", "cond_images": cond}),
    ]
    if big_system:
        r.append(("think_recaption-unified", {"prompt": "一只猫坐在红色的椅子上。", "system": "en_unified"}))
    return r


# ------------------------------------------------------------------ fixtures

def release_tokenizer(tiny_tok_path, out_path):
    """The tiny-release tokenizer with the special tokens at the release's ids."""
    tj = load(tiny_tok_path)
    shift = 127957 - 300

    def moved(i):
        return 130103 + i - 500 if i >= 500 else i + shift if i >= 300 else i
    tj["model"]["vocab"] = {k: moved(v) for k, v in tj["model"]["vocab"].items()}
    for a in tj["added_tokens"]:
        a["id"] = moved(a["id"])
    with open(out_path, "w") as f:
        json.dump(tj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


def fnv(path):
    """hi3_tok_hash: 64-bit FNV-1a of the file's bytes, 16 hex digits."""
    h = 0xcbf29ce484222325
    with open(path, "rb") as f:
        for b in f.read():
            h = ((h ^ b) * 0x100000001b3) & 0xffffffffffffffff
    return "%016x" % h


def run_set(mods, name, model_dir, tok_path, moved, big_system, out_dir, base=False):
    up = BaseUpstream(mods, model_dir, tok_path) if base else Upstream(mods, model_dir, tok_path, moved)
    cases = []
    for case_name, req in (base_requests() if base else requests(big_system)):
        res = up.case(copy.deepcopy(req))
        res["name"] = case_name
        res["request"] = req
        cases.append(res)
    # buckets, and where sizes land (image_processor get_target_size)
    probes = [[1024, 768], [768, 1024], [720, 1280], [1080, 1920], [1280, 720], [1000, 1000], [512, 2048],
              [300, 100], [100, 300], [768, 1020]]
    fixture = {
        "set": name,
        "upstream": ("Tencent-Hunyuan/HunyuanImage-3.0@%s" % BASE_COMMIT if base else
                     "suryatmodulus/HunyuanImage-3.0@%s" % COMMIT) + " hunyuan_image_3/",
        "tokenizer_hash": fnv(tok_path),
        "buckets": up.buckets(),
        "bucket_of": [[h, w, int((up.ip.reso_group if base else up.ip.vae_reso_group)
                                 .get_base_size_and_ratio_index(w, h)[1])] for h, w in probes],
        "cases": cases,
    }
    write_json(os.path.join(out_dir, name + ".json"), fixture)
    print("%s: %d cases, %d buckets" % (name, len(cases), len(fixture["buckets"])))


def tensors(mods, model_dir, out_path):
    """The names and shapes of upstream's HunyuanImage3ForCausalMM built with
    the model's config.json (on the meta device: no weights)."""
    M, _, _, _, Config = mods
    import torch
    config = Config(**load(os.path.join(model_dir, "config.json")))
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        model = M.HunyuanImage3ForCausalMM(config)
    with open(out_path, "w") as f:
        for name, t in sorted(model.state_dict().items()):
            f.write("%s\t%s\n" % (name, ",".join(str(d) for d in t.shape)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="tests/fixtures/upstream")
    ap.add_argument("--released", required=True, help="tests/fixtures/released")
    ap.add_argument("--mirror", default=MIRROR)
    ap.add_argument("--base-mirror", default=BASE_MIRROR)
    args = ap.parse_args()
    hi3 = os.environ.get("HI3", "hi3")
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        extract(args.mirror, COMMIT, os.path.join(tmp, "up"))
        extract(args.base_mirror, BASE_COMMIT, os.path.join(tmp, "up"), BASE_FILES, "hunyuan_image_3_base")
        mods = import_upstream(os.path.join(tmp, "up"))
        base_mods = import_base()
        for preset in ("tiny-release", "tiny-instruct", "tiny-distil"):
            subprocess.run([hi3, "-q", "init-model", "--preset", preset, "-o", os.path.join(tmp, preset)],
                           check=True)
        release_tokenizer(os.path.join(tmp, "tiny-release", "tokenizer.json"),
                          os.path.join(args.released, "tokenizer.json"))
        for preset in ("tiny-release", "tiny-instruct", "tiny-distil"):
            tensors(mods, os.path.join(tmp, preset), os.path.join(args.out, "tensors-%s.txt" % preset))
        for preset in ("tiny-instruct", "tiny-distil"):
            d = os.path.join(tmp, preset)
            run_set(mods, preset, d, os.path.join(d, "tokenizer.json"), True, False, args.out)
        d = os.path.join(args.released, "instruct")
        run_set(mods, "released-instruct", d, os.path.join(args.released, "tokenizer.json"), False, True,
                args.out)
        # the base code: the tiny-release preset, and the released files themselves
        d = os.path.join(tmp, "tiny-release")
        run_set(base_mods, "tiny-release", d, os.path.join(d, "tokenizer.json"), True, False, args.out, base=True)
        run_set(base_mods, "released-base", args.released, os.path.join(args.released, "tokenizer.json"), False,
                False, args.out, base=True)


if __name__ == "__main__":
    main()
