#!/usr/bin/env bash
# On a GPU: mixture-of-experts layers (moe.yaml: 4 SwiGLU experts, top-2, a shared expert, aux and z losses, dropout
# on) train with the CUDA backend and follow the CPU's losses (1e-4 in fp32, 2% in bf16, 20 iterations); the
# aux-loss-free expert bias with a sigmoid router too; expert parallelism 2 and TP 2 with SP (two processes sharing
# the GPU over host-staged Gloo) follow one GPU rank, and so does CP 2 with a capacity factor (the same drops); the
# one-rank job runs on NCCL. Skips without a usable GPU.
source "$(dirname "$0")/lib/common.bash"
require_gpu
prepare_data
write_moe_config
for spec in fp32:1e-4 bf16:2e-2; do
  precision=${spec%%:*} tol=${spec#*:}
  "$MT" --config moe.yaml --set training.precision=$precision --set logging.dir=cpu_$precision >/dev/null
  "$MT" --config moe.yaml --set training.precision=$precision --set training.device=cuda \
        --set logging.dir=gpu_$precision >/dev/null 2>gpu_$precision.err || { tail -5 gpu_$precision.err; fail "GPU run"; }
  same_losses cpu_$precision/metrics.jsonl gpu_$precision/metrics.jsonl 1 20 "$tol"
  echo "MoE $precision: GPU losses follow the CPU's within $tol"
done
bias=(--set model.moe.aux_loss_coeff=0 --set model.moe.bias_update_rate=0.01 --set model.moe.score_function=sigmoid)
"$MT" --config moe.yaml "${bias[@]}" --set logging.dir=cpu_bias >/dev/null
"$MT" --config moe.yaml "${bias[@]}" --set training.device=cuda --set logging.dir=gpu_bias >/dev/null
same_losses cpu_bias/metrics.jsonl gpu_bias/metrics.jsonl 1 20 1e-4
layouts=(--set training.micro_batch_size=1 --set training.device=cuda --set parallel.backend=gloo)
"$MT" --config moe.yaml "${layouts[@]}" --set logging.dir=gpu_one >/dev/null
"$MT" --config moe.yaml "${layouts[@]}" --nproc 2 --set parallel.expert=2 --set parallel.distributed_optimizer=true \
      --set logging.dir=gpu_ep2 >/dev/null 2>ep2.err || { tail -5 ep2.err; fail "EP 2 on the GPU"; }
same_losses gpu_one/metrics.jsonl gpu_ep2/metrics.jsonl 1 20 1e-5
"$MT" --config moe.yaml "${layouts[@]}" --nproc 2 --set parallel.tensor=2 --set parallel.sequence_parallel=true \
      --set logging.dir=gpu_tp2 >/dev/null 2>tp2.err || { tail -5 tp2.err; fail "TP 2 on the GPU"; }
same_losses gpu_one/metrics.jsonl gpu_tp2/metrics.jsonl 1 20 1e-5
echo "MoE on the GPU: EP 2 and TP 2 + SP follow one rank"
# A capacity factor with context parallelism: the CUDA dispatch decides the drops over both context ranks' chunks in
# one rank's token order (a part of the gathered choices, core/cuda/moe_dispatch.cu), so CP 2 drops one GPU rank's
# choices and follows its losses.
capcp=(--config moe.yaml "${layouts[@]}" --set model.dropout=0 --set model.attention_dropout=0
       --set model.moe.capacity_factor=1.0)
"$MT" "${capcp[@]}" --set logging.dir=gpu_cap_one >/dev/null
"$MT" "${capcp[@]}" --nproc 2 --set parallel.context=2 --set logging.dir=gpu_cap_cp2 >/dev/null 2>capcp2.err \
  || { tail -5 capcp2.err; fail "CP 2 with a capacity factor on the GPU"; }
same_losses gpu_cap_one/metrics.jsonl gpu_cap_cp2/metrics.jsonl 1 20 1e-5
python3 - gpu_cap_one/metrics.jsonl gpu_cap_cp2/metrics.jsonl <<'PY'
import json, sys
one, cp = ([json.loads(l)["moe_dropped_tokens"] for l in open(p) if '"loss"' in l] for p in sys.argv[1:])
assert all(d > 0 for d in one) and one == cp, f"dropped choices: one rank {one}, CP 2 {cp}"
PY
echo "MoE on the GPU: CP 2 with a capacity factor drops and follows one rank"
