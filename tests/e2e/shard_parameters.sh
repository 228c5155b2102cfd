#!/usr/bin/env bash
# parallel.shard: parameters (ZeRO-3) trains as none does, in fp32 (dropout on), over 10 iterations:
#  - one microbatch per rank: bit-identical losses to none at DP=2 and DP=4, GPT and Llama, alone and with TP=2 (SP)
#    and PP=2 (each unit's values are gathered from the same rounded masters the other stages gather into the
#    whole model; its gradients are ZeRO-2's reduce-scatters);
#  - full recomputation (a recomputed forward reads the weights gathered for the backward), bf16 (the gathers move
#    the rounded masters) and fp16 (with its loss scaler) bit-identical to gradients;
#  - several microbatches: within 1e-6 of optimizer (ZeRO-2's rule: the microbatches are summed after the ranks);
#  - the measured peak parameter memory at DP=4 (bf16, 16 layers): the quarter that is the shard plus the
#    gathered units (the current one and the prefetched next), about 0.37 of none's;
#  - checkpoints stay layout-free: saved under parameters at DP=4 and resumed under none at DP=2 (and back) give
#    exactly the losses of the same save and resume under none;
#  - with context parallelism (Llama, dropout off): the parameters sharded over data x context, CP 2 x DP 2 alone
#    and with TP 2 (SP), one microbatch a rank, bit-identical to none at the same layout;
#  - the zero-bubble schedules (ZB-H1 at PP 2, ZB-V at PP 2 x VP 2; a deferred W reads no weights), DP 2, four
#    microbatches: bit-identical to gradients, and ZB-V within 1e-6 of one rank;
#  - fp8 (bf16, hybrid, current and delayed scaling; a unit's weight casts dropped with its weights) at DP 2, alone and
#    with TP 2 (SP): bit-identical to gradients, and TP 2 x DP 2 within 1e-2 of one rank in fp8;
#  - mixture of experts (the experts gathered over their expert-data-parallel ranks, the rest over data parallelism):
#    mixtral-tiny (8 experts, top 2) at EP 4 x DP 4, EP 2 x DP 4 with the experts' gradients apart, TP 2 (SP) x EP 2
#    x DP 2 and PP 2 x EP 2 x DP 2, one microbatch a rank: bit-identical to gradients, and EP 4 within 1e-6 of one
#    rank;
#  - one rank warns.
source "$(dirname "$0")/lib/common.bash"
source "$SRC/tests/e2e/lib/shard.bash"
prepare_data
write_config
write_llama_config
"$MT" --config tiny.yaml --set training.train_iters=1 --set optimizer.warmup_iters=0 --set parallel.shard=parameters \
      --set logging.dir=dp1 >/dev/null 2>dp1.err || { cat dp1.err; fail "shard=parameters at DP=1 failed"; }
grep -q "parallel.shard=parameters with one data-parallel rank" dp1/megatrain.log || fail "shard=parameters at DP=1 does not warn"
base=(--set training.train_iters=10 --set optimizer.warmup_iters=2 --set parallel.timeout_s=60
      --set parallel.grad_bucket_size=3000 --set training.micro_batch_size=2)
exact() {  # dir-a dir-b what
  losses $1/metrics.jsonl 1 10 > a.txt
  losses $2/metrics.jsonl 1 10 > b.txt
  [ "$(wc -l < a.txt)" -eq 10 ] || fail "$3: expected 10 losses"
  diff a.txt b.txt >/dev/null || { paste a.txt b.txt; fail "$3: $2 differs from $1"; }
}
# One microbatch per rank: exact.
for cfg in tiny llama; do
  for layout in "1 1 2" "1 1 4" "2 1 2" "1 2 2"; do
    one_microbatch_layout $cfg "$layout"
    for shard in none parameters; do run ${cfg}_tp${tp}pp${pp}dp${dp}_$shard "${args[@]}" --set parallel.shard=$shard; done
    exact ${cfg}_tp${tp}pp${pp}dp${dp}_none ${cfg}_tp${tp}pp${pp}dp${dp}_parameters "$cfg TP $tp PP $pp DP $dp"
    echo "$cfg TP $tp PP $pp DP $dp, one microbatch: parameters bit-identical to none"
  done
