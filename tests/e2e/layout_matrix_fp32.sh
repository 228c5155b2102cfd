#!/usr/bin/env bash
# Layout invariance in fp32 (the project's main correctness test): every TP x PP x DP layout up to 8 ranks,
# with and without SP, the distributed optimizer and interleaving, gives one rank's losses within 1e-4; so do a few
# layouts with sharded gradients and sharded parameters (parallel.shard: gradients, parameters).
source "$(dirname "$0")/lib/common.bash"
source "$SRC/tests/e2e/lib/layout_matrix.bash"
prepare_data
write_config
run_layout_matrix fp32 1e-4 full plain
run_untied_layouts fp32 1e-4
run_shard_layouts fp32 1e-4
