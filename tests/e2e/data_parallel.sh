#!/usr/bin/env bash
# Data parallelism keeps the single-rank loss curve: DP=2 and DP=4 (ranks started by a shell loop with
# torchrun-style variables), with the distributed optimizer (ZeRO-1) off and on, give the losses of one rank
# within 1e-4 in fp32 and 1e-2 in bf16, dropout on; a checkpoint saved at DP=2 with the distributed optimizer
# resumes at DP=1 and at DP=4 without it, continuing the uninterrupted losses.
source "$(dirname "$0")/lib/common.bash"
prepare_data
write_config
common=(--config tiny.yaml --set training.micro_batch_size=2 --set training.global_batch_size=8
        --set training.train_iters=12 --set parallel.timeout_s=60 --set parallel.grad_bucket_size=4000)
for precision in fp32 bf16; do
  tol=1e-4; [ $precision = bf16 ] && tol=1e-2
  "$MT" "${common[@]}" --set training.precision=$precision --set logging.dir=one_$precision >/dev/null
  for n in 2 4; do
    for zero in false true; do
      dir=dp${n}zero${zero}_$precision
      run_ranks $n "${common[@]}" --set training.precision=$precision --set parallel.distributed_optimizer=$zero \
                --set logging.dir=$dir
      same_losses one_$precision/metrics.jsonl $dir/metrics.jsonl 1 12 $tol
    done
  done
done
# Save at DP=2 after iteration 6, resume at DP=1 and at DP=4 (the layout changes, the run does not).
run_ranks 2 "${common[@]}" --set parallel.distributed_optimizer=true --set logging.dir=saved \
          --set checkpoint.save_dir=ckpt --exit-after 6
[ "$(cat ckpt/latest)" = iter_0000006 ] || fail "no checkpoint at iteration 6"
cp -r ckpt ckpt4
"$MT" "${common[@]}" --set logging.dir=resumed1 --set checkpoint.save_dir=ckpt >/dev/null
same_losses one_fp32/metrics.jsonl resumed1/metrics.jsonl 7 12 1e-4
run_ranks 4 "${common[@]}" --set logging.dir=resumed4 --set checkpoint.save_dir=ckpt4
same_losses one_fp32/metrics.jsonl resumed4/metrics.jsonl 7 12 1e-4
# And back: a replicated-optimizer checkpoint from one rank resumes with the distributed optimizer at DP=4.
"$MT" "${common[@]}" --set logging.dir=saved1 --set checkpoint.save_dir=ckpt4z --exit-after 6 >/dev/null
run_ranks 4 "${common[@]}" --set parallel.distributed_optimizer=true --set logging.dir=resumed4z \
          --set checkpoint.save_dir=ckpt4z
same_losses one_fp32/metrics.jsonl resumed4z/metrics.jsonl 7 12 1e-4
