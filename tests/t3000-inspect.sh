#!/bin/bash
# t3000-inspect.sh -- hi3 inspect: summary, --json, values, slices, PNG
# pictures, checkpoints, bad input.
. "$SRCDIR/tests/lib.sh"
TT="$BUILDDIR/tests/test-tools"
PY="$FIXTURES/tools/python.safetensors"
EXPECT="$FIXTURES/tools/python.expect"

# near A B RELTOL: numbers equal within a relative tolerance
near() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b; exit !(d <= t * m) }'; }

(cd "$TRASH" && make_model tiny m) || exit 1
V=$("$TT" json vocab_size <"$TRASH/m/config.json")
H=$("$TT" json hidden_size <"$TRASH/m/config.json")

test_expect_success 'summary of a tiny model lists its tensors with config shapes' '
	test -n "$V" && test -n "$H" &&
	hi3 inspect m/model.safetensors >out &&
	test_grep "^tensors: " out &&
	test_grep "^model\.wte\.weight  *F32  *($V, $H) " out &&
	test_grep "^model\.ln_f\.weight  *F32  *($H,) " out &&
	test_grep "^model\.layers\.1\.self_attn\.qkv_proj\.weight " out
'

test_expect_success '--json is one JSON object that agrees with the text' '
	hi3 inspect --json m/model.safetensors >j &&
	"$TT" json <j &&
	n=$("$TT" json tensors <j | tr -cd "{" | wc -c) &&
	test "$(sed -n "s/^tensors: \([0-9]*\),.*/\1/p" out)" = "$n" &&
	"$TT" json tensors/name=model.wte.weight/shape <j >shape &&
	echo "[$V,$H]" >want && test_cmp want shape &&
	test "$("$TT" json tensors/name=model.wte.weight/nan <j)" = 0
'

test_expect_success 'a checkpoint directory lists the same tensors, with their shard' '
	hi3 inspect m >dir &&
	sed -n "/^name /,\$p" out | awk "{print \$1, \$2, \$3}" >a &&
	sed -n "/^name /,\$p" dir | awk "{print \$1, \$2, \$3}" >b &&
	test_cmp a b &&
	test_grep "model\.ln_f\.weight .* model\.safetensors\$" dir
'

test_expect_success 'a sharded checkpoint (model.safetensors.index.json) is read through its index' '
	mkdir sh && cp m/model.safetensors sh/model-00001-of-00001.safetensors &&
	{ printf "{\"weight_map\": {"; sep=; for t in $("$TT" json tensors <j | tr "," "\n" | sed -n "s/.*\"name\":\"\([^\"]*\)\".*/\1/p"); do
		printf "%s\"%s\": \"model-00001-of-00001.safetensors\"" "$sep" "$t"; sep=", "; done; printf "}}\n"; } >sh/model.safetensors.index.json &&
	hi3 inspect --json sh >sj &&
	test "$("$TT" json kind <sj)" = checkpoint &&
	test "$("$TT" json tensors/name=lm_head.weight/file <sj)" = model-00001-of-00001.safetensors &&
	test "$("$TT" json tensors/name=lm_head.weight/min <sj)" = "$("$TT" json tensors/name=lm_head.weight/min <j)"
'

test_expect_success 'a file written by Python safetensors: stats agree with numpy' '
	hi3 inspect --json "$PY" >pj &&
	test "$("$TT" json format <pj)" = py.test &&
	grep "^stat " "$EXPECT" >stats && test -s stats &&
	while read -r _ name dt numel mn mx mean nan inf; do
		test "$("$TT" json tensors/name=$name/dtype <pj)" = "$dt" &&
		test "$("$TT" json tensors/name=$name/numel <pj)" = "$numel" &&
		test "$("$TT" json tensors/name=$name/nan <pj)" = "$nan" &&
		test "$("$TT" json tensors/name=$name/inf <pj)" = "$inf" &&
		near "$("$TT" json tensors/name=$name/min <pj)" "$mn" 0 &&
		near "$("$TT" json tensors/name=$name/max <pj)" "$mx" 0 &&
		near "$("$TT" json tensors/name=$name/mean <pj)" "$mean" 1e-12 ||
		{ echo "tensor $name disagrees"; exit 1; }
	done <stats
'

