// trainer_stages.cpp: what the pipeline executor runs for the training loop: one iteration's microbatches
// (IterationStage) and evaluation's (EvalStage), and the batches they read.
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

#include "app/train/trainer_impl.h"
#include "core/data/indexed_dataset.h"

namespace mt::app {

Tensor EvalStage::forward(int microbatch, int chunk, const Tensor& input) {
  const int64_t B = t_.cfg_.training.micro_batch_size;
  const int64_t i = t_.dist_.dp_rank() + microbatch * t_.dist_.dp_size();  // the validation batch
  Tensor tokens, targets;
  t_.load_batch(t_.data_.valid, i * B, tokens, targets);
  StepContext ctx{.sample_offset = i * B, .training = false};
  ctx.positions = t_.load_positions(t_.data_.valid_positions, i * B);
  float loss = 0;
  GptModel& model = *t_.chunks_[static_cast<size_t>(chunk)];
  if (t_.data_.valid_mask && model.stage().has_head)
    ctx.loss_weights = t_.load_loss_weights(t_.data_.valid_mask, i * B, t_.eval_target_weight_);
  Tensor out = model.forward_stage(input, tokens, targets, microbatch, ctx, &loss);
  if (model.stage().has_head) loss_sum += loss;
  return out;
}

Tensor EvalStage::backward(int microbatch, int chunk, const Tensor&) {
  throw std::logic_error(
      fmt::format("evaluation: backward of microbatch {} chunk {} in a forward_only schedule", microbatch, chunk));
}

Shape EvalStage::activation_shape() const { return t_.activation_shape(); }

DType EvalStage::activation_dtype() const { return t_.dtype_; }

Device EvalStage::activation_device() const { return t_.device_; }

Tensor IterationStage::forward(int microbatch, int chunk, const Tensor& input) {
  const Config& cfg = t_.cfg_;
  const int64_t first = t_.microbatch_first_sample(microbatch);
  Tensor tokens, targets;
  t_.load_batch(t_.data_.train, first, tokens, targets);
  StepContext ctx{.sample_offset = first, .training = true, .seed = static_cast<uint64_t>(cfg.training.seed)};
  ctx.positions = t_.load_positions(t_.data_.train_positions, first);
  GptModel& model = *t_.chunks_[static_cast<size_t>(chunk)];
  if (t_.data_.train_mask && model.stage().has_head)
    ctx.loss_weights = t_.load_loss_weights(t_.data_.train_mask, first, t_.train_target_weight_);
  return model.forward_stage(input, tokens, targets, microbatch, ctx, loss_sum_);
}

Tensor IterationStage::backward(int microbatch, int chunk, const Tensor& grad) {
  return t_.chunks_[static_cast<size_t>(chunk)]->backward_stage(microbatch, grad, dloss_);
}

Tensor IterationStage::backward_input(int microbatch, int chunk, const Tensor& grad) {
  WeightGradDeferral deferral;  // the layers' weight-gradient work (and the ready hooks after it) queue here
  Tensor din = t_.chunks_[static_cast<size_t>(chunk)]->backward_stage(microbatch, grad, dloss_);
  weight_grads_[{microbatch, chunk}] = deferral.take();
  return din;
}

void IterationStage::backward_weight(int microbatch, int chunk) {
  auto it = weight_grads_.find({microbatch, chunk});
  if (it == weight_grads_.end())
    throw std::logic_error(
        fmt::format("backward_weight of microbatch {} chunk {} without its backward_input", microbatch, chunk));
  WeightGradQueue queue = std::move(it->second);
  weight_grads_.erase(it);
  run_weight_grads(queue);
}

Shape IterationStage::activation_shape() const { return t_.activation_shape(); }

DType IterationStage::activation_dtype() const { return t_.dtype_; }

Device IterationStage::activation_device() const { return t_.device_; }

double Trainer::masked_target_weight(const SampleFn& mask, int64_t first, int64_t samples, int64_t parts,
                                     const std::string& what) const {
  const int64_t counted = count_loss_targets(mask, first, samples, cfg_.model.seq_length);
  if (counted == 0)
    throw DataError(fmt::format(
        "{} (samples [{}, {})): every target's loss mask is 0, so its mean loss is over no tokens; the run stops "
        "rather than take a step on nothing (a larger training.global_batch_size, or data with a response in "
        "every sample, avoids it)",
        what, first, first + samples));
  return static_cast<double>(parts) / static_cast<double>(counted);
}

Tensor Trainer::load_loss_weights(const SampleFn& mask, int64_t first, double weight) const {
  const int64_t B = cfg_.training.micro_batch_size, S = cfg_.model.seq_length;
  Tensor host = Tensor::empty({B, S}, DType::f32);
  make_loss_weights(mask, first, B, S, static_cast<float>(weight), host);
  // This context rank's two chunks of every sample, as its targets (load_batch).
  host = context_chunks(host, ContextParallel{.rank = dist_.cp_rank(), .size = dist_.cp_size()});
  host = host.view({host.numel()});
  return device_ == Device::cpu ? host : host.to(device_);
}

Tensor Trainer::load_positions(const SampleFn& positions, int64_t first) const {
  if (!positions) return {};
  const int64_t B = cfg_.training.micro_batch_size, S = cfg_.model.seq_length;
  Tensor host = Tensor::empty({B, S}, DType::i32);
  make_positions(positions, first, B, S, host);
  return device_ == Device::cpu ? host : host.to(device_);
}

void Trainer::load_batch(const SampleFn& source, int64_t first, Tensor& tokens, Tensor& targets) const {
  const int64_t B = cfg_.training.micro_batch_size, S = cfg_.model.seq_length;
  Tensor host_tokens = Tensor::empty({B, S}, DType::i32), host_targets = Tensor::empty({B, S}, DType::i32);
  make_batch(source, first, B, S, host_tokens, host_targets);
  if (dist_.cp_size() > 1) {  // this context rank's two chunks of every sample
    const ContextParallel cp{.rank = dist_.cp_rank(), .size = dist_.cp_size()};
    host_tokens = context_chunks(host_tokens, cp);
    host_targets = context_chunks(host_targets, cp);
  }
  tokens = device_ == Device::cpu ? host_tokens : host_tokens.to(device_);
  targets = device_ == Device::cpu ? host_targets : host_targets.to(device_);
}

}  // namespace mt::app
