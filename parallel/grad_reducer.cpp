#include "parallel/grad_reducer.h"

namespace mt {

BucketedGradReducer::BucketedGradReducer(std::vector<Parameter*> params, Tensor flat_grads,
                                         std::unique_ptr<Communicator> comm, int64_t bucket_elements)
    : params_(params), flat_(std::move(flat_grads)), comm_(std::move(comm)),
      on_caller_(!comm_->collectives_block_caller()) {
  std::vector<int64_t> offsets;
  int64_t offset = 0;
  for (Parameter* p : params) {
    offsets.push_back(offset);
    offset += p->grad.numel();
  }
  // Reverse order: the last layers' gradients are final first.
  Bucket current;
  current.end = offset;
  current.begin = offset;
  for (size_t i = params.size(); i-- > 0;) {
    current.begin = offsets[i];
    ++current.size;
    bucket_of_[params[i]] = buckets_.size();
    if (current.end - current.begin >= bucket_elements || i == 0) {
      buckets_.push_back(current);
      current = Bucket{.begin = current.begin, .end = current.begin};
    }
  }
  for (Parameter* p : params) ready_[p] = false;
  if (!on_caller_) thread_ = std::thread([this] { worker(); });
}

BucketedGradReducer::~BucketedGradReducer() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void BucketedGradReducer::begin_step() {
  std::lock_guard lock(mu_);
  for (auto& [p, r] : ready_) r = false;
  for (Bucket& b : buckets_) b.pending = b.size;
  launched_ = done_ = 0;
  error_ = nullptr;
  works_.clear();
}

void BucketedGradReducer::mark_ready(const std::vector<Parameter*>& params) {
  std::lock_guard lock(mu_);
  for (Parameter* p : params) {
    auto it = ready_.find(p);
    if (it == ready_.end() || it->second) continue;
    it->second = true;
    const size_t b = bucket_of_.at(p);
    if (--buckets_[b].pending == 0) launch(b);
  }
}

void BucketedGradReducer::launch(size_t bucket) {  // mu_ held
  ++launched_;
  if (on_caller_) {
    if (error_) return;  // the group is unusable after a failure: finish_step reports the first error
    try {
      Tensor view = bucket_view(bucket);
      works_.push_back(comm_->all_reduce(view, ReduceOp::sum));
    } catch (...) {
      error_ = std::current_exception();
    }
    return;
  }
  queue_.push_back(bucket);
  cv_.notify_all();
}

void BucketedGradReducer::finish_step() {
  std::unique_lock lock(mu_);
  for (size_t i = params_.size(); i-- > 0;) {
    bool& r = ready_.at(params_[i]);
    if (r) continue;
    r = true;
    const size_t b = bucket_of_.at(params_[i]);
    if (--buckets_[b].pending == 0) launch(b);
  }
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

void BucketedGradReducer::worker() {
  for (;;) {
    size_t b;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      b = queue_.front();
      queue_.pop_front();
    }
    std::exception_ptr failure;
    bool failed_before;
    {
      std::lock_guard lock(mu_);
      failed_before = error_ != nullptr;
    }
    if (!failed_before) {  // after a failure the group is unusable: finish quickly, report the first error
      try {
        Tensor view = bucket_view(b);
        comm_->all_reduce(view, ReduceOp::sum)->wait();
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
