#!/usr/bin/env bash
# hi3 parity on gen_image requests (hi3-batching(7), IMAGES AND DIFFUSION,
# rules 8 and 9): each request of a ragged batch gives, bitwise, the
# trajectory it gives alone, in every construction, Euler and SDE; each
# upstream defect restored by --ablate breaks that, only with the option,
# and hi3 diff shows the request and step where.
. "$SRCDIR/tests/lib.sh"
J() { "$BUILDDIR/tests/test-tools" json "$@"; }

test_expect_success 'setup: a tiny model, three requests of different prompt lengths' '
	make_model tiny tiny &&
	printf "%s\n" \
		"{\"prompt\": \"a red fox\", \"mode\": \"gen_image\", \"image_size\": \"32x48\", \"seed\": 7}" \
		"{\"prompt\": \"two cats asleep on a warm mat by the fire\", \"mode\": \"gen_image\", \"image_size\": \"32x48\", \"seed\": 9}" \
		"{\"prompt\": \"a boat\", \"mode\": \"gen_image\", \"image_size\": \"32x48\"}" >req.jsonl &&
	hi3 -q -m tiny tokenize-concat --exact-size req.jsonl -o c.st &&
	hi3 inspect --tensor real_pos c.st | tail -n 1 >rp &&
	test "$(wc -w <rp)" -ge 4
'

test_expect_success 'every request equals itself alone, bitwise (3 constructions, euler and sde)' '
	hi3 -q -m tiny parity --exact-size --steps 3 --json --workdir w req.jsonl >rep.json &&
	test "$(J ok <rep.json)" = true &&
	test "$(J tolerance <rep.json)" = 0.0 &&
	test "$(J cases/5/sampler <rep.json)" = sde &&
	for k in 0 1 2 3 4 5; do
		test "$(J cases/$k/pass <rep.json)" = true &&
		test "$(J cases/$k/latent_max_abs <rep.json)" = 0.0 || exit 1
	done &&
	test "$(J cases/0/rows/2/latents_equal <rep.json)" = true &&
	hi3 diff --atol 0 --row 2:0 w/batch-sde-3.traj w/alone-row2-sde-3.traj
'

for a in pos-pad rope-pad rope-1d eoi; do
	test_expect_success "--ablate $a breaks every case, and hi3 diff shows where" "
		hi3 -q -m tiny parity --exact-size --steps 3 --ablate $a --json --workdir w-$a req.jsonl >rep.json &&
		test \"\$(J ok <rep.json)\" = true &&
		for k in 0 1 2 3 4 5; do
			test \"\$(J cases/\$k/pass <rep.json)\" = false || exit 1
		done &&
		step=\$(J cases/0/rows/0/first_step <rep.json) &&
		test \"\$step\" -ge 1 &&
		test_must_fail 1 hi3 diff --atol 0 --row 0:0 --tensor latents w-$a/batch-euler-3.traj \
			w-$a/alone-row0-euler-3.traj >d &&
		test_grep \"latents .*over tol; first at row 0, step \$step,\" d
	"
done

test_expect_success 'the pad defects hit only the padded requests; the longest request stays equal' '
	hi3 -q -m tiny parity --exact-size --steps 3 --ablate pos-pad --greedy-only --json req.jsonl >rep.json &&
	test "$(J cases/0/rows/1/latents_equal <rep.json)" = true &&
	test "$(J cases/0/rows/0/latents_equal <rep.json)" = false &&
	test "$(J cases/0/rows/0/first_step <rep.json)" = 2
'

test_expect_success 'without --ablate nothing breaks: the same run passes (the defects need the option)' '
	hi3 -q -m tiny parity --exact-size --steps 2 --greedy-only req.jsonl >out &&
	test "$(grep -c "^\[PASS\]" out)" = 3
'

test_expect_success 'a decode defect is refused for gen_image requests, a diffusion defect for text (exit 2)' '
	test_must_fail 2 hi3 -m tiny parity --exact-size --ablate decode-mask req.jsonl 2>err &&
	test_grep "decode defect" err &&
	requests 5 9 >txt.jsonl &&
	test_must_fail 2 hi3 -m tiny parity --ablate eoi txt.jsonl 2>err &&
	test_grep "diffusion defect" err
'

test_done
