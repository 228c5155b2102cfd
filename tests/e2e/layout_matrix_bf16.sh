#!/usr/bin/env bash
# Layout invariance in bf16: every TP x PP x DP layout up to 8 ranks, with SP, the distributed optimizer and
# interleaving where they apply, gives one rank's bf16 losses within 1e-2 (the variant without them runs in fp32,
# layout_matrix_fp32.sh); so do context parallelism's CP 4 ring and CP 2
# all-gather with PP 2 (dropout off).
source "$(dirname "$0")/lib/common.bash"
source "$SRC/tests/e2e/lib/layout_matrix.bash"
prepare_data
write_config
run_layout_matrix bf16 1e-2 full
run_shard_layouts bf16 1e-2
run_context_layouts bf16 1e-2 "4 p2p 1 1 1" "2 allgather 1 2 1"