done
# Context parallelism: parameters gathered and gradients reduce-scattered over data x context.
for tp in 1 2; do
  sp=false
  [ $tp -gt 1 ] && sp=true
  args=(--config llama.yaml "${base[@]}" --nproc $((2 * 2 * tp)) --set parallel.context=2 --set parallel.data=2
        --set parallel.tensor=$tp --set parallel.sequence_parallel=$sp --set training.global_batch_size=4
        --set model.dropout=0 --set model.attention_dropout=0)
  for shard in none parameters; do run cp2dp2tp${tp}_$shard "${args[@]}" --set parallel.shard=$shard; done
  exact cp2dp2tp${tp}_none cp2dp2tp${tp}_parameters "CP 2 x DP 2 x TP $tp"
  echo "CP 2 x DP 2 x TP $tp, one microbatch: parameters bit-identical to none"
done
# Full recomputation, bf16 and fp16 at DP=2: as gradients, bit for bit.
for extra in "training.recompute=full" "training.precision=bf16" "training.precision=fp16"; do
  args=(--config tiny.yaml "${base[@]}" --nproc 2 --set training.global_batch_size=4 --set $extra)
  name=${extra#training.}
  name=${name//=/_}
  run ${name}_gradients "${args[@]}" --set parallel.shard=gradients
  run ${name}_parameters "${args[@]}" --set parallel.shard=parameters
  exact ${name}_gradients ${name}_parameters "$extra"
  echo "$extra, DP 2: parameters bit-identical to gradients"
done
# Four microbatches per rank at DP=2, alone and with PP=2 (1F1B: a unit's forward and backward of different
# microbatches interleave): rounding level against optimizer.
for pp in 1 2; do
  args=(--config tiny.yaml "${base[@]}" --nproc $((2 * pp)) --set parallel.pipeline=$pp --set training.global_batch_size=16)
  run mb_pp${pp}_optimizer "${args[@]}" --set parallel.shard=optimizer
  run mb_pp${pp}_parameters "${args[@]}" --set parallel.shard=parameters
  same_losses mb_pp${pp}_optimizer/metrics.jsonl mb_pp${pp}_parameters/metrics.jsonl 1 10 1e-6
  python3 - mb_pp${pp}_optimizer/metrics.jsonl mb_pp${pp}_parameters/metrics.jsonl <<'PY'
import json, sys
runs = [[(r["loss"], r["grad_norm"]) for r in map(json.loads, open(p)) if "loss" in r] for p in sys.argv[1:3]]
loss = max(abs(a[0] - b[0]) / a[0] for a, b in zip(*runs))
norm = max(abs(a[1] - b[1]) / a[1] for a, b in zip(*runs))
print(f"four microbatches: losses within {loss:.1e}, grad norms within {norm:.1e} (relative; tolerance 1e-6)")
assert len(runs[0]) == 10 and norm <= 1e-6, "grad norms differ"
PY
done
# The zero-bubble schedules: W is deferred past the unit's release (it reads activations and output gradients only).
zb=(--config tiny.yaml "${base[@]}" --set model.num_layers=4 --set training.global_batch_size=16)
run zb_one "${zb[@]}"
for sched in zb-h1 zb-v; do
  vp=1
  [ $sched = zb-v ] && vp=2
  args=("${zb[@]}" --nproc 4 --set parallel.pipeline=2 --set parallel.virtual_pipeline=$vp
        --set parallel.pipeline_schedule=$sched)
  for shard in gradients parameters; do run ${sched}_$shard "${args[@]}" --set parallel.shard=$shard; done
  exact ${sched}_gradients ${sched}_parameters "$sched PP 2 DP 2"
  echo "$sched PP 2 x DP 2, four microbatches: parameters bit-identical to gradients"
done
same_losses zb_one/metrics.jsonl zb-v_parameters/metrics.jsonl 1 10 1e-6
echo "zb-v PP 2 x VP 2 x DP 2 with parameters: within 1e-6 of one rank"
# fp8: each unit's weights cast after the gather, the casts dropped with the unit; cast again for its backward from
# the same values under the same scale, so bit-identical to gradients.
fp8=(--config tiny.yaml "${base[@]}" --set training.precision=bf16 --set training.fp8.format=hybrid
     --set training.global_batch_size=8)
run fp8_one "${fp8[@]}"
for recipe in current delayed; do
  for tp in 1 2; do
    sp=false
    [ $tp -gt 1 ] && sp=true
    args=("${fp8[@]}" --nproc $((2 * tp)) --set parallel.tensor=$tp --set parallel.sequence_parallel=$sp
          --set training.fp8.recipe=$recipe)
    for shard in gradients parameters; do run fp8_${recipe}_tp${tp}_$shard "${args[@]}" --set parallel.shard=$shard; done
    exact fp8_${recipe}_tp${tp}_gradients fp8_${recipe}_tp${tp}_parameters "fp8 $recipe TP $tp DP 2"
    echo "fp8 ($recipe) TP $tp x DP 2: parameters bit-identical to gradients"
  done
done
same_losses fp8_one/metrics.jsonl fp8_current_tp2_parameters/metrics.jsonl 1 10 1e-2
echo "fp8 TP 2 x DP 2 with parameters: within 1e-2 of one rank"
# Memory: rank 0's peak parameter memory at DP=4, bf16, 16 layers: the shard (a quarter) plus the gathered units.
mem=(--config tiny.yaml --set optimizer.warmup_iters=0 --set model.num_layers=16 --set model.hidden_size=64
     --set model.ffn_hidden_size=256 --set training.train_iters=1 --set training.micro_batch_size=2
     --set training.global_batch_size=8 --set training.precision=bf16 --set parallel.grad_bucket_size=2000 --nproc 4)
run mem_none "${mem[@]}" --set parallel.shard=none
run mem_parameters "${mem[@]}" --set parallel.shard=parameters
peak() {  # kind dir: the training log's peak memory (MiB) of that kind on rank 0
  grep -m1 'peak memory (MiB):' "$2/megatrain.log" | sed -E "s/.*$1 ([0-9.]+).*/\1/"
}
python3 - "$(peak parameters mem_none)" "$(peak parameters mem_parameters)" "$(peak gathered mem_parameters)" <<'PY'
import sys
none, shard, gathered = map(float, sys.argv[1:4])
ratio = (shard + gathered) / none
print(f"peak parameter memory at DP=4: none {none} MiB, parameters {shard} MiB resident + {gathered} MiB gathered "
      f"({ratio:.2f} of none)")
assert 0.25 <= ratio <= 0.42, f"expected a quarter plus two units, got {ratio:.2f}"
assert 0.24 <= shard / none <= 0.27, f"the resident shard is {shard / none:.2f} of none, not a quarter"
PY
# Mixture of experts: a layer's unit gathers its attention and router over data parallelism and its experts over the
# expert-data-parallel ranks (EP 4 x DP 4: one rank each, nothing to gather; EP 2 x DP 4: two).
moe=(--config "$SRC/configs/mixtral-tiny.yaml" --set data.train=[data/text_document] --set checkpoint.save_dir=
     --set logging.eval_interval=0 --set logging.interval=1 --set training.train_iters=6 --set optimizer.warmup_iters=2 --set parallel.timeout_s=60
     --set parallel.grad_bucket_size=3000 --set training.micro_batch_size=2 --set training.global_batch_size=8
     --set model.seq_length=32)
run moe_one "${moe[@]}"
for layout in "1 1 4 4" "1 1 4 2" "2 1 2 2" "1 2 2 2"; do
  read -r tp pp dp ep <<<"$layout"
  sp=false
  [ $tp -gt 1 ] && sp=true
  args=("${moe[@]}" --nproc $((tp * pp * dp)) --set parallel.tensor=$tp --set parallel.sequence_parallel=$sp
        --set parallel.pipeline=$pp --set parallel.expert=$ep --set training.global_batch_size=$((2 * dp)))
  name=moe_tp${tp}pp${pp}dp${dp}ep${ep}
  for shard in gradients parameters; do run ${name}_$shard "${args[@]}" --set parallel.shard=$shard; done
  losses ${name}_gradients/metrics.jsonl 1 6 > a.txt
  losses ${name}_parameters/metrics.jsonl 1 6 > b.txt
  [ "$(wc -l < a.txt)" -eq 6 ] || fail "$name: expected 6 losses"
  diff a.txt b.txt >/dev/null || { paste a.txt b.txt; fail "$name: parameters differs from gradients"; }
  echo "mixtral-tiny TP $tp PP $pp DP $dp EP $ep: parameters bit-identical to gradients"
done
same_losses moe_one/metrics.jsonl moe_tp1pp1dp4ep4_parameters/metrics.jsonl 1 6 1e-6
echo "mixtral-tiny EP 4 x DP 4 with parameters: within 1e-6 of one rank"
# Layout-free checkpoints (tests/e2e/lib/shard.bash).
check_layout_free_checkpoints parameters
