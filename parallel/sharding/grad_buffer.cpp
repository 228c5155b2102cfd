#include "parallel/sharding/grad_buffer.h"

#include "parallel/comm/flight_recorder.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/tensor/ops.h"
#include "core/tensor/trace.h"
#include "parallel/sharding/hybrid_shard.h"

namespace mt {

namespace {

bool sums(const Communicator* group) { return group && group->size() > 1; }

}  // namespace

GradBuffer::GradBuffer(std::vector<Parameter*> params, Device device, std::unique_ptr<Communicator> dp,
                       GradBufferOptions opt)
    : params_(std::move(params)), opt_(opt), dp_(std::move(dp)), reduces_(sums(dp_.get())), device_(device) {
  if (opt_.bucket_elements < 1)
    throw std::invalid_argument(fmt::format("gradient buffer: bucket size {} must be positive", opt_.bucket_elements));
  for (Parameter* p : params_)
    if (p->grad_sums.embedding) embedding_copies_.push_back(p);
  if (opt_.shard_gradients && !opt_.shard)
    throw std::invalid_argument("gradient buffer: sharded gradients need shard (reduce-scatter)");
  // Whole parameters in reverse order (the last layers' gradients are final first). ZeRO-2: parameters summed
  // over another group first never share a bucket with the others (theirs stay whole for the step).
  // ZeRO-3: a unit's parameters never share a bucket with another unit's.
  for (Parameter* p : params_) shape_[p] = p->value.shape();
  const auto unit = [&](const Parameter* p) {
    auto it = opt_.units.find(p);
    return it == opt_.units.end() ? -1 : it->second;
  };
  int64_t in_bucket = 0;
  for (size_t i = params_.size(); i-- > 0;) {
    const bool whole = opt_.shard_gradients && sums_elsewhere(params_[i]);
    if (in_bucket > 0 && buckets_.back().whole != whole) in_bucket = 0;
    if (in_bucket > 0 && unit(buckets_.back().params.front()) != unit(params_[i])) in_bucket = 0;
    if (in_bucket == 0) {
      buckets_.emplace_back();
      buckets_.back().whole = whole;
    }
    Bucket& b = buckets_.back();
    b.params.insert(b.params.begin(), params_[i]);
    bucket_of_[params_[i]] = buckets_.size() - 1;
    in_bucket += params_[i]->value.numel();
    if (in_bucket >= opt_.bucket_elements) in_bucket = 0;
  }
  // The buffer holds the parameters in their order, so the first bucket in buffer order is the last built.
  if (opt_.replicas && (!opt_.shard || dp_size() % replica_count() != 0))
    throw std::invalid_argument(
        fmt::format("gradient buffer: {} replicas need shard and a data-parallel size ({}) they divide",
                    replica_count(), dp_size()));
  const int64_t n = dp_size(), owners = shard_count();  // padded to n, sharded over owners (hybrid: n / replicas)
  int64_t offset = 0;
  for (size_t b = buckets_.size(); b-- > 0;) {
    Bucket& bucket = buckets_[b];
    bucket.begin = offset;
    for (const Parameter* p : bucket.params) {
      offset_[p] = offset;
      offset += p->value.numel();
    }
    if (opt_.shard) offset = bucket.begin + (offset - bucket.begin + n - 1) / n * n;
    bucket.end = offset;
    bucket.shard = opt_.shard ? (bucket.end - bucket.begin) / owners : 0;
  }
  for (Parameter* p : params_) ready_[p] = false;
  if (opt_.shard_gradients) {
    for (Parameter* p : params_) p->grad = Tensor();  // written only inside a bucket's storage (prepare)
    for (Bucket& b : buckets_) {
      b.accum = Tensor::zeros({b.shard}, DType::f32, device, MemKind::gradient);
      if (b.whole) give_storage(b);
    }
  } else {
    flat_ = Tensor::zeros({offset}, DType::f32, device, MemKind::gradient);
    for (Parameter* p : params_) {
      const int64_t o = offset_.at(p);
      p->grad = flat_.slice(o, o + p->value.numel()).view(p->value.shape());
    }
  }
  if (reduces_) {
    on_caller_ = !dp_->collectives_block_caller();
    if (!on_caller_) thread_ = std::thread([this] { worker(); });
  }
}

GradBuffer::~GradBuffer() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void GradBuffer::give_storage(Bucket& b) {  // mu_ held
  b.storage = Tensor::zeros({b.end - b.begin}, DType::f32, device_, MemKind::gradient);
  for (Parameter* p : b.params) {
    const int64_t o = offset_.at(p) - b.begin;
    const Shape& shape = shape_.at(p);
    p->grad = b.storage.slice(o, o + shape_numel(shape)).view(shape);
  }
}

Tensor GradBuffer::shard_of(size_t bucket) const {
  const Bucket& b = buckets_.at(bucket);
  if (opt_.shard_gradients) return b.accum;
  const int64_t lo = b.begin + shard_rank() * b.shard;
  return flat_.slice(lo, lo + b.shard);
}

int64_t GradBuffer::resident_elements() const {
  if (!opt_.shard_gradients) return flat_.numel();
  int64_t n = 0;
  for (const Bucket& b : buckets_) n += b.shard + (b.whole ? b.end - b.begin : 0);
  return n;
}

void GradBuffer::prepare(const std::vector<Parameter*>& params) {
  if (!opt_.shard_gradients) return;
  std::lock_guard lock(mu_);
  for (Parameter* p : params) {
    auto it = bucket_of_.find(p);
    if (it == bucket_of_.end()) continue;  // another buffer's
    Bucket& b = buckets_[it->second];
    if (b.whole) continue;
    if (!b.storage.defined()) give_storage(b);
    ++prepared_[p];
    ++b.outstanding;
  }
}

void GradBuffer::begin_step() {
  std::lock_guard lock(mu_);
  if (opt_.shard_gradients) {
    for (Bucket& b : buckets_) {
      b.accum.zero_();
      if (b.whole)
        b.storage.zero_();
      else if (b.storage.defined())
        throw std::logic_error("gradient buffer: a bucket's storage outlived its step");
      b.outstanding = 0;
    }
    prepared_.clear();
  } else {
    flat_.zero_();
  }
  for (auto& [p, r] : ready_) r = false;
  for (Bucket& b : buckets_) b.pending = static_cast<int>(b.params.size());
  launched_ = done_ = 0;
  error_ = nullptr;
  works_.clear();
  flushes_.clear();
  flush_works_.clear();
}

bool GradBuffer::sums_elsewhere(const Parameter* p) const {
  return (p->grad_sums.tensor && sums(opt_.tensor)) ||
         (p->grad_sums.embedding && (sums(opt_.embedding) || embedding_copies_.size() > 1));
}

void GradBuffer::mark_ready(const std::vector<Parameter*>& params) {
  std::unique_lock lock(mu_);
  for (Parameter* p : params)
    if (!sums_elsewhere(p)) ready(p);
  // ZeRO-2 with a worker: at most one bucket reduce-scattering beside the one backward writes (backward waits
  // for the worker rather than piling up bucket-sized storage: the memory is the point of the stage).
  if (opt_.shard_gradients && !on_caller_ && reduces_) {
    const CommWaitTimer blocked;  // the caller blocked on the reductions (straggler.h's busy time leaves it out)
    cv_.wait(lock, [&] { return flushes_.empty() || error_ != nullptr; });
  }
}

void GradBuffer::ready(Parameter* p) {  // mu_ held
  auto it = ready_.find(p);
  if (opt_.shard_gradients) {
    if (it == ready_.end()) return;
    const size_t b = bucket_of_.at(p);
    Bucket& bucket = buckets_[b];
    if (bucket.whole) {  // once, by finalize (after the sums over the other group)
      if (!it->second) {
        it->second = true;
        if (--bucket.pending == 0) flush_ready(b);
      }
      return;
    }
    auto prep = prepared_.find(p);
    if (prep != prepared_.end() && prep->second > 0) {
      --prep->second;
      --bucket.outstanding;
    }
    if (!it->second) {
      it->second = true;
      --bucket.pending;
    }
    flush_ready(b);
    return;
  }
  if (it == ready_.end() || it->second) return;
  it->second = true;
  const size_t b = bucket_of_.at(p);
  if (--buckets_[b].pending == 0 && reduces_) launch(b);
}

int64_t GradBuffer::largest_transient_bytes() const {
  int64_t most = 0;
  if (opt_.shard_gradients)
    for (const Bucket& b : buckets_)
      if (!b.whole) most = std::max(most, (b.end - b.begin) * static_cast<int64_t>(sizeof(float)));
  return most;
}

void GradBuffer::flush_ready(size_t bucket) {  // mu_ held
  Bucket& b = buckets_[bucket];
  // Complete: every parameter marked since the last flush, and no deferred weight gradient still to come into
  // this storage (a zero-bubble W may follow the next microbatch's B: then the flush waits and carries both).
  if (b.pending > 0 || b.outstanding > 0 || !b.storage.defined()) return;
  Flush f{bucket, b.storage};
  if (!b.whole) {  // a whole bucket's storage stays its parameters' for the step (reduce-scattered in place)
    b.storage = Tensor();
    for (Parameter* p : b.params) {
      p->grad = Tensor();
      ready_[p] = false;
    }
    b.pending = static_cast<int>(b.params.size());
  }
  ++launched_;
  flushes_.push_back(std::move(f));
  if (on_caller_ || !reduces_) {
    if (error_) return;
    try {
      std::unique_ptr<Work> work = reduce_flush(flushes_.back(), reduces_);
      if (!reduces_) {
        flushes_.pop_back();
        ++done_;
      } else {
        flush_works_.push_back(std::move(work));
        drain_flushes(1);  // one flush in flight beside backward: the earlier ones are added now
      }
    } catch (...) {
      error_ = std::current_exception();
    }
    return;
  }
  cv_.notify_all();
}

std::unique_ptr<Work> GradBuffer::reduce_flush(Flush& f, bool keep) {
  Bucket& b = buckets_[f.bucket];
  const trace::Span span("data-parallel", fmt::format("reduce-scatter {} bucket {}", opt_.name, f.bucket),
                         fmt::format(R"("bucket": {}, "elements": {})", f.bucket, b.end - b.begin));
  const int64_t r = shard_rank();
  Tensor mine = f.storage.slice(r * b.shard, (r + 1) * b.shard);  // in place: block r of the bucket
  if (!reduces_) {
    add(b.accum, mine, b.accum);
    return nullptr;
  }
  std::unique_ptr<Work> work = scatter(f.storage, mine);
  if (keep) return work;
  work->wait();
  add(b.accum, mine, b.accum);
  return nullptr;
}

void GradBuffer::drain_flushes(size_t keep_last) {  // mu_ held, on the caller
  while (flush_works_.size() > keep_last) {
    flush_works_.front()->wait();  // orders the compute stream after the reduce-scatter
    flush_works_.pop_front();
    Flush& f = flushes_.front();
    Bucket& b = buckets_[f.bucket];
    const int64_t r = shard_rank();
    add(b.accum, f.storage.slice(r * b.shard, (r + 1) * b.shard), b.accum);
    flushes_.pop_front();  // the storage goes back to the allocator (a transient one)
    ++done_;
  }
}

void GradBuffer::reduce(size_t bucket, std::vector<std::unique_ptr<Work>>* keep) {
  const Bucket& b = buckets_[bucket];
  const trace::Span span(
      "data-parallel", fmt::format("{} {} bucket {}", opt_.shard ? "reduce-scatter" : "all-reduce", opt_.name, bucket),
      fmt::format(R"("bucket": {}, "elements": {})", bucket, b.end - b.begin));
  Tensor view = flat_.slice(b.begin, b.end);
  std::unique_ptr<Work> work;
  if (opt_.shard) {
    const int64_t r = shard_rank();
    Tensor mine = view.slice(r * b.shard, (r + 1) * b.shard);  // in place: block r of the bucket
    work = scatter(view, mine);
  } else {
    work = dp_->all_reduce(view, ReduceOp::sum);
  }
  if (keep)
    keep->push_back(std::move(work));
  else
    work->wait();
}

std::unique_ptr<Work> GradBuffer::scatter(const Tensor& bucket, Tensor& mine) {
  if (replica_count() > 1) return hybrid_reduce_scatter(*dp_, *opt_.replicas, bucket, mine);
  return dp_->reduce_scatter(bucket, mine);
}

void GradBuffer::launch(size_t bucket) {  // mu_ held
  ++launched_;
  if (on_caller_) {
    if (error_) return;  // the group is unusable after a failure: finalize reports the first error
    try {
      reduce(bucket, &works_);
    } catch (...) {
      error_ = std::current_exception();
    }
    return;
  }
  queue_.push_back(bucket);
  cv_.notify_all();
}

void GradBuffer::finalize() {
  const trace::Span span("data-parallel", fmt::format("finalize {}", opt_.name));
  // Replicas used on sequence shards hold partial gradients (their positions only), and the tied embedding's
  // copies on the first and last stage one part each: summed before their data-parallel buckets start.
  if (sums(opt_.tensor))
    for (Parameter* p : params_)
      if (p->grad_sums.tensor) opt_.tensor->all_reduce(p->grad, ReduceOp::sum)->wait();
  if (embedding_copies_.size() > 1) {  // both copies here: a + b in each, as a two-rank sum gives
    Tensor& first = embedding_copies_[0]->grad;
    for (size_t i = 1; i < embedding_copies_.size(); ++i) add(first, embedding_copies_[i]->grad, first);
    for (size_t i = 1; i < embedding_copies_.size(); ++i) embedding_copies_[i]->grad.copy_from(first);
  }
  if (sums(opt_.embedding))
    for (Parameter* p : params_)
      if (p->grad_sums.embedding) opt_.embedding->all_reduce(p->grad, ReduceOp::sum)->wait();
  std::unique_lock lock(mu_);
  for (size_t i = params_.size(); i-- > 0;) ready(params_[i]);
  if (opt_.shard_gradients) {
    // What no mark completed (whole buckets are launched by the marks above): in backward order, the same on
    // every rank.
    for (size_t b = 0; b < buckets_.size(); ++b)
      if (buckets_[b].storage.defined() && !buckets_[b].whole) {
        buckets_[b].outstanding = 0;
        buckets_[b].pending = 0;
        flush_ready(b);
      }
    if (!reduces_) return;
    if (on_caller_) {
      if (!error_) try {
          drain_flushes(0);
        } catch (...) {
          error_ = std::current_exception();
        }
      flush_works_.clear();
      flushes_.clear();
    } else {
      const CommWaitTimer blocked;
      cv_.wait(lock, [&] { return done_ == launched_; });
    }
    for (Parameter* p : params_)
      if (!buckets_[bucket_of_.at(p)].whole) ready_[p] = false;
    if (error_) std::rethrow_exception(error_);
    return;
  }
  if (!reduces_) return;
  if (on_caller_) {
    for (auto& w : works_) {
      if (error_) break;
      try {
        w->wait();  // orders the compute stream after the bucket; the host does not wait
      } catch (...) {
        error_ = std::current_exception();
      }
    }
    works_.clear();
  } else {
    const CommWaitTimer blocked;
    cv_.wait(lock, [&] { return done_ == buckets_.size(); });
  }
  if (error_) std::rethrow_exception(error_);
}

void GradBuffer::worker() {
  trace::name_thread(fmt::format("{} reducer", opt_.name));
  for (;;) {
    size_t b = 0;
    Flush flush{};
    bool failed_before;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty() || !flushes_.empty(); });
      if (queue_.empty() && flushes_.empty()) return;
      if (opt_.shard_gradients) {
        flush = std::move(flushes_.front());
        flushes_.pop_front();
        cv_.notify_all();  // a backward waiting for room (mark_ready) goes on
      } else {
        b = queue_.front();
        queue_.pop_front();
      }
      failed_before = error_ != nullptr;
    }
    std::exception_ptr failure;
    if (!failed_before) {  // after a failure the group is unusable: finish quickly, report the first error
      try {
        if (opt_.shard_gradients)
          reduce_flush(flush, false);
        else
          reduce(b, nullptr);
      } catch (...) {
        failure = std::current_exception();
      }
    }
    flush.storage = Tensor();  // a transient bucket goes back to the allocator
    {
      std::lock_guard lock(mu_);
      if (failure && !error_) error_ = failure;
      ++done_;
    }
    cv_.notify_all();
  }
}

}  // namespace mt
