#!/usr/bin/env bash
# t6000-parallel.sh -- scale-out (hi3-parallel(7)): layouts of 2 and 4 ranks
# under mpirun (tp, ep with either expert dispatch, both) give bitwise the
# same KV files (cache, next logits), segments (tokens, log-probs: greedy,
# top-k and top-p, the whole vocabulary), replay files and diffusion
# trajectories as one process,
# lm_head split on the vocabulary without exchanging logits rows; KV files
# cross between layouts; a rank
# that dies fails every rank and leaves the files resumable; bad layouts and
# ranks with other models or inputs are refused. Skipped without mpirun or
# without hi3-mpi (configure found no MPI).
. "$SRCDIR/tests/lib.sh"
MPI_BIN=${HI3_MPI:-$BUILDDIR/bin/hi3-mpi}
if ! command -v mpirun >/dev/null 2>&1 || [ ! -x "$MPI_BIN" ]; then
	echo "1..0 # SKIP no mpirun or no hi3-mpi"
	rm -rf "$TRASH"
	exit 0
fi
# CI runs as root; Open MPI refuses root unless told
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# Each test's own session directory: two tests' mpirun at once (make -j)
# both creating /tmp/ompi.HOST.UID failed one with "File exists"
export OMPI_MCA_orte_tmpdir_base=$TRASH
# Under --enable-sanitizers, LeakSanitizer reports Open MPI's own allocations
# (its plugins, hwloc: frames it cannot symbolize, so no suppression matches)
# at every rank's exit; hi3's own leaks are checked by the single-process
# tests of the same code. ASan's and UBSan's errors still fail these.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
# run NP LAYOUT ARGS...: hi3-mpi as NP ranks of one thread each
run() { np=$1 layout=$2; shift 2; mpirun -np "$np" "$MPI_BIN" -q -t 1 --parallel "$layout" "$@"; }

REQ_SEED=6000
SAMPLE="--temperature 0.9 --top-k 40"
# the decodes every layout repeats: greedy, temperature 0.8 with top-k and
# top-p, and the whole vocabulary with top-p (no top-k: the vocabulary
# slices send their ordered candidates until the draw ends inside them)
DECODES="greedy:--greedy topp:--temperature_0.8_--top-k_50_--top-p_0.9 full:--temperature_0.8_--top-p_0.95"

test_expect_success 'the MPI communicator: every collective on 3 ranks (tests/test-comm.c)' '
	mpirun -np 3 "$BUILDDIR/tests/test-comm-mpi" >comm.tap &&
	cat comm.tap && test_grep -q "^ok .* 3 ranks: alltoallv" comm.tap && ! grep -q "^not ok" comm.tap &&
	test "$(grep -c "^ok .* 3 ranks:" comm.tap)" -ge 10
'

test_expect_success 'models: tiny-moe, and a wider MoE (8 experts top-3, 4 kv heads, a dense layer, odd vocab)' '
	make_model tiny-moe tm &&
	make_model tiny-moe tw --set num_experts=8 --set moe_topk=3 --set num_attention_heads=8 \
		--set num_key_value_heads=4 --set moe_layer_num_skipped=1 --set num_hidden_layers=3 \
		--set vocab_size=517 --set moe_intermediate_size=42 &&
	requests 9 23 17 >req.jsonl &&
	hi3 -q -m tm tokenize-concat req.jsonl -o tm.cond &&
	hi3 -q -m tw tokenize-concat req.jsonl -o tw.cond
'

test_expect_success 'one process: prefill, sampled decode, replay (the references)' '
	for m in tm tw; do
		hi3 -q -t 1 -m $m prefill $m.cond -o $m.kv0 --max-new 7 &&
		cp $m.kv0 $m.kv && hi3 -q -t 1 -m $m decode $SAMPLE $m.cond $m.kv -o $m.seg &&
		hi3 -q -t 1 -m $m replay $m.cond $m.seg -o $m.rep >/dev/null || return 1
		for d in $DECODES; do
			cp $m.kv0 $m.kv-${d%%:*} &&
			hi3 -q -t 1 -m $m decode $(echo "${d#*:}" | tr _ " ") $m.cond $m.kv-${d%%:*} -o $m.seg-${d%%:*} ||
			return 1
		done
	done &&
	# the samplers choose differently, so each decode below tests its own path
	! cmp -s tm.seg-greedy tm.seg-topp && ! cmp -s tm.seg-topp tm.seg-full && ! cmp -s tm.seg tm.seg-topp &&
	! cmp -s tw.seg-greedy tw.seg-topp && ! cmp -s tw.seg-topp tw.seg-full
