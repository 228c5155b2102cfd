// runtime.h: the CUDA backend as the rest of megatrain sees it, in plain C++ (no CUDA headers), so that
// core/tensor/tensor.cpp, core/tensor/allocator.cpp and app/ can reach the device without being compiled by nvcc.
// Everything here exists only when MEGATRAIN_WITH_CUDA is defined (the toolkit was found at build time).
//
// Streams: each process drives one GPU (LOCAL_RANK picks it) and enqueues every kernel, copy and GEMM on
// one compute stream, so ops are ordered without host synchronisation. Communication runs on streams of
// its own (parallel/comm/comm_nccl.cpp), ordered against the compute stream by events. A host read of device
// memory (Tensor::to_floats, item) waits for the compute stream.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/tensor/allocator.h"
#include "core/base/dtype.h"

namespace mt::cuda {

// GPUs visible to this process; 0 when there is no driver or no device (never throws).
int device_count() noexcept;
// Why device_count() is 0, e.g. "CUDA driver version is insufficient" or "no CUDA-capable device".
std::string unavailable_reason();
// The cuBLASLt the GEMMs load (core/cuda/cublaslt_api.h): "libcublasLt.so.13 (version 130100)", or why it cannot be
// loaded; `ok` says which.
std::string cublaslt_status(bool* ok);

// Makes `ordinal` this process's device and creates its compute stream. Throws when it does not exist.
void select_device(int ordinal);
// The selected device (selecting device 0 on first use).
int current_device();
// "NVIDIA H100 80GB HBM3, sm_90, 79.2 GiB, driver 13.0"
std::string device_description();
// Dense bf16 peak TFLOP/s of the selected device for MFU (H100/H200 SXM 989.4, A100 312), 0 when unknown.
double peak_bf16_tflops();

// The compute stream as an opaque handle (a cudaStream_t).
void* compute_stream();
// Blocks until everything enqueued on the compute stream has finished; throws on an asynchronous error.
void synchronize();

// Copies bytes between any two devices, ordered on the compute stream; returns after a copy to the host
// has landed. A host source may be freed or reused as soon as it returns: copies to the device of up to
// 16 MiB go through pinned staging buffers and do not wait for the device; larger ones wait.
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
// How many copy_bytes calls so far moved bytes device -> host (reads: each waits for the compute stream) and
// host -> device (staged without a wait up to 16 MiB), so tests can bound the host traffic of a step.
struct HostCopyCounts {
  int64_t to_host = 0;
  int64_t from_host = 0;
};
HostCopyCounts host_copy_counts();
// rows copies of `width` bytes from src (rows `src_pitch` apart) to dst (rows `dst_pitch` apart), both on
// the device; the block permutes of sequence parallelism.
void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t rows);
void fill_zero(void* dst, size_t bytes);
// dst[i] = src[i] converted (one round to nearest even), both on the device.
void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n);

// Timing events for the op profiler (core/tensor/op_profile.h): an event (a cudaEvent_t) created once and
// recorded on the compute stream when asked; elapsed_ms waits for `end` and gives the milliseconds between them.
void* create_timing_event();
void record_on_compute_stream(void* event);
float elapsed_ms(void* start, void* end);
void destroy_timing_event(void* event) noexcept;

// The caching device allocator (core/cuda/allocator.cpp).
Allocator& caching_allocator();
struct CacheStats {
  int64_t reserved_bytes = 0;  // held from cudaMalloc, in use or cached
  int64_t peak_reserved_bytes = 0;
  int64_t device_mallocs = 0;  // cudaMalloc calls so far (none once the training loop is warm)
  int64_t cache_hits = 0;
  int64_t pending_blocks = 0;  // freed blocks waiting for another stream's work (record_stream)
};
// Marks the device memory at `ptr` (anywhere inside a block of the caching allocator) as used by work on
// `stream` (a cudaStream_t other than the compute stream, e.g. a communicator's): once its tensor is freed,
// the block is not handed out again until the work enqueued on that stream by then has finished. No-op for
// memory the allocator does not own and for the compute stream.
void record_stream(const void* ptr, void* stream);
CacheStats cache_stats();
// Returns every cached, unused block to the driver.
void empty_cache();

}  // namespace mt::cuda
