// kernels.cuh (nvcc only; .cu files must not include fmt, whose C++20 consteval checks nvcc rejects):
// device-side helpers of the backend's kernels: fp32 loads and stores of each storage dtype, fp8 included
// (one round to nearest even, as the CPU reference), 16-byte vector loads and stores, dtype dispatch, warp and
// block reductions. The launch arithmetic is in core/cuda/launch.h (included through cuda_check.h).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/cuda/cuda_check.h"
#include "core/base/dtype.h"
#include "core/base/rng.h"
#include "core/tensor/tensor.h"

namespace mt::cuda {

// fp32 to and from each storage dtype, both directions of a dtype side by side: widening is exact, narrowing
// rounds to nearest even (as the CPU reference).
template <class T>
struct F32Convert;
template <>
struct F32Convert<float> {
  static __device__ __forceinline__ float to(float v) { return v; }
  static __device__ __forceinline__ float from(float v) { return v; }
};
template <>
struct F32Convert<__nv_bfloat16> {
  static __device__ __forceinline__ float to(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 from(float v) { return __float2bfloat16_rn(v); }
};
template <>
struct F32Convert<__half> {
  static __device__ __forceinline__ float to(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half from(float v) { return __float2half_rn(v); }
};

// fp8 (core/base/dtype.h): widening is exact; narrowing rounds to nearest even and saturates
// (__NV_SATFINITE: beyond the largest finite value and +-inf -> +-max), and every NaN becomes 0x7f, the canonical
// NaN of CUDA's software conversion, whatever the hardware's cvt makes of its sign, so the CPU's bits follow.
template <>
struct F32Convert<__nv_fp8_e4m3> {
  static __device__ __forceinline__ float to(__nv_fp8_e4m3 v) { return static_cast<float>(v); }
  static __device__ __forceinline__ __nv_fp8_e4m3 from(float v) {
    __nv_fp8_e4m3 r;
    r.__x = isnan(v) ? __nv_fp8_storage_t{0x7f} : __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
    return r;
  }
};
template <>
struct F32Convert<__nv_fp8_e5m2> {
  static __device__ __forceinline__ float to(__nv_fp8_e5m2 v) { return static_cast<float>(v); }
  static __device__ __forceinline__ __nv_fp8_e5m2 from(float v) {
    __nv_fp8_e5m2 r;
    r.__x = isnan(v) ? __nv_fp8_storage_t{0x7f} : __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E5M2);
    return r;
  }
};

template <class T>
__device__ __forceinline__ float to_f32(T v) {
  return F32Convert<T>::to(v);
}
template <class T>
__device__ __forceinline__ T from_f32(float v) {
  return F32Convert<T>::from(v);
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

// Runs the statements with Q bound to the storage type of an fp8 dtype (e4m3, e5m2).
#define MT_DISPATCH_FP8(dtype, what, Q, ...) \
  switch (dtype) {                           \
    case ::mt::DType::e4m3: {                \
      using Q = __nv_fp8_e4m3;               \
      __VA_ARGS__;                           \
      break;                                 \
    }                                        \
    case ::mt::DType::e5m2: {                \
      using Q = __nv_fp8_e5m2;               \
      __VA_ARGS__;                           \
      break;                                 \
    }                                        \
    default:                                 \
      ::mt::cuda::bad_dtype(what, dtype);    \
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

// ---- 16-byte vector loads and stores -----------------------------------------------------------------
// A kernel templated on E (elements a thread moves per access group) runs as its scalar form with E = 1,
// element for element the code it replaced, and vectorised with E = kVec<T> where launch.h's conditions hold
// (every pointer 16-byte aligned; for row kernels, C a multiple of E). The values and their arithmetic are
// the same in both forms: only the loads and stores are wider.

// Elements of T in one 16-byte vector: 4 fp32, 8 bf16 or fp16.
template <class T>
inline constexpr int kVec = kVecBytes / static_cast<int>(sizeof(T));

// W elements of T, aligned to their size so that one access moves them all.
template <class T, int W>
struct alignas(sizeof(T) * W) Pack {
  T v[W];
};

// The unsigned type of one access of `Bytes` bytes.
template <int Bytes>
struct RawOf;
template <>
struct RawOf<2> {
  using type = unsigned short;
};
template <>
struct RawOf<4> {
  using type = unsigned int;
};
template <>
struct RawOf<8> {
  using type = uint2;
};
template <>
struct RawOf<16> {
  using type = uint4;
};

// The W elements at p (aligned to W * sizeof(T) bytes) in one load; W = 1 is a plain load of T.
template <class T, int W>
__device__ __forceinline__ Pack<T, W> load_pack(const T* p) {
  Pack<T, W> r;
  if constexpr (W == 1) {
    r.v[0] = *p;
  } else {
    using Raw = typename RawOf<static_cast<int>(sizeof(T)) * W>::type;
    const Raw raw = *reinterpret_cast<const Raw*>(p);
    static_assert(sizeof(raw) == sizeof(r));
    memcpy(&r, &raw, sizeof(r));
  }
  return r;
}

// Stores the W elements of q at p (aligned to W * sizeof(T) bytes) in one store.
template <class T, int W>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, W>& q) {
  if constexpr (W == 1) {
    *p = q.v[0];
  } else {
    using Raw = typename RawOf<static_cast<int>(sizeof(T)) * W>::type;
    Raw raw;
    static_assert(sizeof(raw) == sizeof(q));
    memcpy(&raw, &q, sizeof(raw));
    *reinterpret_cast<Raw*>(p) = raw;
  }
}

// Elements of T per access when a thread moves E of them: E, or 16 bytes' worth when E is wider.
template <class T, int E>
inline constexpr int kAccess = E* static_cast<int>(sizeof(T)) > kVecBytes ? kVec<T> : E;

// Grid-stride loops of a flat kernel over n elements, E at a time: body(std::integral_constant<int, E>{}, i)
// for the first element i of every whole vector, then body(std::integral_constant<int, 1>{}, i) for each
// element i of the tail [n / E * E, n) (E = 1: every element, no tail). The body sees its width as a constant.
template <int E, class Body>
__device__ __forceinline__ void for_each_vec(int64_t n, Body&& body) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t vecs = n / E;
  for (int64_t v = tid; v < vecs; v += stride) body(std::integral_constant<int, E>{}, v * E);
  if constexpr (E > 1)
    for (int64_t i = vecs * E + tid; i < n; i += stride) body(std::integral_constant<int, 1>{}, i);
}

// The steps of thread threadIdx.x over a row of `end` columns, E columns a step: body(c) for c = tE,
// (t + blockDim.x)E, ... below end (E = 1: the columns t, t + blockDim.x, ...).
template <int E, class Body>
__device__ __forceinline__ void for_each_row_step(int64_t end, Body&& body) {
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * E; c < end; c += static_cast<int64_t>(blockDim.x) * E) body(c);
}

// Host side of a row kernel over rows of C columns: launch(std::integral_constant<int, E>{}) when every row
// starts 16-byte aligned (rows_take_vectors: C a multiple of E, every pointer aligned), else its scalar form
// launch(std::integral_constant<int, 1>{}).
template <int E, class Launch, class... P>
void launch_rows(int64_t C, Launch&& launch, const P*... ptrs) {
  if (rows_take_vectors(C, E, ptrs...))
    launch(std::integral_constant<int, E>{});
  else
    launch(std::integral_constant<int, 1>{});
}

// The global rows of a dropout call (DropoutOptions' row_offset, split_at and split_position): core/tensor/ops.h's
// dropout_row on the device, so a context rank's two chunks draw the one-rank mask.
struct DropoutRows {
  uint64_t offset;
  int64_t split_at;
  uint64_t split_position;
  __device__ __forceinline__ uint64_t at(int64_t t) const {
    return split_at > 0 && t >= split_at ? split_position + static_cast<uint64_t>(t - split_at)
                                         : offset + static_cast<uint64_t>(t);
  }
};

// Dropout of the E = 4Q values v of global columns [4 block0, 4 block0 + E) of one row (sample, row): value
// 4q + lane is kept, times scale, when lane `lane` of Philox block block0 + q is >= p, else 0 (even when it is
// inf or NaN), as the CPU's masks (core/base/rng.h).
template <int E>
__device__ __forceinline__ void drop_vector(float (&v)[E], uint64_t seed, uint64_t site, uint64_t sample, uint64_t row,
                                            uint64_t block0, float p, float scale) {
  static_assert(E % 4 == 0, "a vector covers whole Philox blocks");
#pragma unroll
  for (int q = 0; q < E / 4; ++q) {
    const Philox4 r = dropout_block(seed, site, sample, row, block0 + static_cast<uint64_t>(q));
#pragma unroll
    for (int lane = 0; lane < 4; ++lane) {
      float& e = v[4 * q + lane];
      e = uniform_from_bits(r.v[lane]) >= p ? __fmul_rn(e, scale) : 0.f;
    }
  }
}

// Host side of a flat kernel over n elements: launch(std::integral_constant<int, E>{}, grid) when every pointer
// is 16-byte aligned, else its scalar form launch(std::integral_constant<int, 1>{}, grid), grid sized for the
// form's units of work (launch.h's vec_units).
template <int E, class Launch, class... P>
void launch_flat(int64_t n, int threads, Launch&& launch, const P*... ptrs) {
  if (all_aligned16(ptrs...))
    launch(std::integral_constant<int, E>{}, grid_1d(vec_units(n, E), threads));
  else
    launch(std::integral_constant<int, 1>{}, grid_1d(n, threads));
}

// f[j] = element j of the E elements at p, as fp32, read in accesses of at most 16 bytes (p aligned to them).
template <int E, class T>
__device__ __forceinline__ void load_f32s(const T* p, float (&f)[E]) {
  constexpr int W = kAccess<T, E>;
  static_assert(E % W == 0, "E must be a whole number of accesses");
#pragma unroll
  for (int k = 0; k < E; k += W) {
    const Pack<T, W> q = load_pack<T, W>(p + k);
#pragma unroll
    for (int j = 0; j < W; ++j) f[k + j] = to_f32<T>(q.v[j]);
  }
}

// The E values f rounded once each to T and stored at p, in accesses of at most 16 bytes (p aligned to them).
template <int E, class T>
__device__ __forceinline__ void store_f32s(T* p, const float (&f)[E]) {
  constexpr int W = kAccess<T, E>;
  static_assert(E % W == 0, "E must be a whole number of accesses");
#pragma unroll
  for (int k = 0; k < E; k += W) {
    Pack<T, W> q;
#pragma unroll
    for (int j = 0; j < W; ++j) q.v[j] = from_f32<T>(f[k + j]);
    store_pack<T, W>(p + k, q);
  }
}

}  // namespace mt::cuda
