#!/usr/bin/env bash
# t6200-cuda-parallel.sh -- the layouts of hi3-parallel(7) on the CUDA
# backend: under mpirun, hi3-mpi linked with the CUDA emulator
# (tests/hi3-mpi-cuda-emu) exchanges the activations on its device buffers
# through the MPI communicator, where a GPU build calls NCCL. tp=2, ep=2
# (both dispatches) and tp=2,ep=2 give bitwise the KV files, segments
# (greedy and sampled) and replay files of one emulated CUDA process, and
# under tp=2 and ep=2 all-to-all its diffusion trajectories (resumed under
# tp=2 from the checkpoint rank 0 alone keeps); ep=2 with a quantized
# checkpoint (tp=2 refuses one by name); a KV file made
# by 2 ranks decodes with 1; a rank that dies fails every rank and the file
# resumes to the same bits.
# Skipped without mpirun or without MPI (configure found none).
. "$SRCDIR/tests/lib.sh"
EMU=$BUILDDIR/tests/hi3-cuda-emu
MPI_EMU=$BUILDDIR/tests/hi3-mpi-cuda-emu
if ! command -v mpirun >/dev/null 2>&1 || [ ! -x "$MPI_EMU" ]; then
	echo "1..0 # SKIP no mpirun or no hi3-mpi (configure found no MPI)"
	rm -rf "$TRASH"
	exit 0
fi
# as t6000-parallel.sh: root in CI, more ranks than cores, Open MPI's own leaks
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# Each test's own session directory: two tests' mpirun at once (make -j)
# both creating /tmp/ompi.HOST.UID failed one with "File exists"
export OMPI_MCA_orte_tmpdir_base=$TRASH
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
one() { "$EMU" -q -t 1 --backend cuda "$@"; }
# run NP LAYOUT ARGS...: NP emulated CUDA ranks
run() { np=$1 layout=$2; shift 2; mpirun -np "$np" "$MPI_EMU" -q -t 1 --backend cuda --parallel "$layout" "$@"; }

REQ_SEED=6200
SAMPLE="--temperature 0.8 --top-k 50 --top-p 0.9"

test_expect_success 'models: tiny-moe, and a wider MoE (8 experts top-3, 4 kv heads, a dense layer, odd vocab)' '
	make_model tiny-moe tm &&
	make_model tiny-moe tw --set num_experts=8 --set moe_topk=3 --set num_attention_heads=8 \
		--set num_key_value_heads=4 --set moe_layer_num_skipped=1 --set num_hidden_layers=3 \
		--set vocab_size=517 --set moe_intermediate_size=42 &&
	requests 9 23 17 >req.jsonl &&
	hi3 -q -m tm tokenize-concat req.jsonl -o tm.cond &&
	hi3 -q -m tw tokenize-concat req.jsonl -o tw.cond
'

test_expect_success 'one emulated CUDA process: prefill, greedy and sampled decodes, replay (the references)' '
	for m in tm tw; do
		one -m $m prefill $m.cond -o $m.kv0 --max-new 7 &&
		cp $m.kv0 $m.kv-g && one -m $m decode --greedy $m.cond $m.kv-g -o $m.seg-g &&
		cp $m.kv0 $m.kv-s && one -m $m decode $SAMPLE $m.cond $m.kv-s -o $m.seg-s &&
		one -m $m replay $m.cond $m.seg-s -o $m.rep >/dev/null || return 1
	done &&
	! cmp -s tm.seg-g tm.seg-s && ! cmp -s tw.seg-g tw.seg-s
'

# layout MODEL NP LAYOUT: prefill, a greedy and a sampled decode and the
# replay of the sampled segment under the layout equal one process byte
# for byte (KV file, segments, decoded KV files, replay file), and the
# activations crossed ranks on device buffers
layout() {
	m=$1 np=$2 l=$3 t=$m-$(echo "$3" | tr =, __)
	mpirun -np "$np" "$MPI_EMU" -t 1 --backend cuda --parallel "$l" -m "$m" prefill "$m.cond" -o "$t.kv" \
		--max-new 7 2>"$t.err" && cmp "$m.kv0" "$t.kv" && cp "$t.kv" "$t.kv0" &&
	dev=$(sed -n "s/.*rank 0 of $np: .*(mpi (device buffers): [0-9.]* s, \([0-9.]*\) MiB).*/\1/p" "$t.err") &&
	echo "$l: prefill received $dev MiB on device buffers" && awk -v b="$dev" "BEGIN { exit !(b > 0) }" &&
	run "$np" "$l" -m "$m" decode --greedy "$m.cond" "$t.kv" -o "$t.seg" &&
	cmp "$m.seg-g" "$t.seg" && cmp "$m.kv-g" "$t.kv" &&
	cp "$t.kv0" "$t.kv" && run "$np" "$l" -m "$m" decode $SAMPLE "$m.cond" "$t.kv" -o "$t.seg" &&
	cmp "$m.seg-s" "$t.seg" && cmp "$m.kv-s" "$t.kv" &&
	run "$np" "$l" -m "$m" replay "$m.cond" "$m.seg-s" -o "$t.rep" >/dev/null && cmp "$m.rep" "$t.rep"
}

