#!/usr/bin/env bash
# Layout invariance, the project's main correctness test: the tiny model (fp32, dropout on) trained 6
# iterations gives the single-rank losses within 1e-4 for every layout with TP, PP, DP in {1, 2, 4} and
# TP x PP x DP <= 8, each with sequence parallelism on where TP > 1, the distributed optimizer at DP = 2, and
# the interleaved schedule (2 virtual stages) where the pipeline has 2 stages; small gradient buckets make the
# data-parallel reduction overlap backward in several pieces. A bf16 sample holds within 1e-2.
source "$(dirname "$0")/lib/common.bash"
prepare_data
write_config
common=(--config tiny.yaml --set model.num_layers=8 --set training.micro_batch_size=1
        --set training.global_batch_size=8 --set training.train_iters=6 --set parallel.timeout_s=60
        --set parallel.grad_bucket_size=5000)
"$MT" "${common[@]}" --set logging.dir=one >/dev/null
"$MT" "${common[@]}" --set training.precision=bf16 --set logging.dir=one_bf16 >/dev/null
count=0
for tp in 1 2 4; do for pp in 1 2 4; do for dp in 1 2 4; do
  world=$((tp * pp * dp))
  [ $world -le 8 ] && [ $world -gt 1 ] || continue
  sp=false; [ $tp -gt 1 ] && sp=true
  zero=false; [ $dp -eq 2 ] && zero=true   # DP=4 layouts use the bucketed all-reduce instead
  vp=1; [ $pp -eq 2 ] && vp=2
  dir=tp${tp}pp${pp}dp${dp}
  "$MT" "${common[@]}" --nproc $world --set parallel.tensor=$tp --set parallel.pipeline=$pp \
        --set parallel.virtual_pipeline=$vp --set parallel.sequence_parallel=$sp \
        --set parallel.distributed_optimizer=$zero --set logging.dir=$dir >/dev/null 2>$dir.err \
    || { tail -5 $dir.err; fail "$dir failed"; }
  same_losses one/metrics.jsonl $dir/metrics.jsonl 1 6 1e-4
  count=$((count + 1))
done; done; done
[ $count -eq 16 ] || fail "expected 16 multi-rank layouts, ran $count"
"$MT" "${common[@]}" --nproc 8 --set training.precision=bf16 --set parallel.tensor=2 --set parallel.pipeline=2 \
      --set parallel.sequence_parallel=true --set parallel.distributed_optimizer=true --set logging.dir=bf16 >/dev/null
same_losses one_bf16/metrics.jsonl bf16/metrics.jsonl 1 6 1e-2
echo "all $count layouts match one rank"
