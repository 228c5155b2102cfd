#!/usr/bin/env bash
# Layout invariance of the Llama architecture in bf16: the layouts of layout_matrix_llama_fp32.sh give one rank's
# bf16 losses within 1e-2.
source "$(dirname "$0")/lib/common.bash"
source "$SRC/tests/e2e/lib/layout_matrix.bash"
prepare_data
write_llama_config
MATRIX_CONFIG=llama.yaml run_layout_matrix bf16 1e-2 full
