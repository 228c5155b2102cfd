#!/usr/bin/env bash
# Layout invariance of the Llama architecture in fp32: every TP x PP x DP layout up to 8 ranks with sequence
# parallelism (TP > 1), the distributed optimizer (DP > 1) and interleaving (PP = 2), key/value heads split over
# TP, rotary embeddings on gathered sequences, gives one rank's losses within 1e-4 (dropout on); with context
# parallelism (dropout off: rotary positions of a rank's two chunks, grouped-query blocks on the ring) within 1e-6:
# CP 4 ring and CP 2 all-gather alone, CP 2 with TP 2 + SP (the key/value heads split), with PP 2 (all-gather), with
# DP 2 + ZeRO, and CP 2 all-gather x TP 2 x PP 2. With a sliding window of 5 tokens past the first 2 layers
# (model.sliding_window, model.full_attention_layers): CP 4's 4-token chunks meet blocks the window hides wholly or
# in part, beside TP 2 x PP 2 and DP 2, each within 1e-6 of one rank with the same window.
source "$(dirname "$0")/lib/common.bash"
source "$SRC/tests/e2e/lib/layout_matrix.bash"
prepare_data
write_llama_config
MATRIX_CONFIG=llama.yaml run_layout_matrix fp32 1e-4 full
MATRIX_CONFIG=llama.yaml run_shard_layouts fp32 1e-4
MATRIX_CONFIG=llama.yaml run_context_layouts fp32 1e-6 "4 p2p 1 1 1" "2 allgather 1 1 1" "2 p2p 2 1 1" \
  "2 allgather 1 2 1" "2 p2p 1 1 2" "2 allgather 2 2 1"
MATRIX_ARGS=(--set model.sliding_window=5 --set model.full_attention_layers=2)
MATRIX_CONFIG=llama.yaml run_context_layouts fp32 1e-6 "4 p2p 1 1 1" "2 allgather 2 2 1" "2 p2p 2 1 2"
