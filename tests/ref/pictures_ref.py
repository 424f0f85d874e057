#!/usr/bin/env python3
"""pictures_ref.py -- the picture corpus: files made with Pillow (and, for
the JPEG encodings Pillow cannot write, tests/ref/jpeg_writer.c on the same
libjpeg), and beside each the RGB that upstream's loader gets from it:
Image.open, ImageOps.exif_transpose, convert("RGB").

    pictures_ref.py make --out tests/fixtures/pictures [--cc cc]
    pictures_ref.py check --out tests/fixtures/pictures

`make` writes the pictures and expected.safetensors (one uint8 (H, W, 3)
tensor per picture, named by its file; metadata "cases": format, Pillow's
mode, stored size, orientation; "refused": the files Pillow does not open
or load, with its message). `check` decodes the committed pictures again
with the Pillow it runs under and counts the values that differ from the
committed RGB, per format (run it under another Pillow, e.g. the pip wheel
upstream pins, to see whether that one decodes the same).

The reference is Debian's Pillow (python3-pil, linked with Debian's
libjpeg62-turbo and libwebp): run with /usr/bin/python3. The orientation
rule is Pillow 12's (upstream pins 12.0.0): when the EXIF block has no
orientation, the XMP packet's tiff:Orientation counts for PNG, and also
for JPEG and WebP (Pillow 9.4 reads it only from PNG); the script applies
that rule itself, with Pillow's own transposes.
"""
import argparse
import io
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import zlib

import numpy as np
from PIL import Image, features

TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
XMP_JPEG = b"http://ns.adobe.com/xap/1.0/\x00"


def orientation(im):
    """Pillow 12's getexif().get(0x0112), XMP fallback included."""
    o = im.getexif().get(0x0112)
    if o is None:
        xmp = im.info.get("XML:com.adobe.xmp")
        pattern = r'tiff:Orientation(="|>)([0-9])'
        if not xmp:
            xmp = im.info.get("xmp")
            if xmp is None and getattr(im, "applist", None):   # Pillow < 10 keeps JPEG XMP only in applist
                for app, s in im.applist:
                    if app == "APP1" and s.startswith(XMP_JPEG):
                        xmp = s.split(b"\x00", 1)[1]
            pattern = pattern.encode()
        if xmp:
            m = re.search(pattern, xmp)
            if m:
                o = int(m[2])
    return o


def load_image(path):
    """transformers' load_image: open, exif_transpose, convert("RGB")."""
    im = Image.open(path)
    fmt, mode, size = im.format, im.mode, im.size
    o = orientation(im)
    if o in TRANSPOSE:
        im = im.transpose(TRANSPOSE[o])
    rgb = np.asarray(im.convert("RGB"), dtype=np.uint8)
    if im.mode == "P" and int(Image.__version__.split(".")[0]) < 10:
        # Pillow 12 shows an index past the file's palette as black; 9.4
        # as its initial gray ramp (i, i, i): keep Pillow 12's rule
        n = len(im.palette.palette) // 3
        rgb = rgb.copy()
        rgb[np.asarray(im) >= n] = 0
    return rgb, {"format": fmt, "mode": mode, "size": list(size), "orientation": o if o in TRANSPOSE else 1}


# ------------------------------------------------------------ sources

