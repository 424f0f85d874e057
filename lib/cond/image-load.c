/*
 * image-load.c -- reading a picture as upstream's loader does: transformers'
 * load_image (PIL.Image.open, ImageOps.exif_transpose, convert("RGB")),
 * bit for bit as Pillow decodes it (docs/IMAGES.md). The formats and their
 * decoders: JPEG (image-jpeg.c, libjpeg-turbo), WebP (image-webp.c,
 * libwebp), PNG (image-png.c, libpng), GIF (image-gif.c) and BMP
 * (image-bmp.c); anything else is refused with the list of these.
 *
 * Here: reading the file with bounds (a regular file, at most max_bytes,
 * refused before it is read), recognising the format, walking the
 * container for what Pillow's plugins check or keep besides the pixels (a
 * JPEG's end-of-image marker, a PNG's chunk CRCs before the first IDAT, the
 * EXIF and XMP blocks that getexif() reads), the size check every decoder
 * makes before it allocates pixels, and the EXIF orientation.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <webp/demux.h>
#include <zlib.h>
#include "cond/image-internal.h"

enum fmt { F_UNKNOWN, F_PNG, F_JPEG, F_GIF, F_BMP, F_WEBP, F_OTHER };
/* Pillow's Image.format of each */
static const char *const fmt_names[] = {"image", "PNG", "JPEG", "GIF", "BMP", "WEBP"};
#define ACCEPTED "JPEG, PNG, WebP, GIF or BMP"

static uint32_t be32(const uint8_t *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }
static uint32_t be16(const uint8_t *p) { return (uint32_t)p[0] << 8 | p[1]; }
static uint32_t le32(const uint8_t *p) { return (uint32_t)p[3] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | p[0]; }
static uint32_t le16(const uint8_t *p) { return (uint32_t)p[1] << 8 | p[0]; }

/* The format, from the first bytes; F_OTHER with *other set for formats
 * that are recognised only to be refused by name. */
