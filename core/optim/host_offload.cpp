#include "core/optim/host_offload.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "core/tensor/backend.h"

namespace mt {

namespace {

// At most opt.chunk_elements, and a quarter of the state at most, so that every state has chunks to overlap.
int64_t chunk_of(int64_t n, const OffloadOptions& opt) {
  return std::max<int64_t>(1, std::min((n + 3) / 4, opt.chunk_elements));
}

// Below this many elements a chunk's update is not split over threads (a thread's hand-off costs more).
constexpr int64_t kMinPerThread = 16384;

}  // namespace

int64_t offload_host_bytes(int64_t n, DType value_dtype, const OffloadOptions& opt) {
  if (!opt.enabled || n == 0) return 0;
  const int64_t chunk = chunk_of(n, opt);
  const int64_t staged = value_dtype == DType::f32 ? 4 : 4 + static_cast<int64_t>(dtype_size(value_dtype));
  return 12 * n + 2 * chunk * staged;
}

// Host <-> device copies: on CUDA enqueued on a side stream, ordered against the compute stream and the host by
// events (two for the gradients' chunks, two for the values', one to meet the compute stream); on the CPU plain
// copies, done when they return.
class HostOffload::Copies {
 public:
  static constexpr int kGrads = 0, kValues = 2, kMeet = 4;
  explicit Copies(Device device) : rt_(find_runtime(device)) {
    if (rt_) {
      stream_ = rt_->create_copy_stream();
      for (void*& e : events_) e = rt_->create_sync_event();
    }
  }
  ~Copies() {
    if (rt_) {
      for (void* e : events_) rt_->destroy_sync_event(e);
      rt_->destroy_copy_stream(stream_);
    }
  }
  // The copies issued from here on follow the compute stream's work so far.
  void after_compute() { order(nullptr, stream_); }
  // The compute stream's work from here on follows the copies issued so far.
  void before_compute() { order(stream_, nullptr); }
  void copy(void* dst, const void* src, size_t bytes) {
    if (rt_) return rt_->copy_async(dst, src, bytes, stream_);
    std::memcpy(dst, src, bytes);
  }
  // Event e marks the copies issued so far; wait(e) blocks the host until they have landed.
  void mark(int e) {
    if (rt_) rt_->record_event(events_[e], stream_);
  }
  void wait(int e) {
    if (rt_) rt_->wait_event(events_[e]);
  }

 private:
  // Work enqueued on stream `later` from here on waits for the work enqueued on `earlier` so far (null: the compute
  // stream).
  void order(void* earlier, void* later) {
    if (rt_) {
      rt_->record_event(events_[kMeet], earlier);
      rt_->stream_wait_event(later, events_[kMeet]);
    }
  }
  DeviceRuntime* rt_;  // the device's runtime; null on the host, where copies are plain
  void* stream_ = nullptr;
  void* events_[5] = {};
};

// Threads that run parts of a chunk's update; part 0 runs on the caller.
class HostOffload::Workers {
 public:
  explicit Workers(int threads) {
    for (int i = 1; i < threads; ++i) threads_.emplace_back([this, i] { loop(i); });
  }
  ~Workers() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
      ++generation_;
    }
    wake_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  int size() const { return static_cast<int>(threads_.size()) + 1; }
  // fn(i) for every part i < parts (at most size()), on as many threads; rethrows the first failure.
  void run(int parts, const std::function<void(int)>& fn) {
    if (parts <= 1) return fn(0);
    {
      std::lock_guard lock(mu_);
      fn_ = &fn;
      parts_ = parts;
      pending_ = static_cast<int>(threads_.size());
      error_ = nullptr;
      ++generation_;
    }
    wake_.notify_all();
    std::exception_ptr mine;
    try {
      fn(0);
    } catch (...) {
      mine = std::current_exception();
    }
    std::unique_lock lock(mu_);
    done_.wait(lock, [this] { return pending_ == 0; });
    if (mine) std::rethrow_exception(mine);
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void loop(int i) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int)>* fn = nullptr;
      int parts = 0;
      {
        std::unique_lock lock(mu_);
        wake_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        if (stop_) return;
        fn = fn_;
        parts = parts_;
      }
      std::exception_ptr error;
      if (i < parts) try {
          (*fn)(i);
        } catch (...) {
          error = std::current_exception();
        }
      std::lock_guard lock(mu_);
      if (error && !error_) error_ = error;
      if (--pending_ == 0) done_.notify_one();
    }
  }
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  uint64_t generation_ = 0;
  bool stop_ = false;
  const std::function<void(int)>* fn_ = nullptr;
  int parts_ = 0, pending_ = 0;
  std::exception_ptr error_;
};

