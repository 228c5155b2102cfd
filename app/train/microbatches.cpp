// microbatches.cpp: the samples, positions and loss weights of one microbatch (microbatches.h).
#include "app/train/microbatches.h"

#include <utility>

#include <fmt/format.h>

#include "core/data/indexed_dataset.h"

namespace mt::app {

Microbatches::Microbatches(const Config& cfg, const Distributed& dist, const DataSources& data)
    : cfg_(cfg), data_(data), cp_{.rank = dist.cp_rank(), .size = dist.cp_size()}, dp_rank_(dist.dp_rank()),
      dp_size_(dist.dp_size()), device_(dist.placement.device) {}

MicrobatchInput Microbatches::train(int64_t consumed, int m, bool with_head) const {
  const int64_t first = consumed + (m * dp_size_ + dp_rank_) * cfg_.training.micro_batch_size;
  MicrobatchInput in =
      read(data_.train, data_.train_positions, first,
           StepContext{.sample_offset = first, .training = true, .seed = static_cast<uint64_t>(cfg_.training.seed)});
  if (data_.train_mask && with_head)
    in.ctx.loss_weights = load_loss_weights(data_.train_mask, first, train_target_weight_);
  return in;
}

MicrobatchInput Microbatches::valid(int j, bool with_head) const {
  const int64_t B = cfg_.training.micro_batch_size;
  const int64_t i = dp_rank_ + static_cast<int64_t>(j) * dp_size_;  // the validation batch
  MicrobatchInput in =
      read(data_.valid, data_.valid_positions, i * B, StepContext{.sample_offset = i * B, .training = false});
  if (data_.valid_mask && with_head)
    in.ctx.loss_weights = load_loss_weights(data_.valid_mask, i * B, valid_target_weight_);
  return in;
}

void Microbatches::weigh_train_targets(int64_t consumed, int64_t parts, int64_t iteration) {
  train_target_weight_ = masked_target_weight(data_.train_mask, consumed, cfg_.training.global_batch_size, parts,
                                              fmt::format("iteration {}'s global batch", iteration));
}

void Microbatches::weigh_valid_targets(int64_t batches) {
  valid_target_weight_ = masked_target_weight(data_.valid_mask, 0, batches * cfg_.training.micro_batch_size,
                                              batches * cp_.size, "the validation batches");
}

double Microbatches::masked_target_weight(const SampleFn& mask, int64_t first, int64_t samples, int64_t parts,
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

Tensor Microbatches::load_loss_weights(const SampleFn& mask, int64_t first, double weight) const {
  const int64_t B = cfg_.training.micro_batch_size, S = cfg_.model.seq_length;
  Tensor host = Tensor::empty({B, S}, DType::f32);
  make_loss_weights(mask, first, B, S, static_cast<float>(weight), host);
  // This context rank's two chunks of every sample, as its targets (read).
  host = context_chunks(host, cp_);
  host = host.view({host.numel()});
  return device_ == Device::cpu ? host : host.to(device_);
}

MicrobatchInput Microbatches::read(const SampleFn& source, const SampleFn& positions, int64_t first,
                                   StepContext ctx) const {
  const int64_t B = cfg_.training.micro_batch_size, S = cfg_.model.seq_length;
  MicrobatchInput in{.ctx = std::move(ctx)};
  {
    Tensor host_tokens = Tensor::empty({B, S}, DType::i32), host_targets = Tensor::empty({B, S}, DType::i32);
    make_batch(source, first, B, S, host_tokens, host_targets);
    if (cp_.size > 1) {  // this context rank's two chunks of every sample
      host_tokens = context_chunks(host_tokens, cp_);
      host_targets = context_chunks(host_targets, cp_);
    }
    in.tokens = device_ == Device::cpu ? host_tokens : host_tokens.to(device_);
    in.targets = device_ == Device::cpu ? host_targets : host_targets.to(device_);
  }
  if (positions) {
    Tensor host = Tensor::empty({B, S}, DType::i32);
    make_positions(positions, first, B, S, host);
    // Each token keeps its position within its document whichever rank holds it: this rank's two chunks of them.
    if (cp_.size > 1) host = context_chunks(host, cp_);
    in.ctx.positions = device_ == Device::cpu ? host : host.to(device_);
  }
  return in;
}

}  // namespace mt::app