def photo(w, h, seed=0):
    """A deterministic stand-in for a photo: smooth gradients, a sharp
    diagonal edge, a one-pixel checkerboard patch, and noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 128 + 100 * np.sin(x / (2.5 + seed % 3)) * np.cos(y / 4.0)
    g = 255 * x / max(w - 1, 1)
    b = 255 * y / max(h - 1, 1)
    img = np.stack([r, g, b], axis=-1)
    img[(x + 2 * y) % 23 < 4] = [250, 20, 40]
    cb = ((x.astype(int) + y.astype(int)) & 1).astype(bool) & (x < w / 3) & (y > h / 2)
    img[cb] = 255
    img += rng.normal(0, 12, img.shape)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def save(out, name, im, **kw):
    im.save(os.path.join(out, name), **kw)


def writer(out, jw, name, arr, space, *opts):
    h, w = arr.shape[:2]
    subprocess.run([jw, str(w), str(h), space, os.path.join(out, name), *opts], input=arr.tobytes(), check=True)


def splice_app1(path, payload):
    """Insert an APP1 segment right after SOI."""
    with open(path, "rb") as f:
        data = f.read()
    seg = b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload
    with open(path, "wb") as f:
        f.write(data[:2] + seg + data[2:])


def xmp_packet(o, element=False):
    tag = f"<tiff:Orientation>{o}</tiff:Orientation>" if element else f'tiff:Orientation="{o}"'
    return (f'<?xpacket begin="" id="W5M0MpCehiHzreSzNTczkc9d"?><x:xmpmeta xmlns:x="adobe:ns:meta/">'
            f'<rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#"><rdf:Description '
            f'xmlns:tiff="http://ns.adobe.com/tiff/1.0/" {tag if not element else ""}>'
            f'{tag if element else ""}</rdf:Description></rdf:RDF></x:xmpmeta><?xpacket end="w"?>').encode()


def exif_bytes(o):
    e = Image.Exif()
    e[0x0112] = o
    return e.tobytes()


# --------------------------------------------------------------- JPEG

def make_jpeg(out, jw):
    p = photo(64, 48, 1)
    for sub, tag in ((0, "444"), (1, "422"), (2, "420")):
        save(out, f"jpeg-{tag}.jpg", Image.fromarray(p), quality=90, subsampling=sub)
    for w, h in ((1, 1), (7, 5), (17, 13), (33, 31), (15, 47)):
        save(out, f"jpeg-420-{w}x{h}.jpg", Image.fromarray(photo(w, h, w)), quality=85, subsampling=2)
    save(out, "jpeg-422-17x13.jpg", Image.fromarray(photo(17, 13, 5)), quality=85, subsampling=1)
    save(out, "jpeg-q50.jpg", Image.fromarray(photo(40, 30, 2)), quality=50)
    save(out, "jpeg-q100-444.jpg", Image.fromarray(photo(24, 24, 3)), quality=100, subsampling=0)
    save(out, "jpeg-progressive-420.jpg", Image.fromarray(photo(45, 33, 4)), quality=80, progressive=True)
    save(out, "jpeg-progressive-444.jpg", Image.fromarray(photo(30, 22, 6)), quality=80, progressive=True,
         subsampling=0)
    save(out, "jpeg-optimize.jpg", Image.fromarray(photo(30, 22, 7)), quality=75, optimize=True)
    g = Image.fromarray(photo(37, 29, 8)).convert("L")
    save(out, "jpeg-gray.jpg", g, quality=85)
    save(out, "jpeg-gray-progressive.jpg", g, quality=85, progressive=True)
    save(out, "jpeg-cmyk-adobe.jpg", Image.fromarray(photo(26, 18, 9)).convert("CMYK"), quality=90)
    a = photo(35, 27, 10)
    writer(out, jw, "jpeg-411.jpg", a, "ycc", "sample=4x1,1x1,1x1")
    writer(out, jw, "jpeg-440.jpg", a, "ycc", "sample=1x2,1x1,1x1")
    writer(out, jw, "jpeg-420-restart1.jpg", a, "ycc", "sample=2x2,1x1,1x1", "restart=1")
    writer(out, jw, "jpeg-444-restart3.jpg", a, "ycc", "sample=1x1,1x1,1x1", "restart=3")
    writer(out, jw, "jpeg-progressive-restart2.jpg", a, "ycc", "sample=2x2,1x1,1x1", "restart=2", "progressive=1")
    writer(out, jw, "jpeg-arithmetic.jpg", a, "ycc", "sample=2x1,1x1,1x1", "arithmetic=1")
    writer(out, jw, "jpeg-rgb.jpg", a, "rgb")
    cmyk = np.asarray(Image.fromarray(a).convert("CMYK"))
    cmyk = cmyk.copy()
    cmyk[..., 3] = (np.arange(cmyk.shape[1])[None, :] * 7 + np.arange(cmyk.shape[0])[:, None] * 3) % 256
    # Pillow writes CMYK inverted (Adobe's convention) and reads it back inverted
    writer(out, jw, "jpeg-ycck.jpg", 255 - cmyk, "ycck", "sample=2x2,1x1,1x1,2x2")
    writer(out, jw, "jpeg-cmyk-noadobe.jpg", 255 - cmyk, "cmyk", "adobe=0")
    writer(out, jw, "jpeg-cmyk-411.jpg", 255 - cmyk, "cmyk", "sample=2x2,1x1,1x1,1x1")
    writer(out, jw, "jpeg-gray-restart.jpg", np.asarray(g)[..., None], "gray", "restart=1")
    # orientation: all eight EXIF values on a 23 x 15 picture, then XMP
    o_src = Image.fromarray(photo(23, 15, 11))
    for o in range(1, 9):
        save(out, f"jpeg-exif{o}.jpg", o_src, quality=90, exif=exif_bytes(o))
    save(out, "jpeg-xmp6.jpg", o_src, quality=90)
    splice_app1(os.path.join(out, "jpeg-xmp6.jpg"), XMP_JPEG + xmp_packet(6))
    save(out, "jpeg-xmp8-element.jpg", o_src, quality=90)
    splice_app1(os.path.join(out, "jpeg-xmp8-element.jpg"), XMP_JPEG + xmp_packet(8, element=True))
    save(out, "jpeg-exif3-xmp6.jpg", o_src, quality=90, exif=exif_bytes(3))
    splice_app1(os.path.join(out, "jpeg-exif3-xmp6.jpg"), XMP_JPEG + xmp_packet(6))


# --------------------------------------------------------------- WebP

def make_webp(out):
    p = Image.fromarray(photo(41, 27, 12))
    save(out, "webp-lossy.webp", p, quality=80)
    save(out, "webp-lossy-1x1.webp", Image.fromarray(photo(1, 1, 1)), quality=80)
    save(out, "webp-lossy-odd.webp", Image.fromarray(photo(17, 9, 13)), quality=60, method=6)
    save(out, "webp-lossless.webp", p, lossless=True)
    rgba = p.convert("RGBA")
    al = np.asarray(rgba).copy()
    al[..., 3] = (np.arange(41)[None, :] * 6) % 256
    al[:5, :5, 3] = 0
    rgba = Image.fromarray(al)
    save(out, "webp-lossy-alpha.webp", rgba, quality=80)
    save(out, "webp-lossless-alpha.webp", rgba, lossless=True)
    save(out, "webp-lossless-alpha-exact.webp", rgba, lossless=True, exact=True)
    frames = [Image.fromarray(photo(32, 24, 20 + k)) for k in range(3)]
    save(out, "webp-animated.webp", frames[0], save_all=True, append_images=frames[1:], duration=100, quality=70)
    save(out, "webp-animated-lossless.webp", frames[0].convert("RGBA"), save_all=True,
         append_images=[f.convert("RGBA") for f in frames[1:]], duration=100, lossless=True)
    o_src = Image.fromarray(photo(23, 15, 11))
    save(out, "webp-exif6.webp", o_src, quality=85, exif=exif_bytes(6))
    save(out, "webp-xmp5.webp", o_src, quality=85, xmp=xmp_packet(5))


# ---------------------------------------------------------------- PNG

def png_chunk(t, d):
    return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)


def raw_png(path, w, h, depth, ctype, rows, plte=None, trns=None):
    ihdr = struct.pack(">IIBBBBB", w, h, depth, ctype, 0, 0, 0)
    data = b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr)
    if plte is not None:
        data += png_chunk(b"PLTE", plte)
    if trns is not None:
        data += png_chunk(b"tRNS", trns)
    data += png_chunk(b"IDAT", zlib.compress(b"".join(b"\x00" + r for r in rows))) + png_chunk(b"IEND", b"")
    with open(path, "wb") as f:
        f.write(data)


def make_png(out):
    p = photo(29, 21, 30)
    save(out, "png-rgb.png", Image.fromarray(p))
    rgba = np.concatenate([p, ((np.arange(29)[None, :, None] * 9) % 256 * np.ones((21, 1, 1))).astype(np.uint8)], -1)
    save(out, "png-rgba.png", Image.fromarray(rgba))
    g = Image.fromarray(p).convert("L")
    save(out, "png-gray.png", g)
    save(out, "png-la.png", Image.fromarray(np.stack([np.asarray(g), rgba[..., 3]], -1), "LA"))
    save(out, "png-bilevel.png", g.convert("1"))
    pal = Image.fromarray(p).quantize(colors=200)
    save(out, "png-palette8.png", pal)
    save(out, "png-palette8-trns.png", pal, transparency=3)
    save(out, "png-palette4.png", Image.fromarray(p).quantize(colors=12), bits=4)
    save(out, "png-palette2.png", Image.fromarray(p).quantize(colors=4), bits=2)
    save(out, "png-palette1.png", Image.fromarray(p).quantize(colors=2), bits=1)
    save(out, "png-gray-trns.png", g, transparency=40)
    save(out, "png-rgb-trns.png", Image.fromarray(p), transparency=(p[0, 0, 0], p[0, 0, 1], p[0, 0, 2]))
    w, h = 19, 11
    y, x = np.mgrid[0:h, 0:w]
    g16 = ((x * 3449 + y * 5000) % 65536).astype(">u2")
    raw_png(os.path.join(out, "png-gray16.png"), w, h, 16, 0, [g16[r].tobytes() for r in range(h)])
    g16s = ((x * 13 + y * 11) % 300).astype(">u2")     # around 255: Pillow clips, no high byte
    raw_png(os.path.join(out, "png-gray16-low.png"), w, h, 16, 0, [g16s[r].tobytes() for r in range(h)])
    rgb16 = np.stack([(x * 3449) % 65536, (y * 6007) % 65536, (x * y * 977) % 65536], -1).astype(">u2")
    raw_png(os.path.join(out, "png-rgb16.png"), w, h, 16, 2, [rgb16[r].tobytes() for r in range(h)])
    rgba16 = np.concatenate([rgb16, ((x + y) * 3001 % 65536)[..., None].astype(">u2")], -1)
    raw_png(os.path.join(out, "png-rgba16.png"), w, h, 16, 6, [rgba16[r].tobytes() for r in range(h)])
    la16 = np.stack([g16, ((x * 7001) % 65536).astype(">u2")], -1)
    raw_png(os.path.join(out, "png-la16.png"), w, h, 16, 4, [la16[r].tobytes() for r in range(h)])
    g4 = ((x + 2 * y) % 16).astype(np.uint8)
    rows4 = [bytes(((g4[r, 2 * i] << 4) | (g4[r, 2 * i + 1] if 2 * i + 1 < w else 0)) for i in range((w + 1) // 2))
             for r in range(h)]
    raw_png(os.path.join(out, "png-gray4.png"), w, h, 4, 0, rows4)
    g2 = ((x + y) % 4).astype(np.uint8)
    rows2 = [bytes(sum((int(g2[r, 4 * i + k]) if 4 * i + k < w else 0) << (6 - 2 * k) for k in range(4))
                   for i in range((w + 3) // 4)) for r in range(h)]
    raw_png(os.path.join(out, "png-gray2.png"), w, h, 2, 0, rows2)
    # a palette of 5 entries whose pixels use indices up to 9: Pillow shows
    # the missing entries from its initial gray ramp
    idx = ((x + y) % 10).astype(np.uint8)
    raw_png(os.path.join(out, "png-palette-short.png"), w, h, 8, 3, [idx[r].tobytes() for r in range(h)],
            plte=bytes([10, 20, 30, 200, 10, 10, 0, 255, 0, 1, 2, 3, 99, 98, 97]))
    # Adam7, interlaced by the script (Pillow does not write it)
    adam7(os.path.join(out, "png-rgb-adam7.png"), photo(13, 11, 32))
    adam7(os.path.join(out, "png-rgba16-adam7.png"), rgba16, depth=16)
    o_src = Image.fromarray(photo(23, 15, 11))
    save(out, "png-exif6.png", o_src, exif=exif_bytes(6))
    from PIL import PngImagePlugin
    info = PngImagePlugin.PngInfo()
    info.add_itxt("XML:com.adobe.xmp", xmp_packet(7).decode())
    save(out, "png-xmp7.png", o_src, pnginfo=info)


def adam7(path, arr, depth=8):
    h, w, c = arr.shape
    ctype = {1: 0, 2: 4, 3: 2, 4: 6}[c]
    passes = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))
    raw = b""
    dt = ">u2" if depth == 16 else np.uint8
    for x0, y0, dx, dy in passes:
        sub = arr[y0::dy, x0::dx]
        if sub.size == 0:
            continue
        for r in sub:
            raw += b"\x00" + r.astype(dt).tobytes()
    ihdr = struct.pack(">IIBBBBB", w, h, depth, ctype, 0, 0, 1)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", zlib.compress(raw)) +
                png_chunk(b"IEND", b""))


# ---------------------------------------------------------------- GIF

def lzw_plain(indices, min_size):
    """GIF LZW data without compression: a clear code before the table
    would grow the code size (so every code is min_size + 1 bits)."""
    clear, end, size = 1 << min_size, (1 << min_size) + 1, min_size + 1
    codes, n = [clear], 0
    for i in indices:
        if n == (1 << min_size) - 2:
            codes.append(clear)
            n = 0
        codes.append(int(i))
        n += 1
    codes.append(end)
    acc = bits = 0
    out = bytearray()
    for c in codes:
        acc |= c << bits
        bits += size
        while bits >= 8:
            out.append(acc & 255)
            acc >>= 8
            bits -= 8
    if bits:
        out.append(acc & 255)
    blocks = b"".join(bytes([len(out[i:i + 255])]) + bytes(out[i:i + 255]) for i in range(0, len(out), 255))
    return bytes([min_size]) + blocks + b"\x00"


def raw_gif(path, screen, palette, frames, bg=0):
    """frames: (x, y, w, h, indices, transparency or None, local palette or None)."""
    gbits = max(1, (len(palette) // 3 - 1).bit_length()) if palette else 1
    data = b"GIF89a" + struct.pack("<HHBBB", screen[0], screen[1], (0x80 | (gbits - 1)) if palette else 0, bg, 0)
    if palette:
        data += palette.ljust(3 << gbits, b"\x00")
    for x, y, w, h, idx, trns, local in frames:
        if trns is not None:
            data += b"\x21\xf9\x04" + bytes([1]) + b"\x00\x00" + bytes([trns]) + b"\x00"
        flags = 0
        lb = 0
        if local:
            lb = max(1, (len(local) // 3 - 1).bit_length())
            flags = 0x80 | (lb - 1)
        data += b"\x2c" + struct.pack("<HHHHB", x, y, w, h, flags)
        if local:
            data += local.ljust(3 << lb, b"\x00")
        data += lzw_plain(np.asarray(idx).ravel(), max(2, lb or gbits, int(np.max(idx)).bit_length()))
    data += b"\x3b"
    with open(path, "wb") as f:
        f.write(data)


def make_gif(out):
    p = Image.fromarray(photo(27, 19, 40))
    q = p.quantize(colors=64)
    save(out, "gif-palette.gif", q)
    save(out, "gif-palette-trns.gif", q, transparency=5)
    save(out, "gif-interlaced.gif", Image.fromarray(photo(33, 25, 41)).quantize(colors=32), interlace=True)
    save(out, "gif-gray.gif", p.convert("L"))
    frames = [Image.fromarray(photo(24, 18, 42 + k)).quantize(colors=16) for k in range(3)]
    save(out, "gif-animated.gif", frames[0], save_all=True, append_images=frames[1:], duration=80, loop=0)
    pal = bytes([255, 0, 0, 0, 255, 0, 0, 0, 255, 250, 250, 250, 9, 9, 9, 100, 110, 120, 7, 200, 7, 1, 2, 250])
    y, x = np.mgrid[0:7, 0:9]
    idx = (x + y) % 8
    raw_gif(os.path.join(out, "gif-frame-offset.gif"), (15, 12), pal, [(3, 2, 9, 7, idx, None, None)])
    raw_gif(os.path.join(out, "gif-frame-offset-trns.gif"), (15, 12), pal, [(3, 2, 9, 7, idx, 6, None)])
    raw_gif(os.path.join(out, "gif-local-palette.gif"), (9, 7), pal, [(0, 0, 9, 7, idx, None, pal[::-1])])
    idx4 = (x * 3 + y) % 16                    # indices past a 4-entry palette
    raw_gif(os.path.join(out, "gif-short-palette.gif"), (9, 7), pal[:12], [(0, 0, 9, 7, idx4, None, None)])
    raw_gif(os.path.join(out, "gif-beyond-screen.gif"), (6, 5), pal, [(2, 1, 9, 7, idx, None, None)])
    raw_gif(os.path.join(out, "gif-no-palette.gif"), (9, 7), None, [(0, 0, 9, 7, idx, None, None)])


# ---------------------------------------------------------------- BMP

def raw_bmp(path, w, h, bpp, rows, palette=b"", compression=0, masks=None, top_down=False):
    hdr = 40
    extra = b"" if masks is None else struct.pack("<3I", *masks[:3])
    stride = (w * bpp + 31) // 32 * 4
    pix = b"".join(r.ljust(stride, b"\x00") for r in (rows if top_down else rows[::-1]))
    off = 14 + hdr + len(extra) + len(palette)
    info = struct.pack("<IiiHHIIiiII", hdr, w, -h if top_down else h, 1, bpp, compression, len(pix), 2835, 2835,
                       len(palette) // 4, 0) + extra
    with open(path, "wb") as f:
        f.write(b"BM" + struct.pack("<IHHI", off + len(pix), 0, 0, off) + info + palette + pix)


def make_bmp(out):
    p = photo(21, 13, 50)
    save(out, "bmp-24.bmp", Image.fromarray(p))
    save(out, "bmp-32.bmp", Image.fromarray(np.concatenate([p, np.full((13, 21, 1), 77, np.uint8)], -1)))
    save(out, "bmp-8-palette.bmp", Image.fromarray(p).quantize(colors=100))
    save(out, "bmp-8-gray.bmp", Image.fromarray(p).convert("L"))
    save(out, "bmp-1.bmp", Image.fromarray(p).convert("1"))
    bgr = p[..., ::-1]
    raw_bmp(os.path.join(out, "bmp-24-topdown.bmp"), 21, 13, 24, [bgr[r].tobytes() for r in range(13)],
            top_down=True)
    bgrx = np.concatenate([bgr, np.zeros((13, 21, 1), np.uint8)], -1)
    raw_bmp(os.path.join(out, "bmp-32-bgrx.bmp"), 21, 13, 32, [bgrx[r].tobytes() for r in range(13)])
    raw_bmp(os.path.join(out, "bmp-32-bitfields.bmp"), 21, 13, 32, [bgrx[r].tobytes() for r in range(13)],
            compression=3, masks=(0xFF0000, 0xFF00, 0xFF, 0))
    r5 = (p[..., 0] >> 3).astype(np.uint16)
    g5 = (p[..., 1] >> 3).astype(np.uint16)
    g6 = (p[..., 1] >> 2).astype(np.uint16)
    b5 = (p[..., 2] >> 3).astype(np.uint16)
    v555 = ((r5 << 10) | (g5 << 5) | b5).astype("<u2")
    v565 = ((r5 << 11) | (g6 << 5) | b5).astype("<u2")
    raw_bmp(os.path.join(out, "bmp-16-555.bmp"), 21, 13, 16, [v555[r].tobytes() for r in range(13)])
    raw_bmp(os.path.join(out, "bmp-16-565.bmp"), 21, 13, 16, [v565[r].tobytes() for r in range(13)],
            compression=3, masks=(0xF800, 0x7E0, 0x1F, 0))
    pal16 = b"".join(bytes([i * 16, 255 - i * 16, (i * 77) % 256, 0]) for i in range(16))
    i4 = ((np.arange(21)[None, :] + np.arange(13)[:, None]) % 16).astype(np.uint8)
    rows = [bytes((i4[r, 2 * k] << 4) | (i4[r, 2 * k + 1] if 2 * k + 1 < 21 else 0) for k in range(11))
            for r in range(13)]
    raw_bmp(os.path.join(out, "bmp-4.bmp"), 21, 13, 4, rows, palette=pal16)


# -------------------------------------------------------- safetensors

def write_st(path, tensors, meta):
    header, off = {}, 0
    for k, a in tensors.items():
        header[k] = {"dtype": "U8", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    header["__metadata__"] = meta
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for a in tensors.values():
            f.write(np.ascontiguousarray(a).tobytes())


def read_st(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        body = f.read()
    meta = header.pop("__metadata__")
    return {k: np.frombuffer(body[v["data_offsets"][0]:v["data_offsets"][1]], np.uint8).reshape(v["shape"])
            for k, v in header.items()}, meta


PICTURE = re.compile(r".*\.(jpg|webp|png|gif|bmp)$")


def describe():
    return (f"Pillow {Image.__version__}, libjpeg-turbo {features.version('libjpeg_turbo')}, "
            f"libwebp {features.version('webp')}, zlib {features.version('zlib')}")


def cmd_make(a):
    os.makedirs(a.out, exist_ok=True)
    for f in os.listdir(a.out):
        if PICTURE.match(f):
            os.remove(os.path.join(a.out, f))
    with tempfile.TemporaryDirectory() as tmp:
        jw = os.path.join(tmp, "jpeg_writer")
        src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jpeg_writer.c")
        subprocess.run([a.cc, "-O2", "-o", jw, src, "-ljpeg"], check=True)
        make_jpeg(a.out, jw)
    make_webp(a.out)
    make_png(a.out)
    make_gif(a.out)
    make_bmp(a.out)
    tensors, cases, refused = {}, {}, {}
    for f in sorted(os.listdir(a.out)):
        if not PICTURE.match(f):
            continue
        try:
            rgb, m = load_image(os.path.join(a.out, f))
        except Exception as e:   # recorded: hi3 must refuse these too
            refused[f] = f"{type(e).__name__}: {e}"
            continue
        tensors[f] = rgb
        cases[f] = m
    write_st(os.path.join(a.out, "expected.safetensors"), tensors,
             {"cases": json.dumps(cases), "refused": json.dumps(refused), "reference": describe()})
    total = sum(os.path.getsize(os.path.join(a.out, f)) for f in os.listdir(a.out))
    print(f"{len(cases)} pictures ({len(refused)} refused by Pillow), {total} bytes, {describe()}")


def cmd_check(a):
    want, meta = read_st(os.path.join(a.out, "expected.safetensors"))
    cases = json.loads(meta["cases"])
    per = {}
    for f, m in cases.items():
        rgb, got = load_image(os.path.join(a.out, f))
        fmt = m["format"]
        n, d = per.get(fmt, (0, 0))
        w = want[f]
        diff = int(np.count_nonzero(rgb != w)) if rgb.shape == w.shape else w.size
        if diff or got["orientation"] != m["orientation"] or got["mode"] != m["mode"]:
            print(f"{f}: {diff} values differ; mode {got['mode']} (committed {m['mode']}), orientation "
                  f"{got['orientation']} (committed {m['orientation']})")
        per[fmt] = (n + w.size, d + diff)
    print(f"{describe()} against the committed RGB ({meta['reference']}):")
    for fmt, (n, d) in sorted(per.items()):
        print(f"  {fmt}: {d} of {n} values differ")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=("make", "check"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--cc", default=os.environ.get("CC", "cc"))
    a = ap.parse_args()
    return cmd_make(a) if a.command == "make" else cmd_check(a)


if __name__ == "__main__":
    sys.exit(main())
