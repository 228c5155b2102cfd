#!/usr/bin/env bash
# On a GPU: the layout-invariance matrix for TP, PP, DP in {1, 2} with CUDA compute, several processes
# sharing the one GPU through host-staged Gloo (NCCL refuses two ranks on one GPU), in fp32 and bf16, with
# and without SP, ZeRO and interleaving. Skips without a usable GPU. MATRIX_PART=gpt or llama runs one half (the
# GPT rows are 30 runs, the Llama rows 16; scripts/gpu-run.sh matrix runs them as two capped steps).
source "$(dirname "$0")/lib/common.bash"
source "$SRC/tests/e2e/lib/layout_matrix.bash"
part=${MATRIX_PART:-all}
case $part in all|gpt|llama) ;; *) fail "MATRIX_PART must be gpt, llama or all, got '$part'" ;; esac
require_gpu
prepare_data
write_config
MATRIX_MAX_DEGREE=2
MATRIX_ARGS=(--set training.device=cuda --set parallel.backend=gloo)
if [ "$part" != llama ]; then
  run_layout_matrix fp32 1e-4 full plain
  run_layout_matrix bf16 2e-2 full plain
fi
# The Llama rows: RMSNorm, SwiGLU, rotary embeddings and grouped-query attention kernels on the GPU.
if [ "$part" != gpt ]; then
  write_llama_config
  MATRIX_CONFIG=llama.yaml run_layout_matrix fp32 1e-4 full
  MATRIX_CONFIG=llama.yaml run_layout_matrix bf16 2e-2 full
fi