static int sniff(const uint8_t *d, size_t n, const char **other)
{
	static const struct { const char *magic; size_t len, at; const char *name; } refused[] = {
		{"II*\0", 4, 0, "TIFF"}, {"MM\0*", 4, 0, "TIFF"}, {"8BPS", 4, 0, "PSD"}, {"#?RADIANCE", 10, 0, "HDR"},
		{"#?RGBE", 6, 0, "HDR"}, {"\x53\x80\xF6\x34", 4, 0, "PIC"}, {"ftypheic", 8, 4, "HEIC"},
		{"ftypheix", 8, 4, "HEIC"}, {"ftypmif1", 8, 4, "HEIF"}, {"ftypavif", 8, 4, "AVIF"},
		{"\0\0\0\x0CjP  ", 8, 0, "JPEG 2000"}, {"\xFF\x4F\xFF\x51", 4, 0, "JPEG 2000"},
		{"\0\0\1\0", 4, 0, "ICO"}, {"qoif", 4, 0, "QOI"}, {"\xFF\x0A", 2, 0, "JPEG XL"},
		{"\0\0\0\x0CJXL ", 8, 0, "JPEG XL"}, {"%PDF", 4, 0, "PDF"},
	};

	*other = NULL;
	if (n >= 8 && !memcmp(d, "\x89PNG\r\n\x1a\n", 8))
		return F_PNG;
	if (n >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF)
		return F_JPEG;
	if (n >= 6 && (!memcmp(d, "GIF87a", 6) || !memcmp(d, "GIF89a", 6)))
		return F_GIF;
	if (n >= 2 && d[0] == 'B' && d[1] == 'M')
		return F_BMP;
	if (n >= 15 && !memcmp(d, "RIFF", 4) && !memcmp(d + 8, "WEBPVP8", 7))
		return F_WEBP;
	for (size_t i = 0; i < HI3_ARRAY_SIZE(refused); i++)
		if (n >= refused[i].at + refused[i].len && !memcmp(d + refused[i].at, refused[i].magic, refused[i].len)) {
			*other = refused[i].name;
			return F_OTHER;
		}
	if (n >= 3 && d[0] == 'P' && d[1] >= '1' && d[1] <= '7' && (d[2] == '\n' || d[2] == ' ' || d[2] == '\r')) {
		*other = "PNM";
		return F_OTHER;
	}
	return F_UNKNOWN;
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
	int complete;        /* JPEG: an end-of-image marker after the scans (Pillow: "truncated" without) */
	char broken[5];      /* PNG: the chunk before the first IDAT whose CRC is wrong (Pillow raises) */
	uint8_t *exif;       /* the EXIF (TIFF) block, owned; NULL when none */
	size_t exif_len;
	uint8_t *xmp;        /* the XMP packet Pillow would search, owned */
	size_t xmp_len;
	int bad_meta;        /* 1: a block Pillow could not read (it raises; hi3 ignores it) */
	int oom;             /* 1: out of memory keeping a block */
	int64_t png_w, png_h; /* the PNG's IHDR size; -1 when not a PNG */
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
	const size_t cap = (size_t)1 << 20;
	z_stream s = {0};
	uint8_t *buf;
	int rc;

	if (zn > UINT_MAX || !(buf = malloc(cap + 1)))
		return NULL;
	if (inflateInit(&s) != Z_OK) {
		free(buf);
		return NULL;
	}
	s.next_in = (Bytef *)z;
	s.avail_in = (uInt)zn;
	s.next_out = buf;
	s.avail_out = (uInt)cap + 1;
	rc = inflate(&s, Z_FINISH);
	*out = s.total_out;
	inflateEnd(&s);
	if (rc != Z_STREAM_END || *out > cap) {
		free(buf);
		return NULL;
	}
	return buf;
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

/* Pillow checks the CRC of every chunk up to the first IDAT. */
static int crc_ok(const uint8_t *chunk, uint32_t len)
{
	uint32_t want = be32(chunk + 8 + len);

	return (uint32_t)crc32(0, chunk + 4, len + 4) == want;
}

static void walk_png(const uint8_t *d, size_t n, struct meta *m)
{
	size_t pos = 8, raw_len = 0;
	uint8_t *raw = NULL;
	int first = 1, idat = 0;

	while (pos <= n && n - pos >= 12) {
		uint32_t len = be32(d + pos);
		const uint8_t *type = d + pos + 4, *data = d + pos + 8;

		if (len > 0x7fffffffu || n - pos - 12 < len)
			break;
		if (first && !memcmp(type, "IHDR", 4) && len >= 13) {
			m->png_w = be32(data);
			m->png_h = be32(data + 4);
		}
		first = 0;
		if (!memcmp(type, "IEND", 4))
			break;
		idat |= !memcmp(type, "IDAT", 4);
		if (!idat && !m->broken[0] && !crc_ok(d + pos, len))
			for (int k = 0; k < 4; k++)
				m->broken[k] = type[k] > 32 && type[k] < 127 ? (char)type[k] : '?';
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

/* A WebP's first EXIF and XMP chunks, as Pillow's WebPAnimDecoder's
 * get_chunk finds them (WebPDemuxGetChunk). */
static void webp_chunk(struct meta *m, const WebPDemuxer *dmx, const char *fourcc, uint8_t **dst, size_t *len)
{
	WebPChunkIterator it;

	if (!WebPDemuxGetChunk(dmx, fourcc, 1, &it))
		return;
	keep(m, dst, len, it.chunk.bytes, it.chunk.size);
	WebPDemuxReleaseChunkIterator(&it);
}

static void walk_webp(const uint8_t *d, size_t n, struct meta *m)
{
	WebPData data = {d, n};
	WebPDemuxer *dmx = WebPDemux(&data);

	if (!dmx)
		return;                     /* the decoder says why */
	webp_chunk(m, dmx, "EXIF", &m->exif, &m->exif_len);
	webp_chunk(m, dmx, "XMP ", &m->xmp, &m->xmp_len);
	WebPDemuxDelete(dmx);
}

static void walk(const uint8_t *d, size_t n, int fmt, struct meta *m)
{
	memset(m, 0, sizeof(*m));
	m->png_w = m->png_h = -1;
	m->complete = 1;
	switch (fmt) {
	case F_PNG: walk_png(d, n, m); break;
	case F_JPEG: m->complete = 0; walk_jpeg(d, n, m); break;
	case F_WEBP: walk_webp(d, n, m); break;
	default: break;                 /* GIF and BMP: no metadata Pillow's getexif reads */
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

	const char *other;

	walk(data, len, sniff(data, len, &other), &m);
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

const char *hi3_image_sniff(const void *data, size_t len)
{
	const char *other;
	int fmt = sniff(data, len, &other);

	return fmt == F_OTHER ? other : fmt == F_UNKNOWN ? NULL : fmt_names[fmt];
}

int hi3i_picture_size(const char *name, const char *format, int64_t w, int64_t h, int64_t max_pixels, hi3_error *err)
{
	if (w <= 0 || h <= 0)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: a %lldx%lld %s image has no pixels", name, (long long)w,
		                     (long long)h, format);
	/* a side first: two sides of up to 2^32 (a BMP's) overflow their product */
	if (w > INT_MAX / 4 || h > INT_MAX / 4)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: the %s header declares %lldx%lld, a side of more than %d "
		                     "pixels", name, format, (long long)w, (long long)h, INT_MAX / 4);
	if (max_pixels > 0 && w * h > max_pixels)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: the %s header declares %lldx%lld, %lld pixels, more than "
		                     "the limit of %lld (--max-image-pixels)", name, format, (long long)w, (long long)h,
		                     (long long)(w * h), (long long)max_pixels);
	return 0;
}

void hi3_image_free(hi3_image *im)
{
	if (!im)
		return;
	free(im->rgb);
	free(im->name);
	free(im);
}

int hi3_image_decode(hi3_image **out, const void *data, size_t len, const char *name, const hi3_image_opts *o,
                     hi3_error *err)
{
	const uint8_t *d = data;
	int64_t max = o && o->max_pixels ? o->max_pixels : HI3_IMAGE_MAX_PIXELS;
	struct hi3i_picture pic = {0};
	hi3_image *im = NULL;
	struct meta m = {0};
	const char *other;
	int fmt, orient, rc = -1;

	*out = NULL;
	name = name ? name : "image";
	if (len == 0)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: empty file, not an image", name);
	fmt = sniff(d, len, &other);
	if (fmt == F_OTHER)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: a %s file; hi3 reads " ACCEPTED " pictures", name, other);
	if (fmt == F_UNKNOWN)
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: not an image (hi3 reads " ACCEPTED ")", name);
	walk(d, len, fmt, &m);
	if (m.oom) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "%s: out of memory reading the metadata", name);
		goto out;
	}
	if (!m.complete) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: truncated JPEG file (no end-of-image marker)", name);
		goto out;
	}
	if (m.broken[0]) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: broken PNG file (bad checksum in its %s chunk)", name, m.broken);
		goto out;
	}
	if (m.png_w >= 0 && hi3i_picture_size(name, "PNG", m.png_w, m.png_h, max, err))
		goto out;                   /* the IHDR's size, before libpng reads further */
	switch (fmt) {
	case F_JPEG: rc = hi3i_jpeg_decode(d, len, name, max, &pic, err); break;
	case F_WEBP: rc = hi3i_webp_decode(d, len, name, max, &pic, err); break;
	case F_PNG: rc = hi3i_png_decode(d, len, name, max, &pic, err); break;
	case F_GIF: rc = hi3i_gif_decode(d, len, name, max, &pic, err); break;
	default: rc = hi3i_bmp_decode(d, len, name, max, &pic, err); break;
	}
	if (rc)
		goto out;
	rc = -1;
	if (!(im = hi3i_calloc(1, sizeof(*im), err)) || !(im->name = hi3i_strdup(name))) {
		hi3_error_set(err, HI3_ERR_RUNTIME, "out of memory");
		goto out;
	}
	orient = orientation_of(&m);
	if (m.bad_meta)
		hi3_log(HI3_LOG_WARN, "%s: unreadable EXIF or XMP metadata ignored", name);
	im->rgb = pic.rgb;
	pic.rgb = NULL;
	im->width = pic.width;
	im->height = pic.height;
	if (orient != 1) {
		uint8_t *t = malloc((size_t)pic.width * pic.height * 3);
		if (!t) {
			hi3_error_set(err, HI3_ERR_RUNTIME, "%s: out of memory for a %dx%d image", name, pic.width, pic.height);
			goto out;
		}
		hi3i_image_transpose(t, im->rgb, pic.width, pic.height, 3, orient);
		free(im->rgb);
		im->rgb = t;
		if (orient >= 5) {
			im->width = pic.height;
			im->height = pic.width;
		}
	}
	im->format = fmt_names[fmt];
	im->mode = pic.mode;
	im->file_width = pic.width;
	im->file_height = pic.height;
	im->channels = pic.channels;
	im->bits = pic.bits;
	im->orientation = orient;
	*out = im;
	im = NULL;
	rc = 0;
