#!/usr/bin/env bash
# Picture files as the stages read them, seen through `hi3 inspect PICTURE`:
# what hi3 decoded (format, Pillow's mode, sizes, orientation) and its RGB
# as a PNG; and the bounds of every read: a FIFO, a device (/dev/zero), an
# over-size file and an over-size header are refused at once with exit 3,
# the file and the reason named, in bounded memory. (The pixels against
# Pillow's, value for value: tests/test-pictures.)
. "$SRCDIR/tests/lib.sh"
PIC="$FIXTURES/pictures"

# rss ARGS...: hi3 ARGS under GNU time; its exit status in $rss_rc, its
# peak resident memory in KiB in rss.txt (the last line)
rss() { /usr/bin/time -f "%M" -o rss.txt "$HI3" "$@"; rss_rc=$?; tail -n 1 rss.txt >rss.kb; cat rss.kb >&2; }

test_expect_success 'inspect a JPEG with EXIF orientation 6: format, mode, sizes, the transpose' '
	hi3 inspect "$PIC/jpeg-exif6.jpg" >out &&
	test_grep "^format: JPEG$" out &&
	test_grep "^mode: RGB " out &&
	test_grep "^stored size: 23 x 15 (width x height), 3 channels of 8 bits$" out &&
	test_grep "^EXIF orientation: 6 (ROTATE_270)$" out &&
	test_grep "^size after orientation: 15 x 23$" out
'

test_expect_success 'inspect --json of each format: Pillow 12 modes, XMP orientation in a WebP' '
	for f in jpeg-ycck.jpg:JPEG:CMYK webp-lossless-alpha.webp:WEBP:RGBA png-gray16.png:PNG:I\;16 \
		gif-palette.gif:GIF:P bmp-8-gray.bmp:BMP:L png-palette8.png:PNG:P jpeg-gray.jpg:JPEG:L; do
		IFS=: read -r file format mode <<-IN
		$f
		IN
		hi3 inspect --json "$PIC/$file" >j &&
		test_grep "\"format\": \"$format\"" j && test_grep "\"mode\": \"$mode\"" j || return 1
	done &&
	hi3 inspect --json "$PIC/webp-xmp5.webp" >j &&
	test_grep "\"orientation\": 5" j && test_grep "\"transpose\": \"TRANSPOSE\"" j &&
	test_grep "\"oriented_width\": 15" j
'

test_expect_success 'inspect --png writes the RGB after the orientation; read back, it is the same picture' '
	hi3 inspect --png a.png "$PIC/jpeg-exif6.jpg" >out &&
	test_grep "^png: a.png (RGB, 15 x 23, after the orientation)$" out &&
	hi3 inspect --png b.png a.png >out2 &&
	test_grep "^format: PNG$" out2 && test_grep "^stored size: 15 x 23" out2 &&
	cmp a.png b.png
'

test_expect_success 'a picture with --tensor, --slice or --row is a usage error' '
	test_must_fail 2 hi3 inspect --tensor x "$PIC/png-rgb.png" 2>err &&
	test_grep "is a picture" err
'

test_expect_success '/dev/zero is refused at once as a character device, in bounded memory' '
	rss inspect /dev/zero 2>err; test "$rss_rc" = 3 &&
	test_grep "/dev/zero: not a regular file (a character device)" err &&
	test "$(cat rss.kb)" -lt 200000
'

test_expect_success 'a FIFO is refused at once, without waiting for a writer' '
	mkfifo pipe.jpg &&
	timeout 20 "$HI3" inspect pipe.jpg 2>err; test $? = 3 &&
	test_grep "pipe.jpg: not a regular file (a FIFO)" err
'

test_expect_success 'a file over --max-image-bytes is refused before it is read (a 1 GiB sparse file too)' '
	truncate -s 1G big.jpg &&
	printf "\377\330\377" | dd of=big.jpg conv=notrunc status=none &&
	rss inspect big.jpg 2>err; test "$rss_rc" = 3 &&
	test_grep "big.jpg: 1073741824 bytes, more than the limit of 268435456 (--max-image-bytes)" err &&
	test "$(cat rss.kb)" -lt 200000 &&
	test_must_fail 3 hi3 inspect --max-image-bytes 1000 "$PIC/jpeg-420.jpg" 2>err &&
	test_grep "jpeg-420.jpg: .* bytes, more than the limit of 1000" err &&
	hi3 inspect --max-image-bytes 100000 "$PIC/jpeg-420.jpg" >/dev/null
'

test_expect_success 'a header declaring 60000 x 60000 is refused by its size, before any pixel buffer' '
	{ printf "\211PNG\r\n\032\n\0\0\0\015IHDR\0\0\352\140\0\0\352\140\010\002\0\0\0" &&
	  printf "\017\260\342\025\0\0\0\0IEND\256B\140\202"; } >bomb.png &&
	rss inspect bomb.png 2>err; test "$rss_rc" = 3 &&
	test_grep "bomb.png: the PNG header declares 60000x60000, 3600000000 pixels, more than the limit of 89478485" err &&
	test "$(cat rss.kb)" -lt 200000 &&
	test_must_fail 3 hi3 inspect --max-image-pixels 100 "$PIC/png-rgb.png" 2>err &&
	test_grep "png-rgb.png: the PNG header declares 29x21, 609 pixels, more than the limit of 100" err
'

test_expect_success 'a format hi3 does not read is refused with the list of those it reads' '
	printf "II*\0\010\0\0\0" >a.tif &&
	test_must_fail 3 hi3 inspect a.tif 2>err &&
	test_grep "a.tif: a TIFF file; hi3 reads JPEG, PNG, WebP, GIF or BMP pictures" err
'

test_done
