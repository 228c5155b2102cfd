#include "parallel/sharding/sharded_parameters.h"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

#include "core/tensor/finite.h"
#include "core/tensor/trace.h"

namespace mt {

ShardedParameters::ShardedParameters(const GradBuffer& grads, DistributedOptimizer& optimizer, Communicator& dp,
                                     const std::vector<std::vector<Parameter*>>& units)
    : grads_(grads), optimizer_(optimizer), dp_(dp), buckets_(grads.buckets().size()) {
  const auto& buckets = grads_.buckets();
  std::vector<bool> whole(buckets.size());
  for (size_t b = 0; b < buckets.size(); ++b) {
    whole[b] = buckets[b].whole;
    buckets_[b].sharded = !buckets[b].whole;
  }
  for (const std::vector<Parameter*>& unit : units) {
    std::vector<size_t> mine;
    for (const Parameter* p : unit) {
      if (!grads_.holds(p)) continue;  // not trained here (no gradient): kept whole
      const size_t b = grads_.bucket_of(p);
      if (buckets_[b].sharded && std::find(mine.begin(), mine.end(), b) == mine.end()) mine.push_back(b);
    }
    unit_buckets_.push_back(std::move(mine));
  }
  acquired_.assign(unit_buckets_.size(), false);
  // From here on the optimizer gathers only the whole buckets after a step; the others' values go.
  optimizer_.gather_only(whole);
  for (size_t b = 0; b < buckets_.size(); ++b)
    if (buckets_[b].sharded) drop(b);
}

ShardedParameters::~ShardedParameters() {
  for (BucketState& b : buckets_)
    if (b.work) try {
        b.work->wait();  // no gather is left writing into a freed buffer
      } catch (...) {
      }
}

void ShardedParameters::issue(size_t b) {
  BucketState& s = buckets_[b];
  if (s.full.defined()) return;  // gathered or in flight
  const GradBuffer::Bucket& bucket = grads_.buckets()[b];
  const Tensor shard = optimizer_.value_shard(b);
  const trace::Span span("data-parallel", fmt::format("all-gather parameters bucket {}", b),
                         fmt::format(R"("bucket": {}, "elements": {})", b, bucket.end - bucket.begin));
  s.full = Tensor::empty({bucket.end - bucket.begin}, shard.dtype(), grads_.device(), MemKind::gathered);
  s.work = dp_.all_gather(shard, s.full);
}

void ShardedParameters::drop(size_t b) {
  BucketState& s = buckets_[b];
  if (s.work) {
    s.work->wait();
    s.work.reset();
  }
  s.full = Tensor();  // back to the allocator once the parameters' views are gone
  for (Parameter* p : grads_.buckets()[b].params) p->value = Tensor();
}

void ShardedParameters::prefetch(int u) {
  for (size_t b : unit_buckets_.at(static_cast<size_t>(u))) issue(b);
}

void ShardedParameters::acquire(int u) {
  if (acquired_.at(static_cast<size_t>(u)))
    throw std::logic_error(fmt::format("sharded parameters: unit {} acquired twice", u));
  acquired_[static_cast<size_t>(u)] = true;
  for (size_t b : unit_buckets_[static_cast<size_t>(u)]) {
    BucketState& s = buckets_[b];
    issue(b);
    if (s.work) {  // orders the compute stream after the gather (NCCL), or it is done (Gloo)
      s.work->wait();
      s.work.reset();
      const GradBuffer::Bucket& bucket = grads_.buckets()[b];
      for (Parameter* p : bucket.params) {
        const Shape& shape = grads_.shape(p);
        const int64_t o = grads_.offset(p) - bucket.begin;
        p->value = s.full.slice(o, o + shape_numel(shape)).view(shape);
      }
    }
    ++s.holders;
  }
}

void ShardedParameters::release(int u) {
  if (!acquired_.at(static_cast<size_t>(u)))
    throw std::logic_error(fmt::format("sharded parameters: unit {} released without acquire", u));
  acquired_[static_cast<size_t>(u)] = false;
  for (size_t b : unit_buckets_[static_cast<size_t>(u)])
    if (--buckets_[b].holders == 0) drop(b);
}

const Parameter* ShardedParameters::first_nonfinite_shard() const {
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (!buckets_[b].sharded) continue;
    const NonFinite bad = find_nonfinite(optimizer_.value_shard(b));
    if (!bad) continue;
    const GradBuffer::Bucket& bucket = grads_.buckets()[b];
    const int64_t at = bucket.begin + grads_.shard_rank() * bucket.shard + bad.first;  // in the buffer's layout
    for (const Parameter* p : bucket.params)
      if (at >= grads_.offset(p) && at < grads_.offset(p) + shape_numel(grads_.shape(p))) return p;
    return bucket.params.back();  // the padding after the last parameter (never written: not reached)
  }
  return nullptr;
}

int64_t ShardedParameters::gathered_elements() const {
  int64_t n = 0;
  for (const BucketState& b : buckets_) n += b.full.defined() ? b.full.numel() : 0;
  return n;
}

}  // namespace mt
