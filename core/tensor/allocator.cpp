#include "core/tensor/allocator.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <new>
#include <stdexcept>

#include "core/tensor/backend.h"

namespace mt {

std::string_view device_name(Device d) { return name_of(d); }

std::string_view mem_kind_name(MemKind k) { return k == MemKind::kCount ? "?" : name_of(k); }

void Allocator::reset_peaks() {
  stats_.peak = stats_.current;
  stats_.peak_total = stats_.current_total;
  stats_.host_peak = stats_.host_current;
}

void Allocator::record_alloc(size_t bytes, MemKind kind) {
  auto k = static_cast<size_t>(kind);
  stats_.current[k] += static_cast<int64_t>(bytes);
  stats_.peak[k] = std::max(stats_.peak[k], stats_.current[k]);
  int64_t& current = is_device_kind(kind) ? stats_.current_total : stats_.host_current;
  int64_t& peak = is_device_kind(kind) ? stats_.peak_total : stats_.host_peak;
  current += static_cast<int64_t>(bytes);
  peak = std::max(peak, current);
}

void Allocator::record_free(size_t bytes, MemKind kind) {
  stats_.current[static_cast<size_t>(kind)] -= static_cast<int64_t>(bytes);
  (is_device_kind(kind) ? stats_.current_total : stats_.host_current) -= static_cast<int64_t>(bytes);
}

namespace {

// The runtime that pins MemKind::host memory: that of a GPU build on a machine with a GPU, else null (decided once,
// so that every buffer is freed as it was allocated).
DeviceRuntime* host_pinner() {
  static DeviceRuntime* const pinner = [] {
    DeviceRuntime* rt = find_runtime(Device::cuda);
    return rt && rt->device_count() > 0 ? rt : nullptr;
  }();
  return pinner;
}

// 64-byte aligned host memory (MemKind::host pinned where host_pinner() says). Ranks run as threads in unit tests,
// so accounting is locked.
class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes, MemKind kind) override {
    size_t rounded = std::max<size_t>(64, (bytes + 63) / 64 * 64);
    void* p = nullptr;
    if (kind == MemKind::host && host_pinner()) p = host_pinner()->alloc_pinned(rounded);  // page-aligned
    if (!p) p = std::aligned_alloc(64, rounded);
    if (!p) throw std::bad_alloc();
    std::lock_guard lock(mu_);
    record_alloc(bytes, kind);
    return p;
  }
  void deallocate(void* ptr, size_t bytes, MemKind kind) override {
    if (kind == MemKind::host && host_pinner())
      host_pinner()->free_pinned(ptr);
    else
      std::free(ptr);
    std::lock_guard lock(mu_);
    record_free(bytes, kind);
  }
  Device device() const override { return Device::cpu; }

 private:
  std::mutex mu_;
};

}  // namespace

Allocator& allocator_for(Device d) {
  static CpuAllocator cpu;
  if (d == Device::cpu) return cpu;
  return device_runtime(d, "allocator_for").allocator();
}

}  // namespace mt
