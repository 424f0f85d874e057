#!/usr/bin/env bash
# Decode after a prompt long enough that a step's attention is worth
# several threads: the pool splits it into work items of one kv head's
# query heads, fewer heads an item when the threads outnumber the items.
# However it is split, each query's arithmetic is the same, so the KV
# files and segments are the same bytes on any number of threads, with an
# f32 or a bf16 cache, and a row batched equals the row alone.
. "$SRCDIR/tests/lib.sh"

# 8 query heads over 2 kv heads of 64: past about 1024 keys a step's
# attention leaves the calling thread (HI3_PAR_WORTH in cpu_attention)
test_expect_success 'a model, a 1100-token row and a batch of three' '
	make_model tiny-moe m --set num_attention_heads=8 --set num_key_value_heads=2 \
		--set attention_head_dim=64 &&
	requests 1100 >one.jsonl && requests 1100 1300 40 >three.jsonl &&
	hi3 -q -m m tokenize-concat one.jsonl -o one.st &&
	hi3 -q -m m tokenize-concat three.jsonl -o three.st
'

for kv in f32 bf16; do
	test_expect_success "$kv cache: the same bytes on 1, 2, 3 and 5 threads" '
		for t in 1 2 3 5; do
			hi3 -q -t $t -m m prefill --kv-dtype '$kv' one.st -o t$t.kv --max-new 6 &&
			hi3 -q -t $t -m m decode one.st t$t.kv -o t$t.seg || return 1
		done &&
		for t in 2 3 5; do
			cmp t1.kv t$t.kv && cmp t1.seg t$t.seg || return 1
		done
	'

	test_expect_success "$kv cache: rows of 1100, 1300 and 40 tokens batched equal each alone" '
		hi3 -q -t 3 -m m parity three.jsonl --kv-dtype '$kv' --steps 4 --greedy-only >out &&
		test "$(grep -c "^\[PASS\].*logp max|d|=0 prefill-KV max|d|=0" out)" = 3 &&
		! grep -q "^\[FAIL\]" out
	'
done

test_done