test_expect_success 'cuda, tiny-moe, tp=2: KV file, segments, decoded KV and replay bitwise one process' '
	layout tm 2 tp=2
'
test_expect_success 'cuda, tiny-moe, ep=2: bitwise one process' '
	layout tm 2 ep=2
'
test_expect_success 'cuda, tiny-moe, ep=2 with the all-to-all dispatch: bitwise one process' '
	layout tm 2 ep=2,dispatch=alltoall
'
# a quantized checkpoint (tests/fixtures/quant, ModelOpt fp8 + nvfp4 routed
# experts) on its base model (make_quant_fixtures.py's): ep splits whole
# experts, so each rank uploads its experts' packed matrices as stored
test_expect_success 'cuda, a quantized checkpoint (fp8 + nvfp4 experts), ep=2: bitwise one process; tp=2 refused' '
	hi3 -q init-model --preset tiny-moe --seed 1 --dtype bf16 --set hidden_size=64 --set num_hidden_layers=1 \
		--set moe_intermediate_size=32 --set intermediate_size=64 --set attention_head_dim=16 -o qbase &&
	cp -r "$FIXTURES/quant/modelopt-mixed" q && chmod -R u+w q && rm -rf q/ref &&
	ln -s "$PWD/qbase/model.safetensors" q/base.safetensors &&
	cp qbase/tokenizer.json qbase/tokenizer_config.json qbase/generation_config.json q/ &&
	hi3 -q -m q tokenize-concat req.jsonl -o q.cond &&
	one -m q prefill q.cond -o q.kv0 --max-new 7 &&
	cp q.kv0 q.kv-g && one -m q decode --greedy q.cond q.kv-g -o q.seg-g &&
	cp q.kv0 q.kv-s && one -m q decode $SAMPLE q.cond q.kv-s -o q.seg-s &&
	one -m q replay q.cond q.seg-s -o q.rep >/dev/null &&
	layout q 2 ep=2 &&
	test_must_fail 2 run 2 tp=2 -m q prefill q.cond -o qtp.kv 2>err &&
	test_grep "a quantized weight (fp8) is not split over tensor-parallel ranks yet" err && test ! -e qtp.kv
'
test_expect_success 'cuda, wider MoE, tp=2,ep=2 on 4 ranks: bitwise one process' '
	layout tw 4 tp=2,ep=2
'

# (on a GPU, every layout's decode steps from CUDA graphs faulted inside
# cudaGraphLaunch; op by op they gave one process's bits: docs/PERFORMANCE.md)
test_expect_success 'cuda, tp=2 and ep=2: decode steps run op by op, never from CUDA graphs; --cuda-graphs on refused' '
	for l in tp=2 ep=2; do
		cp tm.kv0 g.kv &&
		mpirun -np 2 "$MPI_EMU" -v -t 1 --backend cuda --parallel $l -m tm decode --greedy tm.cond g.kv -o g.seg \
			2>g.err && cmp tm.seg-g g.seg &&
		test $(grep -c "cuda: decode steps from graphs: off" g.err) = 2 && ! grep "stretches from graphs" g.err ||
			return 1
	done &&
	cp tm.kv0 g.kv && test_must_fail 2 run 2 tp=2 --cuda-graphs on -m tm decode --greedy tm.cond g.kv -o on.seg 2>err &&
	test_grep "cuda-graphs on: not with --parallel over 2 ranks" err && test ! -e on.seg && cmp tm.kv0 g.kv &&
	one -m tm --cuda-graphs on decode --greedy tm.cond g.kv -o on.seg && cmp tm.seg-g on.seg
'

test_expect_success 'cuda, tp=2, one row of 150 tokens decoded alone: the attention cuts its keys as one process' '
	# (few queries: the cache is read in slices, as many as one process cuts,
	# though the rank has half the kv heads)
	REQ_SEED=1 requests 150 >long.jsonl && hi3 -q -m tm tokenize-concat long.jsonl -o long.cond &&
	one -m tm prefill long.cond -o long.kv --max-new 4 && cp long.kv long2.kv &&
	one -m tm decode --greedy long.cond long.kv -o long.seg &&
	run 2 tp=2 -m tm decode --greedy long.cond long2.kv -o long2.seg &&
	cmp long.seg long2.seg && cmp long.kv long2.kv
'

