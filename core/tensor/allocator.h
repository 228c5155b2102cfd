// allocator.h: device memory with per-kind accounting (current and peak bytes), so peak memory is measurable.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/base/enum_names.h"

namespace mt {

// meta: shapes and sizes without values, ops counted and not computed (core/meta/meta.h; the planner's device).
enum class Device : uint8_t { cpu, cuda, meta };
template <>
struct EnumNames<Device> {
  static constexpr std::array<const char*, 3> names = {"cpu", "cuda", "meta"};
};
std::string_view device_name(Device d);

// What a buffer is for; memory reports break peaks down by these.
// gathered: ZeRO-3's whole parameters of a unit, gathered around its forward and backward
// (parallel/sharding/sharded_parameters.h).
// host: the host pool of a device run, apart from the device's: the optimizer offload's masters, moments and
// staging (core/optim/host_offload.h), pinned (cudaHostAlloc) in a CUDA build with a GPU. Always Device::cpu
// memory; it is left out of the device totals (current_total, peak_total) and counted in host_current/host_peak,
// so a CPU run keeps its device and host pools apart in the accounting as a GPU run does.
enum class MemKind : uint8_t { parameter, gradient, optimizer, activation, workspace, gathered, host, kCount };
template <>
struct EnumNames<MemKind> {  // the log's and metrics.jsonl's names (kCount has none)
  static constexpr std::array<const char*, 7> names = {"parameters", "gradients", "optimizer", "activations",
                                                       "workspace",  "gathered",  "host"};
};
std::string_view mem_kind_name(MemKind k);
// Where the host pool of a run on device d lives: the CPU's memory, except for a meta run (core/meta/meta.h), whose
// host pool is counted on the meta device like everything else it holds.
constexpr Device host_of(Device d) { return d == Device::meta ? Device::meta : Device::cpu; }
// Whether bytes of kind k count in the device totals (every kind but host).
constexpr bool is_device_kind(MemKind k) { return k != MemKind::host; }

struct MemoryStats {
  static constexpr size_t kKinds = static_cast<size_t>(MemKind::kCount);
  std::array<int64_t, kKinds> current{};  // bytes live now, per kind
  std::array<int64_t, kKinds> peak{};     // highest bytes live at once, per kind
  int64_t current_total = 0;
  int64_t peak_total = 0;                   // highest total bytes live at once (the device kinds: MemKind::host apart)
  int64_t host_current = 0, host_peak = 0;  // MemKind::host
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes, MemKind kind) = 0;
  virtual void deallocate(void* ptr, size_t bytes, MemKind kind) = 0;
  virtual Device device() const = 0;
  const MemoryStats& stats() const { return stats_; }
  void reset_peaks();

 protected:
  void record_alloc(size_t bytes, MemKind kind);
  void record_free(size_t bytes, MemKind kind);
  MemoryStats stats_;
};

// The process's allocator for a device (the CPU one always exists).
Allocator& allocator_for(Device d);

}  // namespace mt
