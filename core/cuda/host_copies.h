// host_copies.h: what the optimizer offload (core/optim/host_offload.h) needs of the CUDA runtime, in plain C++
// (no CUDA headers): pinned host memory, a side stream for host <-> device copies, and events that order it
// against the compute stream and the host. Exists only when MEGATRAIN_WITH_CUDA is defined.
#pragma once
#include <cstddef>

namespace mt::cuda {

// Page-locked host memory (cudaHostAlloc, portable): copies from and to it run asynchronously at full PCIe rate.
void* alloc_pinned(size_t bytes);
void free_pinned(void* ptr) noexcept;

// A stream of its own (non-blocking) for the offload's copies, created on the selected device.
void* create_copy_stream();
void destroy_copy_stream(void* stream) noexcept;
// An event without timing (a cudaEvent_t) to order streams and the host.
void* create_sync_event();
void destroy_sync_event(void* event) noexcept;
// Records `event` on `stream` (null: the compute stream).
void record_event(void* event, void* stream);
// Work enqueued on `stream` (null: the compute stream) from here on waits for `event`.
void stream_wait_event(void* stream, void* event);
// Blocks the host until `event` has completed; throws on an asynchronous error.
void wait_event(void* event);
// Enqueues a copy of `bytes` between any two places (cudaMemcpyDefault) on `stream`; returns at once.
void copy_async(void* dst, const void* src, size_t bytes, void* stream);

}  // namespace mt::cuda