'

# layout MODEL NP LAYOUT: prefill and decode under the layout equal one
# process, byte for byte: the KV file (cache, next logits), then the
# segment (tokens, log-probs) and the decoded KV file of every decode
layout() {
	m=$1 np=$2 l=$3 t=$m-$(echo "$3" | tr =, __)
	run "$np" "$l" -m "$m" prefill "$m.cond" -o "$t.kv" --max-new 7 &&
	cmp "$m.kv0" "$t.kv" && cp "$t.kv" "$t.kv0" &&
	run "$np" "$l" -m "$m" decode $SAMPLE "$m.cond" "$t.kv" -o "$t.seg" &&
	cmp "$m.seg" "$t.seg" && cmp "$m.kv" "$t.kv" &&
	for d in $DECODES; do
		cp "$t.kv0" "$t.kv" &&
		run "$np" "$l" -m "$m" decode $(echo "${d#*:}" | tr _ " ") "$m.cond" "$t.kv" -o "$t.seg" &&
		cmp "$m.seg-${d%%:*}" "$t.seg" && cmp "$m.kv-${d%%:*}" "$t.kv" || return 1
	done
}

test_expect_success 'tiny-moe, tp=2: KV file, segment and decoded KV bitwise those of one process' '
	layout tm 2 tp=2
'
test_expect_success 'tiny-moe, ep=2: bitwise one process' '
	layout tm 2 ep=2
'
test_expect_success 'tiny-moe, ep=2 with the all-to-all dispatch: bitwise one process' '
	layout tm 2 ep=2,dispatch=alltoall
'
test_expect_success 'wider MoE, tp=2,ep=2 on 4 ranks: bitwise one process' '
	layout tw 4 tp=2,ep=2
'
test_expect_success 'wider MoE, tp=4 (uneven vocabulary split): bitwise one process' '
	layout tw 4 tp=4
'

test_expect_success 'wider MoE, ep=4 (2 of the 8 experts per rank): bitwise one process' '
	layout tw 4 ep=4
'
test_expect_success 'wider MoE, ep=4 and ep=2 with the all-to-all dispatch: bitwise one process' '
	layout tw 4 ep=4,dispatch=alltoall && layout tw 2 ep=2,dispatch=alltoall
'

test_expect_success 'the all-to-all dispatch receives fewer bytes than the gather (it is the path taken)' '
	for d in gather alltoall; do
		mpirun -np 4 "$MPI_BIN" -t 1 --parallel ep=4,dispatch=$d -m tw prefill tw.cond -o $d.kv --max-new 7 \
			2>$d.err && cmp tw.kv0 $d.kv || return 1
	done &&
	g=$(sed -n "s/.*rank 0 of 4: .* s in collectives, \([0-9.]*\) MiB.*/\1/p" gather.err) &&
	a=$(sed -n "s/.*rank 0 of 4: .* s in collectives, \([0-9.]*\) MiB.*/\1/p" alltoall.err) &&
	echo "gather $g MiB, alltoall $a MiB" && awk -v g="$g" -v a="$a" "BEGIN { exit !(a > 0 && a < g) }"
'

test_expect_success 'lm_head split: a decode step exchanges no row of logits (large vocabulary, tp=2)' '
	make_model tiny-moe tv --set vocab_size=40000 &&
	hi3 -q -m tv tokenize-concat req.jsonl -o tv.cond &&
	hi3 -q -t 1 -m tv prefill tv.cond -o tv.kv0 --max-new 7 && cp tv.kv0 tv.kv &&
	hi3 -q -t 1 -m tv decode --temperature 0.8 --top-k 50 --top-p 0.9 tv.cond tv.kv -o tv.seg &&
	mpirun -np 2 "$MPI_BIN" -t 1 --parallel tp=2 -m tv prefill tv.cond -o tv2.kv --max-new 7 2>/dev/null &&
	cmp tv.kv0 tv2.kv &&
	mpirun -np 2 "$MPI_BIN" -t 1 --parallel tp=2 -m tv decode --temperature 0.8 --top-k 50 --top-p 0.9 \
		tv.cond tv2.kv -o tv2.seg 2>err && cmp tv.seg tv2.seg && cmp tv.kv tv2.kv &&
	# 7 steps of 3 rows: gathering the logits would receive 7 x 3 x 40000 floats (3.2 MiB)
	mib=$(sed -n "s/.*rank 0 of 2: .* s in collectives, \([0-9.]*\) MiB.*/\1/p" err) && echo "received $mib MiB" &&
	awk -v b="$mib" "BEGIN { exit !(b < 0.5) }"
