#!/usr/bin/env bash
# A killed diffusion-capture resumes (hi3-diffusion-capture(1), --resume;
# hi3-files(5), DIFFUSION CHECKPOINT): SIGKILL at chosen points of a capture
# (HI3_TEST_KILL_AT=S:C, before or after step S's commit; S = T around the
# trajectory's write) and a real kill -9 at random moments, then --resume,
# give a trajectory and PNGs byte-identical to an uninterrupted run, with
# KV reuse (whose cache of step 0 a resumed run makes again), with a defect
# that acts through that cache, and without KV reuse; a checkpoint of other
# settings is refused, untouched.
. "$SRCDIR/tests/lib.sh"

CAP="--steps 6 --guidance 4.5 --sampler sde --sde-steps 1,2,4 --capture-velocity"

test_expect_success 'setup: a tiny model, two gen_image requests; an uninterrupted run, its checkpoint removed' '
	make_model tiny tiny &&
	printf "%s\n" \
		"{\"prompt\": \"a red fox\", \"mode\": \"gen_image\", \"image_size\": \"32x48\", \"seed\": 7}" \
		"{\"prompt\": \"two cats asleep on a warm mat by the fire\", \"mode\": \"gen_image\", \"image_size\": \"32x48\", \"seed\": 9}" >req.jsonl &&
	hi3 -q -m tiny tokenize-concat --exact-size req.jsonl -o c.st &&
	hi3 -q -m tiny diffusion-capture $CAP c.st -o ref.st --png refpng &&
	test -f refpng/row-0.png && test -f refpng/row-1.png && ! test -e ref.st.partial
'

for kill in 0:0 1:1 3:0 5:1 6:0 6:1; do
	test_expect_success "killed at step:commit $kill, then --resume: the same trajectory and PNGs" "
		rm -rf png k.st k.st.partial &&
		{ HI3_TEST_KILL_AT=$kill \"\$HI3\" -q -m tiny diffusion-capture $CAP c.st -o k.st --png png; rc=\$?; } &&
		test \$rc = 137 && test -f k.st.partial && ! test -d png &&
		case $kill in 6:1) test -f k.st ;; *) ! test -e k.st ;; esac &&
		hi3 -m tiny diffusion-capture $CAP --resume c.st -o k.st --png png 2>err &&
		test_grep \"resumed from k.st.partial at step \" err &&
		cmp ref.st k.st && cmp refpng/row-0.png png/row-0.png && cmp refpng/row-1.png png/row-1.png &&
		! test -e k.st.partial
	"
done

test_expect_success 'the step it resumed at is the last one committed' '
	rm -f k.st.partial &&
	{ HI3_TEST_KILL_AT=3:0 "$HI3" -q -m tiny diffusion-capture $CAP c.st -o k.st; test $? = 137; } &&
	test "$(hi3 inspect --tensor steps_done k.st.partial | tail -n 1)" = 3 &&
	hi3 inspect k.st.partial | grep -q "format: hi3.diffusion-checkpoint" &&
	{ hi3 diff --atol 0 --tensor latents k.st.partial ref.st >d; test $? = 1; } &&
	test_grep "latents .*first at row 0, step 5," d &&
	hi3 -m tiny diffusion-capture $CAP --resume --json c.st -o k.st >j 2>err &&
	test_grep "resumed from k.st.partial at step 3 of 6" err &&
	test_grep "\"resumed_from\": 3" j && cmp ref.st k.st
'

test_expect_success 'a real kill -9 at random moments of a longer capture: resumed, byte-identical' '
	long="--steps 40 --guidance 4.5 --sampler sde --sde-steps 3,9,27" &&
	hi3 -q -m tiny diffusion-capture $long c.st -o lref.st &&
	for t in 0.05 0.15 0.25; do
		rm -f l.st l.st.partial &&
		{ "$HI3" -q -m tiny diffusion-capture $long c.st -o l.st & pid=$!; } &&
		sleep $(awk -v t=$t -v r=$RANDOM "BEGIN { print t * (0.5 + r / 32767) }") &&
		{ kill -9 $pid 2>/dev/null; wait $pid; true; } &&
		hi3 -q -m tiny diffusion-capture $long --resume c.st -o l.st &&
		cmp lref.st l.st || exit 1
	done
'

test_expect_success 'a defect acting through the cache (pos-pad), and no KV reuse: resumed, byte-identical' '
	for opt in "--ablate pos-pad" "--no-kv-reuse"; do
		hi3 -q -m tiny diffusion-capture $CAP $opt c.st -o r2.st 2>/dev/null &&
		rm -f k2.st.partial &&
		{ HI3_TEST_KILL_AT=3:1 "$HI3" -q -m tiny diffusion-capture $CAP $opt c.st -o k2.st 2>/dev/null
		  test $? = 137; } &&
		hi3 -q -m tiny diffusion-capture $CAP $opt --resume c.st -o k2.st 2>/dev/null &&
		cmp r2.st k2.st || exit 1
	done
'

test_expect_success 'a checkpoint of other settings is refused (exit 3), untouched; without --resume: started again' '
	rm -f k.st && { HI3_TEST_KILL_AT=2:1 "$HI3" -q -m tiny diffusion-capture $CAP c.st -o k.st; test $? = 137; } &&
	cp k.st.partial keep &&
	test_must_fail 3 hi3 -m tiny diffusion-capture $CAP --eta 0.5 --resume c.st -o k.st 2>err &&
	test_grep "k.st.partial: the checkpoint of another run: its sampler settings" err &&
	test_must_fail 3 hi3 -m tiny diffusion-capture $CAP --sde-steps 1,2 --resume c.st -o k.st 2>err &&
	test_grep "checkpoint of another run" err &&
	cmp keep k.st.partial && ! test -e k.st &&
	hi3 -q -m tiny diffusion-capture $CAP c.st -o k.st && cmp ref.st k.st && ! test -e k.st.partial
'

test_expect_success '--resume without a checkpoint runs from the start; --no-checkpoint leaves none' '
	rm -f k.st k.st.partial &&
	hi3 -m tiny diffusion-capture $CAP --resume c.st -o k.st 2>err && cmp ref.st k.st &&
	test_grep "no checkpoint k.st.partial: from step 0" err &&
	rm -f k.st && { HI3_TEST_KILL_AT=6:0 "$HI3" -q -m tiny diffusion-capture $CAP --no-checkpoint c.st -o k.st
	                test $? = 137; } &&
	! test -e k.st.partial && ! test -e k.st
'

test_expect_success 'a damaged checkpoint is bad input (exit 3); the usage errors (exit 2)' '
	rm -f k.st && { HI3_TEST_KILL_AT=2:1 "$HI3" -q -m tiny diffusion-capture $CAP c.st -o k.st; test $? = 137; } &&
	head -c 3000 k.st.partial >t && mv t k.st.partial &&
	test_must_fail 3 hi3 -m tiny diffusion-capture $CAP --resume c.st -o k.st 2>err &&
	test_grep "k.st.partial" err && rm k.st.partial &&
	test_must_fail 2 hi3 -m tiny diffusion-capture $CAP --resume --no-checkpoint c.st -o k.st 2>err &&
	test_must_fail 2 hi3 -m tiny diffusion-capture $CAP --resume --trace t.trace c.st -o k.st 2>err &&
	test_grep "resume takes no --trace" err && ! test -e k.st
'

test_done
