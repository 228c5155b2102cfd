// parallelize.cpp: a rank's chunks made data-parallel: gradient buffers, optimizer, ZeRO-2/3 (parallelize.h).
#include "parallel/sharding/parallelize.h"

#include <stdexcept>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>

#include "parallel/sharding/distributed_optimizer.h"

namespace mt {

Parallelized::Parallelized(const std::vector<Parameter*>& params,
                           std::vector<std::vector<std::vector<Parameter*>>> chunk_units, DataParallelGroups groups,
                           ParallelizeOptions opt)
    : zero_(opt.zero), last_microbatch_(static_cast<int>(opt.num_microbatches) - 1), adam_(std::move(opt.adam)),
      groups_(std::move(groups)) {
  // One flat fp32 buffer holds every gradient; its buckets are reduced over data parallelism (reduce-scattered
  // with the distributed optimizer) as soon as the last microbatch's backward has finished them.
  // With the experts apart (their grid apart from the dense one) the experts this rank holds get a buffer of their
  // own, reduced over the expert-data-parallel group, and their own optimizer state (ExpertSplitOptimizer).
  // With ZeRO-2 there is no full buffer: each bucket is reduce-scattered into this rank's fp32 shard every
  // microbatch (parallel/sharding/grad_buffer.h).
  // Frozen parameters (finetune.lora's base) have no gradient and no optimizer state: only the rest enter them.
  std::vector<Parameter*> dense, experts;
  for (Parameter* p : params)
    if (!p->frozen) (p->expert && groups_.experts_apart ? experts : dense).push_back(p);
  const bool shard_optimizer = zero_ >= ZeroStage::optimizer;
  const bool shard_gradients = zero_ >= ZeroStage::gradients;
  const bool shard_parameters = zero_ >= ZeroStage::parameters;
  // ZeRO-3: the units each chunk gathers together (parallel/sharding/sharded_parameters.h), numbered over the chunks; a
  // parameter of two units (the tied word embeddings of one stage) belongs to the first one's buckets.
  std::unordered_map<const Parameter*, int> unit_of;
  if (shard_parameters)
    for (std::vector<std::vector<Parameter*>>& chunk : chunk_units) {
      first_unit_.push_back(static_cast<int>(units_.size()));
      for (std::vector<Parameter*>& unit : chunk) {
        for (const Parameter* p : unit) unit_of.emplace(p, static_cast<int>(units_.size()));
        units_.push_back(std::move(unit));
      }
    }
  grads_ = std::make_unique<GradBuffer>(dense, opt.device, std::move(groups_.dense_grads),
                                        GradBufferOptions{.bucket_elements = opt.bucket_elements,
                                                          .shard = shard_optimizer,
                                                          .shard_gradients = shard_gradients,
                                                          .tensor = groups_.tensor,
                                                          .embedding = groups_.embedding,
                                                          .units = unit_of,
                                                          .replicas = groups_.replicas});
  // ZeRO-3 gathers each buffer's units from its distributed optimizer's shards, over that optimizer's group.
  DistributedOptimizer* dense_shards = nullptr;
  DistributedOptimizer* expert_shards = nullptr;
  auto optimizer_of = [&](const GradBuffer& grads, std::vector<Parameter*> ps, Communicator* group,
                          const AdamWConfig& adam, DistributedOptimizer** shards) {
    if (!shard_optimizer) return std::unique_ptr<Optimizer>(std::make_unique<AdamW>(std::move(ps), adam));
    auto d = std::make_unique<DistributedOptimizer>(grads, *group, adam);
    *shards = d.get();
    return std::unique_ptr<Optimizer>(std::move(d));
  };
  if (experts.empty()) {
    optimizer_ = optimizer_of(*grads_, dense, groups_.shard_owners, adam_, &dense_shards);
  } else {
    // Under ZeRO-3 the experts' buckets are cut at the same units' borders: a layer gathers its attention over the
    // data-parallel group and its experts over the expert-data-parallel group.
    expert_grads_ = std::make_unique<GradBuffer>(experts, opt.device, std::move(groups_.expert_grads),
                                                 GradBufferOptions{.bucket_elements = opt.bucket_elements,
                                                                   .shard = shard_optimizer,
                                                                   .shard_gradients = shard_gradients,
                                                                   .tensor = groups_.expert_tensor,
                                                                   .units = unit_of,
                                                                   .replicas = groups_.expert_replicas});
    // The grad norm counts each expert slice once: a whole expert (not split by expert TP) on the first rank of
    // its expert tensor-parallel group; summed over the expert-parallel group that gives every expert's slice
    // once, which the tensor-parallel group's first fold (tp < ETP) brings into the model-parallel sum.
    AdamWConfig expert_adam = adam_;
    expert_adam.count_replicas = groups_.counts_expert_replicas;
    optimizer_ = std::make_unique<ExpertSplitOptimizer>(
        optimizer_of(*grads_, dense, groups_.shard_owners, adam_, &dense_shards),
        optimizer_of(*expert_grads_, experts, groups_.expert_data, expert_adam, &expert_shards),
        [expert = groups_.expert, first_fold = groups_.first_expert_fold](double x) {
          const double all = sum_doubles(*expert, {x})[0];
          return first_fold ? all : 0.0;
        },
        groups_.keeps_expert_state, adam_);
  }
  // ZeRO-3: from here on each unit's values are whole only around its computation.
  // With the experts apart a second set gathers theirs, over the expert-data-parallel group.
  if (shard_parameters) {
    sharded_.push_back(std::make_unique<ShardedParameters>(*grads_, *dense_shards, *groups_.shard_owners, units_));
    if (expert_grads_)
      sharded_.push_back(
          std::make_unique<ShardedParameters>(*expert_grads_, *expert_shards, *groups_.expert_data, units_));
  }
}

void Parallelized::for_buffers(const std::vector<Parameter*>& params,
                               void (GradBuffer::*act)(const std::vector<Parameter*>&)) {
  std::vector<Parameter*> ps;  // the frozen ones are not the buffers'
  for (Parameter* p : params)
    if (!p->frozen) ps.push_back(p);
  if (!expert_grads_) return (grads_.get()->*act)(ps);
  std::vector<Parameter*> dense_ps, expert_ps;
  for (Parameter* p : ps) (p->expert ? expert_ps : dense_ps).push_back(p);
  if (!dense_ps.empty()) (grads_.get()->*act)(dense_ps);
  if (!expert_ps.empty()) (expert_grads_.get()->*act)(expert_ps);
}

// ZeRO-2 also makes a bucket's storage before backward writes into it.
void Parallelized::grads_needed(int, const std::vector<Parameter*>& params) {
  if (needs_grads_needed()) for_buffers(params, &GradBuffer::prepare);
}

// Marked after the last microbatch's backward (ZeRO-2: after every microbatch's).
void Parallelized::grads_ready(int microbatch, const std::vector<Parameter*>& params) {
  if (microbatch != last_microbatch_ && !grads_->per_microbatch()) return;
  for_buffers(params, &GradBuffer::mark_ready);
}

// The next unit's gather is issued before this one computes.
void Parallelized::unit_begin(int chunk, int unit, int next) {
  const int base = first_unit_.at(static_cast<size_t>(chunk));
  for (const auto& s : sharded_) {
    s->acquire(base + unit);
    if (next >= 0) s->prefetch(base + next);
  }
}

const std::vector<Parameter*>& Parallelized::unit_parameters(int chunk, int unit) const {
  return units_.at(static_cast<size_t>(first_unit_.at(static_cast<size_t>(chunk)) + unit));
}

void Parallelized::unit_end(int chunk, int unit) {
  const int base = first_unit_.at(static_cast<size_t>(chunk));
  for (const auto& s : sharded_) s->release(base + unit);
}

void Parallelized::begin_step() {
  grads_->begin_step();  // zeroes every gradient
  if (expert_grads_) expert_grads_->begin_step();
}

void Parallelized::finish_grads() {
  // The sums over TP (sequence-parallel replicas) and the embedding group (tied copies), then the data-parallel
  // buckets not started yet, then the wait: every gradient is final (this rank's shard of it with ZeRO).
  grads_->finalize();
  if (expert_grads_) expert_grads_->finalize();
  // ZeRO-3: every unit released (a value gathered now would miss this step's update).
  for (const auto& s : sharded_)
    if (s->gathered_elements() != 0)
      throw std::logic_error(fmt::format("parallel.shard=parameters: {} gathered parameter elements outlive the step",
                                         s->gathered_elements()));
}

int64_t Parallelized::stored_numel(const Parameter* p) const {
  if (p->value.defined()) return p->value.numel();
  const GradBuffer& holder = expert_grads_ && expert_grads_->holds(p) ? *expert_grads_ : *grads_;
  return shape_numel(holder.shape(p));  // released: laid out in its buffer
}

const Parameter* Parallelized::first_nonfinite_shard() const {
  for (const auto& s : sharded_)
    if (const Parameter* p = s->first_nonfinite_shard()) return p;
  return nullptr;
}

}  // namespace mt
