#!/usr/bin/env bash
# On a GPU: mixture-of-experts layers (moe.yaml: 4 SwiGLU experts, top-2, a shared expert, aux and z losses, dropout
# on) train with the CUDA backend and follow the CPU's losses (1e-4 in fp32, 2% in bf16, 20 iterations); the
# aux-loss-free expert bias with a sigmoid router too; expert parallelism 2 and TP 2 with SP (two processes sharing
# the GPU over host-staged Gloo) follow one GPU rank; the one-rank job runs on NCCL. Skips without a usable GPU.
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
