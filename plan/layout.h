// layout.h: a parallel layout as the planner varies it, and the resolved config it stands for.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/config/config.h"

namespace mt::plan {

// The knobs `plan --search` turns; everything else comes from the user's config.
struct Layout {
  int64_t tensor = 1;
  int64_t pipeline = 1;
  int64_t virtual_pipeline = 1;
  int64_t data = 1;
  int64_t micro_batch_size = 1;
  bool sequence_parallel = false;
  Recompute recompute = Recompute::none;
  ShardStage shard = ShardStage::none;  // parallel.shard (ZeRO stage)
  int64_t shard_group = 0;              // parallel.shard_group (hybrid sharding); 0: the whole data-parallel group
  int64_t expert = 1;  // expert-parallel size (MoE models): EP consecutive data-parallel ranks split the experts
  // The experts' tensor-parallel size (0: tensor); below tensor, Megatron's parallel folding draws the EP ranks
  // from the tensor ranks too.
  int64_t expert_tensor = 0;
  int64_t context = 1;             // context-parallel size (parallel.context): each sample's sequence over CP ranks
  bool context_allgather = false;  // parallel.context_comm: allgather (else p2p, the ring)

  bool operator==(const Layout&) const = default;
};

// The layout a resolved config uses.
Layout layout_of(const Config& c);
// One line: "TP 4 PP 2 VP 1 DP 1 mbs 1 SP on recompute none ZeRO on" (ZeRO off | on | grads: parallel.shard none,
// optimizer, gradients), and " EP 4" with expert parallelism,
// " ETP 1" with parallel folding, " CP 2 p2p" with context parallelism, " shard group 2" with hybrid sharding.
std::string describe(const Layout& l);

// `base` with `l` applied and every config rule checked again (through core/config, so an invalid layout is
// refused with the message training would give); the global batch stays as in `base`. Throws ConfigError.
Config apply_layout(const Config& base, const Layout& l);

// The checks training makes after the config rules (the pipeline schedule's own): an empty string when `c` can
// run, else why not, worded as the trainer's error.
std::string runtime_refusal(const Config& c);

}  // namespace mt::plan
