// runtime.cpp: device selection, the compute stream, status checks and host <-> device copies.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string_view>
#include <mutex>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "core/cuda/cuda_check.h"

namespace mt::cuda {

void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  throw std::runtime_error(fmt::format("CUDA error {} ({}) in {} at {}:{}", cudaGetErrorName(status),
                                       cudaGetErrorString(status), call, file, line));
}

namespace {

// MEGATRAIN_CUDA_SYNC=1 waits for every kernel right after its launch, so a fault inside one is reported
// with that kernel's name and place instead of at the next synchronisation (slow; for debugging).
bool sync_after_launch() {
  static const bool on = [] {
    const char* v = std::getenv("MEGATRAIN_CUDA_SYNC");
    return v && *v && std::string_view(v) != "0";
  }();
  return on;
}

}  // namespace

void check_launch(const char* kernel, const char* file, int line) {
  cudaError_t status = cudaGetLastError();
  if (status == cudaSuccess && sync_after_launch()) status = cudaStreamSynchronize(stream());
  if (status != cudaSuccess) throw_cuda_error(status, kernel, file, line);
}

namespace {

struct DeviceState {
  std::mutex mu;
  std::atomic<int> ordinal{-1};
  std::atomic<cudaStream_t> stream{nullptr};
};

// cudaSetDevice holds per host thread: every thread that touches the GPU (the trainer's, the gradient
// reducer's) binds itself to the process's device on first use, so its allocations and launches go there.
thread_local int t_bound_device = -1;

void bind_thread(int ordinal) {
  if (t_bound_device == ordinal) return;
  MT_CUDA_CHECK(cudaSetDevice(ordinal));
  t_bound_device = ordinal;
}

DeviceState& state() {
  static DeviceState s;
  return s;
}

}  // namespace

int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" status
    return 0;
  }
  return n;
}

std::string unavailable_reason() {
  int n = 0;
  cudaError_t status = cudaGetDeviceCount(&n);
  cudaGetLastError();
  if (status != cudaSuccess) return fmt::format("{} ({})", cudaGetErrorString(status), cudaGetErrorName(status));
  if (n == 0) return "no CUDA-capable device is visible";
  return "";
}

void select_device(int ordinal) {
  DeviceState& s = state();
  std::lock_guard lock(s.mu);
  if (s.ordinal == ordinal) return;
  if (s.ordinal >= 0)
    throw std::runtime_error(
        fmt::format("CUDA device {} was already selected; a process drives one GPU "
                    "(cannot switch to device {})",
                    s.ordinal.load(), ordinal));
  const int n = device_count();
  if (ordinal < 0 || ordinal >= n)
    throw std::runtime_error(
        n == 0 ? fmt::format("no CUDA device to run on: {}", unavailable_reason())
               : fmt::format("CUDA device {} does not exist: {} visible (LOCAL_RANK picks the device; check "
                             "CUDA_VISIBLE_DEVICES and the number of ranks per node)",
                             ordinal, n));
  bind_thread(ordinal);
  cudaStream_t stream = nullptr;
  MT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  s.stream = stream;
  s.ordinal = ordinal;  // published last: a reader that sees the ordinal also sees the stream
}

int current_device() {
  int ordinal = state().ordinal;
  if (ordinal < 0) {
    select_device(0);
    ordinal = state().ordinal;
  }
  bind_thread(ordinal);
  return ordinal;
}

void* compute_stream() {
  current_device();
  return state().stream;
}

std::string device_description() {
  cudaDeviceProp p{};
  MT_CUDA_CHECK(cudaGetDeviceProperties(&p, current_device()));
  int driver = 0;
  cudaDriverGetVersion(&driver);
  return fmt::format("{}, sm_{}{}, {:.1f} GiB, driver {}.{}", p.name, p.major, p.minor,
                     static_cast<double>(p.totalGlobalMem) / (1 << 30), driver / 1000, (driver % 1000) / 10);
}

double peak_bf16_tflops() {
  cudaDeviceProp p{};
  MT_CUDA_CHECK(cudaGetDeviceProperties(&p, current_device()));
  const std::string name = p.name;
  // Dense bf16 tensor-core peaks of the SXM parts (PCIe/NVL parts are lower; MFU is then optimistic).
  if (name.find("H100") != std::string::npos || name.find("H200") != std::string::npos) return 989.4;
  if (name.find("H800") != std::string::npos || name.find("GH200") != std::string::npos) return 989.4;
  if (name.find("A100") != std::string::npos || name.find("A800") != std::string::npos) return 312.0;
  return 0.0;
}

