#!/usr/bin/env bash
# parallel.shard: gradients (ZeRO-2) trains as none and optimizer do, in fp32 (dropout on):
#  - one microbatch per rank (global batch = DP x micro batch): bit-identical losses to none and to optimizer, at
#    DP=2 and DP=4, GPT and Llama, alone and with TP=2 (SP) and PP=2 (the reduce-scatter sums the ranks in the order
#    the all-reduce does);
#  - several microbatches: every microbatch is reduce-scattered on its own and the fp32 shards add them up, so the
#    additions run in another order than accumulate-then-reduce: losses within 1e-6 (rounding level; over these 6
#    iterations the printed f32 losses came out equal, the grad norms within 2e-8), and fp16 with its loss scaler
#    within 1e-3;
#  - the measured peak gradient memory at DP=4 is about a quarter of none's (the shard plus one layer's transients);
#  - checkpoints stay layout-free: saved under gradients at DP=4 and resumed under none at DP=2 (and back) give
#    exactly the losses of the same save and resume under none;
#  - bad input: an unknown stage, the alias against another stage; one rank warns (parameters: shard_parameters.sh).
source "$(dirname "$0")/lib/common.bash"
source "$SRC/tests/e2e/lib/shard.bash"
prepare_data
write_config
write_llama_config
# Bad input: an unknown stage, the alias against another stage (both keys named); one rank warns.
expect_error "parallel.shard" --config tiny.yaml --set parallel.shard=everything
grep -q "expected one of none, optimizer, gradients, parameters" err.txt || fail "the unknown stage's error does not list the stages"
expect_error "parallel.distributed_optimizer" --config tiny.yaml --set parallel.distributed_optimizer=true \
             --set parallel.shard=gradients
grep -q "parallel.shard: gradients" err.txt || fail "the conflict's error does not name parallel.shard"
"$MT" --config tiny.yaml --set training.train_iters=1 --set optimizer.warmup_iters=0 --set parallel.shard=gradients --set logging.dir=dp1 \
      >/dev/null 2>dp1.err || { cat dp1.err; fail "shard=gradients at DP=1 failed"; }
grep -q "one data-parallel rank" dp1/megatrain.log || fail "shard=gradients at DP=1 does not warn"
# The alias with its own stage is accepted (and is ZeRO-1).
"$MT" --config tiny.yaml --set training.train_iters=1 --set optimizer.warmup_iters=0 --set parallel.distributed_optimizer=true \
      --set parallel.shard=optimizer --set logging.dir=alias >/dev/null
base=(--set training.train_iters=6 --set optimizer.warmup_iters=2 --set parallel.timeout_s=60 --set parallel.grad_bucket_size=3000
      --set training.micro_batch_size=2)
gradients_peak() {  # the training log's peak gradient memory (MiB) of rank 0
  grep -m1 'peak memory (MiB):' "$1/megatrain.log" | sed -E 's/.*gradients ([0-9.]+).*/\1/'
}
# One microbatch per rank: exact.
for cfg in tiny llama; do
  for layout in "1 1 2" "1 1 4" "2 1 2" "1 2 2"; do
    one_microbatch_layout $cfg "$layout"
    for shard in none optimizer gradients; do
      dir=${cfg}_tp${tp}pp${pp}dp${dp}_$shard
      "$MT" "${args[@]}" --set parallel.shard=$shard --set logging.dir=$dir >/dev/null 2>$dir.err \
        || { tail -5 $dir.err; fail "$dir failed"; }
    done
    for shard in optimizer gradients; do
      losses ${cfg}_tp${tp}pp${pp}dp${dp}_none/metrics.jsonl 1 6 > a.txt
      losses ${cfg}_tp${tp}pp${pp}dp${dp}_$shard/metrics.jsonl 1 6 > b.txt
      [ "$(wc -l < a.txt)" -eq 6 ] || fail "$cfg tp$tp pp$pp dp$dp: expected 6 losses"
      diff a.txt b.txt >/dev/null || { paste a.txt b.txt; fail "$cfg tp$tp pp$pp dp$dp: $shard differs from none"; }
    done
    echo "$cfg TP $tp PP $pp DP $dp, one microbatch: none, optimizer and gradients bit-identical"
  done