test_expect_success 'tensors are listed in natural order (layers.2 before layers.10)' '
	hi3 inspect "$PY" >pt &&
	grep -n "^layers\." pt | cut -d" " -f1 >order &&
	printf "%s\n" "$(grep -n "^layers\.2\.w" pt | cut -d: -f1):layers.2.w" \
		"$(grep -n "^layers\.10\.w" pt | cut -d: -f1):layers.10.w" >want &&
	test_cmp want order
'

test_expect_success '--slice selects the values numpy selects' '
	hi3 inspect --json --tensor f32 --slice 1,:,2:5 "$PY" >sj &&
	test "$("$TT" json values_shape <sj)" = "[4,3]" &&
	"$TT" json values <sj | tr -d "[]" | tr "," "\n" >got &&
	sed -n "s/^slice f32 1,:,2:5 //p" "$EXPECT" | tr " " "\n" >want &&
	test "$(wc -l <got)" = 12 && test "$(wc -l <want)" = 12 &&
	paste got want | while read -r g w; do near "$g" "$w" 1e-8 || { echo "$g != $w"; exit 1; }; done &&
	hi3 inspect --tensor i64 --slice :,::2 "$PY" >it &&
	sed 1d it | cut -d" " -f3- | tr " " "\n" >got &&
	sed -n "s/^slice i64 :,::2 //p" "$EXPECT" | tr " " "\n" >want &&
	test_cmp want got
'

test_expect_success 'text values: a header line, one line per run, prefixed by its place' '
	hi3 inspect --tensor f32 --slice 1,:,2:5 "$PY" >tv &&
	test_grep "^f32 F32 (3, 4, 5) \[1, :, 2:5\] -> (4, 3)\$" tv &&
	test "$(wc -l <tv)" = 5 &&
	test_grep "^\[1, 3, 2:5\] " tv &&
	hi3 inspect --tensor f32 --slice 2,3,-1 "$PY" >one &&
	test "$(sed -n 2p one)" = inf
'

for spec in 3 -4 0,0,0,0 0,:,3:9 0,::0 x 0,3:1 ,; do
	test_expect_success "a bad slice '$spec' is a usage error (exit 2)" '
		test_must_fail 2 hi3 inspect --tensor f32 --slice "'"$spec"'" "$PY" >o 2>e &&
		test ! -s o && test_grep "slice" e && test_grep "tensor .f32." e
	'
done

test_expect_success 'an unknown --tensor is a usage error naming it' '
	test_must_fail 2 hi3 inspect --tensor nope "$PY" 2>e && test_grep "no tensor .nope." e
'

test_expect_success '--png renders a 2-D selection as a heatmap of the right size' '
	hi3 inspect --tensor model.wte.weight --slice 0:40,: --png w.png m/model.safetensors >msg &&
	test "$(head -c 8 w.png | od -An -tx1 | tr -d " \n")" = 89504e470d0a1a0a &&
	test "$("$TT" pnginfo w.png)" = "$((H * 8)) 320" &&
	hi3 inspect --tensor model.wte.weight --slice 0:40,: --scale 2 --png w2.png m/model.safetensors &&
	test "$("$TT" pnginfo w2.png)" = "$((H * 2)) 80"
'

test_expect_success 'heatmap: NaN is magenta, negative data diverge blue to red' '
	hi3 inspect --tensor f32 --slice 0 --scale 1 --png f.png "$PY" &&
	test "$("$TT" pnginfo f.png)" = "5 4" &&
	test "$("$TT" pngpix f.png 2 1)" = "255 0 255" &&
	hi3 inspect --tensor f32 --slice 0 --json "$PY" >v &&
	"$TT" json values <v | tr -d "[]" | tr "," "\n" | grep -vn NaN | sort -t: -k2 -g | sed -n "1p;\$p" >ends &&
	lo=$(($(head -1 ends | cut -d: -f1) - 1)) && hi=$(($(tail -1 ends | cut -d: -f1) - 1)) &&
	set -- $("$TT" pngpix f.png $((lo % 5)) $((lo / 5))) && test "$3" -gt "$1" &&
	set -- $("$TT" pngpix f.png $((hi % 5)) $((hi / 5))) && test "$1" -gt "$3"
'

test_expect_success '--png of a selection that is not 2-D is a usage error and writes nothing' '
	test_must_fail 2 hi3 inspect --tensor f32 --png no.png "$PY" 2>e &&
	test_grep "must be 2-D" e && test ! -e no.png