HostOffload::HostOffload(int64_t n, std::vector<Segment> segments, DType value_dtype, Device device, OffloadOptions opt)
    : n_(n), segments_(std::move(segments)), value_dtype_(value_dtype), device_(device), opt_(opt),
      chunk_(chunk_of(n, opt)) {
  int64_t at = 0;
  for (const Segment& s : segments_) {
    if (s.begin < at || s.end < s.begin || s.end > n_)
      throw std::logic_error(
          fmt::format("host offload: segment [{}, {}) out of order or outside the state of {}", s.begin, s.end, n_));
    at = s.end;
  }
  master_ = Tensor::zeros({n_}, DType::f32, host_of(device_), MemKind::host);
  exp_avg_ = Tensor::zeros({n_}, DType::f32, host_of(device_), MemKind::host);
  exp_avg_sq_ = Tensor::zeros({n_}, DType::f32, host_of(device_), MemKind::host);
  for (int i = 0; i < 2; ++i) {
    grad_staging_[i] = Tensor::empty({chunk_}, DType::f32, host_of(device_), MemKind::host);
    if (value_dtype_ != DType::f32)
      value_staging_[i] = Tensor::empty({chunk_}, value_dtype_, host_of(device_), MemKind::host);
  }
  copies_ = std::make_unique<Copies>(device_);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  workers_ = std::make_unique<Workers>(std::max(1, opt_.threads > 0 ? opt_.threads : cores));
}

HostOffload::~HostOffload() = default;

std::vector<HostOffload::Piece> HostOffload::pieces_of(int64_t chunk_begin, int64_t chunk_end) const {
  std::vector<Piece> out;
  auto it = std::lower_bound(segments_.begin(), segments_.end(), chunk_begin,
                             [](const Segment& s, int64_t x) { return s.end <= x; });
  for (; it != segments_.end() && it->begin < chunk_end; ++it) {
    const int64_t b = std::max(it->begin, chunk_begin), e = std::min(it->end, chunk_end);
    if (b < e) out.push_back({static_cast<size_t>(it - segments_.begin()), b, e});
  }
  return out;
}

namespace {

// Copies whose source and destination both continue the previous one's are issued as one.
class CoalescedCopies {
 public:
  explicit CoalescedCopies(const std::function<void(void*, const void*, size_t)>& copy) : copy_(copy) {}
  ~CoalescedCopies() = default;
  void add(void* dst, const void* src, size_t bytes) {
    if (bytes_ > 0 && static_cast<char*>(dst) == dst_ + bytes_ && static_cast<const char*>(src) == src_ + bytes_) {
      bytes_ += bytes;
      return;
    }
    flush();
    dst_ = static_cast<char*>(dst);
    src_ = static_cast<const char*>(src);
    bytes_ = bytes;
  }
  void flush() {
    if (bytes_ > 0) copy_(dst_, src_, bytes_);
    bytes_ = 0;
  }

