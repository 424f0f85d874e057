#!/usr/bin/env python3
"""The VAE reference: upstream's own autoencoder_kl_3d.py (AutoencoderKLConv3D),
instantiated small, with the weights of tests/vae-model.h's counter-based
generator, in fp32 on the CPU.

  vae_ref.py fixtures --out tests/fixtures/vae [--upstream FILE]
      writes vae-tiny.safetensors and vae-nomatch.safetensors (the
      resamples' channels not matched, a shift_factor): decoder and encoder
      inputs and outputs at two sizes, with the config, seed and the
      weights' checksum in the metadata (tests/test-vae.c regenerates the weights).
  vae_ref.py bench --model DIR --sizes 2x2,4x4 [--repeat N] [--encode]
      times upstream's decode (or, --encode, encode) on the weights of DIR
      (a model directory written by tests/bench-vae), one JSON line per
      latent size: the mean of N runs after a warm-up.

Without --upstream the module is taken from the git clone of upstream's
Instruct code that UPSTREAM names (git show
1201fe8:hunyuan_image_3/autoencoder_kl_3d.py); it needs torch, numpy,
safetensors, diffusers and einops.
"""
import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
from safetensors import safe_open
from safetensors.numpy import save_file

# a git clone of upstream's Instruct code (suryatmodulus/HunyuanImage-3.0,
# which holds UPSTREAM_REV): the environment's UPSTREAM
UPSTREAM_GIT = os.environ.get("UPSTREAM", "")
UPSTREAM_REV = "1201fe8"
UPSTREAM_PATH = "hunyuan_image_3/autoencoder_kl_3d.py"

TINY = {
    "block_out_channels": [32, 32, 32, 64, 64],
    "in_channels": 3,
    "out_channels": 3,
    "latent_channels": 16,
    "layers_per_block": 1,
    "ffactor_spatial": 16,
    "ffactor_temporal": 4,
    "downsample_match_channel": True,
    "upsample_match_channel": True,
    "scaling_factor": 0.562679178327931,
    "shift_factor": None,
}
# The other branches of upstream's constructor: channels not matched at
# the resamples (ResnetBlocks with a nin_shortcut), 4 levels at factors 8
# and 2, and a shift_factor.
NOMATCH = {
    "block_out_channels": [32, 64, 96, 96],
    "in_channels": 3,
    "out_channels": 3,
    "latent_channels": 16,
    "layers_per_block": 1,
    "ffactor_spatial": 8,
    "ffactor_temporal": 2,
    "downsample_match_channel": False,
    "upsample_match_channel": False,
    "scaling_factor": 0.75,
    "shift_factor": 0.25,
}
FIXTURES = {"vae-tiny": TINY, "vae-nomatch": NOMATCH}
SEED = 7
SIZES = [(2, 3), (4, 4)]          # latent (h, w): images 32 x 48 and 64 x 64 (tiny)

MASK = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15


def fnv1a(s):
    h = 0xCBF29CE484222325
    for b in s.encode():
        h ^= b
        h = (h * 0x100000001B3) & MASK
    return h


