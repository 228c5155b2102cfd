#!/usr/bin/env bash
# On a GPU: parallel.shard: parameters (ZeRO-3) with CUDA compute, the ranks sharing the one GPU through host-staged
# Gloo (NCCL refuses two ranks on one GPU): the gathered units are device tensors from the caching allocator, given
# back after each forward and backward. With one microbatch per rank the fp32 losses equal none's bit for bit at
# DP 2 and TP 2 (SP) x DP 2, GPT and Llama, at DP 4 in shard groups of 2 (parallel.shard_group), and a MoE model at
# EP 2 x DP 4, alone and in shard groups of 2; bf16 equals
# gradients'; the log's gathered pool is not empty and the
# resident parameters at most about half of none's at DP 2 (none in fp32: the fp32 masters are the values).
# Skips without a usable GPU.
source "$(dirname "$0")/lib/common.bash"
source "$SRC/tests/e2e/lib/shard.bash"
require_gpu
prepare_data
write_config
write_llama_config
base=(--set training.train_iters=6 --set optimizer.warmup_iters=2 --set parallel.timeout_s=120
      --set parallel.grad_bucket_size=3000 --set training.micro_batch_size=2 --set training.device=cuda
      --set parallel.backend=gloo)
same() {  # dir-a dir-b what
  losses $1/metrics.jsonl 1 6 > a.txt
  losses $2/metrics.jsonl 1 6 > b.txt
  [ "$(wc -l < a.txt)" -eq 6 ] || fail "$3: expected 6 losses"
  diff a.txt b.txt >/dev/null || { paste a.txt b.txt; fail "$3: $2 differs from $1"; }
  echo "$3: $2 bit-identical to $1"
}
for cfg in tiny llama; do
  for layout in "1 1 2" "2 1 2"; do
    one_microbatch_layout $cfg "$layout"
    for shard in none parameters; do
      dir=${cfg}_tp${tp}dp${dp}_$shard
      "$MT" "${args[@]}" --set parallel.shard=$shard --set logging.dir=$dir >/dev/null 2>$dir.err \
        || { tail -5 $dir.err; fail "$dir failed"; }
    done
    same ${cfg}_tp${tp}dp${dp}_none ${cfg}_tp${tp}dp${dp}_parameters "$cfg TP $tp DP $dp fp32"
  done
done
# Hybrid sharding (parallel.shard_group 2 of DP 4): the bucket staged on the device, the pieces gathered over the
# replicas.
one_microbatch_layout tiny "1 1 4"
"$MT" "${args[@]}" --set parallel.shard=none --set logging.dir=hsdp_none >/dev/null
"$MT" "${args[@]}" --set parallel.shard=parameters --set parallel.shard_group=2 --set logging.dir=hsdp_parameters >/dev/null
same hsdp_none hsdp_parameters "tiny DP 4 fp32, parameters in shard groups of 2"
# Mixture of experts at EP 2 x DP 4 (the experts gathered over their expert-data-parallel pair) and with hybrid
# sharding in groups of 2 (the experts in groups of one, two replicas).
write_moe_config
moe=(--config moe.yaml "${base[@]}" --nproc 4 --set parallel.expert=2 --set training.global_batch_size=8)
"$MT" "${moe[@]}" --set parallel.shard=none --set logging.dir=moe_none >/dev/null
"$MT" "${moe[@]}" --set parallel.shard=parameters --set logging.dir=moe_parameters >/dev/null
"$MT" "${moe[@]}" --set parallel.shard=parameters --set parallel.shard_group=2 --set logging.dir=moe_hsdp >/dev/null
same moe_none moe_parameters "MoE EP 2 x DP 4 fp32, parameters"
same moe_none moe_hsdp "MoE EP 2 x DP 4 fp32, parameters in shard groups of 2"
one_microbatch_layout tiny "1 1 2"
for shard in gradients parameters; do
  "$MT" "${args[@]}" --set training.precision=bf16 --set parallel.shard=$shard --set logging.dir=bf16_$shard >/dev/null
done
same bf16_gradients bf16_parameters "tiny DP 2 bf16"
peak() { grep -m1 'peak memory (MiB):' "$2/megatrain.log" | sed -E "s/.*$1 ([0-9.]+).*/\1/"; }
python3 - "$(peak parameters tiny_tp1dp2_none)" "$(peak parameters tiny_tp1dp2_parameters)" \
          "$(peak gathered tiny_tp1dp2_parameters)" <<'PY'
import sys
none, shard, gathered = map(float, sys.argv[1:4])
print(f"GPU, DP 2: none {none} MiB parameters; parameters {shard} MiB resident + {gathered} MiB gathered")
assert gathered > 0, "no gathered buffer was accounted"
assert shard <= 0.55 * none, f"the resident parameters are {shard / none:.2f} of none, not about half"
PY
