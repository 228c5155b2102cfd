// microbatches.h: what the pipeline stages read for one microbatch (models/model_stage.h MicrobatchInput): its
// samples of the training or validation data, this context rank's chunks of them on the model's device, with their
// positions (data.sft_packing: pack) and loss weights (data.loss_mask).
#pragma once
#include <cstdint>
#include <string>

#include "app/runtime/distributed.h"
#include "app/train/data_sources.h"
#include "core/config/config.h"
#include "models/model_stage.h"

namespace mt::app {

class Microbatches {
 public:
  // `data` must outlive it.
  Microbatches(const Config& cfg, const Distributed& dist, const DataSources& data);

  // Training microbatch m of this data-parallel rank in the iteration that starts after `consumed` samples: samples
  // consumed + (m * dp + dp_rank) * B + [0, B), so the global batch is the same set of samples whatever the layout.
  MicrobatchInput train(int64_t consumed, int m, bool with_head) const;
  // Evaluation's local microbatch j: validation batch dp_rank + j * dp, without dropout.
  MicrobatchInput valid(int j, bool with_head) const;
  // Loss masks: the weight of one counted target in the mean over the training step's `parts` microbatch means
  // (iteration `iteration`, starting after `consumed` samples), or over evaluation's `batches` validation batches
  // (each context rank's mean of each counted): read before their microbatches. Throws DataError when no target
  // counts (an all-masked batch stops the run, never a NaN).
  void weigh_train_targets(int64_t consumed, int64_t parts, int64_t iteration);
  void weigh_valid_targets(int64_t batches);

 private:
  // A microbatch's tokens and targets (B, S), read on the host and moved to the model's device; the position ids
  // (B, S) i32 of `positions` (empty when it is); the loss weights (B * S) f32: `weight` where the mask is 1, else 0.
  MicrobatchInput read(const SampleFn& source, const SampleFn& positions, int64_t first, StepContext ctx) const;
  Tensor load_loss_weights(const SampleFn& mask, int64_t first, double weight) const;
  // parts / (targets whose mask is 1 in samples [first, first + samples)); `what` names the batch in the error.
  double masked_target_weight(const SampleFn& mask, int64_t first, int64_t samples, int64_t parts,
                              const std::string& what) const;

  const Config& cfg_;
  const DataSources& data_;
  ContextParallel cp_;  // this rank's place in the context-parallel group (rank, size)
  int dp_rank_, dp_size_;
  Device device_;
  double train_target_weight_ = 0;  // this step's masked_target_weight (training with loss masks)
  double valid_target_weight_ = 0;  // evaluation's
};

}  // namespace mt::app