def gen(name, shape, seed):
    """tests/vae-model.h's generator, element for element."""
    n = int(np.prod(shape))
    key = np.uint64((fnv1a(name) + seed) & MASK)
    with np.errstate(over="ignore"):
        z = key + np.arange(1, n + 1, dtype=np.uint64) * np.uint64(GAMMA)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    u = (z >> np.uint64(40)).astype(np.float64) / 16777216.0
    if name.endswith(".bias"):
        v = 0.1 * (2 * u - 1)
    elif len(shape) == 1:
        v = 1 + 0.25 * (2 * u - 1)
    else:
        v = (2 * u - 1) / np.sqrt(float(n // shape[0]))
    return v.astype(np.float32).reshape(shape)


def load_upstream(path):
    if path is None:
        if not UPSTREAM_GIT:
            sys.exit("vae_ref: set UPSTREAM to a git clone of upstream's Instruct code "
                     f"(it must hold commit {UPSTREAM_REV}), or pass --upstream FILE")
        text = subprocess.run(["git", "-C", UPSTREAM_GIT, "show", f"{UPSTREAM_REV}:{UPSTREAM_PATH}"],
                              check=True, capture_output=True).stdout
        d = tempfile.mkdtemp(prefix="hi3-vae-ref.")
        path = os.path.join(d, "autoencoder_kl_3d.py")
        with open(path, "wb") as f:
            f.write(text)
    spec = importlib.util.spec_from_file_location("autoencoder_kl_3d", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build(mod, cfg, only_decoder=False, only_encoder=False):
    """AutoencoderKLConv3D as upstream defines it. Its constructor makes an
    empty CUDA tensor (a placeholder for non-zero ranks); on a machine
    without a GPU that one tensor goes to the CPU."""
    real_empty = torch.empty

    def empty(*a, **k):
        if str(k.get("device", "")).startswith("cuda"):
            k["device"] = "cpu"
        return real_empty(*a, **k)

    torch.empty = empty
    try:
        vae = mod.AutoencoderKLConv3D(
            in_channels=cfg["in_channels"], out_channels=cfg["out_channels"],
            latent_channels=cfg["latent_channels"], block_out_channels=tuple(cfg["block_out_channels"]),
            layers_per_block=cfg["layers_per_block"], ffactor_spatial=cfg["ffactor_spatial"],
            ffactor_temporal=cfg["ffactor_temporal"], sample_size=384, sample_tsize=96,
            scaling_factor=cfg["scaling_factor"], shift_factor=cfg.get("shift_factor"),
            downsample_match_channel=cfg["downsample_match_channel"],
            upsample_match_channel=cfg["upsample_match_channel"],
            only_encoder=only_encoder, only_decoder=only_decoder)
    finally:
        torch.empty = real_empty
    return vae.eval().float()


def set_weights(vae, get):
    """Every parameter and buffer of the module from get("vae." + name, shape)."""
    sd = vae.state_dict()
    with torch.no_grad():
        for k, t in sd.items():
            t.copy_(torch.from_numpy(np.ascontiguousarray(get("vae." + k, tuple(t.shape)))))
    return sorted("vae." + k for k in sd)


def checksum(vae):
    sd = vae.state_dict()
    total = 0.0
    for k in sorted(sd):
        v = sd[k].detach().numpy().astype(np.float64).ravel()
        total += float(np.sum(v * (np.arange(v.size) % 13 + 1)))
    return total


def decode(vae, latent, cfg):
    """The pipeline's decode: z = latent / scaling (+ shift), a time axis,
    the decoder's last frame."""
    z = torch.from_numpy(latent) / cfg["scaling_factor"]
    if cfg.get("shift_factor"):
        z = z + cfg["shift_factor"]
    with torch.no_grad():
        img = vae.decode(z.unsqueeze(2)).sample
    return img[:, :, 0].numpy()


def encode(vae, image):
    with torch.no_grad():
        post = vae.encode(torch.from_numpy(image)).latent_dist
    return post.mean[:, :, 0].numpy(), post.logvar[:, :, 0].numpy()


def test_image(rng, H, W):
    """A smooth picture with some noise, in [-1, 1] (1, 3, H, W)."""
    y, x = np.mgrid[0:H, 0:W].astype(np.float64)
    chans = [np.sin(x / 5.0 + c) * np.cos(y / 7.0 - c) for c in range(3)]
    img = np.stack(chans)[None] * 0.8 + 0.2 * rng.standard_normal((1, 3, H, W))
    return np.clip(img, -1, 1).astype(np.float32)


def cmd_fixtures(a):
    mod = load_upstream(a.upstream)
    for name, cfg in FIXTURES.items():
        write_fixture(a, mod, name, cfg)


def write_fixture(a, mod, name, cfg):
    vae = build(mod, cfg)
    names = set_weights(vae, lambda n, s: gen(n, s, SEED))
    rng = np.random.default_rng(12)
    out = {}
    f = cfg["ffactor_spatial"]
    z = cfg["latent_channels"]
    for i, (h, w) in enumerate(SIZES):
        lat = rng.standard_normal((1, z, h, w)).astype(np.float32)
        out[f"dec.latent.{i}"] = lat
        out[f"dec.image.{i}"] = np.ascontiguousarray(decode(vae, lat, cfg))
        img = test_image(rng, h * f, w * f)
        mean, logvar = encode(vae, img)
        noise = rng.standard_normal(mean.shape).astype(np.float32)
        post_t = torch.from_numpy(mean) + torch.exp(0.5 * torch.from_numpy(logvar)) * torch.from_numpy(noise)
        if cfg.get("shift_factor"):
            post_t = post_t - cfg["shift_factor"]
        out[f"enc.image.{i}"] = img
        out[f"enc.mean.{i}"] = np.ascontiguousarray(mean)
        out[f"enc.logvar.{i}"] = np.ascontiguousarray(logvar)
        out[f"enc.noise.{i}"] = noise
        out[f"enc.latent.{i}"] = np.ascontiguousarray((post_t * cfg["scaling_factor"]).numpy())
    meta = {
        "format": "hi3.vae-fixture",
        "vae": json.dumps(cfg),
        "seed": str(SEED),
        "checksum": repr(checksum(vae)),
        "n_tensors": str(len(names)),
        "upstream": f"{UPSTREAM_REV}:{UPSTREAM_PATH}",
        "torch": torch.__version__,
    }
    os.makedirs(a.out, exist_ok=True)
    save_file(out, os.path.join(a.out, name + ".safetensors"), metadata=meta)
    print(f"vae_ref: wrote {a.out}/{name}.safetensors ({len(names)} weight tensors, checksum {meta['checksum']})")


def cmd_bench(a):
    mod = load_upstream(a.upstream)
    with open(os.path.join(a.model, "config.json")) as fh:
        cfg = json.load(fh)["vae"]
    vae = build(mod, cfg, only_decoder=not a.encode, only_encoder=a.encode)
    with safe_open(os.path.join(a.model, "model.safetensors"), framework="numpy") as st:
        set_weights(vae, lambda n, s: st.get_tensor(n).astype(np.float32))
    if a.threads:
        torch.set_num_threads(a.threads)
    f = cfg["ffactor_spatial"]
    z = cfg["latent_channels"]
    rng = np.random.default_rng(1)
    for size in a.sizes.split(","):
        h, w = (int(v) for v in size.split("x"))
        lat = rng.standard_normal((1, z, h, w)).astype(np.float32)
        img = test_image(rng, h * f, w * f)
        run = (lambda: encode(vae, img)) if a.encode else (lambda: decode(vae, lat, cfg))
        run()                                   # warm up
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(a.repeat):
            run()
        rec = {"engine": "pytorch", "torch": torch.__version__, "threads": torch.get_num_threads(),
               "latent": [h, w], "image": [h * f, w * f],
               ("encode_s" if a.encode else "decode_s"): (time.perf_counter() - t0) / a.repeat,
               "cpu_s": (time.process_time() - c0) / a.repeat,
               "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}
        print(json.dumps(rec), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--upstream", help="autoencoder_kl_3d.py to use instead of the mirror's")
    sub = p.add_subparsers(dest="cmd", required=True)
    fx = sub.add_parser("fixtures")
    fx.add_argument("--out", required=True)
    bn = sub.add_parser("bench")
    bn.add_argument("--model", required=True)
    bn.add_argument("--sizes", default="2x2,4x4")
    bn.add_argument("--repeat", type=int, default=3)
    bn.add_argument("--threads", type=int, default=0)
    bn.add_argument("--encode", action="store_true")
    a = p.parse_args()
    torch.manual_seed(0)
    {"fixtures": cmd_fixtures, "bench": cmd_bench}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
