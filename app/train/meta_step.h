// meta_step.h: one rank's training step run on the meta device (core/meta/meta.h): the trainer itself, its chunks,
// parallelize step, schedule and executor, on a rank of the config's layout whose groups move nothing
// (app/runtime/distributed.h meta_distributed) and whose ops compute nothing. Its allocations are the ones a real
// rank of that layout makes, by construction: the planner's memory (plan/memory_model.h) is measured this way, and
// the zero-bubble V schedule's weights (what a chunk's forward and B keep) too.
#pragma once
#include <cstdint>
#include <optional>

#include "core/config/config.h"
#include "core/meta/meta.h"
#include "parallel/pipeline/schedule.h"

namespace mt::app {

struct MetaStepOptions {
  meta::Mirror mirror = meta::Mirror::cpu;  // whose in-op allocations: the CPU reference and Gloo's, or CUDA's
  double moe_receive_factor = 1;            // rows an expert-parallel rank receives over its balanced share
  // Microbatches of the measured step: 0 for the config's. The planner passes fewer (peaks_microbatches): the
  // peaks are reached once the pipeline is full and repeat after.
  int64_t microbatches = 0;
  // false: the trainer's set-up only (parameters, gradient buffers, optimizer state; no step): a lower bound of the
  // step's peaks at a seventh of the cost, for the planner's search to skip what cannot fit.
  bool step = true;
  // The zero-bubble V schedule's weights when measured already (measure_schedule_memory, the same for every stage of
  // a config); empty: measured here.
  std::optional<ScheduleMemory> zb_v;
};

struct MetaStep {
  MemoryStats memory;      // from the end of the trainer's set-up (as the training log's peaks) through one step
  int64_t parameters = 0;  // elements this rank stores (its shards, tied copies included)
  int64_t layers = 0;      // transformer layers on this rank
  int peak_in_flight = 0;  // most (microbatch, chunk) forwards held at once by its schedule
  // ZeRO-2/3: the largest gradient bucket that lives only until its reduction. The measured step holds one such
  // reduction in flight beside backward (NCCL's order, issued on the caller); Gloo's reducer thread may free it
  // sooner, so a CPU run's gradient peak may lie below the measured one by up to this.
  int64_t transient_grad_bytes = 0;
  meta::Counts counts;  // the step's ops
};

// The first iteration of pipeline stage `stage` (tensor, context, data-parallel rank 0), as a rank of the resolved
// config `cfg` runs it (checkpoints, evaluation and logging left out).
MetaStep measure_step(const Config& cfg, int stage, const MetaStepOptions& opt);

// The fewest microbatches (at most the config's) whose step reaches the same peaks as the config's on every stage:
// those of a pipeline filled and run through two steady rounds.
int64_t peaks_microbatches(const Config& cfg);

// What a zb-v (microbatch, chunk) pair holds (parallel/pipeline/schedule.h ScheduleMemory), per virtual stage: its
// forward's and its B's activations measured on the meta device, in units of stage p - 1's first chunk's forward
// (layers only), rounded to 1/64. Empty for the other schedules. The trainer builds its schedule with it (the same
// on every rank: the same measurement) and the planner's measured step runs that schedule.
ScheduleMemory measure_schedule_memory(const Config& cfg, meta::Mirror mirror);

}  // namespace mt::app
