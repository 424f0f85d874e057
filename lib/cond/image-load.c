/*
 * image-load.c -- reading an image file as upstream's loader does:
 * transformers' load_image (PIL.Image.open, ImageOps.exif_transpose, then
 * convert("RGB")), with stb_image (Debian's libstb) as the decoder.
 *
 * Before decoding: the container is walked (PNG chunks, JPEG segments,
 * GIF blocks, BMP sizes) to refuse a truncated file, to find the EXIF
 * orientation, and stbi_info gives the size, checked against the pixel
 * limit. Decoding keeps what PIL's convert("RGB") keeps: alpha dropped
 * (not composited), palettes expanded, gray replicated, 16-bit RGB(A) and
 * gray+alpha PNGs by their high byte; a 16-bit gray PNG is clipped to 255
 * as PIL's I;16 -> RGB conversion does (stb would take the high byte).
 * Known differences from PIL: JPEG decoding (stb_image's IDCT, chroma
 * upsampling and YCbCr conversion are not libjpeg-turbo's: within 2
 * levels on the test pictures), CMYK/YCCK JPEGs (stb's rounding of C*K/255), PNM files with
 * a maxval other than 255 or 16 bits per sample (stb neither rescales
 * nor clips). docs/IMAGES.md has the list.
 */
#include <limits.h>
#include <string.h>
#include <stb_image.h>
#include "cond/image-internal.h"

enum fmt { F_UNKNOWN, F_PNG, F_JPEG, F_GIF, F_BMP, F_PSD, F_HDR, F_PNM, F_PIC, F_TGA };
static const char *const fmt_names[] = {"image", "PNG", "JPEG", "GIF", "BMP", "PSD", "HDR", "PNM", "PIC", "TGA"};

static uint32_t be32(const uint8_t *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }
static uint32_t be16(const uint8_t *p) { return (uint32_t)p[0] << 8 | p[1]; }
static uint32_t le32(const uint8_t *p) { return (uint32_t)p[3] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | p[0]; }
static uint32_t le16(const uint8_t *p) { return (uint32_t)p[1] << 8 | p[0]; }

static int sniff(const uint8_t *d, size_t n)
{
	if (n >= 8 && !memcmp(d, "\x89PNG\r\n\x1a\n", 8))
		return F_PNG;
	if (n >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF)
		return F_JPEG;
	if (n >= 6 && (!memcmp(d, "GIF87a", 6) || !memcmp(d, "GIF89a", 6)))
		return F_GIF;
	if (n >= 2 && d[0] == 'B' && d[1] == 'M')
		return F_BMP;
	if (n >= 4 && !memcmp(d, "8BPS", 4))
		return F_PSD;
	if (n >= 6 && (!memcmp(d, "#?RADIANCE", HI3_MIN(n, 10)) || !memcmp(d, "#?RGBE", 6)))
		return F_HDR;
	if (n >= 2 && d[0] == 'P' && (d[1] == '5' || d[1] == '6'))
		return F_PNM;
	if (n >= 4 && !memcmp(d, "\x53\x80\xF6\x34", 4))
		return F_PIC;
	return F_UNKNOWN;  /* TGA has no signature: stb tries it last */
}

/* --------------------------------------------------- orientation */

/* A TIFF block as Pillow's Exif.load reads it. Returns 1 with *value set
 * when IFD0 has an orientation entry of a type Pillow loads (*value -1
 * when that type is not an integer: Pillow then does not transpose),
 * 0 when it has none, -1 when the block is not TIFF at all. */