 private:
  const std::function<void(void*, const void*, size_t)>& copy_;
  char* dst_ = nullptr;
  const char* src_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace

void HostOffload::update_chunk(int64_t chunk_begin, const std::vector<Piece>& pieces, const Tensor& grads,
                               const Tensor& values, const AdamWOptions& opt) {
  if (pieces.empty()) return;
  const int64_t lo = pieces.front().begin, hi = pieces.back().end;
  const int parts = static_cast<int>(std::clamp<int64_t>((hi - lo) / kMinPerThread, 1, workers_->size()));
  workers_->run(parts, [&](int part) {
    // This part's elements of the chunk: [from, to), cut anywhere (the update is the same element by element).
    const int64_t from = lo + (hi - lo) * part / parts, to = lo + (hi - lo) * (part + 1) / parts;
    std::vector<AdamWTensors> ts;
    for (const Piece& p : pieces) {
      const int64_t b = std::max(p.begin, from), e = std::min(p.end, to);
      if (b >= e) continue;
      ts.push_back({.master = master_.slice(b, e),
                    .grad = grads.slice(b - chunk_begin, e - chunk_begin),
                    .exp_avg = exp_avg_.slice(b, e),
                    .exp_avg_sq = exp_avg_sq_.slice(b, e),
                    .value = values.defined() ? values.slice(b - chunk_begin, e - chunk_begin) : Tensor(),
                    .decay = segments_[p.segment].decay});
    }
    adamw_multi_step(ts, opt);  // host tensors: the CPU backend's
  });
}

void HostOffload::step(const AdamWOptions& opt, const std::vector<Tensor>& grads, const std::vector<Tensor>& values) {
  if (grads.size() != segments_.size() || values.size() != segments_.size())
    throw std::logic_error(fmt::format("host offload: {} gradients and {} values for {} segments", grads.size(),
                                       values.size(), segments_.size()));
  for (size_t i = 0; i < segments_.size(); ++i) {
    const int64_t n = segments_[i].end - segments_[i].begin;
    if (grads[i].numel() != n || grads[i].dtype() != DType::f32 || grads[i].device() != device_ ||
        values[i].numel() != n || values[i].dtype() != value_dtype_ || values[i].device() != device_)
      throw std::logic_error(
          fmt::format("host offload: segment {} ({} elements, values {} on {}) got gradient {} "
                      "on {} and value {} on {}",
                      i, n, dtype_name(value_dtype_), device_name(device_), grads[i].describe(),
                      device_name(grads[i].device()), values[i].describe(), device_name(values[i].device())));
  }
  if (n_ == 0) return;
  const int64_t chunks = (n_ + chunk_ - 1) / chunk_;
  const size_t value_size = dtype_size(value_dtype_);
  const bool staged = value_dtype_ != DType::f32;
  const std::function<void(void*, const void*, size_t)> copy = [this](void* d, const void* s, size_t b) {
    copies_->copy(d, s, b);
  };
  std::vector<std::vector<Piece>> pieces(static_cast<size_t>(chunks));
  for (int64_t k = 0; k < chunks; ++k)
    pieces[static_cast<size_t>(k)] = pieces_of(k * chunk_, std::min(n_, (k + 1) * chunk_));
  auto grads_to_host = [&](int64_t k) {
    const Tensor& staging = grad_staging_[k % 2];
    CoalescedCopies run(copy);
    for (const Piece& p : pieces[static_cast<size_t>(k)]) {
      const Segment& s = segments_[p.segment];
      run.add(staging.data<float>() + (p.begin - k * chunk_),
              static_cast<const char*>(grads[p.segment].raw()) + 4 * (p.begin - s.begin), 4 * (p.end - p.begin));
    }
    run.flush();
    copies_->mark(Copies::kGrads + static_cast<int>(k % 2));
  };
  auto values_to_device = [&](int64_t k) {
    CoalescedCopies run(copy);
    for (const Piece& p : pieces[static_cast<size_t>(k)]) {
      const Segment& s = segments_[p.segment];
      const char* src =
          staged ? static_cast<const char*>(value_staging_[k % 2].raw()) + value_size * (p.begin - k * chunk_)
                 : static_cast<const char*>(master_.raw()) + 4 * p.begin;
      run.add(static_cast<char*>(values[p.segment].raw()) + value_size * (p.begin - s.begin), src,
              value_size * (p.end - p.begin));
    }
    run.flush();
    copies_->mark(Copies::kValues + static_cast<int>(k % 2));
  };
  // Chunk k + 1's gradients travel while the host updates chunk k; chunk k's values travel while it updates k + 1.
  // Staging slot k % 2 is free again once chunk k - 2's update has read it (the gradients: the host is past it) and
  // its values have landed (waited for below). Across steps the stream's order keeps the slots apart: the next
  // step's gradients are copied after this step's values.
  copies_->after_compute();
  grads_to_host(0);
  for (int64_t k = 0; k < chunks; ++k) {
    if (k + 1 < chunks) grads_to_host(k + 1);
    copies_->wait(Copies::kGrads + static_cast<int>(k % 2));
    if (staged && k >= 2) copies_->wait(Copies::kValues + static_cast<int>(k % 2));
    update_chunk(k * chunk_, pieces[static_cast<size_t>(k)], grad_staging_[k % 2],
                 staged ? value_staging_[k % 2] : Tensor(), opt);
    values_to_device(k);
  }
  copies_->before_compute();
}

}  // namespace mt
