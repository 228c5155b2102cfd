// swiglu.cu: the SwiGLU activation of Llama's MLP on the GPU, on interleaved (gate, up) column pairs, with
// the formulas of core/cpu/swiglu.cpp: fp32 throughout, rounded once on store. The products and sums use
// __fmul_rn / __fadd_rn so they are not contracted into FMAs; exp is CUDA's expf (within 2 ulp, as the CPU's
// exp_f32), so results match the CPU within the dtype tolerance rather than bit for bit.
#include <algorithm>
#include <cstdint>

#include "core/cuda/kernels.cuh"
#include "core/cuda/ops_cuda.h"

namespace mt::cuda {

namespace {

constexpr int kThreads = 256;

#define MT_GRID_STRIDE(i, n)                                                             \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// sigmoid(g) and exp(-g), -g capped at 80 as the CPU (e stays finite, e * s = 1 - s stays a number).
__device__ __forceinline__ void sigmoid_parts(float g, float& s, float& e) {
  e = expf(fminf(-g, 80.f));
  s = __fdiv_rn(1.f, __fadd_rn(1.f, e));
}

// out[i] = silu(x[2i]) * x[2i + 1] over the n = N * F pairs (a pair never straddles rows: rows hold 2F values).
template <class T>
__global__ void swiglu_forward_kernel(const T* x, T* out, int64_t n) {
  MT_GRID_STRIDE(i, n) {
    const float g = to_f32<T>(x[2 * i]), u = to_f32<T>(x[2 * i + 1]);
    float s, e;
    sigmoid_parts(g, s, e);
    out[i] = from_f32<T>(__fmul_rn(__fmul_rn(g, s), u));  // g * s * u
  }
}

// dgate = dout * up * (s + g s (e s)), dup = dout * (g s). dx may alias x: each pair is read, then written,
// by one thread.
template <class T>
__global__ void swiglu_backward_kernel(const T* x, const T* dout, T* dx, int64_t n) {
  MT_GRID_STRIDE(i, n) {
    const float g = to_f32<T>(x[2 * i]), u = to_f32<T>(x[2 * i + 1]), d = to_f32<T>(dout[i]);
    float s, e;
    sigmoid_parts(g, s, e);
    const float gs = __fmul_rn(g, s);
    const float dsilu = __fadd_rn(s, __fmul_rn(gs, __fmul_rn(e, s)));
    dx[2 * i] = from_f32<T>(__fmul_rn(__fmul_rn(d, u), dsilu));
    dx[2 * i + 1] = from_f32<T>(__fmul_rn(d, gs));
  }
}

#undef MT_GRID_STRIDE

}  // namespace

void swiglu_forward(const Tensor& x, Tensor& out) {
  const int64_t n = out.numel();
  if (n == 0) return;
  MT_DISPATCH_FLOAT(out.dtype(), "swiglu_forward", T,
                    swiglu_forward_kernel<T>
                    <<<grid_1d(n, kThreads), kThreads, 0, stream()>>>(x.data<T>(), out.data<T>(), n));
  MT_CUDA_LAUNCHED("swiglu_forward_kernel");
}

void swiglu_backward(const Tensor& x, const Tensor& dout, Tensor& dx) {
  const int64_t n = dout.numel();
  if (n == 0) return;
  MT_DISPATCH_FLOAT(dx.dtype(), "swiglu_backward", T,
                    swiglu_backward_kernel<T>
                    <<<grid_1d(n, kThreads), kThreads, 0, stream()>>>(x.data<T>(), dout.data<T>(), dx.data<T>(), n));
  MT_CUDA_LAUNCHED("swiglu_backward_kernel");
}

}  // namespace mt::cuda
