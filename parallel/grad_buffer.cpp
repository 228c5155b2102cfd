#include "parallel/grad_buffer.h"

#include <fmt/format.h>

#include "core/tensor/ops.h"
#include "core/tensor/trace.h"

namespace mt {

namespace {

bool sums(const Communicator* group) { return group && group->size() > 1; }

}  // namespace

GradBuffer::GradBuffer(std::vector<Parameter*> params, Device device, std::unique_ptr<Communicator> dp,
                       GradBufferOptions opt)
    : params_(std::move(params)), opt_(opt), dp_(std::move(dp)), reduces_(sums(dp_.get())) {
  if (opt_.bucket_elements < 1)
    throw std::invalid_argument(fmt::format("gradient buffer: bucket size {} must be positive", opt_.bucket_elements));
  for (Parameter* p : params_)
    if (p->grad_sums.embedding) embedding_copies_.push_back(p);
  // Whole parameters in reverse order (the last layers' gradients are final first).
  int64_t in_bucket = 0;
  for (size_t i = params_.size(); i-- > 0;) {
    if (in_bucket == 0) buckets_.emplace_back();
    Bucket& b = buckets_.back();
    b.params.insert(b.params.begin(), params_[i]);
    bucket_of_[params_[i]] = buckets_.size() - 1;
    in_bucket += params_[i]->value.numel();
    if (in_bucket >= opt_.bucket_elements) in_bucket = 0;
  }
  // The buffer holds the parameters in their order, so the first bucket in buffer order is the last built.
  const int64_t n = dp_size();
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
    bucket.shard = opt_.shard ? (bucket.end - bucket.begin) / n : 0;
  }
  flat_ = Tensor::zeros({offset}, DType::f32, device, MemKind::gradient);
  for (Parameter* p : params_) {
    const int64_t o = offset_.at(p);
    p->grad = flat_.slice(o, o + p->value.numel()).view(p->value.shape());
    ready_[p] = false;
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

void GradBuffer::begin_step() {
  std::lock_guard lock(mu_);
  flat_.zero_();
  for (auto& [p, r] : ready_) r = false;
  for (Bucket& b : buckets_) b.pending = static_cast<int>(b.params.size());
  launched_ = done_ = 0;
  error_ = nullptr;
  works_.clear();
}

bool GradBuffer::sums_elsewhere(const Parameter* p) const {
  return (p->grad_sums.tensor && sums(opt_.tensor)) ||
         (p->grad_sums.embedding && (sums(opt_.embedding) || embedding_copies_.size() > 1));
}

void GradBuffer::mark_ready(const std::vector<Parameter*>& params) {
  std::lock_guard lock(mu_);
  for (Parameter* p : params)
    if (!sums_elsewhere(p)) ready(p);
}

void GradBuffer::ready(Parameter* p) {  // mu_ held
  auto it = ready_.find(p);
  if (it == ready_.end() || it->second) return;
  it->second = true;
  const size_t b = bucket_of_.at(p);
  if (--buckets_[b].pending == 0 && reduces_) launch(b);
}

void GradBuffer::reduce(size_t bucket, std::vector<std::unique_ptr<Work>>* keep) {
  const Bucket& b = buckets_[bucket];
  const trace::Span span(
      "data-parallel", fmt::format("{} {} bucket {}", opt_.shard ? "reduce-scatter" : "all-reduce", opt_.name, bucket),
      fmt::format(R"("bucket": {}, "elements": {})", bucket, b.end - b.begin));
  Tensor view = flat_.slice(b.begin, b.end);
  std::unique_ptr<Work> work;
  if (opt_.shard) {
    const int64_t r = dp_->rank();
    Tensor mine = view.slice(r * b.shard, (r + 1) * b.shard);  // in place: block r of the bucket
    work = dp_->reduce_scatter(view, mine);
  } else {
    work = dp_->all_reduce(view, ReduceOp::sum);
  }
  if (keep)
    keep->push_back(std::move(work));
  else
    work->wait();
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
    cv_.wait(lock, [&] { return done_ == buckets_.size(); });
  }
  if (error_) std::rethrow_exception(error_);
}

void GradBuffer::worker() {
  trace::name_thread(fmt::format("{} reducer", opt_.name));
  for (;;) {
    size_t b;
    bool failed_before;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      b = queue_.front();
      queue_.pop_front();
      failed_before = error_ != nullptr;
    }
    std::exception_ptr failure;
    if (!failed_before) {  // after a failure the group is unusable: finish quickly, report the first error
      try {
        reduce(b, nullptr);
      } catch (...) {
        failure = std::current_exception();
      }
    }
    {
      std::lock_guard lock(mu_);
      if (failure && !error_) error_ = failure;
      ++done_;
    }
    cv_.notify_all();
  }
}

}  // namespace mt
