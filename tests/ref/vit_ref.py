#!/usr/bin/env python3
"""The vision encoder reference: upstream's own siglip2.py
(Siglip2VisionTransformer and LightProjector, read at 1201fe8 from the git
clone of upstream's Instruct code that UPSTREAM names), instantiated small, with the weights of tests/model-gen.h's
counter-based generator, fp32 on the CPU.

  vit_ref.py fixtures --out tests/fixtures/vit
      writes vit-tiny.safetensors: three generated pictures (stored as
      uint8) through upstream's image processor (HunyuanImage3ImageProcessor
      .vit_process_image, transformers' Siglip2ImageProcessorFast) and one
      patch grid given directly (uint8 levels), as one batch of 4 through
      the ViT and the aligner; and vit-gelu.safetensors: another config (erf
      GELU, an 8 x 8 position grid, a 3-deep aligner) on two given grids.
      Per entry: its grid, its inputs, the FNV-1a of its pixel_values and of
      its resized position embeddings, and its outputs: last_hidden_state
      and the aligner's, rows 0 .. nph npw (the real patches and the first
      pad slot: every pad slot of an image computes the same, which the
      script checks). Metadata: the configs, seed, the weights' checksum.
  vit_ref.py bench --model DIR [--repeat N] [--threads T]
      times upstream's ViT, and ViT + aligner, on a 1024 x 1024 image's
      32 x 32 grid of patches (1024 of 1024 slots) with the weights of DIR
      (a model directory written by tests/bench-vit --write): one JSON line,
      the mean of N runs after a warm-up.

The fixtures run torch at ATEN_CPU_CAPABILITY=default, where the resizes
(the processor's and the position grid's F.interpolate antialias) take the
float kernels hi3 reproduces bit for bit. Needs torch, torchvision, numpy,
safetensors, pillow and transformers >= 4.56, < 5 (upstream's pins: transformers
4.57.1, pillow 12; 5.x lacks the modeling_attn_mask_utils siglip2.py imports): make check-ref-vit, with PYTHONPATH naming them where
the Python's own are older.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

# a git clone of upstream's Instruct code (suryatmodulus/HunyuanImage-3.0,
# which holds UPSTREAM_REV): the environment's UPSTREAM
UPSTREAM_GIT = os.environ.get("UPSTREAM", "")
UPSTREAM_REV = "1201fe8"
UPSTREAM_PATH = "hunyuan_image_3/siglip2.py"
SEED = 11
P = 1024                          # max_num_patches: slots per image

VIT = {"_attn_implementation": "sdpa", "attention_dropout": 0.0, "hidden_act": "gelu_pytorch_tanh",
       "hidden_size": 32, "intermediate_size": 64, "layer_norm_eps": 1e-06, "num_attention_heads": 2,
       "num_channels": 3, "num_hidden_layers": 2, "num_patches": 256, "patch_size": 16,
       "output_attentions": False, "output_hidden_states": False, "use_return_dict": True}
ALIGNER = {"projector_type": "mlp_gelu", "input_dim": 32, "n_embed": 48, "depth": 2}
VIT_GELU = dict(VIT, hidden_act="gelu", hidden_size=24, intermediate_size=40, num_attention_heads=3,
                num_hidden_layers=1, num_patches=64)
ALIGNER_GELU = {"projector_type": "mlp_gelu", "input_dim": 24, "n_embed": 16, "depth": 3}

# (kind, what): "image" (h, w) of a generated picture, or "levels" (nph, npw) of a grid given directly
TINY_ENTRIES = [("image", (48, 48)), ("image", (30, 240)), ("image", (200, 24)), ("levels", (6, 9))]
GELU_ENTRIES = [("levels", (5, 7)), ("levels", (3, 40))]


def fnv1a_bytes(b):
    h = 0xCBF29CE484222325
    for x in b:
        h = ((h ^ x) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def load_siglip2(path=None):
    import importlib.util
    if path is None:
        if not UPSTREAM_GIT:
            sys.exit("vit_ref: set UPSTREAM to a git clone of upstream's Instruct code "
                     f"(it must hold commit {UPSTREAM_REV}), or pass --upstream FILE")
        text = subprocess.run(["git", "-C", UPSTREAM_GIT, "show", f"{UPSTREAM_REV}:{UPSTREAM_PATH}"],
                              check=True, capture_output=True).stdout
        d = tempfile.mkdtemp(prefix="hi3-vit-ref.")
        path = os.path.join(d, "siglip2.py")
        with open(path, "wb") as f:
            f.write(text)
    spec = importlib.util.spec_from_file_location("siglip2", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build(mod, vit, aligner, get):
    """Upstream's modules with every parameter from get(name, shape)."""
    import numpy as np
    import torch
    vm = mod.Siglip2VisionTransformer(dict(vit)).eval().float()
    va = mod.LightProjector(dict(aligner)).eval().float()
    names = []
    with torch.no_grad():
        for prefix, m in (("vision_model.", vm), ("vision_aligner.", va)):
            for k, t in m.state_dict().items():
                t.copy_(torch.from_numpy(np.ascontiguousarray(get(prefix + k, tuple(t.shape)))))
                names.append(prefix + k)
    return vm, va, names


