// backend.h: the device backends behind a table. Each device registers its op table (BackendOps, one function
// pointer per line of core/tensor/backend_ops.inc) and, when it is not the host, its runtime (DeviceRuntime:
// devices, streams and events, host <-> device copies, memory). The op entry points (core/tensor/ops*.cpp) check
// their arguments and call backend(device, op).name(...); the tensor, the allocator, the profiler, the optimizer
// offload, the config rules and app/ reach a device through its runtime. So nothing outside core/cuda/ and the
// registry (core/tensor/backend_registry.cpp, the one place that knows which backends this build has) asks whether
// CUDA was built, and core/tensor includes no backend's header.
//
// The backends are peers: core/cpu/ registers the CPU table (cpu::register_backend, core/cpu/backend_cpu.cpp; the
// CPU is the host and has no runtime), core/cuda/ the CUDA table and runtime when the toolkit was found at build
// time (cuda::register_backend, core/cuda/backend_cuda.cpp), and core/meta/ the meta device's (shapes checked by the
// entry points, bytes and FLOPs counted, nothing computed; its runtime's allocator counts what a real one would
// hold: meta::register_backend, core/meta/backend_meta.cpp), always.
#pragma once
#include <string>
#include <vector>

#include "core/base/dtype.h"
#include "core/tensor/allocator.h"
#include "core/tensor/ops.h"

namespace mt {

// The op table of one device: every op of backend_ops.inc, arguments checked by the caller.
struct BackendOps {
#define MT_BACKEND_OP(name, params) void(*name) params = nullptr;
#include "core/tensor/backend_ops.inc"
#undef MT_BACKEND_OP
};

// A library a device's backend loads, for `megatrain info`: "cudnn: 9.19.0 (built against 9.19.0)".
struct RuntimeLibrary {
  std::string name;
  std::string status;
  bool usable = true;  // false: no device of this kind can train without it
};

// A device other than the host, as the rest of megatrain sees it. Handles (streams, events) are opaque; a null
// stream is the device's compute stream, on which every op is enqueued.
class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;

  // ---- devices ----
  // Devices visible to this process; 0 when there is no driver or no device (never throws).
  virtual int device_count() const noexcept = 0;
  // Why device_count() is 0.
  virtual std::string unavailable_reason() const = 0;
  // Makes `ordinal` this process's device and creates its compute stream. Throws when it does not exist.
  virtual void select_device(int ordinal) = 0;
  // "NVIDIA H100 80GB HBM3, sm_90, 79.2 GiB, driver 13.0"
  virtual std::string device_description() const = 0;
  // Dense bf16 peak TFLOP/s of the selected device for MFU, 0 when unknown.
  virtual double peak_bf16_tflops() const = 0;
  // The libraries the backend loads and their state.
  virtual std::vector<RuntimeLibrary> libraries() const = 0;
  // Which attention training runs for this dtype and dropout, and why; throws when a forced choice cannot run.
  virtual std::string attention_description(DType dtype, float dropout_p) const = 0;

  // ---- streams and events ----
  // Blocks until everything enqueued on the compute stream has finished; throws on an asynchronous error.
  virtual void synchronize() = 0;
  // Timing events (the op profiler): recorded on the compute stream; elapsed_ms waits for `end`.
  virtual void* create_timing_event() = 0;
  virtual void record_timing_event(void* event) = 0;
  virtual float elapsed_ms(void* start, void* end) = 0;
  virtual void destroy_timing_event(void* event) noexcept = 0;
  // A stream of its own for host <-> device copies, and events without timing to order streams and the host.
  virtual void* create_copy_stream() = 0;
  virtual void destroy_copy_stream(void* stream) noexcept = 0;
  virtual void* create_sync_event() = 0;
  virtual void destroy_sync_event(void* event) noexcept = 0;
  // Records `event` on `stream` (null: the compute stream).
  virtual void record_event(void* event, void* stream) = 0;
  // Work enqueued on `stream` (null: the compute stream) from here on waits for `event`.
  virtual void stream_wait_event(void* stream, void* event) = 0;
  // Blocks the host until `event` has completed.
  virtual void wait_event(void* event) = 0;

  // ---- copies ----
  // Copies bytes between the host and the device or within the device, ordered on the compute stream; returns
  // after a copy to the host has landed.
  virtual void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) = 0;
  // Enqueues a copy of `bytes` between any two places on `stream`; returns at once.
  virtual void copy_async(void* dst, const void* src, size_t bytes, void* stream) = 0;
  virtual void fill_zero(void* dst, size_t bytes) = 0;
  // dst[i] = src[i] converted (one round to nearest even), both on the device.
  virtual void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n) = 0;

  // ---- memory ----
  // The device's allocator.
  virtual Allocator& allocator() = 0;
  // Page-locked host memory, whose copies run asynchronously at full rate.
  virtual void* alloc_pinned(size_t bytes) = 0;
  virtual void free_pinned(void* ptr) noexcept = 0;
};

// Registers device d's op table (every entry set; it must outlive the process) and its runtime (null for the host).
// The registry's built-ins register themselves before the first lookup; another backend registers before its
// device's first op.
void register_backend(Device d, const BackendOps& ops, DeviceRuntime* runtime);
// Whether this megatrain has a backend for d.
bool has_backend(Device d);
// Device d's op table; throws naming `op` when this megatrain has no backend for d.
const BackendOps& backend(Device d, const char* op);
// Device d's runtime, or null (the host, or a device this megatrain has no backend for).
DeviceRuntime* find_runtime(Device d);
// Device d's runtime; throws naming `what` when there is none.
DeviceRuntime& device_runtime(Device d, const char* what);

}  // namespace mt