void synchronize() { MT_CUDA_CHECK(cudaStreamSynchronize(stream())); }

void* create_timing_event() {
  current_device();
  cudaEvent_t e = nullptr;
  MT_CUDA_CHECK(cudaEventCreate(&e));
  return e;
}

void record_on_compute_stream(void* event) {
  MT_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), stream()));
}

float elapsed_ms(void* start, void* end) {
  MT_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(end)));
  float ms = 0;
  MT_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end)));
  return ms;
}

void destroy_timing_event(void* event) noexcept {
  if (event) (void)cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

namespace {
std::atomic<int64_t> g_copies_to_host{0}, g_copies_from_host{0};
}  // namespace

HostCopyCounts host_copy_counts() { return {g_copies_to_host.load(), g_copies_from_host.load()}; }

namespace {

// Host-to-device copies of batch-sized data (token ids, small host exchanges) go through pinned staging
// buffers, so they need no host wait: the source is copied into a free buffer on the host (the caller may
// free or reuse it at once), the device copy is enqueued on the compute stream, and an event recorded behind
// it tells when the buffer is free again. Large one-off copies (parameters at start) copy directly and wait.
class PinnedStaging {
 public:
  static constexpr size_t kMaxStaged = 16 << 20;  // larger copies are one-offs: copy and synchronise
  static constexpr size_t kMaxBuffers = 32;       // beyond this, wait for the oldest fitting buffer

  // False when the copy is too large to stage (the caller copies directly).
  bool copy_to_device(void* dst, const void* src, size_t bytes) {
    if (bytes > kMaxStaged) return false;
    std::lock_guard lock(mu_);
    Buffer& b = free_buffer(bytes);
    std::memcpy(b.ptr, src, bytes);
    MT_CUDA_CHECK(cudaMemcpyAsync(dst, b.ptr, bytes, cudaMemcpyHostToDevice, stream()));
    MT_CUDA_CHECK(cudaEventRecord(b.done, stream()));
    return true;
  }

 private:
  struct Buffer {
    void* ptr = nullptr;  // pinned host memory
    size_t bytes = 0;
    cudaEvent_t done = nullptr;  // recorded behind the last copy out of it
  };

  Buffer& free_buffer(size_t bytes) {
    Buffer* fitting = nullptr;
    for (Buffer& b : buffers_) {
      if (b.bytes < bytes) continue;
      const cudaError_t q = cudaEventQuery(b.done);
      if (q == cudaSuccess) return b;
      if (q != cudaErrorNotReady) MT_CUDA_CHECK(q);
      if (!fitting) fitting = &b;
    }
    if (fitting && buffers_.size() >= kMaxBuffers) {  // enough buffers: wait for one rather than pin more
      MT_CUDA_CHECK(cudaEventSynchronize(fitting->done));
      return *fitting;
    }
    Buffer b;
    b.bytes = std::max<size_t>(bytes, 64 << 10);
    MT_CUDA_CHECK(cudaMallocHost(&b.ptr, b.bytes));
    MT_CUDA_CHECK(cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming));
    buffers_.push_back(b);
    return buffers_.back();
  }

  std::mutex mu_;
  std::deque<Buffer> buffers_;  // a deque: references stay valid as it grows
};

PinnedStaging& staging() {
  static PinnedStaging* s = new PinnedStaging();  // never destroyed: pinned memory goes with the process
  return *s;
}

}  // namespace

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  if (dst_device == Device::cpu && src_device == Device::cpu) {
    std::memmove(dst, src, bytes);
    return;
  }
  if (dst_device == Device::cpu) ++g_copies_to_host;
  if (src_device == Device::cpu) ++g_copies_from_host;
  if (dst_device == Device::cuda && src_device == Device::cpu && staging().copy_to_device(dst, src, bytes)) return;
  MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream()));
  // A host destination is read right after; a large host source may be freed or reused right after (pageable
  // memory is staged by the driver, but only a synchronised copy makes that safe for every source).
  if (dst_device == Device::cpu || src_device == Device::cpu) synchronize();
}

void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t rows) {
  if (width == 0 || rows == 0) return;
  MT_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDeviceToDevice, stream()));
}

void fill_zero(void* dst, size_t bytes) {
  if (bytes == 0) return;
  MT_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream()));
}

}  // namespace mt::cuda
