// expert_parallel.h: the expert-parallel group as a MoE layer sees it (parallel.expert): EP ranks, drawn from the
// data-parallel ranks (and with parallel folding, parallel.expert_tensor < parallel.tensor, from the tensor-parallel
// ranks too; parallel/comm/topology.h), each hold an equal share of every MoE layer's experts and exchange the tokens
// routed to them with an all-to-all (models/moe_mlp.h). The ranks of one group process their microbatches at the
// same time (the data-parallel replicas run the same schedule in lockstep, the tensor-parallel ranks the same
// microbatch), so every MoE layer's forward and backward is a collective of the group.
#pragma once
#include <cstdint>

#include "parallel/comm/communicator.h"

namespace mt {

struct ExpertParallel {
  Communicator* comm = nullptr;  // null when size == 1
  int rank = 0;
  int size = 1;
  // The experts' tensor-parallel degree ETP (0: the tensor-parallel group's size T), dividing T: the experts are
  // split over ETP ranks, and the T / ETP folds of a tensor-parallel group (tp / ETP) each dispatch a share of the
  // group's tokens (models/moe_mlp.h).
  int tensor = 0;

  // The experts (global indices [first, first + count)) this rank holds of `experts`.
  int64_t first(int64_t experts) const { return experts / size * rank; }
  int64_t count(int64_t experts) const { return experts / size; }
};

}  // namespace mt
