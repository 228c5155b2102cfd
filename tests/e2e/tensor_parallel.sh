#!/usr/bin/env bash
# Tensor parallelism (column/row-parallel linears, heads split, vocabulary-parallel embedding and
# cross-entropy), with and without sequence parallelism, keeps the single-rank loss curve, alone and with data
# parallelism, fp32 within 1e-4 and bf16 within 1e-2, dropout on; a checkpoint saved at TP=2 x DP=2 resumes at TP=4 and at one rank, continuing the
# uninterrupted losses within 1e-4.
source "$(dirname "$0")/lib/common.bash"
prepare_data
write_config
common=(--config tiny.yaml --set training.micro_batch_size=2 --set training.global_batch_size=8
        --set training.train_iters=10 --set parallel.timeout_s=60)
for precision in fp32 bf16; do
  tol=1e-4; [ $precision = bf16 ] && tol=1e-2
  "$MT" "${common[@]}" --set training.precision=$precision --set logging.dir=one_$precision >/dev/null
  for layout in "2 2 1 false" "4 4 1 false" "4 2 2 false" "2 2 1 true" "4 4 1 true" "4 2 2 true"; do
    read -r world tp dp sp <<<"$layout"
    dir=tp${tp}dp${dp}sp${sp}_$precision
    run_ranks "$world" "${common[@]}" --set training.precision=$precision --set parallel.tensor=$tp \
              --set parallel.sequence_parallel=$sp --set logging.dir=$dir
    same_losses one_$precision/metrics.jsonl $dir/metrics.jsonl 1 10 $tol
  done
done
# Untied head and full recomputation under TP=2 with SP.
"$MT" "${common[@]}" --set model.tie_embeddings=false --set training.recompute=full --set logging.dir=untied1 >/dev/null
run_ranks 2 "${common[@]}" --set model.tie_embeddings=false --set training.recompute=full --set parallel.tensor=2 \
          --set parallel.sequence_parallel=true --set logging.dir=untied2
same_losses untied1/metrics.jsonl untied2/metrics.jsonl 1 10 1e-4
# Save at TP=2 x DP=2 after iteration 5; resume at TP=4 x DP=1 and at one rank.
run_ranks 4 "${common[@]}" --set parallel.tensor=2 --set parallel.sequence_parallel=true --set logging.dir=saved \
          --set checkpoint.save_dir=ckpt --exit-after 5
[ "$(cat ckpt/latest)" = iter_0000005 ] || fail "no checkpoint at iteration 5"
"$MT" ckpt inspect ckpt --verify >/dev/null || fail "the TP=2 x DP=2 checkpoint does not verify"
cp -r ckpt ckpt1
run_ranks 4 "${common[@]}" --set parallel.tensor=4 --set logging.dir=resumed4 --set checkpoint.save_dir=ckpt
same_losses one_fp32/metrics.jsonl resumed4/metrics.jsonl 6 10 1e-4
"$MT" "${common[@]}" --set logging.dir=resumed1 --set checkpoint.save_dir=ckpt1 >/dev/null
same_losses one_fp32/metrics.jsonl resumed1/metrics.jsonl 6 10 1e-4