out:
	free(pic.rgb);
	hi3_image_free(im);
	meta_release(&m);
	return rc;
}

/* The whole of an open file, at most max bytes (<= 0: no limit): a
 * regular file's size is checked before anything is read, a pipe's as it
 * is read. */
static int read_bounded(int fd, const char *name, int regular, off_t size, int64_t max, char **out, size_t *len,
                        hi3_error *err)
{
	size_t cap = regular ? (size_t)size + 1 : (size_t)1 << 16, n = 0;
	char *buf = malloc(cap);

	for (;;) {
		size_t want;
		ssize_t got;

		if (buf && n == cap) {
			char *nb = realloc(buf, cap * 2);
			if (!nb)
				free(buf);
			buf = nb;
			cap *= 2;
		}
		if (!buf)
			return hi3_error_set(err, HI3_ERR_RUNTIME, "%s: out of memory reading the file", name);
		want = cap - n;
		if (max > 0 && want > (size_t)max + 1 - n)
			want = (size_t)max + 1 - n;     /* never more than one byte past the limit */
		got = read(fd, buf + n, want);
		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0) {
			int e = errno;
			free(buf);
			return hi3_error_set(err, HI3_ERR_INPUT, "%s: cannot read: %s", name, strerror(e));
		}
		n += (size_t)got;
		if (got == 0 || (max > 0 && (int64_t)n > max))
			break;
	}
	if (max > 0 && (int64_t)n > max) {
		free(buf);
		return hi3_error_set(err, HI3_ERR_INPUT, "%s: more than %lld bytes, the limit (--max-image-bytes)", name,
		                     (long long)max);
	}
	*out = buf;
	*len = n;
	return 0;
}

