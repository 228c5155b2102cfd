#include "parallel/distributed_optimizer.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/ops.h"

namespace mt {

DistributedOptimizer::DistributedOptimizer(std::vector<Parameter*> params, Tensor flat_grads, Communicator& dp,
                                           AdamWConfig cfg)
    : params_(std::move(params)), flat_grads_(std::move(flat_grads)), dp_(dp), cfg_(std::move(cfg)) {
  if (flat_grads_.numel() % dp_.size() != 0)
    throw std::invalid_argument(fmt::format("distributed optimizer: {} gradient elements do not split over {} ranks",
                                            flat_grads_.numel(), dp_.size()));
  shard_ = flat_grads_.numel() / dp_.size();
  const int64_t lo = shard_ * dp_.rank(), hi = lo + shard_;
  int64_t offset = 0;
  for (Parameter* p : params_) {
    offsets_.push_back(offset);
    const int64_t b = std::max(lo, offset), e = std::min(hi, offset + p->value.numel());
    if (b < e) segments_.push_back({p, b - offset, b - lo, e - lo});
    offset += p->value.numel();
  }
  master_ = Tensor::zeros({shard_}, DType::f32, flat_grads_.device(), MemKind::optimizer);
  exp_avg_ = Tensor::zeros({shard_}, DType::f32, flat_grads_.device(), MemKind::optimizer);
  exp_avg_sq_ = Tensor::zeros({shard_}, DType::f32, flat_grads_.device(), MemKind::optimizer);
  grad_shard_ = Tensor::zeros({shard_}, DType::f32, flat_grads_.device(), MemKind::gradient);
  for (const Segment& s : segments_) {
    Tensor whole = s.param->value.view({s.param->value.numel()});
    master_.slice(s.begin, s.end).copy_from(whole.slice(s.param_offset, s.param_offset + (s.end - s.begin)));
  }
}

StepResult DistributedOptimizer::step(double lr, double loss_scale) {
  dp_.reduce_scatter(flat_grads_, grad_shard_)->wait();
  std::vector<Tensor> counted;
  for (const Segment& s : segments_)
    if (counts_in_grad_norm(*s.param, cfg_)) counted.push_back(grad_shard_.slice(s.begin, s.end));
  double sumsq = sum_squares(counted);
  if (dp_.size() > 1) {
    Tensor t = Tensor::from_floats(std::vector<float>{static_cast<float>(sumsq)}, {1});
    dp_.all_reduce(t, ReduceOp::sum)->wait();
    sumsq = t.item();
  }
  if (cfg_.sum_across_ranks) sumsq = cfg_.sum_across_ranks(sumsq);
  double grad_scale = 0;
  const StepResult r = grad_norm_verdict(sumsq, loss_scale, cfg_.grad_clip, &grad_scale);
  if (r.found_inf) return r;
  ++steps_;
  for (const Segment& s : segments_) {
    Tensor master = master_.slice(s.begin, s.end), m = exp_avg_.slice(s.begin, s.end),
           v = exp_avg_sq_.slice(s.begin, s.end);
    adamw_step(master, grad_shard_.slice(s.begin, s.end), m, v, adamw_options(cfg_, *s.param, lr, steps_, grad_scale));
  }
  all_gather_into_values();
  return r;
}

void DistributedOptimizer::all_gather_into_values() {
  Tensor full = Tensor::empty({shard_ * dp_.size()}, DType::f32, flat_grads_.device(), MemKind::workspace);
  dp_.all_gather(master_, full)->wait();
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter* p = params_[i];
    p->value.copy_from(full.slice(offsets_[i], offsets_[i] + p->value.numel()));
  }
}

std::vector<AdamW::Slot> DistributedOptimizer::gather_slots() {
  Tensor full[3];
  const Tensor* shards[3] = {&master_, &exp_avg_, &exp_avg_sq_};
  for (int k = 0; k < 3; ++k) {
    full[k] = Tensor::empty({shard_ * dp_.size()}, DType::f32, flat_grads_.device(), MemKind::workspace);
    dp_.all_gather(*shards[k], full[k])->wait();
  }
  std::vector<AdamW::Slot> slots;
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter* p = params_[i];
    auto part = [&](const Tensor& t) { return t.slice(offsets_[i], offsets_[i] + p->value.numel()).view(p->value.shape()); };
    slots.push_back({p, part(full[0]), part(full[1]), part(full[2])});
  }
  return slots;
}

void DistributedOptimizer::scatter_slots(const std::vector<AdamW::Slot>& slots) {
  for (const Segment& s : segments_) {
    const AdamW::Slot* slot = nullptr;
    for (const AdamW::Slot& x : slots)
      if (x.param == s.param) slot = &x;
    if (!slot) throw std::logic_error("distributed optimizer: no state for parameter " + s.param->name);
    const int64_t n = s.end - s.begin, numel = s.param->value.numel();
    master_.slice(s.begin, s.end).copy_from(slot->master.view({numel}).slice(s.param_offset, s.param_offset + n));
    exp_avg_.slice(s.begin, s.end).copy_from(slot->exp_avg.view({numel}).slice(s.param_offset, s.param_offset + n));
    exp_avg_sq_.slice(s.begin, s.end)
        .copy_from(slot->exp_avg_sq.view({numel}).slice(s.param_offset, s.param_offset + n));
  }
  all_gather_into_values();
}

}  // namespace mt