'

test_expect_success 'a trace under tp=4: the logits points (top-k, ids, log-sum-exp) equal one process' '
	hi3 -q -t 1 -m tw prefill tw.cond -o tr1.kv --max-new 7 --trace tr1.st &&
	run 4 tp=4 -m tw prefill tw.cond -o tr4.kv --max-new 7 --trace tr4.st &&
	hi3 diff --atol 0 --tensor logits.topk --tensor logits.topk_ids --tensor logits.lse --tensor final_norm \
		tr1.st tr4.st
'

test_expect_success 'replay under tp=2,ep=2 writes the replay file of one process' '
	run 4 tp=2,ep=2 -m tw replay tw.cond tw.seg -o tw4.rep >rep.json &&
	cmp tw.rep tw4.rep && test_grep -q "\"tokens\"" rep.json
'

test_expect_success 'diffusion-capture under tp=2 and ep=2: the trajectory and PNGs of one process, no checkpoint left' '
	printf "%s\n" \
		"{\"prompt\": \"a red fox\", \"mode\": \"gen_image\", \"image_size\": \"32x48\", \"seed\": 7}" \
		"{\"prompt\": \"two cats asleep on a warm mat\", \"mode\": \"gen_image\", \"image_size\": \"32x48\", \"seed\": 9}" \
		>dreq.jsonl &&
	hi3 -q -m tm tokenize-concat --exact-size dreq.jsonl -o d.cond &&
	hi3 -q -t 1 -m tm diffusion-capture --steps 3 --sampler sde --sde-steps 1 d.cond -o d1.st --png p1 &&
	for l in tp=2 ep=2; do
		run 2 $l -m tm diffusion-capture --steps 3 --sampler sde --sde-steps 1 d.cond -o d-$l.st --png p-$l &&
		cmp d1.st d-$l.st && cmp p1/row-0.png p-$l/row-0.png && cmp p1/row-1.png p-$l/row-1.png &&
		test ! -e d-$l.st.partial || return 1
	done
'

test_expect_success 'a KV file prefilled by 2 ranks decodes with 1, one prefilled by 1 decodes with 2' '
	run 2 tp=2 -m tm prefill tm.cond -o two.kv --max-new 7 &&
	hi3 -q -t 1 -m tm decode $SAMPLE tm.cond two.kv -o two.seg &&
	cmp tm.seg two.seg && cmp tm.kv two.kv &&
	cp tm.kv0 one.kv &&
	run 2 ep=2 -m tm decode $SAMPLE tm.cond one.kv -o one.seg &&
	cmp tm.seg one.seg && cmp tm.kv one.kv
'

test_expect_success 'a KV file prefilled with tp=4 decodes with tp=2 (other vocabulary slices of next_logits)' '
	run 4 tp=4 -m tw prefill tw.cond -o four.kv --max-new 7 && cmp tw.kv0 four.kv &&
	run 2 tp=2 -m tw decode --temperature 0.8 --top-k 50 --top-p 0.9 tw.cond four.kv -o four.seg &&
	cmp tw.seg-topp four.seg && cmp tw.kv-topp four.kv
'

test_expect_success 'parity passes under tp=2' '
	run 2 tp=2 -m tm parity --steps 3 --greedy-only req.jsonl >par.txt &&
	test_grep -q "^\[PASS\]" par.txt && ! grep -q "^\[FAIL\]" par.txt
'

