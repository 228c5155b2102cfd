#!/usr/bin/env bash
# parallel.shard_group (hybrid sharding, parallel/sharding/hybrid_shard.h) trains as none does, in fp32 (dropout on), over 10
# iterations:
#  - one microbatch per rank at DP=4 in shard groups of 2: each stage (optimizer, gradients, parameters) bit-identical
#    to none, GPT and Llama, and with TP=2 (SP, GPT) and PP=2 (Llama): the gradients are summed over the whole
#    data-parallel group in rank order whatever the grouping;
#  - the measured optimizer state per rank is half the model's (1/N of it, N = 2): twice that of shard groups of 4;
#  - checkpoints stay layout-free: saved under parameters in groups of 2 at DP=4 and resumed under none at DP=2 (and
#    back) give exactly the losses of the same save and resume under none;
#  - with context parallelism (a shard group is N data ranks with all their context ranks; Llama, dropout off): CP 2 x
#    DP 2 in groups of 1 (optimizer, gradients, parameters) and CP 2 x DP 4 in groups of 2 (parameters) bit-identical
#    to none at the same layout;
#  - with expert parallelism (the experts shard over the expert-data-parallel ranks inside a shard group): moe.yaml
#    at EP 2 x DP 4 in groups of 2 (the experts in groups of 1, two replicas), EP 2 x DP 8 in groups of 4 (groups of 2),
#    CP 2 x DP 2 x EP 2 in groups of 1, bit-identical to none at the same layout;
#  - bad input: a group that does not divide parallel.data, one without a stage that shards, a negative one, one
#    whose ranks the expert-parallel groups would straddle: errors naming the keys.
source "$(dirname "$0")/lib/common.bash"
source "$SRC/tests/e2e/lib/shard.bash"
prepare_data
write_config
write_llama_config
expect_error "parallel.shard_group: 3 does not divide parallel.data=4" --config tiny.yaml --nproc 4 \
             --set parallel.shard=optimizer --set parallel.shard_group=3
expect_error "parallel.shard_group: 2 needs a stage that shards" --config tiny.yaml --nproc 4 --set parallel.shard_group=2
grep -q "parallel.shard: none" err.txt || fail "the error does not name parallel.shard"
expect_error "parallel.shard_group" --config tiny.yaml --set parallel.shard=optimizer --set parallel.shard_group=-1
write_moe_config
expect_error "parallel.shard_group: 3 makes shard groups of parallel.tensor x shard_group x context = 3 ranks" \
             --config moe.yaml --nproc 6 --set parallel.expert=2 --set parallel.shard=optimizer --set parallel.shard_group=3
base=(--set training.train_iters=10 --set optimizer.warmup_iters=2 --set parallel.timeout_s=60
      --set parallel.grad_bucket_size=3000 --set training.micro_batch_size=2)
# config "tp pp dp" stages...
for row in "tiny|1 1 4|optimizer gradients parameters" "llama|1 1 4|optimizer gradients parameters" \
           "tiny|2 1 4|gradients parameters" "llama|1 2 4|optimizer parameters"; do
  IFS='|' read -r cfg layout stages <<<"$row"
  one_microbatch_layout $cfg "$layout"
  name=${cfg}_tp${tp}pp${pp}dp${dp}
  "$MT" "${args[@]}" --set parallel.shard=none --set logging.dir=${name}_none >/dev/null 2>${name}_none.err \
    || { tail -5 ${name}_none.err; fail "${name}_none failed"; }
  losses ${name}_none/metrics.jsonl 1 10 > a.txt
  [ "$(wc -l < a.txt)" -eq 10 ] || fail "$name: expected 10 losses"
  for stage in $stages; do
    dir=${name}_${stage}_sg2
    "$MT" "${args[@]}" --set parallel.shard=$stage --set parallel.shard_group=2 --set logging.dir=$dir >/dev/null \
          2>$dir.err || { tail -5 $dir.err; fail "$dir failed"; }
    losses $dir/metrics.jsonl 1 10 > b.txt
    diff a.txt b.txt >/dev/null || { paste a.txt b.txt; fail "$name: $stage in shard groups of 2 differs from none"; }
  done
  echo "$cfg TP $tp PP $pp DP $dp, one microbatch: $stages in shard groups of 2 bit-identical to none"
