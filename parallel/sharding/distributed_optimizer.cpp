#include "parallel/sharding/distributed_optimizer.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <unordered_map>

#include <fmt/format.h>

#include "core/tensor/ops.h"

namespace mt {

DistributedOptimizer::DistributedOptimizer(const GradBuffer& grads, Communicator& dp, AdamWConfig cfg)
    : Optimizer(std::move(cfg)), grads_(grads), dp_(dp) {
  if (!grads_.sharded() || grads_.shard_count() != dp_.size() || grads_.shard_rank() != dp_.rank())
    throw std::invalid_argument(
        fmt::format("distributed optimizer: the gradient buffer must be sharded over {} (rank {} of {}), it is {}over "
                    "rank {} of {}",
                    dp_.name(), dp_.rank(), dp_.size(), grads_.sharded() ? "" : "not sharded, ", grads_.shard_rank(),
                    grads_.shard_count()));
  // This rank's blocks of the buckets, laid out in buffer order (with one bucket: the block of the whole).
  const int64_t r = dp_.rank();
  const auto& buckets = grads_.buckets();
  for (size_t i = buckets.size(); i-- > 0;) {
    const GradBuffer::Bucket& bucket = buckets[i];
    const int64_t lo = bucket.begin + r * bucket.shard, hi = lo + bucket.shard;  // in the buffer
    buckets_.push_back({bucket.begin, bucket.end, shard_, bucket.shard, &bucket.params, i});
    for (Parameter* p : bucket.params) {
      const int64_t offset = grads_.offset(p);
      const int64_t b = std::max(lo, offset), e = std::min(hi, offset + p->value.numel());
      if (b < e)
        segments_.push_back(
            {p, b - offset, shard_ + b - lo, shard_ + e - lo, grads_.shard_of(i).slice(b - lo, e - lo)});
    }
    shard_ += bucket.shard;
    largest_bucket_ = std::max(largest_bucket_, bucket.end - bucket.begin);
  }
  const Device device = grads_.device();
  // One compute dtype for all parameters (a model's are): gather values in it; mixed or f32: gather masters.
  const std::vector<Parameter*>& params = grads_.params();
  DType value_dtype = params.empty() ? DType::f32 : params[0]->value.dtype();
  for (const Parameter* p : params)
    if (p->value.dtype() != value_dtype) value_dtype = DType::f32;
  if (cfg_.offload.enabled) {
    // The state in host memory; the values the host update makes land in value_shard_ on the device (f32 too).
    std::vector<HostOffload::Segment> pieces;
    for (const Segment& s : segments_)
      pieces.push_back({.begin = s.begin, .end = s.end, .decay = s.param->weight_decay});
    offload_ = std::make_unique<HostOffload>(shard_, std::move(pieces), value_dtype, device, cfg_.offload);
    master_ = offload_->master();
    exp_avg_ = offload_->exp_avg();
    exp_avg_sq_ = offload_->exp_avg_sq();
  } else {
    master_ = Tensor::zeros({shard_}, DType::f32, device, MemKind::optimizer);
    exp_avg_ = Tensor::zeros({shard_}, DType::f32, device, MemKind::optimizer);
    exp_avg_sq_ = Tensor::zeros({shard_}, DType::f32, device, MemKind::optimizer);
  }
  for (const Segment& s : segments_) {
    Tensor whole = s.param->value.view({s.param->value.numel()});
    master_.slice(s.begin, s.end).copy_from(whole.slice(s.param_offset, s.param_offset + (s.end - s.begin)));
  }
  if (value_dtype != DType::f32 || offload_) {
    value_shard_ = Tensor::zeros({shard_}, value_dtype, device, MemKind::optimizer);
    value_shard_.copy_from(master_);
  }
}

std::vector<Tensor> DistributedOptimizer::counted_grads() const {
  std::vector<Tensor> counted;
  for (const Segment& s : segments_)
    if (counts_in_grad_norm(*s.param, cfg_)) counted.push_back(s.grad);
  return counted;
}

double DistributedOptimizer::sum_over_state_shards(double local) { return sum_doubles(dp_, {local})[0]; }

DistributedOptimizer::~DistributedOptimizer() = default;

void DistributedOptimizer::update(const AdamWOptions& opt) {
  if (offload_) {
    std::vector<Tensor> grads, values;
    for (const Segment& s : segments_) {
      grads.push_back(s.grad);
      values.push_back(value_shard_.slice(s.begin, s.end));
    }
    offload_->step(opt, grads, values);
    return all_gather_into_values(true);
  }
  std::vector<AdamWTensors> ts;
  ts.reserve(segments_.size());
  for (const Segment& s : segments_)
    ts.push_back({.master = master_.slice(s.begin, s.end),
                  .grad = s.grad,
                  .exp_avg = exp_avg_.slice(s.begin, s.end),
                  .exp_avg_sq = exp_avg_sq_.slice(s.begin, s.end),
                  .value = value_shard_.defined() ? value_shard_.slice(s.begin, s.end) : Tensor(),
                  .decay = s.param->weight_decay});
  adamw_multi_step(ts, opt);
  all_gather_into_values(true);
}

void DistributedOptimizer::gather_only(std::vector<bool> buckets) {
  gather_only_ = std::move(buckets);
  if (!value_shard_.defined() || value_shard_.kind() == MemKind::parameter) return;
  Tensor resident = Tensor::empty({shard_}, value_shard_.dtype(), value_shard_.device(), MemKind::parameter);
  resident.copy_from(value_shard_);
  value_shard_ = resident;
}

Tensor DistributedOptimizer::value_shard(size_t bucket) const {
  const BucketShard& b = buckets_.at(buckets_.size() - 1 - bucket);  // buckets_ is in buffer order
  return (value_shard_.defined() ? value_shard_ : master_).slice(b.shard_begin, b.shard_begin + b.shard);
}

void DistributedOptimizer::for_each_gathered_bucket(const Tensor& shard,
                                                    const std::function<void(const BucketShard&, const Tensor&)>& use,
                                                    const std::vector<bool>* only) {
  // One bucket at a time through a bucket-sized temporary: a whole-buffer one would cost the model slice's size
  // again in device memory (the gradient buffer's length in the gathered dtype; three f32 ones for the slots).
  // A host shard (optimizer.offload's state, for checkpoints) goes through the device a block at a time: the
  // group's communicator moves device memory.
  const Device device = grads_.device();
  Tensor staging = Tensor::empty({largest_bucket_}, shard.dtype(), device, MemKind::workspace);
  for (const BucketShard& b : buckets_) {
    if (only && !only->empty() && !only->at(b.index)) continue;
    Tensor full = staging.slice(0, b.end - b.begin);
    Tensor block = shard.slice(b.shard_begin, b.shard_begin + b.shard);
    if (block.device() != device) block = block.to(device, MemKind::workspace);
    dp_.all_gather(block, full)->wait();
    use(b, full);
  }
}

void DistributedOptimizer::all_gather_into_values(bool values_current) {
  const Tensor* shard = &master_;
  if (value_shard_.defined()) {
    if (!values_current) value_shard_.copy_from(master_);
    shard = &value_shard_;
  }
  for_each_gathered_bucket(
      *shard,
      [&](const BucketShard& b, const Tensor& full) {
        for (Parameter* p : *b.params) {
          const int64_t o = grads_.offset(p) - b.begin;
          p->value.copy_from(full.slice(o, o + p->value.numel()));
        }
      },
      &gather_only_);
}

std::vector<OptimizerSlot> DistributedOptimizer::gather_slots(bool keep) {
  std::vector<Slot> slots;
  std::unordered_map<const Parameter*, size_t> slot_of;
  if (keep)
    for (Parameter* p : grads_.params()) {
      slot_of[p] = slots.size();
      // On the host: the writer's whole state of the model slice is 12 bytes per parameter, more than a GPU
      // holds beside the run.
      auto host = [&] { return Tensor::empty(grads_.shape(p), DType::f32, Device::cpu, MemKind::workspace); };
      slots.push_back({p, host(), host(), host()});
    }
  const Tensor* shards[3] = {&master_, &exp_avg_, &exp_avg_sq_};
  for (int k = 0; k < 3; ++k)
    for_each_gathered_bucket(*shards[k], [&](const BucketShard& b, const Tensor& full) {
      if (!keep) return;
      for (Parameter* p : *b.params) {
        Slot& slot = slots[slot_of.at(p)];
        const int64_t o = grads_.offset(p) - b.begin, n = shape_numel(grads_.shape(p));
        Tensor& whole = k == 0 ? slot.master : k == 1 ? slot.exp_avg : slot.exp_avg_sq;
        whole.view({n}).copy_from(full.slice(o, o + n));
      }
    });
  return slots;
}

void DistributedOptimizer::load_state(const std::function<void(const std::vector<Slot>&)>& fill, bool partial) {
  // Whole per-parameter states of this model-parallel slice in host memory, then this rank's shard of them. What
  // a partial load skips keeps the initial values (the masters: the parameters' own, which ZeRO-3 does not keep
  // whole) and zero moments.
  std::vector<Slot> slots;
  if (partial) {  // else `fill` writes every element
    slots = gather_slots(true);
    for (Slot& slot : slots) {
      slot.exp_avg.zero_();
      slot.exp_avg_sq.zero_();
    }
  } else {
    for (Parameter* p : grads_.params()) {
      auto host = [&] { return Tensor::empty(grads_.shape(p), DType::f32, Device::cpu, MemKind::workspace); };
      slots.push_back({p, host(), host(), host()});
    }
  }
  fill(slots);
  scatter_slots(slots);
}

void DistributedOptimizer::scatter_slots(const std::vector<Slot>& slots) {
  for (const Segment& s : segments_) {
    const Slot* slot = nullptr;
    for (const Slot& x : slots)
      if (x.param == s.param) slot = &x;
    if (!slot) throw std::logic_error("distributed optimizer: no state for parameter " + s.param->name);
    const int64_t n = s.end - s.begin, numel = shape_numel(grads_.shape(s.param));
    master_.slice(s.begin, s.end).copy_from(slot->master.view({numel}).slice(s.param_offset, s.param_offset + n));
    exp_avg_.slice(s.begin, s.end).copy_from(slot->exp_avg.view({numel}).slice(s.param_offset, s.param_offset + n));
    exp_avg_sq_.slice(s.begin, s.end)
        .copy_from(slot->exp_avg_sq.view({numel}).slice(s.param_offset, s.param_offset + n));
  }
  all_gather_into_values(false);
}

}  // namespace mt
