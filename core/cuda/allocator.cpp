// allocator.cpp: the caching device allocator. cudaMalloc and cudaFree synchronise the device, so blocks
// freed by tensors are kept and handed out again; after the first iteration a training loop that allocates
// the same shapes every iteration never reaches the driver (cache_stats().device_mallocs stops growing).
//
// Streams: kernels run on the one compute stream, so a block freed on the host can be reused at once by later
// compute work: it runs after the work that last used the block. A block that another stream used
// (communication: record_stream) is different: when it is freed, an event is recorded on each such stream and
// the block waits in `pending_` until those events have completed before it is cached again, so an NCCL
// transfer still reading or writing it never races with its next owner (PyTorch's recordStream rule).
//
// Sizes are rounded (512 B below 1 MiB, 2 MiB above) and a request is served by the smallest cached block
// of at least its rounded size and at most twice it, so a reused block never wastes more than half itself. When cudaMalloc fails, the cache is emptied and
// the call retried once; a second failure throws with the numbers a user needs.
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <new>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "core/cuda/cuda_check.h"

namespace mt::cuda {

namespace {

constexpr size_t kSmall = 1 << 20;  // requests below this are rounded to 512 B
constexpr size_t kSmallRound = 512;
constexpr size_t kLargeRound = 2 << 20;

size_t round_size(size_t bytes) {
  if (bytes == 0) bytes = 1;
  const size_t r = bytes < kSmall ? kSmallRound : kLargeRound;
  return (bytes + r - 1) / r * r;
}

std::string gib(int64_t bytes) { return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / (1 << 30)); }

class CachingAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes, MemKind kind) override {
    const size_t size = round_size(bytes);
    std::lock_guard lock(mu_);
    reclaim_pending(false);
    void* ptr = nullptr;
    // The smallest cached block that fits, if it is at most twice the request.
    auto it = free_.lower_bound(size);
    if (it != free_.end() && it->first <= 2 * size) {
      ptr = it->second;
      live_[ptr] = Block{.size = it->first};
      free_.erase(it);
      ++stats_cache_.cache_hits;
    } else {
      ptr = device_malloc(size);
      live_[ptr] = Block{.size = size};
    }
    record_alloc(bytes, kind);
    return ptr;
  }

  void deallocate(void* ptr, size_t bytes, MemKind kind) override {
    std::lock_guard lock(mu_);
    auto it = live_.find(ptr);
    if (it == live_.end()) return;  // not ours: nothing to give back (never happens for Storage)
    if (it->second.streams.empty()) {
      free_.emplace(it->second.size, ptr);
    } else {
      Pending p{.ptr = ptr, .size = it->second.size};
      for (cudaStream_t s : it->second.streams) {
        cudaEvent_t e = take_event();
        MT_CUDA_CHECK(cudaEventRecord(e, s));
        p.events.push_back(e);
      }
      pending_.push_back(std::move(p));
    }
    live_.erase(it);
    record_free(bytes, kind);
  }

  void record_stream(const void* ptr, cudaStream_t s) {
    std::lock_guard lock(mu_);
    // The block holding ptr: the last one starting at or before it, if ptr lies inside it.
    auto it = live_.upper_bound(const_cast<void*>(ptr));
    if (it == live_.begin()) return;
    --it;
    if (static_cast<const char*>(ptr) >= static_cast<const char*>(it->first) + it->second.size) return;
    if (s == stream()) return;  // the compute stream needs no record: its work is ordered already
    auto& streams = it->second.streams;
    if (std::find(streams.begin(), streams.end(), s) == streams.end()) streams.push_back(s);
  }

  Device device() const override { return Device::cuda; }

  CacheStats cache_stats() {
    std::lock_guard lock(mu_);
    CacheStats c = stats_cache_;
    c.pending_blocks = static_cast<int64_t>(pending_.size());
    return c;
  }

  void empty_cache() {
    std::lock_guard lock(mu_);
    release_cached();
  }

 private:
  void* device_malloc(size_t size) {
    current_device();  // select the device (and make its stream) before the first allocation
    void* ptr = nullptr;
    cudaError_t status = cudaMalloc(&ptr, size);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      release_cached();
      status = cudaMalloc(&ptr, size);
    }
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      size_t free_bytes = 0, total_bytes = 0;
      cudaMemGetInfo(&free_bytes, &total_bytes);
      throw std::runtime_error(fmt::format(
          "CUDA out of memory: asked for {} more with {} in use by tensors and {} reserved; the device has {} "
          "free of {} (peaks by kind are in the log; try a smaller micro_batch_size, recompute: full, more "
          "tensor or pipeline parallelism, or use_distributed_optimizer)",
          gib(static_cast<int64_t>(size)), gib(stats().current_total), gib(stats_cache_.reserved_bytes),
          gib(static_cast<int64_t>(free_bytes)), gib(static_cast<int64_t>(total_bytes))));
    }
    MT_CUDA_CHECK(status);
    ++stats_cache_.device_mallocs;
    stats_cache_.reserved_bytes += static_cast<int64_t>(size);
    stats_cache_.peak_reserved_bytes = std::max(stats_cache_.peak_reserved_bytes, stats_cache_.reserved_bytes);
    return ptr;
  }

  struct Block {
    size_t size = 0;                    // rounded
    std::vector<cudaStream_t> streams;  // streams other than the compute stream that used it (record_stream)
  };
  struct Pending {  // freed, waiting for the work of other streams that used it
    void* ptr = nullptr;
    size_t size = 0;
    std::vector<cudaEvent_t> events;
  };

  cudaEvent_t take_event() {
    if (!spare_events_.empty()) {
      cudaEvent_t e = spare_events_.back();
      spare_events_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    MT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }

  // Caches the pending blocks whose streams are done with them (all of them, waiting, when `wait`).
  void reclaim_pending(bool wait) {
    for (auto it = pending_.begin(); it != pending_.end();) {
      bool done = true;
      for (cudaEvent_t e : it->events) {
        cudaError_t q = wait ? cudaEventSynchronize(e) : cudaEventQuery(e);
        if (q == cudaErrorNotReady) {
          done = false;
          break;
        }
        MT_CUDA_CHECK(q);
      }
      if (!done) {
        ++it;
        continue;
      }
      for (cudaEvent_t e : it->events) spare_events_.push_back(e);
      free_.emplace(it->size, it->ptr);
      it = pending_.erase(it);
    }
  }

  // Gives every cached block back; waits for the compute stream (and the streams of pending blocks) first,
  // since freed blocks may still be in use by enqueued work.
  void release_cached() {
    reclaim_pending(true);
    if (free_.empty()) return;
    synchronize();
    for (auto& [size, ptr] : free_) {
      MT_CUDA_CHECK(cudaFree(ptr));
      stats_cache_.reserved_bytes -= static_cast<int64_t>(size);
    }
    free_.clear();
  }

  std::mutex mu_;
  std::multimap<size_t, void*> free_;  // cached blocks by size
  std::map<void*, Block> live_;        // handed-out blocks by address (record_stream finds inner pointers)
  std::vector<Pending> pending_;
  std::vector<cudaEvent_t> spare_events_;
  CacheStats stats_cache_;
};

CachingAllocator& instance() {
  // Never destroyed: tensors held by static objects may be freed after main returns, when the CUDA runtime
  // is already shutting down; the driver reclaims the memory with the process.
  static CachingAllocator* a = new CachingAllocator();
  return *a;
}

}  // namespace

Allocator& caching_allocator() { return instance(); }
void record_stream(const void* ptr, void* stream) { instance().record_stream(ptr, static_cast<cudaStream_t>(stream)); }
CacheStats cache_stats() { return instance().cache_stats(); }
void empty_cache() { instance().empty_cache(); }

}  // namespace mt::cuda
