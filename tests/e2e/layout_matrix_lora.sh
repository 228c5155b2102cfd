#!/usr/bin/env bash
# Layout invariance with LoRA (finetune.lora, rank 4 on every linear, adapter dropout on), GPT and Llama in fp32:
# every TP x PP x DP layout with degrees up to 2, with sequence parallelism (TP > 1), the distributed optimizer
# (DP > 1) and interleaving (PP = 2), gives one rank's losses within 1e-6 (model dropout on); the frozen base is each
# model's seeded initialization. tests/e2e/lora_train.sh covers TP x PP x DP = 8 from an init_from base.
source "$(dirname "$0")/lib/common.bash"
source "$SRC/tests/e2e/lib/layout_matrix.bash"
prepare_data
write_config
write_llama_config
MATRIX_MAX_DEGREE=2
MATRIX_ARGS=(--set finetune.lora.rank=4 --set finetune.lora.alpha=8 --set finetune.lora.dropout=0.1
             --set finetune.lora.random_base=true)
run_layout_matrix fp32 1e-6 full
mkdir llama && cd llama && ln -s ../data data && cp ../llama.yaml .  # its own run directories
MATRIX_CONFIG=llama.yaml run_layout_matrix fp32 1e-6 full
