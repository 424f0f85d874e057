#!/usr/bin/env python3
"""The diffusion reference: upstream's own image heads and scheduler, UniRL's
SDE step, around the PyTorch reference of the backbone (hi3ref.py), in fp32
on the CPU.

The modules are upstream's, not ports: TimestepEmbedder, UNetDown (patch_embed)
and UNetUp (final_layer) of modeling_hunyuan_image_3.py and
FlowMatchDiscreteScheduler of hunyuan_image_3_pipeline.py, from the mirror of
suryatmodulus/HunyuanImage-3.0 at 1201fe8 (extracted with git as
upstream_template.py does); the SDE transition is UniRL's FlowSDEStrategy
(unirl/sde/kernels.py of the mirror of Tencent-Hunyuan/UniRL). The backbone
is hi3ref.Model, fed the image and timestep rows as its input embeddings
(upstream's instantiate_* scatter), read before ln_f (upstream's
ragged_final_layer).

  diffusion_ref.py heads --hi3 BIN --out DIR
      heads-tiny.safetensors and heads-distil.safetensors: the heads of
      `hi3 init-model --preset tiny` (f32) and tiny-distil (bf16, widened) at
      seed 1, on random inputs: every timestep embedder, patch_embed and
      final_layer (tests/test-heads.c).
  diffusion_ref.py trajectory --model DIR --cond COND --noise NOISE --out OUT
          [--steps T] [--guidance G] [--flow-shift S] [--sampler euler|sde]
          [--eta E] [--sde-steps LIST] [--latent-dtype f32|bf16|f16]
      the trajectory of the conditions file COND (hi3 tokenize-concat) from
      the noise of NOISE (x_T, sde_noise: a trajectory or noise file), every
      step over the whole sequence; OUT holds latents (in the latent dtype), sigmas,
      timesteps, sde_logp (tests/t5300-diffusion-reference.sh: hi3 diffusion-capture
      --noise against it).
  diffusion_ref.py bench --model DIR --cond COND [--steps N] [--threads N]
      per-step time of the reference on COND: the whole sequence each step,
      and with the KV cache of step 0 (only <timestep> and the image tokens
      fed), one JSON line (scripts/bench-diffusion).

Needs a Python with (torch, numpy, safetensors, diffusers, einops,
transformers) and git.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import types

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hi3ref  # noqa: E402
import upstream_template as U  # noqa: E402
import vae_ref  # noqa: E402
import vit_ref  # noqa: E402

UNIRL_MIRROR = os.path.join(U.MIRRORS, "Tencent-Hunyuan+UniRL", "repo")
UNIRL_COMMIT = "1a7b501"
SEED = 1


def load_upstream():
    d = tempfile.mkdtemp(prefix="hi3-diffusion-ref.")
    U.extract(U.MIRROR, U.COMMIT, d)
    M = U.import_upstream(d)[0]
    import hunyuan_image_3.hunyuan_image_3_pipeline as P
    return M, P


def load_unirl_sde():
    """unirl/sde/kernels.py of the UniRL mirror, as a module of its own."""
    src = subprocess.run(["git", "-C", UNIRL_MIRROR, "show", UNIRL_COMMIT + ":unirl/sde/kernels.py"], check=True,
                         capture_output=True).stdout.decode()
    mod = types.ModuleType("unirl_sde_kernels")
    sys.modules[mod.__name__] = mod  # dataclasses look their module up there
    exec(compile(src, "unirl/sde/kernels.py", "exec"), mod.__dict__)
    return mod


class Heads:
    """Upstream's image heads of a model directory, fp32."""

    def __init__(self, M, model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            cfg = json.load(f)
        w = hi3ref.load_weights(model_dir)
        H, P, Z = cfg["hidden_size"], cfg.get("patch_embed_hidden_dim", 1024), cfg["vae"]["latent_channels"]
        self.H, self.Z = H, Z
        self.temb = {}
        for name in ("timestep_emb", "time_embed", "time_embed_2", "guidance_emb", "timestep_r_emb"):
            if name + ".mlp.0.weight" in w:
                m = M.TimestepEmbedder(hidden_size=H)
                self._load(m, w, name)
                self.temb[name] = m
        self.patch_embed = M.UNetDown(patch_size=1, emb_channels=H, in_channels=Z, hidden_channels=P, out_channels=H)
        self._load(self.patch_embed, w, "patch_embed")
        self.final_layer = M.UNetUp(patch_size=1, emb_channels=H, in_channels=H, hidden_channels=P, out_channels=Z,
                                    out_norm=True)
        self._load(self.final_layer, w, "final_layer")

    @staticmethod
    def _load(mod, w, prefix):
        sd = {k[len(prefix) + 1:]: v.float() for k, v in w.items() if k.startswith(prefix + ".")}
        mod.load_state_dict(sd, strict=True)
        mod.float().eval()

    def emb(self, name, t):
        with torch.no_grad():
            return self.temb[name](torch.as_tensor(t, dtype=torch.float32).reshape(-1))

    def down(self, x, temb):
        with torch.no_grad():
            return self.patch_embed(x, temb)[0]

    def up(self, hid, temb, h, w):
        with torch.no_grad():
            return self.final_layer(hid, temb, h, w)


# ------------------------------------------------------------------ heads

def cmd_heads(a):
    M, _ = load_upstream()
    os.makedirs(a.out, exist_ok=True)
    for stem, preset, dtype in (("heads-tiny", "tiny", "f32"), ("heads-distil", "tiny-distil", "bf16")):
        with tempfile.TemporaryDirectory(prefix="hi3-heads.") as tmp:
            mdir = os.path.join(tmp, "m")
            subprocess.run([a.hi3, "-q", "init-model", "--preset", preset, "--seed", str(SEED), "--dtype", dtype,
                            "-o", mdir], check=True)
            hd = Heads(M, mdir)
            rng = np.random.default_rng(5)
            R, h, w = 2, 3, 5
            t = np.array([1000.0, 387.5], np.float32)
            out = {"t": t}
            for name in hd.temb:
                out["temb." + name] = hd.emb(name, t).numpy()
            x = rng.standard_normal((R, hd.Z, h, w)).astype(np.float32)
            te = hd.emb("time_embed", t)
            out["pe.x"] = x
            out["pe.out"] = hd.down(torch.from_numpy(x), te).numpy()
            hid = rng.standard_normal((R, h * w, hd.H)).astype(np.float32)
            te2 = hd.emb("time_embed_2", t)
            out["fl.hidden"] = hid
            out["fl.out"] = hd.up(torch.from_numpy(hid), te2, h, w).numpy()
            meta = {"format": "hi3.test.heads", "preset": preset, "seed": str(SEED), "dtype": dtype,
                    "upstream": U.COMMIT + ":hunyuan_image_3/modeling_hunyuan_image_3.py",
                    "torch": torch.__version__}
            path = os.path.join(a.out, stem + ".safetensors")
            hi3ref.save_sorted({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in out.items()}, path, meta)
            os.chmod(path, 0o644)
            print("diffusion_ref: wrote %s (%s)" % (path, ", ".join(sorted(hd.temb))))


# ------------------------------------------------------------- trajectory

def read_st(path):
    """The tensors of a safetensors file as numpy arrays (bf16 ones as f32:
    numpy has no bf16), and its metadata."""
    from safetensors import safe_open
    out = {}
    with safe_open(path, framework="pt") as f:
        meta = f.metadata() or {}
        for k in f.keys():
            t = f.get_tensor(k)
            out[k] = (t.float() if t.dtype == torch.bfloat16 else t).numpy()
    return out, meta


DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def runs(mask):
    """The [start, stop) runs of true values of a 1-D mask."""
    out, t, L = [], 0, len(mask)
    while t < L:
        if mask[t]:
            u = t
            while u < L and mask[u]:
                u += 1
            out.append((t, u))
            t = u
        else:
            t += 1
    return out


class CondImages:
    """The cond images' input rows as upstream makes them on the first pass
    (instantiate_vae_image_tokens, instantiate_continuous_tokens and the cond
    <timestep> of modeling_hunyuan_image_3.py): upstream's
    AutoencoderKLConv3D encoder (autoencoder_kl_3d.py; the posterior mean,
    times the scaling factor), UNetDown with time_embed(0), timestep_emb(0),
    Siglip2VisionTransformer and LightProjector (siglip2.py), all fp32, on
    the views the conditions file stores, or (files: each request's picture
    paths) on the views upstream's processor makes from the files, with how
    many values differ from the stored ones. Row r's k-th image feeds its k-th
    run of cond_vae_mask (raster order), the <timestep> just before it and
    its k-th run of cond_vit_mask (all P slots). rows[r] maps a column to its
    row."""

    def __init__(self, model_dir, c, meta, hd, files=None):
        with open(os.path.join(model_dir, "config.json")) as f:
            cfg = json.load(f)
        if meta.get("vae_posterior", "mean") != "mean":
            sys.exit("diffusion_ref: only the posterior mean (vae_posterior 'mean') is referenced")
        w = hi3ref.load_weights(model_dir)
        get = lambda n, s: w[n].float().numpy().reshape(s)  # noqa: E731
        vae = vae_ref.build(vae_ref.load_upstream(None), cfg["vae"], only_encoder=True)
        vae_ref.set_weights(vae, get)
        vm, va, _ = vit_ref.build(vit_ref.load_siglip2(), cfg["vit"], cfg["vit_aligner"], get)
        R, L = c["input_ids"].shape
        self.rows = [dict() for _ in range(R)]
        image_row, P = c["image_row"], c["vit_pixels"].shape[1]
        te0 = hd.emb("time_embed", [0.0])
        ts0 = hd.emb("timestep_emb", [0.0])[0]
        off, seen = 0, {}
        for k in range(len(image_row)):
            r = int(image_row[k])
            kr = seen.get(r, 0)
            seen[r] = kr + 1
            H, W = (int(v) for v in c["vae_shape"][k])
            u = c["vae_pixels"][off:off + H * W * 3].reshape(H, W, 3)
            off += H * W * 3
            if files is not None:
                # the VAE view from the picture file as upstream makes it:
                # transformers' load_image (Pillow: open, exif_transpose,
                # convert RGB), then image_processor.resize_and_crop to the
                # bucket the conditions chose
                path = files[r % len(files)][kr]
                mine = u
                u = upstream_vae_view(path, W, H)
                differ = int(np.count_nonzero(u != mine))
                print(f"diffusion_ref: image {k} ({os.path.basename(path)}): the VAE view from the file, "
                      f"{W}x{H}: {differ} of {u.size} values differ from the conditions'", file=sys.stderr)
            x = (torch.from_numpy(u.copy()).float().div(255.0) - 0.5) / 0.5
            with torch.no_grad():
                mean = vae.encode(x.permute(2, 0, 1)[None].contiguous()).latent_dist.mean[:, :, 0]
            z = mean * cfg["vae"]["scaling_factor"]
            vae_rows = hd.down(z, te0)[0]                               # (N, H)
            v0, v1 = runs(c["cond_vae_mask"][r])[kr]
            assert v1 - v0 == vae_rows.shape[0], (k, v1 - v0, vae_rows.shape)
            for i in range(v1 - v0):
                self.rows[r][v0 + i] = vae_rows[i]
            self.rows[r][v0 - 1] = ts0
            gh, gw = (int(v) for v in c["vit_grid"][k])
            pv = torch.zeros(P, c["vit_pixels"].shape[2])
            pv[:gh * gw] = (torch.from_numpy(c["vit_pixels"][k][:gh * gw].astype(np.float32)) - 127.5) / 127.5
            if files is not None:
                # the ViT view from the file as upstream makes it (torchvision's
                # uint8 kernel under ATEN_CPU_CAPABILITY=avx2, hi3's default)
                mine = pv
                pv, grid = upstream_vit_view(files[r % len(files)][kr], cfg)
                differ = int((pv != mine).sum()) if grid == (gh, gw) and pv.shape == mine.shape else -1
                print(f"diffusion_ref: image {k}: the ViT view from the file, grid {grid[0]}x{grid[1]} "
                      f"({torch.backends.cpu.get_cpu_capability()}): {differ} of {pv.numel()} values differ "
                      f"from the conditions'", file=sys.stderr)
                assert grid == (gh, gw), (grid, gh, gw)
            # upstream casts the input to the patch weight's dtype (bf16 in the
            # release presets) before the fp32 modules here see it
            pv = pv.to(w["vision_model.embeddings.patch_embedding.weight"].dtype).float()
            mask = torch.zeros(P, dtype=torch.int32)
            mask[:gh * gw] = 1
            with torch.no_grad():
                hid = vm(pv[None], attention_mask=mask[None],
                         spatial_shapes=torch.tensor([[gh, gw]], dtype=torch.long)).last_hidden_state
                emb = va(hid)[0]                                        # (P, H)
            t0, t1 = runs(c["cond_vit_mask"][r])[kr]
            assert t1 - t0 == P
            for s_ in range(P):
                self.rows[r][t0 + s_] = emb[s_]


def upstream_ip():
    """Upstream's image_processor.py at 1201fe8, from the mirror."""
    global _ip
    if _ip is None:
        tmp = tempfile.mkdtemp(prefix="hi3-upstream-ip.")
        pkg = os.path.join(tmp, "hunyuan_image_3")
        os.makedirs(pkg)
        open(os.path.join(pkg, "__init__.py"), "w").close()
        for f in ("image_processor.py", "tokenization_hunyuan_image_3.py"):
            src = subprocess.run(["git", "-C", vae_ref.UPSTREAM_GIT, "show",
                                  f"{vae_ref.UPSTREAM_REV}:hunyuan_image_3/{f}"], check=True, capture_output=True).stdout
            with open(os.path.join(pkg, f), "wb") as fh:
                fh.write(src)
        sys.path.insert(0, tmp)
        import hunyuan_image_3.image_processor as ip
        _ip = ip
    return _ip


def upstream_vae_view(path, W, H):
    """Upstream's VAE view of a picture file: load_image (Pillow: open,
    exif_transpose, convert RGB), then resize_and_crop(image, (W, H)), centre
    crop, LANCZOS; (H, W, 3) uint8."""
    ip = upstream_ip()
    return np.asarray(ip.resize_and_crop(ip.load_image(path), (W, H), crop_type="center"), dtype=np.uint8)


def upstream_vit_view(path, cfg):
    """Upstream's ViT view of a picture file: load_image, then
    HunyuanImage3ImageProcessor.vit_process_image (transformers'
    Siglip2ImageProcessorFast with the model's vit_processor: torchvision's
    antialiased resize, the fused normalisation): (pixel_values (P, 768) f32,
    (grid h, grid w))."""
    ip = upstream_ip()
    conf = types.SimpleNamespace(image_base_size=cfg["image_base_size"], vae_type=cfg["vae_type"],
                                 vae_downsample_factor=cfg["vae_downsample_factor"], patch_size=1,
                                 vit_type=cfg["vit_type"], vit_processor=cfg["vit_processor"],
                                 cond_token_attn_type=cfg.get("cond_token_attn_type", "joint_full"),
                                 cond_image_type=cfg.get("cond_image_type", "vae_vit"))
    t = ip.HunyuanImage3ImageProcessor(conf).vit_process_image(ip.load_image(path))
    return t.float(), tuple(int(v) for v in t.vision_encoder_kwargs["spatial_shapes"])


_ip = None


def request_files(path):
    """Each request's "images", as paths (relative to the requests file)."""
    base = os.path.dirname(os.path.abspath(path))
    out = []
    with open(path) as f:
        for line in f:
            if line.strip():
                out.append([os.path.join(base, p) for p in json.loads(line).get("images", [])])
    return out


class UpstreamBackbone:
    """Upstream's own HunyuanImage3Model (modeling_hunyuan_image_3.py: its
    SDPA attention, HunyuanMoE with the default top-k gate and einsum
    dispatch, HunyuanStaticCache) in fp32 on the CPU, with the weights of a
    model directory; forward() has hi3ref.Model.forward's arguments for the
    calls the Denoiser makes and returns the last layer's output before
    ln_f, as upstream's ragged_final_layer reads it."""

    def __init__(self, M, model_dir, ref):
        from hunyuan_image_3.configuration_hunyuan_image_3 import HunyuanImage3Config
        with open(os.path.join(model_dir, "config.json")) as f:
            raw = json.load(f)
        raw.pop("vae", None)        # the backbone needs none of the image towers' settings
        self.cfg = HunyuanImage3Config(**raw)
        self.cfg._attn_implementation = "sdpa"
        # HunyuanMoE.forward selects the CUDA device of its input; on the CPU
        # there is none to select
        torch.cuda.set_device = lambda *a, **k: None
        self.model = M.HunyuanImage3Model(self.cfg).float().eval()
        sd = {k[len("model."):]: v for k, v in ref.w.items() if k.startswith("model.")}
        missing, unexpected = self.model.load_state_dict(sd, strict=False)
        assert not unexpected and all(k.startswith("ln_f") for k in missing), (missing, unexpected)
        self.ref = ref
        self.L = 0

    def new_cache(self, R, L):
        self.L = L
        return upstream_cache(self.cfg, R, L)

    def forward(self, ids, rope, hi, blocks=None, cache=None, slots=None, embeds=None, logits=False):
        B, T = ids.shape
        cos, sin = self.ref.rope_cos_sin(rope)
        if cache is None:
            mask = hi3ref.attention_mask(torch.arange(T).expand(B, T), hi, blocks, T)
        else:
            mask = hi3ref.attention_mask(slots, hi, blocks, self.L)
        out = self.model(inputs_embeds=embeds.float(), attention_mask=mask.unsqueeze(1),
                         position_ids=None if cache is None else slots.long(), past_key_values=cache,
                         use_cache=cache is not None, custom_pos_emb=(cos, sin), mode="gen_image",
                         return_dict=True)
        return {"last": out.last_hidden_state}


def upstream_cache(cfg, R, L):
    """Upstream's HunyuanStaticCache for R rows of L slots."""
    import hunyuan_image_3.modeling_hunyuan_image_3 as M
    return M.HunyuanStaticCache(config=cfg, max_cache_len=L, max_batch_size=R)


class Denoiser:
    """Velocity predictions for the gen_image rows of a conditions file."""

    def __init__(self, M, model_dir, cond_path, requests=None, backbone="hi3ref"):
        self.m = hi3ref.Model(model_dir)
        self.net = UpstreamBackbone(M, model_dir, self.m) if backbone == "upstream" else self.m
        self.hd = Heads(M, model_dir)
        c, meta = read_st(cond_path)
        self.c, self.meta = c, meta
        self.ids = torch.from_numpy(c["input_ids"])
        self.rope = torch.from_numpy(c["rope_pos"])
        self.blocks = torch.from_numpy(c["image_blocks"])
        self.R, self.L = self.ids.shape
        self.cfg = int(meta["cfg_factor"])
        self.B = self.R // self.cfg
        mask = c["gen_image_mask"].astype(bool)
        hw = c["gen_image_hw"]
        self.h, self.w = int(hw[0, 0]), int(hw[0, 1])
        self.N = self.h * self.w
        self.img_start = [int(np.nonzero(mask[r])[0][0]) for r in range(self.R)]
        ts = c["timestep_index"]
        self.ts = [int(ts[r][ts[r] >= 0][-1]) for r in range(self.R)]
        mc = self.m.cfg.raw
        self.cond = (CondImages(model_dir, c, meta, self.hd, request_files(requests) if requests else None)
                     if "image_row" in c else None)
        self.guidance = bool(mc.get("cfg_distilled", False))
        self.meanflow = bool(mc.get("use_meanflow", False))

    def new_cache(self):
        """An empty KV cache of the backbone for every row and slot."""
        if self.net is self.m:
            return hi3ref.StaticCache(self.m.cfg, self.R, self.L)
        return self.net.new_cache(self.R, self.L)

    def embeds(self, x_rows, t, t_r, gv, cols):
        """The input rows of the tokens cols (R, T) for latents x_rows (R, Z, h, w)."""
        hd, R = self.hd, self.R
        e = self.m.w["model.wte.weight"][self.ids.gather(1, cols)].clone()
        te = hd.emb("time_embed", [t] * R)
        img = hd.down(x_rows, te)                              # (R, N, H)
        for r in range(R):
            cr = {int(v): j for j, v in enumerate(cols[r].tolist())}
            # the cond images: in the prefix, on whole-sequence passes only
            for col, row in (self.cond.rows[r].items() if self.cond else ()):
                if col in cr:
                    e[r, cr[col]] = row
            s = self.img_start[r]
            e[r, cr[s]:cr[s] + self.N] = img[r]
            e[r, cr[self.ts[r]]] = hd.emb("timestep_emb", [t])[0]
            k = self.ts[r] + 1
            if self.guidance:
                e[r, cr[k]] = hd.emb("guidance_emb", [gv])[0]
                k += 1
            if self.meanflow:
                e[r, cr[k]] = hd.emb("timestep_r_emb", [t_r])[0]
        return e

    def velocity(self, x, t, t_r, gv, cache=None, first=True):
        """v (R, Z, h, w): every row at latents x (B, Z, h, w) (row r reads
        request r % B); without a cache the whole sequence, with one the
        step-0 pass fills it (first) or only the image and special tokens
        are fed."""
        R, L = self.R, self.L
        x_rows = torch.cat([x] * self.cfg)
        ns = 1 + self.guidance + self.meanflow
        if cache is None or first:
            cols = torch.arange(L).expand(R, L)
            slots = cols if cache is not None else None
            hi = cols.clone()
        else:
            cols = torch.stack([torch.cat([torch.arange(self.ts[r], self.ts[r] + ns),
                                           torch.arange(self.img_start[r], self.img_start[r] + self.N)])
                                for r in range(R)])
            slots, hi = cols, cols.clone()
        e = self.embeds(x_rows, t, t_r, gv, cols)
        rope = torch.stack([self.rope[r][cols[r]] for r in range(R)])
        with torch.no_grad():
            out = self.net.forward(self.ids.gather(1, cols), rope, hi, self.blocks, cache=cache, slots=slots,
                                   embeds=e, logits=False)
        last = out["last"]
        cr0 = [{int(v): j for j, v in enumerate(cols[r].tolist())} for r in range(R)]
        hid = torch.stack([last[r, cr0[r][self.img_start[r]]:cr0[r][self.img_start[r]] + self.N] for r in range(R)])
        te2 = self.hd.emb("time_embed_2", [t] * R)
        return self.hd.up(hid, te2, self.h, self.w)


def parse_list(s):
    return [int(v) for v in s.split(",")] if s else []


def cmd_trajectory(a):
    M, P = load_upstream()
    K = load_unirl_sde()
    dn = Denoiser(M, a.model, a.cond, a.images)
    noise, _ = read_st(a.noise)
    x_T = torch.from_numpy(noise["x_T"])
    B = dn.B
    T = a.steps
    sde = parse_list(a.sde_steps) if a.sampler == "sde" else []
    if a.sampler == "sde" and not a.sde_steps:
        sde = list(range(T))
    dt = DTYPES[a.latent_dtype]
    sched = P.FlowMatchDiscreteScheduler(shift=a.flow_shift, reverse=True, solver="euler")
    sched.set_timesteps(T)
    sigmas, timesteps = sched.sigmas.float(), sched.timesteps.float()
    full_t = sched.timesteps_full.float()
    strat = K.FlowSDEStrategy()
    sigma_max = float(sigmas[1])
    gv = float(torch.tensor(1000.0 * a.guidance, dtype=torch.bfloat16).float())
    x = x_T.to(dt).float()
    lat = [x.clone()]
    logp = np.zeros((B, len(sde)), np.float32)
    vel = []
    for i in range(T):
        t = float(timesteps[i])
        v = dn.velocity(x, t, float(full_t[i + 1]), gv)
        vel.append(v.clone())
        if dn.cfg == 2 and a.guidance > 1.0:
            vc, vu = v[:B].to(DTYPES[a.cfg_dtype]), v[B:].to(DTYPES[a.cfg_dtype])
            v = (vu + a.guidance * (vc - vu)).float()
        else:
            v = v[:B]
        if i in sde:
            k = sde.index(i)
            s0, s1 = sigmas[i].reshape(1, 1, 1, 1), sigmas[i + 1].reshape(1, 1, 1, 1)
            _, mu, std = strat.step(noise_pred=v, sample=x, sigma=s0, sigma_next=s1, eta=a.eta,
                                    prev_sample=torch.zeros_like(x), sigma_max=sigma_max)
            xi = torch.from_numpy(noise["sde_noise"][:, k])
            xn = mu + std * xi
            xn, lp = strat._finalize_logp(prev_sample=xn, prev_sample_mean=mu, std_var=std, eta=a.eta,
                                          input_dtype=dt)
            logp[:, k] = lp.numpy()
            x = xn
        else:
            # the scheduler counts its own calls; the SDE steps did not call it
            sched._step_index = i
            x = sched.step(v, timesteps[i], x, return_dict=False)[0].to(dt).float()
        lat.append(x.clone())
    out = {"latents": torch.stack(lat, 1).to(dt).contiguous(), "sigmas": sigmas.contiguous(),
           "timesteps": timesteps.contiguous(), "sde_logp": torch.from_numpy(logp),
           "sde_steps": torch.tensor(sde, dtype=torch.int64), "velocity": torch.stack(vel).contiguous()}
    meta = {"format": "hi3.test.trajectory", "steps": str(T), "guidance": repr(a.guidance),
            "flow_shift": repr(a.flow_shift), "sampler": a.sampler, "eta": repr(a.eta),
            "latent_dtype": a.latent_dtype, "torch": torch.__version__,
            "upstream": U.COMMIT + " (heads, FlowMatchDiscreteScheduler); UniRL " + UNIRL_COMMIT + " (FlowSDEStrategy)"}
    hi3ref.save_sorted(out, a.out, meta)
    print("diffusion_ref: wrote %s (%d steps, %d rows)" % (a.out, T, B))


# ------------------------------------------------------------------ bench

def cmd_bench(a):
    M, _ = load_upstream()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.set_grad_enabled(False)
    dn = Denoiser(M, a.model, a.cond, backbone=a.backbone)
    x = torch.from_numpy(np.random.default_rng(1).standard_normal((dn.B, dn.hd.Z, dn.h, dn.w)).astype(np.float32))
    res = {"impl": "torch-ref", "backbone": a.backbone, "torch": torch.__version__,
           "threads": torch.get_num_threads(), "R": dn.R, "L": dn.L, "image_tokens": dn.N, "steps": a.steps}
    v = dn.velocity(x, 1000.0, 0.0, 0.0)                      # warm up
    if a.backbone != "hi3ref":
        # the same math: the velocity of hi3ref's backbone at the same step
        net, dn.net = dn.net, dn.m
        res["max_abs_vs_hi3ref"] = float((v - dn.velocity(x, 1000.0, 0.0, 0.0)).abs().max())
        dn.net = net
    t0 = time.perf_counter()
    for i in range(a.steps):
        dn.velocity(x, 900.0 - i, 0.0, 0.0)
    res["step_full_s"] = (time.perf_counter() - t0) / a.steps
    cache = dn.new_cache()
    t0 = time.perf_counter()
    dn.velocity(x, 1000.0, 0.0, 0.0, cache=cache, first=True)
    res["step0_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(a.steps):
        dn.velocity(x, 900.0 - i, 0.0, 0.0, cache=cache, first=False)
    res["step_kv_s"] = (time.perf_counter() - t0) / a.steps
    print(json.dumps(res), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("heads")
    h.add_argument("--hi3", default=os.environ.get("HI3", "hi3"))
    h.add_argument("--out", required=True)
    t = sub.add_parser("trajectory")
    t.add_argument("--model", required=True)
    t.add_argument("--cond", required=True)
    t.add_argument("--noise", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--steps", type=int, default=4)
    t.add_argument("--guidance", type=float, default=5.0)
    t.add_argument("--flow-shift", type=float, default=3.0)
    t.add_argument("--sampler", choices=["euler", "sde"], default="euler")
    t.add_argument("--eta", type=float, default=1.0)
    t.add_argument("--sde-steps", default="")
    t.add_argument("--latent-dtype", choices=list(DTYPES), default="f32")
    t.add_argument("--cfg-dtype", choices=list(DTYPES), default="f32")
    t.add_argument("--images", metavar="REQUESTS",
                   help="the requests file the conditions were made from: the cond images' VAE views are then "
                        "made from its picture files by upstream's image processor (load_image: Pillow; "
                        "resize_and_crop; the SigLIP2 processor), not taken from the conditions")
    b = sub.add_parser("bench")
    b.add_argument("--model", required=True)
    b.add_argument("--cond", required=True)
    b.add_argument("--steps", type=int, default=3)
    b.add_argument("--threads", type=int, default=0)
    b.add_argument("--backbone", choices=["upstream", "hi3ref"], default="upstream",
                   help="the backbone around upstream's heads: upstream's HunyuanImage3Model (default) or "
                        "hi3ref.Model")
    a = p.parse_args()
    torch.manual_seed(0)
    {"heads": cmd_heads, "trajectory": cmd_trajectory, "bench": cmd_bench}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