test_expect_success 'a rank killed mid-decode fails every rank, names it; the file resumes to the same result' '
	cp tm.kv0 kill.kv &&
	{ mpirun -np 2 sh -c "if [ \$OMPI_COMM_WORLD_RANK = 1 ]; then export HI3_TEST_KILL_AT=2:0; fi; \
		exec \"$MPI_BIN\" -q -t 1 --parallel tp=2 -m tm decode $SAMPLE tm.cond kill.kv -o kill.seg" 2>err;
	  rc=$?; } ; echo "mpirun: exit $rc" && test "$rc" -ne 0 &&
	test_grep -q "process rank 1 .* exited on signal 9" err && test ! -e kill.seg &&
	test "$(hi3 inspect --tensor gen_len kill.kv | tail -n 1)" != "0 0 0" &&
	run 2 tp=2 -m tm decode --resume $SAMPLE tm.cond kill.kv -o kill.seg &&
	cmp tm.seg kill.seg && cmp tm.kv kill.kv
'

test_expect_success 'a rank that fails ends every rank with its status, naming it; no file is damaged' '
	cp tm.kv0 bad.kv &&
	test_must_fail 3 mpirun -np 2 sh -c "if [ \$OMPI_COMM_WORLD_RANK = 1 ]; then c=missing.cond; else c=tm.cond; fi; \
		exec \"$MPI_BIN\" -q -t 1 --parallel tp=2 -m tm decode \$c bad.kv -o bad.seg" 2>err &&
	test_grep -q "rank 1 of 2: error: missing.cond" err && test ! -e bad.seg && cmp tm.kv0 bad.kv
'

test_expect_success 'ranks with other conditions stop with exit 3, the KV file untouched' '
	REQ_SEED=1 requests 9 23 17 >other.jsonl && hi3 -q -m tm tokenize-concat other.jsonl -o other.cond &&
	cp tm.kv0 mix.kv &&
	test_must_fail 3 mpirun -np 1 "$MPI_BIN" -q -t 1 --parallel ep=2 -m tm prefill tm.cond -o y.kv : \
		-np 1 "$MPI_BIN" -q -t 1 --parallel ep=2 -m tm prefill other.cond -o y.kv 2>err &&
	test_grep -q "rank 1 runs conditions hash" err && test ! -e y.kv && ! ls y.kv.* 2>/dev/null
'

test_expect_success 'ranks with other models stop with exit 3 before any file is made' '
	make_model tiny-moe tm2 --seed 2 &&
	test_must_fail 3 mpirun -np 1 "$MPI_BIN" -q -t 1 --parallel tp=2 -m tm prefill tm.cond -o x.kv : \
		-np 1 "$MPI_BIN" -q -t 1 --parallel tp=2 -m tm2 prefill tm.cond -o x.kv 2>err &&
	test_grep -q "rank 1 runs" err && test ! -e x.kv && ! ls x.kv.* 2>/dev/null
'

test_expect_success 'a tp that does not divide the kv heads, an ep that does not divide the experts: exit 2' '
	test_must_fail 2 run 4 tp=4 -m tm prefill tm.cond -o x.kv 2>err &&
	test_grep -q "num_key_value_heads 2 is not divisible by 4" err &&
	test_must_fail 2 run 3 ep=3 -m tm prefill tm.cond -o x.kv 2>err &&
	test_grep -q "num_experts 4 of layer 0 is not divisible by 3" err &&
	test_must_fail 2 run 2 tp=1 -m tm prefill tm.cond -o x.kv 2>err &&
	test_grep -q "needs 1 ranks; the launcher started 2" err &&
	test_must_fail 2 run 4 tp=2,ep=2,dispatch=alltoall -m tw prefill tw.cond -o x.kv 2>err &&
	test_grep -q "all-to-all dispatch needs ep > 1 and tp = 1" err &&
	test_must_fail 2 run 2 ep=2,dispatch=scatter -m tm prefill tm.cond -o x.kv 2>err &&
	test_grep -q "dispatch=scatter is not gather or alltoall" err && test ! -e x.kv
'

test_expect_success '--parallel without a launcher, and with the plain hi3: a clear message, exit 2' '
	test_must_fail 2 env -u OMPI_COMM_WORLD_SIZE "$MPI_BIN" -q --parallel tp=2 -m tm prefill tm.cond -o x.kv 2>err &&
	test_grep -q "not started by an MPI launcher" err &&
	test_must_fail 2 hi3 -q --parallel tp=2 -m tm prefill tm.cond -o x.kv 2>err &&
	test_grep -q "built without MPI.*hi3-mpi" err &&
	test_must_fail 2 hi3 -q --parallel tp=0 -m tm prefill tm.cond -o x.kv 2>err &&
	test_grep -q "tp=0 is not a count" err && test ! -e x.kv
'

test_done
