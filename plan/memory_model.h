// memory_model.h: predicted peak memory of one rank, split by the allocator's kinds (core/tensor/allocator.h MemKind)
// exactly as the training log prints it ("peak memory (MiB): parameters .. | gradients .. | ...").
//
// The prediction mirrors the code, not a textbook formula: parameters and their gradient buffer as the model
// and the trainer allocate them, the optimizer state of core/optim/optimizer.cpp or parallel/sharding/distributed_optimizer.cpp,
// and activations from an allocation tape (plan/activation_tape.cpp) that replays, in the code's order, every
// tensor a transformer layer, the head and the embedding allocate and free, walked through the real pipeline
// schedule (parallel/pipeline/schedule.h) so the microbatches in flight on each stage are the trainer's.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor/allocator.h"
#include "core/config/config.h"
#include "parallel/pipeline/schedule.h"

namespace mt::plan {

// Which backend's allocations to mirror: the CPU reference widens bf16/fp16 GEMM operands into fp32 workspaces
// and Gloo reduces in fp32 copies; CUDA (cuBLASLt, NCCL) works in place but keeps a cuBLASLt workspace.
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
};

struct MemoryPlan {
  std::vector<StageMemory> stages;  // first, middle (when p > 2), last; or one "only"
  double max_total() const;         // the largest total over the rank kinds
};

// What a ZB-V (microbatch, chunk) pair holds through its B relative to what its forward keeps (parallel/pipeline/schedule.h
// ScheduleMemory), from the activation tape of the layers of stage p - 1's first chunk, rounded to 1/64; the default
// for the other schedules. The trainer builds its schedule with it, so the planner walks the same lists.
ScheduleMemory schedule_memory(const Config& c, Backend backend);
// training_schedule (models/pipeline_schedule.h) with schedule_memory: the lists the trainer runs.
ScheduleSpec planned_training_schedule(const Config& c, int64_t microbatches, Backend backend);

// Predicts every rank kind of the resolved config `c` (tensor-parallel rank 0, data-parallel rank 0: ranks of
// one kind differ by at most a padding element).
MemoryPlan predict_memory(const Config& c, Backend backend);

// The ZeRO paper's model-state bytes per device (Rajbhandari et al. 2020, section 5 and figure 1): `psi` parameters
// trained in mixed precision hold 2 bytes of values, 2 of gradients and `k` of optimizer state each, the stages
// shard over `nd` data-parallel ranks the optimizer state (P_os), and the gradients (P_os+g), and the parameters
// (P_os+g+p). Their worked example: 7.5B parameters, k = 12, nd = 64 gives 120, 31.4, 16.6 and 1.9 GB.
double zero_model_state_bytes(double psi, int64_t nd, ShardStage stage, double k = 12);

}  // namespace mt::plan
