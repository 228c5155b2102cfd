// host_copies.cpp: pinned memory, the offload's copy stream and its events (core/cuda/host_copies.h).
#include "core/cuda/host_copies.h"

#include "core/cuda/cuda_check.h"

namespace mt::cuda {

namespace {
cudaStream_t or_compute(void* s) { return s ? static_cast<cudaStream_t>(s) : stream(); }
}  // namespace

void* alloc_pinned(size_t bytes) {
  void* p = nullptr;
  MT_CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocPortable));
  return p;
}

void free_pinned(void* ptr) noexcept { cudaFreeHost(ptr); }

void* create_copy_stream() {
  current_device();  // the stream belongs to the selected device
  cudaStream_t s = nullptr;
  MT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

void destroy_copy_stream(void* stream) noexcept {
  if (stream) cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}

void* create_sync_event() {
  cudaEvent_t e = nullptr;
  MT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

void destroy_sync_event(void* event) noexcept {
  if (event) cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

void record_event(void* event, void* s) {
  MT_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), or_compute(s)));
}

void stream_wait_event(void* s, void* event) {
  MT_CUDA_CHECK(cudaStreamWaitEvent(or_compute(s), static_cast<cudaEvent_t>(event), 0));
}

void wait_event(void* event) { MT_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event))); }

void copy_async(void* dst, const void* src, size_t bytes, void* s) {
  if (bytes == 0) return;
  MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, or_compute(s)));
}

}  // namespace mt::cuda
