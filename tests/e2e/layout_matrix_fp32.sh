#!/usr/bin/env bash
# Layout invariance in fp32 (the project's main correctness test): every TP x PP x DP layout up to 8 ranks,
# with and without SP, the distributed optimizer and interleaving, gives one rank's losses within 1e-4; so do a few
# layouts with sharded gradients and sharded parameters (parallel.shard: gradients, parameters), and context
# parallelism (dropout off) within 1e-6: CP 2 ring and CP 4 all-gather alone, CP 2 with TP 2 + SP, with PP 2, with
# DP 2 + ZeRO, and all four on 8 ranks. Two layouts over Gloo's TCP alone (parallel.gloo_shared_memory false) give the
# losses of their runs through shared memory bit for bit.
source "$(dirname "$0")/lib/common.bash"
source "$SRC/tests/e2e/lib/layout_matrix.bash"
prepare_data
write_config
run_layout_matrix fp32 1e-4 full plain
run_tcp_layouts fp32
run_untied_layouts fp32 1e-4
run_shard_layouts fp32 1e-4
run_context_layouts fp32 1e-6 "2 p2p 1 1 1" "4 allgather 1 1 1" "2 allgather 2 1 1" "2 p2p 1 2 1" "2 p2p 1 1 2" \
  "2 p2p 2 2 2"