done
# Context and expert parallelism: name|config|ranks|layout|shard group|stages, each stage against none at the layout.
for row in "cp2dp2|llama|4|--set parallel.context=2|1|optimizer gradients parameters" \
           "cp2dp4|llama|8|--set parallel.context=2|2|parameters" \
           "ep2dp4|moe|4|--set parallel.expert=2|2|optimizer parameters" \
           "ep2dp8|moe|8|--set parallel.expert=2|4|gradients" \
           "cp2dp2ep2|moe|4|--set parallel.context=2 --set parallel.expert=2|1|parameters"; do
  IFS='|' read -r name cfg world sets group stages <<<"$row"
  read -r -a layout <<<"$sets"
  data=$world
  [[ $name == cp2* ]] && data=$((world / 2))
  args=(--config $cfg.yaml "${base[@]}" --nproc $world "${layout[@]}" --set training.global_batch_size=$((2 * data))
        --set model.dropout=0 --set model.attention_dropout=0)
  "$MT" "${args[@]}" --set parallel.shard=none --set logging.dir=${name}_none >/dev/null 2>${name}_none.err \
    || { tail -5 ${name}_none.err; fail "${name}_none failed"; }
  losses ${name}_none/metrics.jsonl 1 10 > a.txt
  [ "$(wc -l < a.txt)" -eq 10 ] || fail "$name: expected 10 losses"
  for stage in $stages; do
    dir=${name}_${stage}_sg$group
    "$MT" "${args[@]}" --set parallel.shard=$stage --set parallel.shard_group=$group --set logging.dir=$dir \
          >/dev/null 2>$dir.err || { tail -5 $dir.err; fail "$dir failed"; }
    losses $dir/metrics.jsonl 1 10 > b.txt
    diff a.txt b.txt >/dev/null || { paste a.txt b.txt; fail "$name: $stage in shard groups of $group differs from none"; }
  done
  echo "$name ($cfg), one microbatch: $stages in shard groups of $group bit-identical to none"
done
# Memory: rank 0's optimizer state (fp32 masters and moments of its shard) in groups of 2 is twice that in groups of
# 4 (the whole data-parallel group), for each stage (padding aside: within 2%).
optimizer_peak() { grep -m1 'peak memory (MiB):' "$1/megatrain.log" | sed -E 's/.*optimizer ([0-9.]+).*/\1/'; }
mem=(--config tiny.yaml --set optimizer.warmup_iters=0 --set model.num_layers=8 --set model.hidden_size=64
     --set model.ffn_hidden_size=256 --set training.train_iters=1 --set training.micro_batch_size=2
     --set training.global_batch_size=8 --set parallel.grad_bucket_size=2000 --nproc 4)
for stage in optimizer gradients parameters; do
  "$MT" "${mem[@]}" --set parallel.shard=$stage --set logging.dir=mem_${stage}_sg4 >/dev/null
  "$MT" "${mem[@]}" --set parallel.shard=$stage --set parallel.shard_group=2 --set logging.dir=mem_${stage}_sg2 >/dev/null
  python3 - $stage "$(optimizer_peak mem_${stage}_sg4)" "$(optimizer_peak mem_${stage}_sg2)" <<'PY'
import sys
stage, whole, half = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
print(f"{stage}: optimizer state at DP=4, groups of 4: {whole} MiB, groups of 2: {half} MiB ({half / whole:.3f}x)")
assert 1.96 <= half / whole <= 2.04, f"expected twice the state, got {half / whole:.3f}x"
PY
done
# Layout-free checkpoints (tests/e2e/lib/shard.bash).
check_layout_free_checkpoints parameters --set parallel.shard_group=2
