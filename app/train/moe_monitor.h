// moe_monitor.h: the trainer's view of the mixture-of-experts layers (model.moe): after each step it takes every
// MoE layer's routing, moves DeepSeek-V3's expert biases (model.moe.bias_update_rate) from the step's token counts
// summed over the data-parallel group, and keeps the logging interval's totals for the report (the auxiliary and
// z losses, tokens per expert); checkpoints save and restore the biases through it.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "app/runtime/distributed.h"
#include "app/train/metrics.h"
#include "core/config/config.h"
#include "models/gpt.h"

namespace mt::app {

class MoeMonitor {
 public:
  // The MoE layers of this rank's chunks (none: every call does nothing).
  MoeMonitor(const ModelConfig& cfg, const std::vector<std::unique_ptr<GptModel>>& chunks, Distributed& dist);

  // After a step: `applied` false for a step the optimizer skipped (its expert biases stay). A collective of the
  // data-parallel group when the biases move.
  void after_step(bool applied);
  // The interval's figures by global MoE layer (every pipeline stage's), then cleared. `sum_over_stages_and_replicas`
  // sums a vector over the pipeline and data-parallel groups (a collective: every rank calls report at once).
  MoeIntervalReport report(const std::function<std::vector<double>(std::vector<double>)>& sum_over_stages_and_replicas);

  // The largest of this rank's layers' MoeMlp::peak_received (0 without expert parallelism).
  double peak_received() const;

  // The expert biases of this rank's layers by layer name prefix ("layers.3.mlp"), for checkpoints.
  std::vector<std::pair<std::string, std::vector<float>>> expert_biases() const;
  // Restores one layer's bias; false when this rank holds no such layer.
  bool set_expert_bias(const std::string& prefix, const std::vector<float>& bias);

 private:
  ModelConfig cfg_;
  Distributed& dist_;
  std::vector<MoeMlp*> layers_;        // this rank's, in chunk then layer order
  std::vector<int64_t> global_index_;  // each one's index among the model's MoE layers
  std::vector<MoeLoad> interval_;      // per layer of layers_: the interval's sums
};

}  // namespace mt::app
