// memory_model.h: the peak memory of one rank, split by the allocator's kinds (core/tensor/allocator.h MemKind)
// exactly as the training log prints it ("peak memory (MiB): parameters .. | gradients .. | ...").
//
// Measured, not modelled: the trainer's own first step runs on the meta device (app/train/meta_step.h), a rank of the
// layout whose ops compute nothing and whose groups move nothing, and its allocator's peaks are the prediction. So a
// new feature is planned by the code that runs it; the planner keeps no copy of what a layer allocates.
#pragma once
#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/tensor/allocator.h"
#include "core/config/config.h"
#include "parallel/pipeline/schedule.h"

namespace mt::plan {

// Which backend's in-op allocations the meta device mirrors (core/meta/meta.h): the CPU reference widens bf16/fp16
// GEMM operands into fp32 workspaces and Gloo reduces in fp32 copies; CUDA (cuBLASLt, NCCL) works in place but keeps a
// cuBLASLt workspace.
enum class Backend { cpu, cuda };

struct KindBytes {
  static constexpr size_t kKinds = static_cast<size_t>(MemKind::kCount);
  std::array<double, kKinds> peak{};  // bytes, per MemKind
  double total = 0;                   // peak of the sum (not the sum of the peaks: kinds peak at different times)
  double& operator[](MemKind k) { return peak[static_cast<size_t>(k)]; }
  double operator[](MemKind k) const { return peak[static_cast<size_t>(k)]; }
};

// One pipeline rank kind's prediction.
struct StageMemory {
  std::string kind;        // "only" (no pipelining), "first", "middle", "last"
  int64_t stage = 0;       // the pipeline rank it stands for
  int64_t parameters = 0;  // elements this rank holds (its chunks), vocabulary padding included
  int64_t layers = 0;      // transformer layers on this rank
  int peak_in_flight = 0;  // most (microbatch, chunk) forwards held at once
  KindBytes bytes;         // predicted peaks
  // ZeRO-2/3: the largest transient gradient bucket, one reduction in flight (app/train/meta_step.h MetaStep).
  double transient_grad_bytes = 0;
};

struct MemoryPlan {
  std::vector<StageMemory> stages;  // first, middle (when p > 2), last; or one "only"
  double max_total() const;         // the largest total over the rank kinds
};

// training_schedule (models/pipeline_schedule.h) with the ZB-V weights measured as the trainer measures them
// (app/train/meta_step.h measure_schedule_memory): the lists the trainer runs.
ScheduleSpec planned_training_schedule(const Config& c, int64_t microbatches, Backend backend);

// Measures every rank kind of the resolved config `c` (tensor-parallel rank 0, data-parallel rank 0: ranks of
// one kind differ by at most a padding element): the step of app::peaks_microbatches, whose peaks are the
// config's.
// With `give_up_above`, the kinds after the first whose total is above it are left out: the plan then only says
// that it does not fit (max_total() above that), at a fraction of the cost (the search's question).
MemoryPlan predict_memory(const Config& c, Backend backend,
                          double give_up_above = std::numeric_limits<double>::infinity());

// The most any rank kind of `c` holds once the trainer is set up (parameters, gradient buffers, optimizer state),
// before its first step: a lower bound of predict_memory's max_total() at a fraction of its cost.
double setup_memory(const Config& c, Backend backend, double give_up_above = std::numeric_limits<double>::infinity());

// The ZeRO paper's model-state bytes per device (Rajbhandari et al. 2020, section 5 and figure 1): `psi` parameters
// trained in mixed precision hold 2 bytes of values, 2 of gradients and `k` of optimizer state each, the stages
// shard over `nd` data-parallel ranks the optimizer state (P_os), and the gradients (P_os+g), and the parameters
// (P_os+g+p). Their worked example: 7.5B parameters, k = 12, nd = 64 gives 120, 31.4, 16.6 and 1.9 GB.
double zero_model_state_bytes(double psi, int64_t nd, ShardStage stage, double k = 12);

}  // namespace mt::plan
