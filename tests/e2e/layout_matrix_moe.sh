#!/usr/bin/env bash
# Layout invariance of mixture-of-experts layers (issue 25): TP x PP x DP in {1, 2}^3, and expert parallelism 2 and 4
# with TP and PP, on moe.yaml (4 MoE layers: 4 SwiGLU experts, top-2, a shared expert, auxiliary and z losses,
# dropout on), with and without sequence parallelism, the distributed optimizer (over the expert-data-parallel
# group for the experts) and interleaving, give one rank's losses over 10 iterations: fp32 within 1e-6, bf16 within
# 1e-2 (and parallel.shard: gradients in two layouts, fp32). Under TP every expert is split as the dense MLP is (Megatron's expert_tensor = tensor) or, with parallel
# folding (expert_tensor = 1 < tensor), whole experts are drawn into EP groups across the tensor ranks; every TP rank
# routes every token.
source "$(dirname "$0")/lib/common.bash"
source "$SRC/tests/e2e/lib/layout_matrix.bash"
prepare_data
write_moe_config
# tp pp dp ep etp: every TP x PP x DP in {1, 2}^3 without expert parallelism, then EP 2 and 4 (drawn from DP) with
# TP and PP up to 8 ranks, then parallel folding (ETP 1 under TP 2: EP 1, 2 and 4 drawn from TP and DP).
layouts=("1 1 2 1 1" "1 2 1 1 1" "1 2 2 1 1" "2 1 1 1 2" "2 1 2 1 2" "2 2 1 1 2" "2 2 2 1 2"
         "1 1 2 2 1" "2 1 2 2 2" "1 2 2 2 1" "2 2 2 2 2" "1 1 4 2 1" "2 1 4 2 2" "1 2 4 2 1" "1 1 4 4 1" "2 1 4 4 2"
         "1 2 4 4 1"
         "2 1 1 2 1" "2 1 2 1 1" "2 1 2 2 1" "2 1 2 4 1" "2 2 2 2 1" "2 2 2 4 1")
# The layouts the plain variant (no SP, ZeRO or interleaving) and bf16 run: one of each kind (TP, PP, DP, TP x PP x DP
# without experts split; EP from DP with TP and with PP; EP 4; folding EP 2 and 4 with PP), where fp32 with every
# feature on runs all of them.
some=(1 2 3 6 10 12 14 16 20 22)
run_moe_matrix() {  # precision tolerance variant... (a variant "name:some" runs the layouts of $some)
  local precision=$1 tol=$2; shift 2
  local common=(--config moe.yaml --set model.num_layers=4 --set training.micro_batch_size=1
                --set training.global_batch_size=8 --set training.train_iters=10 --set parallel.timeout_s=60
                --set parallel.grad_bucket_size=5000 --set training.precision=$precision)
  "$MT" "${common[@]}" --set logging.dir=one_$precision >/dev/null
  local count=0 expected=0 tp pp dp ep etp variant sp zero vp dir layout pick picks
  for variant in "$@"; do
    picks=("${!layouts[@]}")
    [ "${variant#*:}" = some ] && picks=("${some[@]}")
    variant=${variant%:*}
    expected=$((expected + ${#picks[@]}))
    for pick in "${picks[@]}"; do
      layout=${layouts[$pick]}
      read -r tp pp dp ep etp <<<"$layout"
      sp=false; zero=false; vp=1
      if [ "$variant" = full ]; then
        [ $tp -gt 1 ] && sp=true
        [ $dp -gt 1 ] && zero=true
        [ $pp -eq 2 ] && vp=2
      fi
      dir=${precision}_${variant}_tp${tp}pp${pp}dp${dp}ep${ep}etp${etp}
      "$MT" "${common[@]}" --nproc $((tp * pp * dp)) --set parallel.tensor=$tp --set parallel.pipeline=$pp \
            --set parallel.virtual_pipeline=$vp --set parallel.sequence_parallel=$sp --set parallel.expert=$ep \
            --set parallel.expert_tensor=$etp \
            --set parallel.distributed_optimizer=$zero --set logging.dir=$dir >/dev/null 2>$dir.err \
        || { tail -5 $dir.err; fail "$dir failed"; }
      same_losses one_$precision/metrics.jsonl $dir/metrics.jsonl 1 10 "$tol"
      count=$((count + 1))
    done
  done
  [ $count -eq $expected ] || fail "expected $expected multi-rank runs, ran $count"
  echo "all $count MoE runs match one rank ($precision)"
}
run_moe_matrix fp32 1e-6 full plain:some
# Sharded gradients (ZeRO-2) with the experts' own buffer over the expert-data-parallel group: EP 2 x DP 4, and
# TP 2 (SP) x EP 2 x DP 2.
for layout in "1 4 2" "2 2 2"; do
  read -r tp dp ep <<<"$layout"
  dir=shard_tp${tp}dp${dp}ep${ep}
  sp=false; [ $tp -gt 1 ] && sp=true
  "$MT" --config moe.yaml --set model.num_layers=4 --set training.micro_batch_size=1 --set training.global_batch_size=8 \
        --set training.train_iters=10 --set parallel.timeout_s=60 --set parallel.grad_bucket_size=5000 \
        --nproc $((tp * dp)) --set parallel.tensor=$tp --set parallel.sequence_parallel=$sp --set parallel.expert=$ep \
        --set parallel.shard=gradients --set logging.dir=$dir >/dev/null 2>$dir.err || { tail -5 $dir.err; fail "$dir failed"; }
  same_losses one_fp32/metrics.jsonl $dir/metrics.jsonl 1 10 1e-6
done
run_moe_matrix bf16 1e-2 full:some
