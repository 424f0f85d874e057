#!/usr/bin/env python3
"""Reference fixtures for hi3's image reading and preprocessing (tests/test-image.c).

Runs upstream's own preprocessing -- HunyuanImage3ImageProcessor from
image_processor.py at 1201fe8, read from a git mirror of
suryatmodulus/HunyuanImage-3.0 at run time (nothing of it is copied here) --
and Pillow and torchvision directly, and writes under --out
(tests/fixtures/image/):

  *.png *.jpg *.gif *.bmp *.tga *.ppm   test images, generated here: gradients,
        checkerboards, noise, text drawn with DejaVu Sans; RGBA / LA / palette /
        1-bit / 16-bit / interlaced PNGs, EXIF- and XMP-rotated PNGs and JPEGs,
        grayscale, progressive and CMYK JPEGs
  expected.safetensors   what the references make of them; metadata "cases"
        (JSON) says what each tensor is:
          resize.N.*      Image.resize / torchvision resize of a synthetic
                          source (pattern() below, which test-image.c computes
                          the same way): the whole output when small, else its
                          checksum() and three rows
          load.NAME       load_image(NAME) as (H, W, 3) uint8
          vae.NAME.* vit.NAME.KERNEL.*   get_image_with_size(NAME, ...,
                          "vae_vit"): bucket, crop, checksums of the uint8
                          image and of the float tensors
          buckets, lut.vae, lut.vit, grid.*   bucket table, normalisation of
                          all 256 values, bucket and patch grid of many sizes

torchvision picks its uint8 resize kernel from torch's CPU capability, read
when torch is imported, so the ViT parts run in three subprocesses with
ATEN_CPU_CAPABILITY=avx2 (the native uint8 kernel), default (the float32
path as the plain x86-64 build computes it) and avx512 (the float32 path of
torch's AVX-512 build, which hi3 matches only approximately); the machine
must have AVX-512.

Needs the versions upstream pins (requirements.txt at 1201fe8: pillow 12.0.0,
transformers 4.57.1; torch 2.8.0, torchvision 0.23.0), numpy, safetensors.
  make check-ref-image PYTHON_REF=/path/to/venv/bin/python \\
      UPSTREAM=/path/to/HunyuanImage-3.0.git
"""
import argparse
import io
import json
import os
import struct
import subprocess
import sys
import tempfile
import types
import zlib

import numpy as np

UPSTREAM_COMMIT = "1201fe8"
FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
# config.json vit_processor of the released checkpoints
VIT_PROCESSOR = {"do_convert_rgb": None, "do_normalize": True, "do_rescale": True, "do_resize": True,
                 "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "Siglip2ImageProcessorFast",
                 "image_std": [0.5, 0.5, 0.5], "max_num_patches": 1024, "patch_size": 16,
                 "processor_class": "Siglip2Processor", "resample": 2, "rescale_factor": 0.00392156862745098}
KERNELS = {"avx2": "u8", "default": "f32", "avx512": "avx512"}
FULL_MAX = 12288       # outputs up to this many bytes are stored whole


# ------------------------------------------------------------ shared with C

