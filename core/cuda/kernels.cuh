// kernels.cuh (nvcc only; .cu files must not include fmt, whose C++20 consteval checks nvcc rejects):
// device-side helpers of the backend's kernels: fp32 loads and stores of each storage dtype
// (one round to nearest even, as the CPU reference), dtype dispatch, warp and block reductions. The launch
// arithmetic is in core/cuda/launch.h (included through cuda_check.h).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include <algorithm>
#include <cstdint>

#include "core/cuda/cuda_check.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace mt::cuda {

template <class T>
__device__ __forceinline__ float to_f32(T v);
template <>
__device__ __forceinline__ float to_f32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <>
__device__ __forceinline__ float to_f32<__half>(__half v) {
  return __half2float(v);
}

template <class T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) {
  return __float2half_rn(v);
}

[[noreturn]] inline void bad_dtype(const char* what, DType t) {
  throw std::invalid_argument(std::string(what) + ": no CUDA kernel for dtype " + std::string(dtype_name(t)));
}

}  // namespace mt::cuda

// Runs the statements with T bound to the storage type of a floating dtype.
#define MT_DISPATCH_FLOAT(dtype, what, T, ...) \
  switch (dtype) {                             \
    case ::mt::DType::f32: {                   \
      using T = float;                         \
      __VA_ARGS__;                             \
      break;                                   \
    }                                          \
    case ::mt::DType::bf16: {                  \
      using T = __nv_bfloat16;                 \
      __VA_ARGS__;                             \
      break;                                   \
    }                                          \
    case ::mt::DType::f16: {                   \
      using T = __half;                        \
      __VA_ARGS__;                             \
      break;                                   \
    }                                          \
    default:                                   \
      ::mt::cuda::bad_dtype(what, dtype);      \
  }

namespace mt::cuda {

template <class V>
__device__ __forceinline__ V warp_sum(V v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result. The order
// of additions is fixed by the launch shape, so results are deterministic.
template <class V>
__device__ V block_sum(V v) {
  __shared__ V partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  V total = lane < warps ? partial[lane] : V(0);
  return warp_sum(total);
}

__device__ inline float block_max(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float m = lane < warps ? partial[lane] : -INFINITY;
  return warp_max(m);
}

// ---- launch arithmetic: core/cuda/launch.h (plain C++, tested on the host) ---------------------------

inline dim3 grid_dims(const RowUnitsGrid& g) { return dim3(g.grid_x, g.grid_y); }

// An fp32 pointer to the values of a small device tensor (a bias, a norm's weight): its own memory when it
// is f32, else a converted workspace copy kept alive by `hold` (exact: bf16 and f16 values are fp32 values).
inline const float* f32_values(const Tensor& t, Tensor& hold) {
  if (t.dtype() == DType::f32) return t.data<float>();
  hold = Tensor::empty({t.numel()}, DType::f32, Device::cuda, MemKind::workspace);
  convert(t.raw(), t.dtype(), hold.raw(), DType::f32, t.numel());
  return hold.data<float>();
}

}  // namespace mt::cuda
