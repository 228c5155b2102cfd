// model_chunks.h: the model chunks one rank holds, made data-parallel (parallel/sharding/parallelize.h), and the training
// losses they leave on the device.
#pragma once
#include <algorithm>
#include <memory>
#include <vector>

#include "app/runtime/distributed.h"
#include "core/config/config.h"
#include "core/tensor/ops.h"
#include "models/gpt.h"
#include "models/model_stage.h"
#include "parallel/sharding/parallelize.h"

namespace mt::app {

// The model chunks this rank holds (models/pipeline_schedule.h stage_chunks: virtual stage c * pp + stage, or the V of
// zb-v), each with its layers, the embedding on virtual stage 0, the head on the last.
std::vector<std::unique_ptr<GptModel>> build_chunks(const Config& cfg, const Distributed& dist, DType dtype);
// Every parameter of the chunks, in chunk order.
std::vector<Parameter*> all_parameters(const std::vector<std::unique_ptr<GptModel>>& chunks);
// The chunks made data-parallel as parallel.shard and the optimizer keys say, over `dist`'s groups (its reducers'
// communicators are handed over): gradient buffers, optimizer, ZeRO-2/3, with the chunks' hooks calling them.
// `params`: all_parameters(chunks). Checks optimizer.offload_host_memory_gib against the host state it made.
// `fp8`: the chunks' fp8 context, or null; under ZeRO-3 a unit's fp8 weight casts are dropped with its weights.
std::unique_ptr<Parallelized> parallelize_chunks(const Config& cfg, Distributed& dist,
                                                 const std::vector<std::unique_ptr<GptModel>>& chunks,
                                                 const std::vector<Parameter*>& params,
                                                 const std::shared_ptr<Fp8Context>& fp8 = nullptr);

// What crosses between this rank's pipeline stages: one microbatch's hidden states (this context rank's chunks,
// sequence shards of them with SP), in the compute dtype on the rank's device.
inline StageActivation stage_activation(const Config& cfg, const Distributed& dist, DType dtype) {
  const int64_t sp = cfg.parallel.sequence_parallel ? dist.tp_size() : 1;
  return {.shape = {cfg.training.micro_batch_size, cfg.model.seq_length / dist.cp_size() / sp, cfg.model.hidden_size},
          .dtype = dtype,
          .device = dist.placement.device};
}

// The training losses of the steps since the host last read them, kept on the model's device: each step
// gets an f64 slot that the last stage's microbatches add their mean losses into (GptModel::forward_stage),
// and the host reads all slots at once, once per logging interval (or before a checkpoint), so a GPU step
// never waits for its loss.
class StepLosses {
 public:
  StepLosses(Device device, int64_t capacity) : slots_(f64_zeros(std::max<int64_t>(capacity, 1), device)) {}
  bool full() const { return used_ == slots_.numel(); }
  // The next step's slot (1) f64, zeroed.
  Tensor next_slot() {
    Tensor slot = slots_.slice(used_, used_ + 1);
    slot.zero_();
    ++used_;
    return slot;
  }
  // This rank's loss sums of the steps since the last take, in order (one copy to the host).
  std::vector<double> take() {
    if (used_ == 0) return {};
    std::vector<double> v = read_f64(slots_.slice(0, used_));
    used_ = 0;
    return v;
  }

 private:
  Tensor slots_;  // (capacity) f64
  int64_t used_ = 0;
};

}  // namespace mt::app
