// cuda_check.h: what the backend's own sources share: status checks that throw with the call and the place,
// the compute stream, dtype dispatch to CUDA's storage types, and launch arithmetic.
#pragma once
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "core/cuda/launch.h"  // blocks_for and the rest of the launch arithmetic
#include "core/cuda/runtime.h"
#include "core/base/dtype.h"

namespace mt::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line);

inline cudaStream_t stream() { return static_cast<cudaStream_t>(compute_stream()); }

// Throws when the last launch failed (a bad configuration; faults inside kernels surface at synchronize(),
// or right here, naming the kernel, when MEGATRAIN_CUDA_SYNC=1 is set).
void check_launch(const char* kernel, const char* file, int line);

}  // namespace mt::cuda

#define MT_CUDA_CHECK(call)                                                                             \
  do {                                                                                                  \
    cudaError_t mt_status_ = (call);                                                                    \
    if (mt_status_ != cudaSuccess) ::mt::cuda::throw_cuda_error(mt_status_, #call, __FILE__, __LINE__); \
  } while (0)

#define MT_CUDA_LAUNCHED(kernel) ::mt::cuda::check_launch(kernel, __FILE__, __LINE__)