def pattern(w, h, c, seed):
    """The synthetic source of the resize cases (test-image.c: pattern()):
    per pixel, by ((x / 7) + 2 (y / 5) + seed) mod 3: hash noise, a
    gradient, or a one-pixel checkerboard of 0 and 255 (the worst case for
    ringing and clipping). uint32 arithmetic, wrapping."""
    y, x, ch = np.meshgrid(np.arange(h, dtype=np.uint32), np.arange(w, dtype=np.uint32),
                           np.arange(c, dtype=np.uint32), indexing="ij")
    s = np.uint32(seed)
    with np.errstate(over="ignore"):
        hs = (x * np.uint32(0x9E3779B1)) ^ (y * np.uint32(0x85EBCA77)) ^ (ch * np.uint32(0xC2B2AE3D)) \
            ^ (s * np.uint32(0x27D4EB2F))
        hs ^= hs >> np.uint32(15)
        hs *= np.uint32(0x2C1B3C6D)
        hs ^= hs >> np.uint32(12)
        q = (x // np.uint32(7) + np.uint32(2) * (y // np.uint32(5)) + s) % np.uint32(3)
        grad = (x * np.uint32(3) + y * np.uint32(5) + ch * np.uint32(85)) & np.uint32(255)
        chk = np.where(((x + y + ch) & np.uint32(1)) == 1, np.uint32(255), np.uint32(0))
        v = np.where(q == 0, hs & np.uint32(255), np.where(q == 1, grad, chk))
    return v.astype(np.uint8)


def checksum(data):
    """test-image.c: checksum(): the bytes as little-endian u64 words (zero
    padded), sum of splitmix64(word ^ index * golden) mod 2^64, plus the
    length."""
    b = bytes(data)
    b += b"\0" * (-len(b) % 8)
    w = np.frombuffer(b, dtype="<u8")
    with np.errstate(over="ignore"):
        z = w ^ (np.arange(len(w), dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
        return int((z.sum(dtype=np.uint64) + np.uint64(len(bytes(data)))) & np.uint64(0xFFFFFFFFFFFFFFFF))


# ------------------------------------------------------------ the cases

# (source w, h, c, seed, output w, h, filter): Pillow filters 1 LANCZOS, 2 BILINEAR, 3 BICUBIC
PIL_CASES = [
    (64, 48, 3, 1, 32, 24, 1), (64, 48, 3, 2, 17, 13, 1), (40, 30, 3, 3, 61, 47, 1), (50, 4000, 3, 4, 5, 400, 1),
    (4000, 50, 3, 5, 400, 5, 1), (50, 4000, 3, 6, 64, 4096, 1), (33, 33, 3, 7, 33, 20, 1), (33, 33, 3, 8, 20, 33, 1),
    (1, 50, 3, 9, 7, 9, 1), (50, 1, 3, 10, 9, 7, 1), (123, 77, 3, 11, 31, 97, 1), (64, 48, 3, 12, 32, 24, 3),
    (40, 30, 3, 13, 61, 47, 3), (64, 48, 3, 14, 17, 13, 2), (40, 30, 3, 15, 61, 47, 2), (300, 200, 3, 16, 256, 171, 1),
    (7, 5, 3, 17, 1, 1, 1), (1000, 8, 3, 18, 3, 8, 1), (64, 48, 1, 19, 32, 24, 1), (64, 48, 4, 20, 32, 24, 1),
    (2000, 1500, 3, 21, 1365, 1024, 1), (97, 61, 3, 22, 97, 61, 1), (512, 512, 3, 23, 37, 41, 3),
    (16, 16, 3, 24, 1024, 1024, 1),
]
# (source w, h, c, seed, output w, h): torchvision bilinear antialias, every kernel
TV_CASES = [
    (64, 48, 3, 31, 32, 32), (40, 30, 3, 32, 96, 64), (1024, 1024, 3, 33, 512, 512), (1920, 1080, 3, 34, 672, 384),
    (50, 4000, 3, 35, 64, 4096), (4000, 50, 3, 36, 4096, 64), (100, 100, 3, 37, 512, 512), (333, 517, 3, 38, 320, 496),
    (777, 123, 3, 39, 720, 112), (33, 33, 3, 40, 16, 33), (33, 33, 3, 41, 33, 16), (7, 5, 3, 42, 16, 16),
    (1, 1, 3, 43, 16, 16), (300, 200, 3, 44, 48, 32), (123, 77, 3, 45, 61, 211), (64, 48, 1, 46, 32, 32),
    (64, 48, 4, 47, 32, 32), (4000, 3000, 3, 48, 592, 448), (57, 43, 3, 49, 23, 19),
]
# (h, w) for the bucket index and the ViT grid
GRID_SIZES = [(1024, 1024), (1080, 1920), (1920, 1080), (100, 100), (50, 4000), (4000, 50), (1, 100000),
              (100000, 1), (768, 1024), (1024, 768), (720, 1280), (1280, 720), (3000, 4000), (1, 1), (2, 1),
              (1, 2), (600, 1000), (999, 1000), (1000, 999), (512, 2048), (2048, 512), (333, 517), (517, 333),
              (1200, 1600), (1, 3), (3, 1), (17, 4001), (4001, 17), (640, 1408), (1408, 640), (832, 1216),
              (650, 1400), (1000, 1365), (1000, 1366), (123, 456), (456, 123), (9000, 7), (7, 9000),
              # halfway between two buckets' ratios (np.argmin: the first on a tie)
              (1600, 1500), (1500, 1600), (930, 1600), (1600, 930), (1245, 1600), (1600, 1245)]


# ------------------------------------------------------------ test images

def png_chunk(t, d):
    return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)


def raw_png(w, h, ct, bd, rows, extra_before=b"", extra_after=b"", interlace=False):
    """A PNG written by hand: rows are the filtered-less scanlines of each
    pass (filter byte 0 added here)."""
    data = b"".join(b"\0" + r for r in rows)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, bd, ct, 0, 0, int(interlace)))
            + extra_before + png_chunk(b"IDAT", zlib.compress(data, 9)) + extra_after + png_chunk(b"IEND", b""))