def checksum(mods):
    import numpy as np
    sd = {}
    for prefix, m in mods:
        sd.update({prefix + k: v for k, v in m.state_dict().items()})
    total = 0.0
    for k in sorted(sd):
        v = sd[k].detach().numpy().astype(np.float64).ravel()
        total += float(np.sum(v * (np.arange(v.size) % 13 + 1)))
    return total


def picture(h, w, seed):
    """A smooth picture with some noise and hard edges, uint8 (h, w, 3)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    chans = [127.5 + 100 * np.sin(x / (3.0 + c) + c) * np.cos(y / (5.0 + c) - c) for c in range(3)]
    img = np.stack(chans, axis=-1) + rng.normal(0, 12, (h, w, 3))
    img[(x.astype(int) // 8 + y.astype(int) // 8) % 5 == 0] = 250
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def run(mod, vit, aligner, entries, name, out):
    import numpy as np
    import torch
    from PIL import Image
    from safetensors.numpy import save_file
    from vae_ref import gen
    import imageprep_ref

    vm, va, names = build(mod, vit, aligner, lambda n, s: gen(n, s, SEED))
    D = vit["num_channels"] * vit["patch_size"] ** 2
    tensors, meta_entries = {}, []
    pvs, masks, shapes = [], [], []
    rng = np.random.default_rng(5)
    with tempfile.TemporaryDirectory() as tmp:
        proc = None
        for i, (kind, (a, b)) in enumerate(entries):
            if kind == "image":
                if proc is None:
                    proc = imageprep_ref.processor(imageprep_ref.import_upstream(UPSTREAM_GIT, tmp))
                img = picture(a, b, 100 + i)
                tensors[f"image.{i}"] = img
                t = proc.vit_process_image(Image.fromarray(img, "RGB"))
                pv = t.float()
                kw = t.vision_encoder_kwargs
                grid = [int(v) for v in kw["spatial_shapes"].tolist()]
                mask = kw["pixel_attention_mask"].to(torch.int32)
            else:
                grid = [a, b]
                lv = rng.integers(0, 256, (a * b, D), dtype=np.uint8)
                tensors[f"levels.{i}"] = lv
                pv = torch.zeros(P, D)
                pv[:a * b] = (torch.from_numpy(lv).float() - 127.5) / 127.5
                mask = torch.zeros(P, dtype=torch.int32)
                mask[:a * b] = 1
            assert pv.shape == (P, D) and mask.shape == (P,), (pv.shape, mask.shape)
            pvs.append(pv)
            masks.append(mask)
            shapes.append(grid)
            meta_entries.append({"kind": kind, "size": [a, b], "grid": grid,
                                 "pixel_values": fnv1a_bytes(pv.numpy().astype("<f4").tobytes())})
    pv = torch.stack(pvs)
    mask = torch.stack(masks)
    ss = torch.tensor(shapes, dtype=torch.long)
    with torch.no_grad():
        hidden = vm(pv, attention_mask=mask, spatial_shapes=ss).last_hidden_state
        embeds = va(hidden)
        g = int(vit["num_patches"] ** 0.5)
        table = vm.embeddings.position_embedding.weight.reshape(g, g, -1)
        pos = vm.embeddings.resize_positional_embeddings(table, ss, max_length=P)
    for i, (h, w) in enumerate(shapes):
        n = h * w
        rows = min(P, n + 1)
        for key, t in (("hidden", hidden[i]), ("embeds", embeds[i])):
            t = t.numpy()
            if n < P:   # every pad slot computes what the first does
                spread = float(np.abs(t[n:] - t[n]).max() / max(np.abs(t[n]).max(), 1e-30))
                assert spread < 1e-6, (name, i, key, spread)
            tensors[f"{key}.{i}"] = np.ascontiguousarray(t[:rows])
        meta_entries[i]["position"] = fnv1a_bytes(pos[i].numpy().astype("<f4").tobytes())
        tensors[f"shape.{i}"] = np.array([h, w], dtype=np.int32)
    meta = {
        "format": "hi3.vit-fixture",
        "vit": json.dumps(vit),
        "vit_aligner": json.dumps(aligner),
        "seed": str(SEED),
        "checksum": repr(checksum([("vision_model.", vm), ("vision_aligner.", va)])),
        "n_tensors": str(len(names)),
        "slots": str(P),
        "entries": json.dumps(meta_entries),
        "upstream": f"{UPSTREAM_REV}:{UPSTREAM_PATH}",
        "torch": torch.__version__,
        "capability": torch.backends.cpu.get_cpu_capability(),
    }
    os.makedirs(out, exist_ok=True)
    save_file(tensors, os.path.join(out, name + ".safetensors"), metadata=meta)
    print(f"vit_ref: wrote {out}/{name}.safetensors ({len(names)} weight tensors, grids {shapes})")


def cmd_fixtures(a):
    import torch
    cap = torch.backends.cpu.get_cpu_capability()
    if cap != "NO AVX":
        sys.exit(f"vit_ref: torch reports CPU capability {cap!r}, wanted 'NO AVX' (ATEN_CPU_CAPABILITY=default)")
    mod = load_siglip2(a.upstream)
    run(mod, VIT, ALIGNER, TINY_ENTRIES, "vit-tiny", a.out)
    run(mod, VIT_GELU, ALIGNER_GELU, GELU_ENTRIES, "vit-gelu", a.out)


def cmd_bench(a):
    import time
    import numpy as np
    import torch
    from safetensors import safe_open
    if a.threads:
        torch.set_num_threads(a.threads)
    with open(os.path.join(a.model, "config.json")) as fh:
        cfg = json.load(fh)
    mod = load_siglip2(a.upstream)
    with safe_open(os.path.join(a.model, "model.safetensors"), framework="numpy") as st:
        vm, va, _ = build(mod, cfg["vit"], cfg["vit_aligner"], lambda n, s: st.get_tensor(n).astype(np.float32))
    D = cfg["vit"]["num_channels"] * cfg["vit"]["patch_size"] ** 2
    rng = np.random.default_rng(1)
    pv = torch.from_numpy((rng.integers(0, 256, (1, P, D)).astype(np.float32) - 127.5) / 127.5)
    mask = torch.ones(1, P, dtype=torch.int32)
    ss = torch.tensor([[32, 32]])
    rec = {"engine": "pytorch", "torch": torch.__version__, "threads": torch.get_num_threads(),
           "capability": torch.backends.cpu.get_cpu_capability(), "grid": [32, 32]}
    with torch.no_grad():
        for key, fn in (("vit_s", lambda: vm(pv, attention_mask=mask, spatial_shapes=ss).last_hidden_state),
                        ("vit_aligner_s", lambda: va(vm(pv, attention_mask=mask, spatial_shapes=ss)
                                                     .last_hidden_state))):
            fn()                                   # warm up
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(a.repeat):
                fn()
            rec[key] = (time.perf_counter() - t0) / a.repeat
            rec[key[:-2] + "_cpu_s"] = (time.process_time() - c0) / a.repeat
    import resource
    rec["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps(rec), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--upstream", help="siglip2.py to use instead of the mirror's")
    sub = p.add_subparsers(dest="cmd", required=True)
    fx = sub.add_parser("fixtures")
    fx.add_argument("--out", required=True)
    bn = sub.add_parser("bench")
    bn.add_argument("--model", required=True)
    bn.add_argument("--repeat", type=int, default=3)
    bn.add_argument("--threads", type=int, default=0)
    a = p.parse_args()
    if a.cmd == "fixtures":
        os.environ["ATEN_CPU_CAPABILITY"] = "default"   # read when torch is imported
    import torch
    torch.manual_seed(0)
    {"fixtures": cmd_fixtures, "bench": cmd_bench}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
