#!/usr/bin/env bash
# Layout invariance of mixture-of-experts layers (issue 25; expert parallelism 1 for now): TP x PP x DP in
# {1, 2}^3 on moe.yaml (4 MoE layers: 4 SwiGLU experts, top-2, a shared expert, auxiliary and z losses, dropout on),
# with and without sequence parallelism, the distributed optimizer and interleaving, give one rank's losses over 10
# iterations: fp32 within 1e-6, bf16 within 1e-2. Under TP every expert is split as the dense MLP is (Megatron's
# expert_tensor = tensor) and every TP rank routes every token.
source "$(dirname "$0")/lib/common.bash"
source "$SRC/tests/e2e/lib/layout_matrix.bash"
prepare_data
write_moe_config
run_moe_matrix() {  # precision tolerance variant...
  local precision=$1 tol=$2; shift 2
  local common=(--config moe.yaml --set model.num_layers=4 --set training.micro_batch_size=1
                --set training.global_batch_size=8 --set training.train_iters=10 --set parallel.timeout_s=60
                --set parallel.grad_bucket_size=5000 --set training.precision=$precision)
  "$MT" "${common[@]}" --set logging.dir=one_$precision >/dev/null
  local count=0 tp pp dp variant sp zero vp dir
  for variant in "$@"; do
    for tp in 1 2; do for pp in 1 2; do for dp in 1 2; do
      [ $((tp * pp * dp)) -gt 1 ] || continue
      sp=false; zero=false; vp=1
      if [ "$variant" = full ]; then
        [ $tp -gt 1 ] && sp=true
        [ $dp -gt 1 ] && zero=true
        [ $pp -eq 2 ] && vp=2
      fi
      dir=${precision}_${variant}_tp${tp}pp${pp}dp${dp}
      "$MT" "${common[@]}" --nproc $((tp * pp * dp)) --set parallel.tensor=$tp --set parallel.pipeline=$pp \
            --set parallel.virtual_pipeline=$vp --set parallel.sequence_parallel=$sp \
            --set parallel.distributed_optimizer=$zero --set logging.dir=$dir >/dev/null 2>$dir.err \
        || { tail -5 $dir.err; fail "$dir failed"; }
      same_losses one_$precision/metrics.jsonl $dir/metrics.jsonl 1 10 "$tol"
      count=$((count + 1))
    done; done; done
  done
  [ $count -eq $((7 * $#)) ] || fail "expected $((7 * $#)) multi-rank runs, ran $count"
  echo "all $count MoE runs match one rank ($precision)"
}
run_moe_matrix fp32 1e-6 full plain
run_moe_matrix bf16 1e-2 full
