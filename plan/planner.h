// planner.h: one layout's full prediction (memory per rank kind and step time), and the search over layouts.
#pragma once
#include <string>
#include <vector>

#include "core/config/config.h"
#include "plan/hardware.h"
#include "plan/layout.h"
#include "plan/memory_model.h"
#include "plan/time_model.h"

namespace mt::plan {

struct Prediction {
  Config config;  // the resolved config of the layout
  Layout layout;
  MemoryPlan memory;
  StepTime time;
  bool fits = false;  // every rank kind's total within the device memory (and its host pool within the budget)
};

// The most host memory a rank kind's offloaded optimizer state takes (MemKind::host; 0 without optimizer.offload),
// and whether it is within optimizer.offload_host_memory_gib (no budget: yes).
double max_host_bytes(const MemoryPlan& m);
bool host_fits(const Config& c, const MemoryPlan& m);
// Prediction::fits: every rank kind's device total within hw's memory and the host pool within its budget.
bool fits(const Config& c, const MemoryPlan& m, const Hardware& hw);

// Which memory model a device implies: the CPU backend's for the CPU, CUDA's for GPUs.
Backend backend_for(const Hardware& hw);

// Predicts a resolved config. Throws std::invalid_argument with the trainer's message when the pipeline
// schedule refuses the layout.
Prediction predict(const Config& c, const Hardware& hw);

struct SearchOptions {
  std::vector<int64_t> micro_batch_sizes = {1, 2, 4, 8};
  int64_t max_virtual_pipeline = 8;
  bool allow_zero = true;
  bool allow_recompute = true;
  // Context parallelism is tried only where each of a sample's 2 CP chunks keeps at least this many tokens: below
  // about a thousand a block's attention is too short to hide the ring's transfers (and it keeps the search of
  // short-sequence models, thousands of ranks included, as it was).
  int64_t min_context_chunk = 1024;
  // Threads measuring layouts side by side (each on a meta device of its own); 0: every hardware thread. The result
  // does not depend on it.
  int threads = 0;
};

// Every layout of `base`'s model on `world` ranks that the config rules and the schedule accept and that fits,
// fastest first (predicted tokens/s). The global batch stays `base`'s.
std::vector<Prediction> search(const Config& base, int64_t world, const Hardware& hw, const SearchOptions& opt = {});

}  // namespace mt::plan
