// expert_parallel.h: the expert-parallel group as a MoE layer sees it (parallel.expert): EP ranks, drawn from the
// data-parallel ranks, each hold an equal share of every MoE layer's experts and exchange the tokens routed to them
// with an all-to-all (models/moe_mlp.h). The ranks of one group process different microbatches at the same time (the
// data-parallel replicas run the same schedule in lockstep), so every MoE layer's forward and backward is a
// collective of the group.
#pragma once
#include <cstdint>

#include "parallel/communicator.h"

namespace mt {

struct ExpertParallel {
  Communicator* comm = nullptr;  // null when size == 1
  int rank = 0;
  int size = 1;

  // The experts (global indices [first, first + count)) this rank holds of `experts`.
  int64_t first(int64_t experts) const { return experts / size * rank; }
  int64_t count(int64_t experts) const { return experts / size; }
};

}  // namespace mt
