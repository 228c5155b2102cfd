#!/usr/bin/env bash
# Layout invariance of the Llama architecture in bf16: the layouts of layout_matrix_llama_fp32.sh give one rank's
# bf16 losses within 1e-2; so do context parallelism's CP 2 ring with TP 2 + SP and CP 4 all-gather with DP 2 + ZeRO
# (dropout off).
source "$(dirname "$0")/lib/common.bash"
source "$SRC/tests/e2e/lib/layout_matrix.bash"
prepare_data
write_llama_config
MATRIX_CONFIG=llama.yaml run_layout_matrix bf16 1e-2 full
MATRIX_CONFIG=llama.yaml run_context_layouts bf16 1e-2 "2 p2p 2 1 1" "4 allgather 1 1 2"
