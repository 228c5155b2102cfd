// model_stage.cpp: the model chunks as pipeline stages, for training and for evaluation (model_stage.h).
#include "models/model_stage.h"

#include <stdexcept>

#include <fmt/format.h>

namespace mt {

Tensor TrainingStage::forward(int microbatch, int chunk, const Tensor& input) {
  GptModel& model = *chunks_[static_cast<size_t>(chunk)];
  const MicrobatchInput in = read_(microbatch, model.stage().has_head);
  return model.forward_stage(input, in.tokens, in.targets, microbatch, in.ctx, loss_sum_);
}

Tensor TrainingStage::backward(int microbatch, int chunk, const Tensor& grad) {
  return chunks_[static_cast<size_t>(chunk)]->backward_stage(microbatch, grad, dloss_);
}

Tensor TrainingStage::backward_input(int microbatch, int chunk, const Tensor& grad) {
  WeightGradDeferral deferral;  // the layers' weight-gradient work (and the ready hooks after it) queue here
  Tensor din = chunks_[static_cast<size_t>(chunk)]->backward_stage(microbatch, grad, dloss_);
  weight_grads_[{microbatch, chunk}] = deferral.take();
  return din;
}

void TrainingStage::backward_weight(int microbatch, int chunk) {
  auto it = weight_grads_.find({microbatch, chunk});
  if (it == weight_grads_.end())
    throw std::logic_error(
        fmt::format("backward_weight of microbatch {} chunk {} without its backward_input", microbatch, chunk));
  WeightGradQueue queue = std::move(it->second);
  weight_grads_.erase(it);
  run_weight_grads(queue);
}

Tensor EvaluationStage::forward(int microbatch, int chunk, const Tensor& input) {
  GptModel& model = *chunks_[static_cast<size_t>(chunk)];
  const MicrobatchInput in = read_(microbatch, model.stage().has_head);
  float loss = 0;
  Tensor out = model.forward_stage(input, in.tokens, in.targets, microbatch, in.ctx, &loss);
  if (model.stage().has_head) loss_sum_ += loss;
  return out;
}

Tensor EvaluationStage::backward(int microbatch, int chunk, const Tensor&) {
  throw std::logic_error(
      fmt::format("evaluation: backward of microbatch {} chunk {} in a forward_only schedule", microbatch, chunk));
}

}  // namespace mt
