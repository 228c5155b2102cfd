#!/usr/bin/env bash
# Layout invariance of the Llama architecture in fp32: every TP x PP x DP layout up to 8 ranks with sequence
# parallelism (TP > 1), the distributed optimizer (DP > 1) and interleaving (PP = 2), key/value heads split over
# TP, rotary embeddings on gathered sequences, gives one rank's losses within 1e-4 (dropout on).
source "$(dirname "$0")/lib/common.bash"
source "$SRC/tests/e2e/lib/layout_matrix.bash"
prepare_data
write_llama_config
MATRIX_CONFIG=llama.yaml run_layout_matrix fp32 1e-4 full
MATRIX_CONFIG=llama.yaml run_shard_layouts fp32 1e-4