static int tiff_orientation(const uint8_t *d, size_t n, int *value)
{
	int le, found = 0;
	size_t ifd, count;

	while (n >= 6 && !memcmp(d, "Exif\0\0", 6)) {
		d += 6;
		n -= 6;
	}
	if (n < 8 || !(!memcmp(d, "II*\0", 4) || !memcmp(d, "MM\0*", 4)))
		return -1;
	le = d[0] == 'I';
#define U16(p) (le ? le16(p) : be16(p))
#define U32(p) (le ? le32(p) : be32(p))
	ifd = U32(d + 4);
	if (ifd > n || n - ifd < 2)
		return 0;
	count = U16(d + ifd);
	for (size_t i = 0; i < count; i++) {
		static const uint8_t unit[17] = {0, 1, 1, 2, 4, 8, 1, 1, 2, 4, 8, 4, 8, 4, 0, 0, 8};
		size_t e = ifd + 2 + 12 * i, size, at;
		uint32_t tag, type, cnt;

		if (e > n || n - e < 12)
			break;                      /* Pillow: "Truncated File Read", the rest is lost */
		tag = U16(d + e);
		type = U16(d + e + 2);
		cnt = U32(d + e + 4);
		if (type > 16 || !unit[type])
			continue;                   /* a type Pillow does not load */
		size = (size_t)cnt * unit[type];
		at = e + 8;
		if (size > 4) {
			at = U32(d + e + 8);
			if (at > n || n - at < size)
				break;
		}
		if (tag != 0x0112 || size == 0)
			continue;
		found = 1;                      /* the last entry wins */
		switch (type) {
		case 3: *value = (int)U16(d + at); break;
		case 8: *value = (int16_t)U16(d + at); break;
		case 4: *value = U32(d + at) > 9 ? -1 : (int)U32(d + at); break;
		case 9: *value = (int32_t)U32(d + at) < 0 || (int32_t)U32(d + at) > 9 ? -1 : (int)U32(d + at); break;
		default: *value = -1; break;
		}
	}
#undef U16
#undef U32
	return found;
}

int hi3i_exif_orientation(const uint8_t *tiff, size_t len)
{
	int v = 0;

	return tiff_orientation(tiff, len, &v) == 1 ? v : 0;
}

/* re.search(rb'tiff:Orientation(="|>)([0-9])', xmp); -1 when no match. */
static int xmp_orientation(const uint8_t *d, size_t n)
{
	static const char key[] = "tiff:Orientation";
	const size_t k = sizeof(key) - 1;

	for (size_t i = 0; i + k < n; i++) {
		const uint8_t *p;
		size_t rest;

		if (memcmp(d + i, key, k))
			continue;
		p = d + i + k;
		rest = n - i - k;
		if (rest >= 3 && p[0] == '=' && p[1] == '"' && p[2] >= '0' && p[2] <= '9')
			return p[2] - '0';
		if (rest >= 2 && p[0] == '>' && p[1] >= '0' && p[1] <= '9')
			return p[1] - '0';
	}
	return -1;
}

/* What the container walk finds. */
struct meta {
	int complete;        /* PNG: IEND; JPEG: EOI; GIF: the first image; BMP: the pixel array */
	uint8_t *exif;       /* the EXIF (TIFF) block, owned; NULL when none */
	size_t exif_len;
	uint8_t *xmp;        /* the XMP packet Pillow would search, owned */
	size_t xmp_len;
	int bad_meta;        /* 1: a block Pillow could not read (it raises; hi3 ignores it) */
	int oom;             /* 1: out of memory keeping a block */
	int png_gray16;      /* a 16-bit gray PNG (PIL mode I;16) */
	int64_t png_w, png_h; /* the PNG's IHDR size; -1 when not a PNG */
	int gif_trans;       /* the first GIF image has a transparent colour index ... */
	uint8_t gif_rgb[3];  /* ... whose palette entry is this */
};

static void meta_release(struct meta *m)
{
	free(m->exif);
	free(m->xmp);
}

/* Replace *dst by a copy of src (the last block of a kind wins). */
static void keep(struct meta *m, uint8_t **dst, size_t *dlen, const uint8_t *src, size_t n)
{
	uint8_t *p = malloc(n ? n : 1);

	if (!p) {
		m->oom = 1;
		return;
	}
	memcpy(p, src, n);
	free(*dst);
	*dst = p;
	*dlen = n;
}