done
# Four microbatches per rank at DP=4 (and PP=2 x DP=2 with zb-h1): the sum order differs, rounding level.
for layout in "1 4 none" "2 2 zb-h1"; do
  read -r pp dp sched <<<"$layout"
  extra=(); [ $sched != none ] && extra=(--set parallel.pipeline_schedule=$sched)
  args=(--config tiny.yaml "${base[@]}" --nproc $((pp * dp)) --set parallel.pipeline=$pp
        --set training.global_batch_size=$((8 * dp)) "${extra[@]}")
  "$MT" "${args[@]}" --set parallel.shard=optimizer --set logging.dir=mb_pp${pp}dp${dp}_optimizer >/dev/null
  "$MT" "${args[@]}" --set parallel.shard=gradients --set logging.dir=mb_pp${pp}dp${dp}_gradients >/dev/null
  same_losses mb_pp${pp}dp${dp}_optimizer/metrics.jsonl mb_pp${pp}dp${dp}_gradients/metrics.jsonl 1 6 1e-6
  # The gradients themselves: the grad norms differ at rounding level (the other sum order), no more.
  python3 - mb_pp${pp}dp${dp}_optimizer/metrics.jsonl mb_pp${pp}dp${dp}_gradients/metrics.jsonl <<'PY'
import json, sys
norms = [[r["grad_norm"] for r in map(json.loads, open(p)) if "loss" in r] for p in sys.argv[1:3]]
worst = max(abs(a - b) / a for a, b in zip(*norms))
print(f"grad norms: worst relative difference {worst:.1e} (tolerance 1e-6)")
assert len(norms[0]) == 6 and worst <= 1e-6, "grad norms differ"
PY
done
# fp16 (the loss scaler reads the shards for inf/NaN) at DP=2, two microbatches: as optimizer within 1e-3.
fp16=(--config tiny.yaml "${base[@]}" --nproc 2 --set training.precision=fp16 --set training.global_batch_size=8)
"$MT" "${fp16[@]}" --set parallel.shard=optimizer --set logging.dir=fp16_optimizer >/dev/null
"$MT" "${fp16[@]}" --set parallel.shard=gradients --set logging.dir=fp16_gradients >/dev/null
same_losses fp16_optimizer/metrics.jsonl fp16_gradients/metrics.jsonl 1 6 1e-3
# Memory: rank 0's peak gradient memory at DP=4, 16 layers, small buckets: a quarter (the shard) plus the transient
# storage: the layer backward writes (1/16), a bucket in flight or shared with the next layer, and the tied
# table held from the head to the embedding (each a largest parameter: 0.02 of the model).
mem=(--config tiny.yaml --set optimizer.warmup_iters=0 --set model.num_layers=16 --set model.hidden_size=64 --set model.ffn_hidden_size=256
     --set training.train_iters=1 --set training.micro_batch_size=2 --set training.global_batch_size=16
     --set parallel.grad_bucket_size=2000 --nproc 4)
"$MT" "${mem[@]}" --set parallel.shard=none --set logging.dir=mem_none >/dev/null
"$MT" "${mem[@]}" --set parallel.shard=gradients --set logging.dir=mem_gradients >/dev/null
python3 - "$(gradients_peak mem_none)" "$(gradients_peak mem_gradients)" <<'PY'
import sys
none, sharded = float(sys.argv[1]), float(sys.argv[2])
ratio = sharded / none
print(f"peak gradient memory at DP=4: none {none} MiB, gradients {sharded} MiB ({ratio:.2f} of none)")
assert 0.25 <= ratio <= 0.4, f"expected about a quarter (plus the transients), got {ratio:.2f}"
PY
# Layout-free checkpoints (tests/e2e/lib/shard.bash).
check_layout_free_checkpoints gradients
