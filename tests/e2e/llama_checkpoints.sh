#!/usr/bin/env bash
# Llama checkpoints: resume is exact (20 straight vs 10 + resume + 10, fp32 and bf16); a checkpoint saved at
# TP=2 x PP=2 with sequence parallelism resumes at TP=4 and at one rank on the uninterrupted losses (1e-4);
# multi-query attention (one key/value head) and full recomputation keep the one-rank losses; a tensor-parallel
# size that does not divide the key/value heads is refused naming both.
source "$(dirname "$0")/lib/common.bash"
prepare_data
write_llama_config
common=(--config llama.yaml --set parallel.timeout_s=60)
for precision in fp32 bf16; do
  "$MT" "${common[@]}" --set training.precision=$precision --set logging.dir=straight_$precision >/dev/null
  "$MT" "${common[@]}" --set training.precision=$precision --set logging.dir=resumed_$precision \
        --set checkpoint.save_dir=ckpt_$precision --exit-after 10 >/dev/null
  "$MT" "${common[@]}" --set training.precision=$precision --set logging.dir=resumed_$precision \
        --set checkpoint.save_dir=ckpt_$precision >/dev/null
  losses straight_$precision/metrics.jsonl 1 20 > a.txt
  losses resumed_$precision/metrics.jsonl 1 20 | sort -n -k1,1 -u > b.txt
  [ "$(wc -l < a.txt)" -eq 20 ] || fail "$precision: expected 20 losses, got $(wc -l < a.txt)"
  diff a.txt b.txt || fail "$precision: losses after resume differ"
  echo "$precision: iterations 1-20 identical after resume"
done

# Save at TP=2 x PP=2 (+SP) after iteration 10; resume at TP=4 and at one rank.
"$MT" "${common[@]}" --nproc 4 --set parallel.tensor=2 --set parallel.pipeline=2 \
      --set parallel.sequence_parallel=true --set logging.dir=saved --set checkpoint.save_dir=ckpt4 \
      --exit-after 10 >/dev/null 2>saved.err || { tail -5 saved.err; fail "TP2 x PP2 run failed"; }
[ "$(cat ckpt4/latest)" = iter_0000010 ] || fail "no checkpoint at iteration 10"
"$MT" ckpt inspect ckpt4 --verify >/dev/null || fail "the TP=2 x PP=2 checkpoint does not verify"
cp -r ckpt4 ckpt1
"$MT" "${common[@]}" --nproc 4 --set parallel.tensor=4 --set parallel.sequence_parallel=true \
      --set logging.dir=resumed_tp4 --set checkpoint.save_dir=ckpt4 >/dev/null 2>tp4.err \
  || { tail -5 tp4.err; fail "resume at TP=4 failed"; }
same_losses straight_fp32/metrics.jsonl resumed_tp4/metrics.jsonl 11 20 1e-4
"$MT" "${common[@]}" --set logging.dir=resumed_one --set checkpoint.save_dir=ckpt1 >/dev/null
same_losses straight_fp32/metrics.jsonl resumed_one/metrics.jsonl 11 20 1e-4

# Multi-query attention over PP=2 x DP=2, and full recomputation under TP=2 + SP, against one rank.
mqa=(--set model.num_query_groups=1 --set training.train_iters=8)
"$MT" "${common[@]}" "${mqa[@]}" --set logging.dir=mqa_one >/dev/null
"$MT" "${common[@]}" "${mqa[@]}" --nproc 4 --set parallel.pipeline=2 --set parallel.distributed_optimizer=true \
      --set logging.dir=mqa_pp2dp2 >/dev/null
same_losses mqa_one/metrics.jsonl mqa_pp2dp2/metrics.jsonl 1 8 1e-4
rec=(--set training.recompute=full)
"$MT" "${common[@]}" "${rec[@]}" --set logging.dir=rec_one >/dev/null
"$MT" "${common[@]}" "${rec[@]}" --nproc 2 --set parallel.tensor=2 --set parallel.sequence_parallel=true \
      --set logging.dir=rec_tp2 >/dev/null
same_losses rec_one/metrics.jsonl rec_tp2/metrics.jsonl 1 20 1e-4
losses straight_fp32/metrics.jsonl 1 20 > s.txt
losses rec_one/metrics.jsonl 1 20 > r.txt
diff s.txt r.txt || fail "full recomputation changed the losses"

expect_error "parallel.tensor: 4 does not divide model.num_query_groups=2" \
  "${common[@]}" --nproc 4 --set model.num_query_groups=2 --set parallel.tensor=4