'

test_expect_success 'conditions: --row draws the attention mask (causal, image block, pads)' '
	"$TT" cond c.st &&
	hi3 inspect --png mask.png --row 1 --scale 1 c.st &&
	test "$("$TT" pnginfo mask.png)" = "8 8" &&
	test "$("$TT" pngpix mask.png 0 1)" = "240 240 240" &&
	test "$("$TT" pngpix mask.png 2 1)" = "80 150 240" &&
	test "$("$TT" pngpix mask.png 3 1)" = "25 25 25" &&
	test "$("$TT" pngpix mask.png 1 0)" = "25 25 25" &&
	test "$("$TT" pngpix mask.png 2 6)" = "190 140 80" &&
	test "$("$TT" pngpix mask.png 6 2)" = "70 45 25" &&
	hi3 inspect --png mask0.png --row 0 --scale 1 c.st &&
	test "$("$TT" pngpix mask0.png 4 2)" = "80 150 240" &&
	test "$("$TT" pngpix mask0.png 5 2)" = "25 25 25" &&
	test "$("$TT" pngpix mask0.png 7 7)" = "240 240 240"
'

test_expect_success 'conditions: --png needs --row, and --row must be a row of the file' '
	test_must_fail 2 hi3 inspect --png x.png c.st 2>e && test_grep "needs --row" e &&
	test_must_fail 2 hi3 inspect --png x.png --row 2 c.st 2>e && test_grep "rows 0 to 1" e &&
	test ! -e x.png
'

test_expect_success 'kv: --png draws the valid-slot map' '
	"$TT" kv kv.st ids=7,9 lens=8,5 gen=2,2 L=8 C=12 salt=1 &&
	hi3 inspect --png slots.png --scale 1 kv.st &&
	test "$("$TT" pnginfo slots.png)" = "12 2" &&
	test "$("$TT" pngpix slots.png 4 1)" = "240 240 240" &&
	test "$("$TT" pngpix slots.png 5 1)" = "90 200 90" &&
	test "$("$TT" pngpix slots.png 6 1)" = "90 200 90" &&
	test "$("$TT" pngpix slots.png 7 1)" = "150 100 60" &&
	test "$("$TT" pngpix slots.png 8 1)" = "25 25 25" &&
	test "$("$TT" pngpix slots.png 9 0)" = "90 200 90" &&
	test "$("$TT" pngpix slots.png 10 0)" = "25 25 25"
'

test_expect_success 'a truncated file: exit 3 naming the file, existing output untouched' '
	head -c 3000 m/model.safetensors >trunc.safetensors &&
	echo keep >keep.png &&
	test_must_fail 3 hi3 inspect trunc.safetensors >o 2>e &&
	test ! -s o && test_grep "trunc\.safetensors" e && test_grep "truncated" e &&
	test_must_fail 3 hi3 inspect --json --tensor model.wte.weight --png keep.png trunc.safetensors 2>e &&
	test "$(cat keep.png)" = keep && test_grep "trunc\.safetensors" e &&
	test_must_fail 3 hi3 inspect missing.safetensors 2>e && test_grep "missing\.safetensors" e
'

test_expect_success 'a header that is not JSON: exit 3 with the reader message' '
	printf "\020\000\000\000\000\000\000\000{not json here!}" >bad.st &&
	test_must_fail 3 hi3 inspect bad.st 2>e && test_grep "bad\.st: header is not valid JSON" e
'

test_expect_success '--help shows the usage line that the man page synopsis has' '
	hi3 inspect --help >h && hi3 help inspect >h2 && test_cmp h h2 &&
	u=$(head -1 h | sed "s/^usage: //") &&
	sed -n "/^\.SH SYNOPSIS/,/^\.SH DESCRIPTION/p" "$SRCDIR/man/hi3-inspect.1" | sed "s/\\\\-/-/g" >syn &&
	grep -Fx "$u" syn
'

test_expect_success 'usage errors: no file, two files, --slice without --tensor' '
	test_must_fail 2 hi3 inspect &&
	test_must_fail 2 hi3 inspect a b &&
	test_must_fail 2 hi3 inspect --slice 0 "$PY" &&
	test_must_fail 2 hi3 inspect --scale 0 --png x.png "$PY"
'

test_done
