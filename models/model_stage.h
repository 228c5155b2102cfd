// model_stage.h: a rank's model chunks as the pipeline executor runs them (parallel/pipeline/pipeline_executor.h
// PipelineStage): one training iteration's microbatches (TrainingStage: forward, backward, and the split backward of
// the zero-bubble schedules) or evaluation's (EvaluationStage: forward only, the losses summed on the host). What a
// microbatch reads (its tokens, targets and context) comes from the caller, which owns the data.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "models/gpt.h"
#include "parallel/pipeline/pipeline_executor.h"
#include "parallel/pipeline/weight_grad.h"

namespace mt {

// One microbatch as a chunk reads it: tokens and targets (B, T) i32 on the model's device, and its context (first
// sample, training or not, dropout seed, positions; loss weights for the chunk with the head).
struct MicrobatchInput {
  Tensor tokens, targets;
  StepContext ctx;
};
// Microbatch `microbatch`'s input for a chunk; `with_head`: the chunk computes the loss (the loss weights are read
// for it only).
using MicrobatchReader = std::function<MicrobatchInput(int microbatch, bool with_head)>;

// What crosses between pipeline stages: one microbatch's hidden states.
struct StageActivation {
  Shape shape;  // (B, T, C) of this context rank's chunks; (B, T/tp, C) shards with SP
  DType dtype = DType::f32;
  Device device = Device::cpu;
};

// One training iteration: the last stage's losses are added into the step's device slot, the backward seeds with
// `dloss` (loss scale / the microbatches of the step's mean).
class TrainingStage final : public PipelineStage {
 public:
  TrainingStage(const std::vector<std::unique_ptr<GptModel>>& chunks, StageActivation activation, MicrobatchReader read,
                float dloss, Tensor loss_sum)
      : chunks_(chunks), activation_(std::move(activation)), read_(std::move(read)), dloss_(dloss),
        loss_sum_(std::move(loss_sum)) {}
  Tensor forward(int microbatch, int chunk, const Tensor& input) override;
  Tensor backward(int microbatch, int chunk, const Tensor& grad) override;
  // Zero-bubble schedules: the backward with the weight gradients deferred (parallel/pipeline/weight_grad.h), then those.
  Tensor backward_input(int microbatch, int chunk, const Tensor& grad) override;
  void backward_weight(int microbatch, int chunk) override;
  Shape activation_shape() const override { return activation_.shape; }
  DType activation_dtype() const override { return activation_.dtype; }
  Device activation_device() const override { return activation_.device; }

 private:
  const std::vector<std::unique_ptr<GptModel>>& chunks_;
  StageActivation activation_;
  MicrobatchReader read_;
  float dloss_;
  std::map<std::pair<int, int>, WeightGradQueue> weight_grads_;  // by (microbatch, chunk), between B and W
  Tensor loss_sum_;  // (1) f64 on the device: the step's sum over the microbatches whose loss this rank computed
};

// Evaluation (a forward_only schedule): forward without dropout, the loss summed on the last stage.
class EvaluationStage final : public PipelineStage {
 public:
  EvaluationStage(const std::vector<std::unique_ptr<GptModel>>& chunks, StageActivation activation,
                  MicrobatchReader read)
      : chunks_(chunks), activation_(std::move(activation)), read_(std::move(read)) {}
  Tensor forward(int microbatch, int chunk, const Tensor& input) override;
  Tensor backward(int microbatch, int chunk, const Tensor& grad) override;  // never called: forward only
  Shape activation_shape() const override { return activation_.shape; }
  DType activation_dtype() const override { return activation_.dtype; }
  Device activation_device() const override { return activation_.device; }
  // Over the microbatches whose loss this rank computed, in microbatch order.
  double loss_sum() const { return loss_sum_; }

 private:
  const std::vector<std::unique_ptr<GptModel>>& chunks_;
  StageActivation activation_;
  MicrobatchReader read_;
  double loss_sum_ = 0;
};

}  // namespace mt