test_expect_success 'cuda, diffusion-capture under tp=2 (KV reuse, CFG, an SDE step): the trajectory of one process' '
	make_model tiny tiny &&
	printf "%s\n" \
		"{\"prompt\": \"a red fox\", \"mode\": \"gen_image\", \"image_size\": \"32x48\", \"seed\": 7}" \
		"{\"prompt\": \"two cats asleep on a warm mat\", \"mode\": \"gen_image\", \"image_size\": \"32x48\", \"seed\": 9}" \
		>dreq.jsonl &&
	hi3 -q -m tiny tokenize-concat --exact-size dreq.jsonl -o d.cond &&
	one -m tiny diffusion-capture --steps 3 --sampler sde --sde-steps 1 d.cond -o d1.st &&
	run 2 tp=2 -m tiny diffusion-capture --steps 3 --sampler sde --sde-steps 1 d.cond -o d2.st &&
	cmp d1.st d2.st
'

test_expect_success 'cuda, tp=2: rank 0 alone keeps the checkpoint; killed after step 2, --resume gives the same trajectory' '
	rm -f dk.st dk.st.partial &&
	{ mpirun -np 2 sh -c "if [ \$OMPI_COMM_WORLD_RANK = 0 ]; then export HI3_TEST_KILL_AT=1:1; fi; \
		exec \"$MPI_EMU\" -q -t 1 --backend cuda --parallel tp=2 -m tiny diffusion-capture --steps 3 \
		--sampler sde --sde-steps 1 d.cond -o dk.st" 2>err; rc=$?; } ; echo "mpirun: exit $rc" && test "$rc" -ne 0 &&
	test ! -e dk.st && test "$(hi3 inspect --tensor steps_done dk.st.partial | tail -n 1)" = 2 &&
	run 2 tp=2 -m tiny diffusion-capture --resume --steps 3 --sampler sde --sde-steps 1 d.cond -o dk.st &&
	cmp d1.st dk.st && test ! -e dk.st.partial
'

test_expect_success 'cuda, diffusion-capture of tiny-moe under ep=2 with the all-to-all: the trajectory of one process' '
	hi3 -q -m tm tokenize-concat --exact-size dreq.jsonl -o dm.cond &&
	one -m tm diffusion-capture --steps 3 --sampler sde --sde-steps 1 dm.cond -o dm1.st &&
	run 2 ep=2,dispatch=alltoall -m tm diffusion-capture --steps 3 --sampler sde --sde-steps 1 dm.cond -o dm2.st &&
	cmp dm1.st dm2.st
'

test_expect_success 'cuda, a KV file prefilled by 2 ranks (tp=2) decodes with 1 to the same bits' '
	cp tm-tp_2.kv0 two.kv && one -m tm decode $SAMPLE tm.cond two.kv -o two.seg &&
	cmp tm.seg-s two.seg && cmp tm.kv-s two.kv
'

test_expect_success 'cuda, a rank killed mid-decode fails every rank; --resume gives the same bits' '
	cp tm.kv0 kill.kv &&
	{ mpirun -np 2 sh -c "if [ \$OMPI_COMM_WORLD_RANK = 1 ]; then export HI3_TEST_KILL_AT=2:0; fi; \
		exec \"$MPI_EMU\" -q -t 1 --backend cuda --parallel tp=2 -m tm decode $SAMPLE tm.cond kill.kv \
		-o kill.seg" 2>err; rc=$?; } ; echo "mpirun: exit $rc" && test "$rc" -ne 0 &&
	test_grep -q "process rank 1 .* exited on signal 9" err && test ! -e kill.seg &&
	test "$(hi3 inspect --tensor gen_len kill.kv | tail -n 1)" != "0 0 0" &&
	run 2 tp=2 -m tm decode --resume $SAMPLE tm.cond kill.kv -o kill.seg &&
	cmp tm.seg-s kill.seg && cmp tm.kv-s kill.kv
'

test_expect_success 'cuda, a rank that fails ends every rank with its status, naming it; no file is damaged' '
	cp tm.kv0 bad.kv &&
	test_must_fail 3 mpirun -np 2 sh -c "if [ \$OMPI_COMM_WORLD_RANK = 1 ]; then c=missing.cond; else c=tm.cond; fi; \
		exec \"$MPI_EMU\" -q -t 1 --backend cuda --parallel ep=2 -m tm decode \$c bad.kv -o bad.seg" 2>err &&
	test_grep -q "rank 1 of 2: error: missing.cond" err && test ! -e bad.seg && cmp tm.kv0 bad.kv
'

test_expect_success 'HI3_PAR_COMM=host: the same bits through host buffers; a bad value is refused' '
	cp tm.kv0 host.kv &&
	HI3_PAR_COMM=host mpirun -np 2 "$MPI_EMU" -t 1 --backend cuda --parallel tp=2 -m tm decode $SAMPLE tm.cond \
		host.kv -o host.seg 2>err && cmp tm.seg-s host.seg && cmp tm.kv-s host.kv &&
	! grep -q "device buffers" err &&
	HI3_PAR_COMM=nvlink test_must_fail 2 run 2 tp=2 -m tm decode tm.cond host.kv -o x.seg 2>err &&
	test_grep -q "HI3_PAR_COMM: .nvlink. is not host or device" err
'

test_done