/* zlib data of a PNG text chunk, at most 1 MiB as Pillow's
 * _safe_zlib_decompress allows; NULL when it does not inflate. */
static uint8_t *inflate_text(const uint8_t *z, size_t zn, size_t *out)
{
	const int cap = 1 << 20;
	char *buf;
	int got;

	if (zn > INT_MAX || !(buf = malloc((size_t)cap + 1)))
		return NULL;
	got = stbi_zlib_decode_buffer(buf, cap + 1, (const char *)z, (int)zn);
	if (got < 0 || got > cap) {
		free(buf);
		return NULL;
	}
	*out = (size_t)got;
	return (uint8_t *)buf;
}

/* bytes.fromhex("".join(text.split("\n")[3:])): ImageMagick's
 * "Raw profile type exif". NULL when it is not hex. */
static uint8_t *raw_profile(const uint8_t *t, size_t n, size_t *out)
{
	size_t i = 0, k = 0;
	uint8_t *buf;
	int nl = 0, half = -1;

	while (i < n && nl < 3)
		nl += t[i++] == '\n';
	if (!(buf = malloc(n / 2 + 1)))
		return NULL;
	for (; i < n; i++) {
		int c = t[i], v;
		if (c == '\n' || c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f')
			continue;
		v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
		if (v < 0)
			break;
		if (half < 0) {
			half = v;
		} else {
			buf[k++] = (uint8_t)(half << 4 | v);
			half = -1;
		}
	}
	if (i < n || half >= 0) {
		free(buf);
		return NULL;
	}
	*out = k;
	return buf;
}

/* One PNG text chunk (tEXt, zTXt, iTXt): the XMP packet and the raw EXIF
 * profile are what getexif() reads. */
static void png_text(struct meta *m, const uint8_t *type, const uint8_t *d, size_t n, uint8_t **raw, size_t *raw_len)
{
	const uint8_t *nul = memchr(d, 0, n), *v;
	size_t kl, vn;
	int is_xmp, is_raw, compressed = 0;
	uint8_t *inflated = NULL;

	if (!nul)
		return;
	kl = (size_t)(nul - d);
	is_xmp = kl == 17 && !memcmp(d, "XML:com.adobe.xmp", 17);
	is_raw = kl == 21 && !memcmp(d, "Raw profile type exif", 21);
	if (!is_xmp && !is_raw)
		return;
	v = nul + 1;
	vn = n - kl - 1;
	if (!memcmp(type, "zTXt", 4)) {
		if (vn < 1)
			return;
		compressed = 1;
		v++;
		vn--;
	} else if (!memcmp(type, "iTXt", 4)) {
		const uint8_t *lang, *tk;
		if (vn < 2 || (v[0] && v[1]))
			return;             /* Pillow keeps a chunk of unknown compression as raw bytes only */
		compressed = v[0];
		v += 2;
		vn -= 2;
		if (!(lang = memchr(v, 0, vn)) || !(tk = memchr(lang + 1, 0, vn - (size_t)(lang + 1 - v))))
			return;
		vn -= (size_t)(tk + 1 - v);
		v = tk + 1;
	}
	if (compressed) {
		if (!(inflated = inflate_text(v, vn, &vn))) {
			m->bad_meta = 1;
			return;
		}
		v = inflated;
	}
	if (is_xmp) {
		keep(m, &m->xmp, &m->xmp_len, v, vn);
	} else {
		size_t rn;
		uint8_t *r = raw_profile(v, vn, &rn);
		if (r) {
			free(*raw);
			*raw = r;
			*raw_len = rn;
		} else {
			m->bad_meta = 1;
		}
	}
	free(inflated);
}

static void walk_png(const uint8_t *d, size_t n, struct meta *m)
{
	size_t pos = 8, raw_len = 0;
	uint8_t *raw = NULL;
	int first = 1;

	while (pos <= n && n - pos >= 12) {
		uint32_t len = be32(d + pos);
		const uint8_t *type = d + pos + 4, *data = d + pos + 8;

		if (len > 0x7fffffffu || n - pos - 12 < len)
			break;
		if (first && !memcmp(type, "IHDR", 4) && len >= 13) {
			m->png_gray16 = data[8] == 16 && data[9] == 0;
			m->png_w = be32(data);
			m->png_h = be32(data + 4);
		}
		first = 0;
		if (!memcmp(type, "IEND", 4)) {
			m->complete = 1;
			break;
		}
		if (!memcmp(type, "eXIf", 4))
			keep(m, &m->exif, &m->exif_len, data, len);
		else if (!memcmp(type, "tEXt", 4) || !memcmp(type, "zTXt", 4) || !memcmp(type, "iTXt", 4))
			png_text(m, type, data, len, &raw, &raw_len);
		pos += 12 + (size_t)len;
	}
	if (!m->exif && raw) {
		m->exif = raw;
		m->exif_len = raw_len;
	} else {
		free(raw);
	}
}

static void walk_jpeg(const uint8_t *d, size_t n, struct meta *m)
{
	size_t pos = 2;
	int scanned = 0;

	while (pos < n) {
		uint8_t mk;
		size_t len;

		if (d[pos] != 0xFF)
			break;                      /* not a marker: corrupt */
		while (pos < n && d[pos] == 0xFF)
			pos++;                      /* fill bytes */
		if (pos >= n)
			break;
		mk = d[pos++];
		if (mk == 0xD9) {
			m->complete = 1;
			break;
		}
		if (mk == 0xD8 || mk == 0x01 || (mk >= 0xD0 && mk <= 0xD7))
			continue;
		if (n - pos < 2 || (len = be16(d + pos)) < 2 || n - pos < len)
			break;
		if (mk == 0xE1 && !scanned) {
			const uint8_t *s = d + pos + 2;
			size_t sn = len - 2;
			if (sn >= 6 && !memcmp(s, "Exif\0\0", 6)) {
				/* Pillow appends later Exif segments (without their
				 * prefix) to the first */
				size_t add = m->exif ? sn - 6 : sn;
				uint8_t *e = realloc(m->exif, m->exif_len + add);
				if (!e) {
					m->oom = 1;
				} else {
					memcpy(e + m->exif_len, m->exif ? s + 6 : s, add);
					m->exif_len += add;
					m->exif = e;
				}
			} else if (sn >= 29 && !memcmp(s, "http://ns.adobe.com/xap/1.0/\0", 29)) {
				keep(m, &m->xmp, &m->xmp_len, s + 29, sn - 29);
			}
		}
		pos += len;
		if (mk == 0xDA) {
			/* entropy-coded data up to the next marker that is not a
			 * stuffed 0xFF00 or a restart */
			scanned = 1;
			for (;;) {
				const uint8_t *ff = pos < n ? memchr(d + pos, 0xFF, n - pos) : NULL;
				size_t q;
				if (!ff) {
					pos = n;
					break;
				}
				q = (size_t)(ff - d);
				while (q < n && d[q] == 0xFF)
					q++;
				if (q >= n) {
					pos = n;
					break;
				}
				if (d[q] == 0 || (d[q] >= 0xD0 && d[q] <= 0xD7)) {
					pos = q + 1;
					continue;
				}
				pos = q - 1;        /* at the 0xFF before the marker */
				break;
			}
		}
	}
}

/* GIF: header, screen descriptor and colour table, then extensions up to
 * the first image, whose LZW sub-blocks must all be present. Also the
 * first image's transparent colour (its graphic control extension) and
 * that index's palette entry: PIL's convert("RGB") of mode P shows it,
 * stb_image leaves those pixels transparent black. */
static void walk_gif(const uint8_t *d, size_t n, struct meta *m)
{
	size_t pos = 13, table = 0, ntable = 0;
	int trans = -1;

	if (n < 13)
		return;
	if (d[10] & 0x80) {
		table = 13;
		ntable = (size_t)1 << ((d[10] & 7) + 1);
		pos += 3 * ntable;
	}
	while (pos < n) {
		int image = d[pos] == 0x2C;

		if (d[pos] == 0x21) {           /* extension: introducer, label */
			if (n - pos >= 7 && d[pos + 1] == 0xF9 && d[pos + 2] == 4)
				trans = d[pos + 3] & 1 ? d[pos + 6] : -1;   /* graphic control */
			pos += 2;
		} else if (image) {             /* descriptor, local table, LZW code size */
			if (n - pos < 10)
				return;
			if (d[pos + 9] & 0x80) {
				table = pos + 10;
				ntable = (size_t)1 << ((d[pos + 9] & 7) + 1);
				pos += 3 * ntable;
			}
			pos += 11;
		} else {
			return;                     /* the trailer, or garbage, before any image */
		}
		while (pos < n && d[pos])       /* sub-blocks up to the terminator */
			pos += (size_t)d[pos] + 1;
		if (pos >= n)
			return;
		pos++;
		if (image) {
			m->complete = 1;
			if (trans >= 0 && (size_t)trans < ntable) {
				m->gif_trans = 1;
				memcpy(m->gif_rgb, d + table + 3 * (size_t)trans, 3);
			}
			return;
		}
	}
}

static void walk_bmp(const uint8_t *d, size_t n, struct meta *m)
{
	uint32_t off, hsize, comp = 0;
	int64_t w, h;
	int bpp;

	m->complete = 1;
	if (n < 26)
		return;
	off = le32(d + 10);
	hsize = le32(d + 14);
	if (hsize == 12) {
		w = le16(d + 18);
		h = le16(d + 20);
		bpp = (int)le16(d + 24);
	} else if (hsize >= 40 && n >= 34) {
		w = (int32_t)le32(d + 18);
		h = (int32_t)le32(d + 22);
		bpp = (int)le16(d + 28);
		comp = le32(d + 30);
	} else {
		return;
	}
	if (h < 0)
		h = -h;
	if (w > 0 && bpp > 0 && bpp <= 32 && (comp == 0 || comp == 3)) {
		uint64_t row = (((uint64_t)w * (uint64_t)bpp + 31) / 32) * 4;
		if ((uint64_t)off + row * (uint64_t)h > n)
			m->complete = 0;
	}
}

static void walk(const uint8_t *d, size_t n, int fmt, struct meta *m)
{
	memset(m, 0, sizeof(*m));
	m->png_w = m->png_h = -1;
	switch (fmt) {
	case F_PNG: walk_png(d, n, m); break;
	case F_JPEG: walk_jpeg(d, n, m); break;
	case F_GIF: walk_gif(d, n, m); break;
	case F_BMP: walk_bmp(d, n, m); break;
	default: m->complete = 1; break;  /* stb_image is the only judge */
	}
}

/* exif_transpose's choice: the EXIF orientation, else XMP's, applied
 * when it is 2..8. */
static int orientation_of(struct meta *m)
{
	int v = 0, r = m->exif ? tiff_orientation(m->exif, m->exif_len, &v) : 0;

	if (r < 0) {
		m->bad_meta = 1;
		r = 0;
	}
	if (r == 0 && m->xmp) {
		int x = xmp_orientation(m->xmp, m->xmp_len);
		if (x >= 0) {
			v = x;
			r = 1;
		}
	}
	return r == 1 && v >= 2 && v <= 8 ? v : 1;
}

int hi3i_image_orientation(const uint8_t *data, size_t len)
{
	struct meta m;
	int o;

	walk(data, len, sniff(data, len), &m);
	o = orientation_of(&m);
	meta_release(&m);
	return o;
}

void hi3i_image_transpose(uint8_t *dst, const uint8_t *src, int w, int h, int c, int o)
{
	int ow = o >= 5 ? h : w, oh = o >= 5 ? w : h;

	for (int y = 0; y < oh; y++)
		for (int x = 0; x < ow; x++) {
			int sx, sy;
			switch (o) {
			case 2: sx = w - 1 - x; sy = y; break;              /* FLIP_LEFT_RIGHT */
			case 3: sx = w - 1 - x; sy = h - 1 - y; break;      /* ROTATE_180 */
			case 4: sx = x; sy = h - 1 - y; break;              /* FLIP_TOP_BOTTOM */
			case 5: sx = y; sy = x; break;                      /* TRANSPOSE */
			case 6: sx = y; sy = h - 1 - x; break;              /* ROTATE_270 */
			case 7: sx = w - 1 - y; sy = h - 1 - x; break;      /* TRANSVERSE */
			case 8: sx = w - 1 - y; sy = x; break;              /* ROTATE_90 */
			default: sx = x; sy = y; break;
			}
			memcpy(dst + ((size_t)y * ow + x) * c, src + ((size_t)sy * w + sx) * c, (size_t)c);
		}
}

/* ------------------------------------------------------------ loading */

struct image {                  /* a hi3_image and what backs its pixels */
	hi3_image pub;
	int stb_owned;              /* pub.rgb came from stbi_load */
};

void hi3_image_free(hi3_image *im)
{
	struct image *p = (struct image *)im;

	if (!p)
		return;
	if (p->stb_owned)
		stbi_image_free(p->pub.rgb);
	else
		free(p->pub.rgb);
	free(p->pub.name);
	free(p);
}

int hi3_image_decode(hi3_image **out, const void *data, size_t len, const char *name, const hi3_image_opts *o,
                     hi3_error *err)
{
	const uint8_t *d = data;
	int64_t max = o && o->max_pixels ? o->max_pixels : HI3_IMAGE_MAX_PIXELS;
	struct image *im = NULL;
	struct meta m = {0};
	int fmt, w, h, comp, orient, rc = -1;
	uint8_t *px = NULL;

	*out = NULL;
	name = name ? name : "image";
	if (len == 0)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: empty file, not an image", name);
	if (len > INT_MAX)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: %zu bytes: too large a file to decode", name, len);
	fmt = sniff(d, len);
	walk(d, len, fmt, &m);
	if (m.oom) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "%s: out of memory reading the metadata", name);
		goto out;
	}
	if (!m.complete) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: truncated %s file (%s)", name, fmt_names[fmt],
		              fmt == F_PNG ? "no IEND chunk" : fmt == F_JPEG ? "no end-of-image marker" :
		              fmt == F_GIF ? "the first image's data is cut short" : "the pixel data is cut short");
		goto out;
	}
	if (m.png_w == 0 || m.png_h == 0) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: a %lldx%lld image has no pixels", name, (long long)m.png_w,
		              (long long)m.png_h);
		goto out;
	}
	stbi_set_flip_vertically_on_load_thread(0);
	if (!stbi_info_from_memory(d, (int)len, &w, &h, &comp)) {
		if (fmt == F_UNKNOWN)
			hi3_error_set(err, HI3_ERR_INPUT, "%s: not an image (PNG, JPEG, GIF, BMP, PSD, TGA, HDR, PIC or PNM): %s",
			              name, stbi_failure_reason());
		else
			hi3_error_set(err, HI3_ERR_INPUT, "%s: cannot read the %s header: %s", name, fmt_names[fmt],
			              stbi_failure_reason());
		goto out;
	}
	if (fmt == F_UNKNOWN)
		fmt = F_TGA;
	if (w <= 0 || h <= 0) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: a %dx%d image has no pixels", name, w, h);
		goto out;
	}
	if (max > 0 && (int64_t)w * h > max) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: %dx%d is %lld pixels, more than the limit of %lld", name, w, h,
		              (long long)w * h, (long long)max);
		goto out;
	}
	if (!(im = hi3i_calloc(1, sizeof(*im), err)) || !(im->pub.name = hi3i_strdup(name)))
		goto oom;
	if (fmt == F_PNG && m.png_gray16) {
		/* PIL opens it as I;16, and I;16 -> RGB clips at 255 */
		int gw, gh, gn;
		uint16_t *g = stbi_load_16_from_memory(d, (int)len, &gw, &gh, &gn, 1);
		if (!g) {
			hi3_error_set(err, HI3_ERR_INPUT, "%s: cannot decode the PNG image: %s", name, stbi_failure_reason());
			goto out;
		}
		if (!(px = malloc((size_t)w * h * 3))) {
			stbi_image_free(g);
			goto oom;
		}
		for (size_t i = 0; i < (size_t)w * h; i++)
			px[3 * i] = px[3 * i + 1] = px[3 * i + 2] = g[i] > 255 ? 255 : (uint8_t)g[i];
		stbi_image_free(g);
	} else if (fmt == F_GIF && m.gif_trans) {
		/* the transparent pixels get their palette colour, as in PIL */
		int gw, gh, gn;
		uint8_t *rgba = stbi_load_from_memory(d, (int)len, &gw, &gh, &gn, 4);
		if (!rgba) {
			hi3_error_set(err, HI3_ERR_INPUT, "%s: cannot decode the GIF image: %s", name, stbi_failure_reason());
			goto out;
		}
		if (!(px = malloc((size_t)w * h * 3))) {
			stbi_image_free(rgba);
			goto oom;
		}
		for (size_t i = 0; i < (size_t)w * h; i++)
			memcpy(px + 3 * i, rgba[4 * i + 3] ? rgba + 4 * i : m.gif_rgb, 3);
		stbi_image_free(rgba);
	} else {
		int gw, gh, gn;
		if (!(px = stbi_load_from_memory(d, (int)len, &gw, &gh, &gn, 3))) {
			hi3_error_set(err, HI3_ERR_INPUT, "%s: cannot decode the %s image: %s", name, fmt_names[fmt],
			              stbi_failure_reason());
			goto out;
		}
		im->stb_owned = 1;
	}
	im->pub.rgb = px;
	px = NULL;
	orient = orientation_of(&m);
	if (m.bad_meta)
		hi3_log(HI3_LOG_WARN, "%s: unreadable EXIF or XMP metadata ignored", name);
	im->pub.width = w;
	im->pub.height = h;
	if (orient != 1) {
		uint8_t *t = malloc((size_t)w * h * 3);
		if (!t)
			goto oom;
		hi3i_image_transpose(t, im->pub.rgb, w, h, 3, orient);
		if (im->stb_owned)
			stbi_image_free(im->pub.rgb);
		else
			free(im->pub.rgb);
		im->pub.rgb = t;
		im->stb_owned = 0;
		if (orient >= 5) {
			im->pub.width = h;
			im->pub.height = w;
		}
	}
	im->pub.format = fmt_names[fmt];
	im->pub.file_width = w;
	im->pub.file_height = h;
	im->pub.channels = comp;
	im->pub.bits = fmt == F_HDR ? 32 : stbi_is_16_bit_from_memory(d, (int)len) ? 16 : 8;
	im->pub.orientation = orient;
	*out = &im->pub;
	im = NULL;
	rc = 0;
	goto out;
oom:
	hi3_error_set(err, HI3_ERR_RUNTIME, "%s: out of memory for a %dx%d image", name, w, h);
out:
	if (px)
		stbi_image_free(px);
	hi3_image_free(im ? &im->pub : NULL);
	meta_release(&m);
	return rc;
}

int hi3_image_load(hi3_image **out, const char *path, const hi3_image_opts *o, hi3_error *err)
{
	char *buf;
	size_t len;
	int rc;

	*out = NULL;
	if (hi3i_read_file(path, &buf, &len, err))
		return -1;
	rc = hi3_image_decode(out, buf, len, strcmp(path, "-") ? path : "standard input", o, err);
	free(buf);
	return rc;
}