int hi3_image_load(hi3_image **out, const char *path, const hi3_image_opts *o, hi3_error *err)
{
	int64_t max = o && o->max_bytes ? o->max_bytes : HI3_IMAGE_MAX_BYTES;
	const char *name = strcmp(path, "-") ? path : "standard input";
	struct stat st;
	char *buf = NULL;
	size_t len = 0;
	int fd, rc;

	*out = NULL;
	if (strcmp(path, "-")) {
		/* O_NONBLOCK: opening a FIFO must not wait for a writer */
		if ((fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC)) < 0)
			return hi3_error_set(err, HI3_ERR_INPUT, "%s: cannot open: %s", path, strerror(errno));
	} else {
		fd = STDIN_FILENO;
	}
	if (fstat(fd, &st)) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: cannot stat: %s", name, strerror(errno));
		goto fail;
	}
	if (fd != STDIN_FILENO && !S_ISREG(st.st_mode)) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: not a regular file (%s): a picture must be a file", name,
		              S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO" :
		              S_ISCHR(st.st_mode) ? "a character device" : S_ISBLK(st.st_mode) ? "a block device" :
		              S_ISSOCK(st.st_mode) ? "a socket" : "not a file");
		goto fail;
	}
	if (S_ISREG(st.st_mode) && max > 0 && st.st_size > max) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: %lld bytes, more than the limit of %lld (--max-image-bytes)", name,
		              (long long)st.st_size, (long long)max);
		goto fail;
	}
	if (fd != STDIN_FILENO && fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) < 0) {
		hi3_error_set(err, HI3_ERR_INPUT, "%s: cannot read: %s", name, strerror(errno));
		goto fail;
	}
	if (read_bounded(fd, name, S_ISREG(st.st_mode), st.st_size, max, &buf, &len, err))
		goto fail;
	if (fd != STDIN_FILENO)
		close(fd);
	rc = hi3_image_decode(out, buf, len, name, o, err);
	free(buf);
	return rc;
fail:
	if (fd != STDIN_FILENO)
		close(fd);
	return -1;
}