def adam7_rows(a):
    """Scanlines of an (h, w, c) uint8 array in Adam7 pass order."""
    passes = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]
    rows = []
    for x0, y0, dx, dy in passes:
        sub = a[y0::dy, x0::dx]
        if sub.shape[0] and sub.shape[1]:
            rows += [r.tobytes() for r in sub]
    return rows


def tiff_orientation(o, endian="<", typ=3):
    e = endian
    head = (b"II*\0" if e == "<" else b"MM\0*") + struct.pack(e + "I", 8)
    val = struct.pack(e + "HH", o, 0) if typ == 3 else struct.pack(e + "I", o)
    return head + struct.pack(e + "H", 1) + struct.pack(e + "HHI", 0x0112, typ, 1) + val + struct.pack(e + "I", 0)


def smooth(w, h, seed, noise=0.0):
    """A compressible picture: gradients, a few discs (and soft noise)."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    rng = np.random.default_rng(seed)
    img = np.stack([x / max(w - 1, 1) * 255, y / max(h - 1, 1) * 255, (x + y) / max(w + h - 2, 1) * 255], -1)
    for _ in range(4):
        cx, cy, r = rng.uniform(0, w), rng.uniform(0, h), rng.uniform(0.1, 0.4) * min(w, h)
        col = rng.uniform(0, 255, 3)
        m = (x - cx) ** 2 + (y - cy) ** 2 < r * r
        img[m] = 0.5 * img[m] + 0.5 * col
    if noise:
        img += rng.normal(0, noise, img.shape)
    return np.clip(np.round(img), 0, 255).astype(np.uint8)


def text_image(w, h, text):
    from PIL import Image, ImageDraw, ImageFont
    im = Image.new("RGB", (w, h), (250, 248, 240))
    d = ImageDraw.Draw(im)
    font = ImageFont.truetype(FONT, max(10, h // 3))
    d.rectangle([2, 2, w - 3, h - 3], outline=(30, 60, 200), width=2)
    d.text((6, h // 6), text, font=font, fill=(10, 10, 10))
    return im


def make_images(out):
    """Writes the test images; returns {name: how to compare} ("exact", or
    "unaccepted" for a format hi3 refuses)."""
    from PIL import Image
    files = {}

    def save(name, data_or_image, how="exact", **kw):
        p = os.path.join(out, name)
        if isinstance(data_or_image, bytes):
            with open(p, "wb") as f:
                f.write(data_or_image)
        else:
            data_or_image.save(p, **kw)
        files[name] = how

    base = pattern(37, 23, 3, 101)
    save("rgb.png", Image.fromarray(base))
    alpha = pattern(37, 23, 1, 102)[:, :, 0]
    save("rgba.png", Image.fromarray(np.dstack([base, alpha]), "RGBA"))
    save("la.png", Image.fromarray(np.dstack([base[:, :, 0], alpha]), "LA"))
    save("gray.png", Image.fromarray(base[:, :, 1], "L"))
    save("palette.png", Image.fromarray(base).quantize(colors=37, method=Image.Quantize.MEDIANCUT))
    pt = Image.fromarray(base).quantize(colors=16, method=Image.Quantize.MEDIANCUT)
    pt.info["transparency"] = 3
    save("palette-trns.png", pt, transparency=3)
    save("bilevel.png", Image.fromarray(base[:, :, 2] > 127).convert("1"))
    vals = np.array([0, 1, 255, 256, 300, 1000, 30000, 65535], dtype=np.uint16)
    g16 = np.tile(vals, (3, 2)) + np.arange(3, dtype=np.uint16)[:, None] * 7
    save("gray16.png", raw_png(16, 3, 0, 16, [r.astype(">u2").tobytes() for r in g16]))
    rgb16 = np.dstack([g16, g16[:, ::-1], np.full_like(g16, 40000)])
    save("rgb16.png", raw_png(16, 3, 2, 16, [r.astype(">u2").tobytes() for r in rgb16]))
    la16 = np.dstack([g16, g16[::-1]])
    save("la16.png", raw_png(16, 3, 4, 16, [r.astype(">u2").tobytes() for r in la16]))
    save("interlaced.png", raw_png(37, 23, 2, 8, adam7_rows(base), interlace=True))
    # EXIF orientation in PNG: every value, MM byte order, after IDAT, XMP
    small = pattern(5, 3, 3, 103)
    rows = [r.tobytes() for r in small]
    for o in range(1, 9):
        save("exif%d.png" % o, raw_png(5, 3, 2, 8, rows, png_chunk(b"eXIf", tiff_orientation(o))))
    save("exif6-mm.png", raw_png(5, 3, 2, 8, rows, png_chunk(b"eXIf", tiff_orientation(6, ">"))))
    save("exif6-long.png", raw_png(5, 3, 2, 8, rows, png_chunk(b"eXIf", tiff_orientation(6, typ=4))))
    save("exif8-after.png", raw_png(5, 3, 2, 8, rows, extra_after=png_chunk(b"eXIf", tiff_orientation(8))))
    save("exif-bad.png", raw_png(5, 3, 2, 8, rows, png_chunk(b"eXIf", b"not a TIFF block")), "refused")
    xmp = b'<x:xmpmeta><rdf:Description tiff:Orientation="6"/></x:xmpmeta>'
    save("xmp6.png", raw_png(5, 3, 2, 8, rows, png_chunk(b"iTXt", b"XML:com.adobe.xmp\0\0\0\0\0" + xmp)))
    save("xmp5z.png", raw_png(5, 3, 2, 8, rows, png_chunk(b"iTXt", b"XML:com.adobe.xmp\0\1\0\0\0" + zlib.compress(
        b"<x:xmpmeta><tiff:Orientation>5</tiff:Orientation></x:xmpmeta>"))))
    save("exif3-xmp6.png", raw_png(5, 3, 2, 8, rows, png_chunk(b"eXIf", tiff_orientation(3))
                                   + png_chunk(b"iTXt", b"XML:com.adobe.xmp\0\0\0\0\0" + xmp)))
    rawprof = "\nexif\n%8d\n" % len(tiff_orientation(7)) + tiff_orientation(7).hex() + "\n"
    save("rawprofile7.png", raw_png(5, 3, 2, 8, rows, png_chunk(b"tEXt", b"Raw profile type exif\0"
                                                                 + rawprof.encode("latin-1"))))
    # GIF and BMP; TGA and PPM, which hi3 refuses (it reads JPEG, PNG, WebP, GIF and BMP)
    save("palette.gif", Image.fromarray(base).quantize(colors=64), format="GIF")
    save("palette-trns.gif", Image.fromarray(base).quantize(colors=16), format="GIF", transparency=3)
    save("rgb.bmp", Image.fromarray(base), format="BMP")
    save("rgb.tga", Image.fromarray(base), how="unaccepted", format="TGA")
    save("rgb.ppm", Image.fromarray(base), how="unaccepted", format="PPM")
    # JPEGs: exact since hi3 decodes them with libjpeg-turbo (the fixtures
    # committed before that say "jpeg"; tests/test-image.c takes both)
    pic = Image.fromarray(smooth(56, 40, 104, noise=2.0))
    save("photo.jpg", pic, quality=90)
    save("photo-444.jpg", pic, quality=95, subsampling=0)
    save("photo-progressive.jpg", pic, quality=90, progressive=True)
    save("gray.jpg", pic.convert("L"), quality=90)
    save("cmyk.jpg", pic.convert("CMYK"), quality=95)
    save("text.jpg", text_image(72, 40, "Ag"), quality=85)
    ex = Image.Exif()
    ex[0x0112] = 6
    save("exif6.jpg", pic, quality=90, exif=ex.tobytes())
    ex[0x0112] = 3
    save("exif3.jpg", pic, quality=90, exif=ex.tobytes())
    # pictures for the preprocessing views
    save("text.png", text_image(256, 96, "hi3 preprocessing"))
    save("smooth.png", Image.fromarray(smooth(300, 200, 105)))
    tall = smooth(50, 4000, 106)
    save("tall.png", Image.fromarray(tall))
    save("one.png", Image.fromarray(np.array([[[200, 30, 90]]], dtype=np.uint8)))
    ex[0x0112] = 6
    save("smooth6.png", Image.fromarray(smooth(120, 90, 107)), exif=ex.tobytes())
    save("wide.png", Image.fromarray(smooth(480, 270, 108).repeat(4, 0).repeat(4, 1)))
    return files


# ------------------------------------------------------------ upstream

def import_upstream(git_dir, tmp):
    pkg = os.path.join(tmp, "hunyuan_image_3")
    os.makedirs(pkg, exist_ok=True)
    open(os.path.join(pkg, "__init__.py"), "w").close()
    for f in ("image_processor.py", "tokenization_hunyuan_image_3.py"):
        src = subprocess.run(["git", "-C", git_dir, "show", "%s:hunyuan_image_3/%s" % (UPSTREAM_COMMIT, f)],
                             check=True, capture_output=True).stdout
        with open(os.path.join(pkg, f), "wb") as fh:
            fh.write(src)
    # the tokenizer module imports diffusers for one base class
    du = types.ModuleType("diffusers.utils")
    du.BaseOutput = type("BaseOutput", (), {})
    sys.modules.setdefault("diffusers", types.ModuleType("diffusers"))
    sys.modules["diffusers.utils"] = du
    sys.path.insert(0, tmp)
    import hunyuan_image_3.image_processor as ip
    return ip


def processor(ip):
    cfg = types.SimpleNamespace(image_base_size=1024, vae_type="hunyuan-image-vae-v1",
                                vae_downsample_factor=[16, 16], patch_size=1,
                                vit_type="siglip2-so400m-patch16-naflex", vit_processor=VIT_PROCESSOR,
                                cond_token_attn_type="joint_full", cond_image_type="vae_vit")
    return ip.HunyuanImage3ImageProcessor(cfg)


def put(tensors, name, arr):
    tensors[name] = np.ascontiguousarray(arr)


def put_image(tensors, meta, name, arr):
    """Whole when small, else its checksum and the checksums of 16 bands of
    rows (band b: rows b h / 16 to (b + 1) h / 16), to say where it differs."""
    arr = np.ascontiguousarray(arr)
    b = arr.tobytes()
    meta["shape"] = list(arr.shape)
    meta["checksum"] = "%016x" % checksum(b)
    if len(b) <= FULL_MAX:
        put(tensors, name, arr)
        meta["whole"] = True
    else:
        h, n = arr.shape[0], min(16, arr.shape[0])
        put(tensors, name + ".bands", np.array([checksum(arr[k * h // n:(k + 1) * h // n].tobytes())
                                                 for k in range(n)], dtype=np.uint64))
        meta["whole"] = False


# ------------------------------------------------------------ parts

def part_tv(args):
    """Run under one ATEN_CPU_CAPABILITY: torchvision cases and ViT views."""
    import torch
    from PIL import Image
    from torchvision.transforms.v2 import functional as F
    from torchvision.transforms import InterpolationMode
    cap = torch.backends.cpu.get_cpu_capability()
    want = {"avx2": "AVX2", "default": "NO AVX", "avx512": "AVX512"}[args.capability]
    if cap != want:
        sys.exit("imageprep_ref: torch reports CPU capability %r, wanted %r (%s)" % (cap, want, args.capability))
    with tempfile.TemporaryDirectory() as tmp:
        ip = import_upstream(args.upstream, tmp)
        proc = processor(ip)
        tensors, meta = {}, {"capability": cap, "resize": [], "views": {}}
        for i, (sw, sh, c, seed, dw, dh) in enumerate(TV_CASES):
            src = pattern(sw, sh, c, seed)
            t = torch.from_numpy(src).permute(2, 0, 1)      # as pil_to_tensor lays it out
            r = F.resize(t, [dh, dw], interpolation=InterpolationMode.BILINEAR, antialias=True)
            m = {"sw": sw, "sh": sh, "c": c, "seed": seed, "dw": dw, "dh": dh}
            put_image(tensors, m, "tv.%d" % i, r.permute(1, 2, 0).numpy())
            tensors["raw.tv.%d" % i] = r.permute(1, 2, 0).numpy()
            meta["resize"].append(m)
        for name in args.views:
            cond, _ = proc.get_image_with_size(os.path.join(args.out, name), random_crop="center",
                                               return_type="vae_vit")
            vit = cond.vit_image
            shapes = vit.vision_encoder_kwargs["spatial_shapes"].tolist()
            mask = vit.vision_encoder_kwargs["pixel_attention_mask"]
            pv = vit.float().numpy()
            # the resized uint8 image, as the processor made it
            img = Image.open(os.path.join(args.out, name))
            from PIL import ImageOps
            img = ImageOps.exif_transpose(img).convert("RGB")
            r = F.resize(F.pil_to_tensor(img), [shapes[0] * 16, shapes[1] * 16],
                         interpolation=InterpolationMode.BILINEAR, antialias=True)
            # self-check: pixel_values are the normalised patches of r
            x = (r.float() - 127.5) / 127.5
            n = shapes[0] * shapes[1]
            patches = x.reshape(3, shapes[0], 16, shapes[1], 16).permute(1, 3, 2, 4, 0).reshape(n, 768)
            assert torch.equal(patches, vit[:n]) and not vit[n:].any(), name
            assert int(mask.sum()) == n and mask[:n].all(), name
            m = {"grid": shapes, "image_token_length": vit.i.image_token_length,
                 "pixel_values": "%016x" % checksum(pv.tobytes()), "mask": "%016x" % checksum(
                     mask.numpy().astype("<i4").tobytes())}
            put_image(tensors, m, "vit.%s.%s" % (name, args.capability), r.permute(1, 2, 0).numpy())
            tensors["raw.vit.%s" % name] = r.permute(1, 2, 0).numpy()
            meta["views"][name] = m
        if args.capability == "avx2":
            u = torch.arange(256, dtype=torch.uint8).reshape(1, 1, 256).expand(3, 1, 256)
            vp = proc.vit_processor
            lut = vp.rescale_and_normalize(u, True, vp.rescale_factor, True, tuple(vp.image_mean), tuple(vp.image_std))
            put(tensors, "lut.vit", lut[0, 0].numpy())
            pil = Image.fromarray(np.arange(256, dtype=np.uint8).reshape(1, 256)).convert("RGB")
            put(tensors, "lut.vae", proc.pil_image_to_tensor(pil)[0, 0].numpy())
        np.savez(args.part_out, meta=json.dumps(meta), **tensors)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="tests/fixtures/image")
    ap.add_argument("--upstream", required=True, help="git directory of suryatmodulus/HunyuanImage-3.0")
    ap.add_argument("--capability", help=argparse.SUPPRESS)
    ap.add_argument("--part-out", help=argparse.SUPPRESS)
    ap.add_argument("--views", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.capability:
        return part_tv(args)

    import PIL
    import torch
    import torchvision
    import transformers
    from PIL import Image, ImageOps
    from safetensors.numpy import save_file
    from transformers.image_utils import load_image
    from transformers.models.siglip2.image_processing_siglip2_fast import get_image_size_for_max_num_patches

    os.makedirs(args.out, exist_ok=True)
    for f in os.listdir(args.out):
        os.remove(os.path.join(args.out, f))
    files = make_images(args.out)
    tensors, cases = {}, {"versions": {"pillow": PIL.__version__, "torch": torch.__version__,
                                       "torchvision": torchvision.__version__,
                                       "transformers": transformers.__version__, "numpy": np.__version__,
                                       "upstream": "suryatmodulus/HunyuanImage-3.0@" + UPSTREAM_COMMIT}}

    # Pillow's resize of the synthetic sources
    cases["pil"] = []
    for i, (sw, sh, c, seed, dw, dh, flt) in enumerate(PIL_CASES):
        src = pattern(sw, sh, c, seed)
        mode = {1: "L", 3: "RGB", 4: "CMYK"}[c]        # CMYK: four plain bands (RGBA is premultiplied)
        im = Image.fromarray(src[:, :, 0] if c == 1 else src, mode)
        r = np.asarray(im.resize((dw, dh), resample=flt)).reshape(dh, dw, c)
        m = {"sw": sw, "sh": sh, "c": c, "seed": seed, "dw": dw, "dh": dh, "filter": flt}
        put_image(tensors, m, "pil.%d" % i, r)
        cases["pil"].append(m)

    # load_image of every file
    cases["load"] = {}
    for name, how in sorted(files.items()):
        m = {"how": how}
        try:
            a = np.asarray(load_image(os.path.join(args.out, name)))
            put_image(tensors, m, "load." + name, a)
        except Exception as e:     # what upstream does with it
            m["error"] = "%s: %s" % (type(e).__name__, e)
        cases["load"][name] = m

    with tempfile.TemporaryDirectory() as tmp:
        ip = import_upstream(args.upstream, tmp)
        proc = processor(ip)
        g = proc.vae_reso_group
        put(tensors, "buckets", np.array([[r.h, r.w] for r in g.data], dtype=np.int32))
        grid = []
        for h, w in GRID_SIZES:
            gh, gw = get_image_size_for_max_num_patches(h, w, 16, 1024)
            grid.append([int(g.get_base_size_and_ratio_index(w, h)[1]), gh // 16, gw // 16])
        put(tensors, "grid.sizes", np.array(GRID_SIZES, dtype=np.int64))
        put(tensors, "grid.expected", np.array(grid, dtype=np.int32))

        # the VAE view: upstream's get_image_with_size, with its resize and
        # crop calls recorded
        views = ["text.png", "smooth.png", "tall.png", "one.png", "smooth6.png", "wide.png", "rgb.png"]
        cases["vae"] = {}
        calls = []
        orig_resize, orig_crop = Image.Image.resize, Image.Image.crop
        Image.Image.resize = lambda self, size, *a, **k: (calls.append(("resize", tuple(size))),
                                                           orig_resize(self, size, *a, **k))[1]
        Image.Image.crop = lambda self, box=None: (calls.append(("crop", tuple(box))), orig_crop(self, box))[1]
        try:
            for name in views:
                for crop in ("center", "resize"):
                    calls.clear()
                    t, _ = proc.get_image_with_size(os.path.join(args.out, name), random_crop=crop, return_type="vae")
                    rs = [c[1] for c in calls if c[0] == "resize"]
                    cr = [c[1] for c in calls if c[0] == "crop"]
                    u8 = np.asarray(ip.resize_and_crop(load_image(os.path.join(args.out, name)), (t.i.image_width,
                                                       t.i.image_height), crop_type=crop))
                    f = t.numpy()
                    assert f.dtype == np.float32 and f.shape == (3, t.i.image_height, t.i.image_width)
                    m = {"bucket": int(t.i.ratio_index), "size": [t.i.image_height, t.i.image_width],
                         "resize": list(rs[-1]) if rs else None, "crop": list(cr[-1]) if cr else None,
                         "pixels": "%016x" % checksum(f.tobytes())}
                    put_image(tensors, m, "vae.%s.%s" % (name, crop), u8)
                    cases["vae"]["%s.%s" % (name, crop)] = m
        finally:
            Image.Image.resize, Image.Image.crop = orig_resize, orig_crop

    # torchvision, under each CPU capability
    cases["tv"] = {}
    raw = {}
    with tempfile.TemporaryDirectory() as tmp:
        for capability, kernel in KERNELS.items():
            part = os.path.join(tmp, capability + ".npz")
            env = dict(os.environ, ATEN_CPU_CAPABILITY=capability)
            subprocess.run([sys.executable, __file__, "--out", args.out, "--upstream", args.upstream,
                            "--capability", capability, "--part-out", part, "--views"] + views, env=env, check=True)
            z = np.load(part)
            cases["tv"][kernel] = json.loads(str(z["meta"]))
            for k in z.files:
                if k.startswith("raw."):
                    raw[(kernel, k)] = z[k]
                elif k != "meta":
                    tensors[k.replace("." + capability, "." + kernel) if k.startswith("vit.") else
                            (k.replace("tv.", "tv.%s." % kernel, 1) if k.startswith("tv.") else k)] = z[k]

    # how far torch's AVX-512 float build is from its plain one (which hi3's
    # float kernel reproduces)
    for i, m in enumerate(cases["tv"]["avx512"]["resize"]):
        d = np.abs(raw[("avx512", "raw.tv.%d" % i)].astype(int) - raw[("f32", "raw.tv.%d" % i)])
        m["vs_f32"] = [int(np.count_nonzero(d)), int(d.max())]
    for name, m in cases["tv"]["avx512"]["views"].items():
        d = np.abs(raw[("avx512", "raw.vit.%s" % name)].astype(int) - raw[("f32", "raw.vit.%s" % name)])
        m["vs_f32"] = [int(np.count_nonzero(d)), int(d.max())]
    save_file(tensors, os.path.join(args.out, "expected.safetensors"),
              metadata={"cases": json.dumps(cases, sort_keys=True)})
    total = sum(os.path.getsize(os.path.join(args.out, f)) for f in os.listdir(args.out))
    print("imageprep_ref: %d files, %d bytes in %s" % (len(os.listdir(args.out)), total, args.out))


if __name__ == "__main__":
    main()
