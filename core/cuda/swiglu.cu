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

// sigmoid(g) and exp(-g), -g capped at 80 as the CPU (e stays finite, e * s = 1 - s stays a number).
__device__ __forceinline__ void sigmoid_parts(float g, float& s, float& e) {
  e = expf(fminf(-g, 80.f));
  s = __fdiv_rn(1.f, __fadd_rn(1.f, e));
}

// The 2W values at p (W interleaved pairs) as fp32: 16-byte vectors when W > 1 (p aligned), two plain loads
// when W = 1 (p aligned only to its element).
template <int W, class T>
__device__ __forceinline__ void load_pairs(const T* p, float (&f)[2 * W]) {
  if constexpr (W == 1) {
    f[0] = to_f32<T>(p[0]);
    f[1] = to_f32<T>(p[1]);
  } else {
    load_f32s<2 * W>(p, f);
  }
}

template <int W, class T>
__device__ __forceinline__ void store_pairs(T* p, const float (&f)[2 * W]) {
  if constexpr (W == 1) {
    p[0] = from_f32<T>(f[0]);
    p[1] = from_f32<T>(f[1]);
  } else {
    store_f32s<2 * W>(p, f);
  }
}

// out[i] = silu(x[2i]) * x[2i + 1] over the n = N * F pairs (a pair never straddles rows: rows hold 2F values),
// E outputs a thread-step (for_each_vec; E = 1 or a 16-byte vector of outputs, twice that of inputs).
template <class T, int E>
__global__ void swiglu_forward_kernel(const T* x, T* out, int64_t n) {
  for_each_vec<E>(n, [&](auto w, int64_t i) {
    constexpr int W = decltype(w)::value;
    float in[2 * W], o[W];
    load_pairs<W>(x + 2 * i, in);
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const float g = in[2 * j], u = in[2 * j + 1];
      float s, e;
      sigmoid_parts(g, s, e);
      o[j] = __fmul_rn(__fmul_rn(g, s), u);  // g * s * u
    }
    store_f32s<W>(out + i, o);
  });
}

// dgate = dout * up * (s + g s (e s)), dup = dout * (g s). dx may alias x: each pair is read, then written,
// by one thread.
template <class T, int E>
__global__ void swiglu_backward_kernel(const T* x, const T* dout, T* dx, int64_t n) {
  for_each_vec<E>(n, [&](auto w, int64_t i) {
    constexpr int W = decltype(w)::value;
    float in[2 * W], d[W];
    load_pairs<W>(x + 2 * i, in);
    load_f32s<W>(dout + i, d);
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const float g = in[2 * j], u = in[2 * j + 1];
      float s, e;
      sigmoid_parts(g, s, e);
      const float gs = __fmul_rn(g, s);
      const float dsilu = __fadd_rn(s, __fmul_rn(gs, __fmul_rn(e, s)));
      in[2 * j] = __fmul_rn(__fmul_rn(d[j], u), dsilu);
      in[2 * j + 1] = __fmul_rn(d[j], gs);
    }
    store_pairs<W>(dx + 2 * i, in);
  });
}

}  // namespace

void swiglu_forward(const Tensor& x, Tensor& out) {
  const int64_t n = out.numel();
  if (n == 0) return;
  MT_DISPATCH_FLOAT(out.dtype(), "swiglu_forward", T, {
    const T* px = x.data<T>();
    T* po = out.data<T>();
    launch_flat<kVec<T>>(
        n, kThreads,
        [&](auto e, unsigned grid) {
          swiglu_forward_kernel<T, decltype(e)::value><<<grid, kThreads, 0, stream()>>>(px, po, n);
        },
        px, po);
  });
  MT_CUDA_LAUNCHED("swiglu_forward_kernel");
}

void swiglu_backward(const Tensor& x, const Tensor& dout, Tensor& dx) {
  const int64_t n = dout.numel();
  if (n == 0) return;
  MT_DISPATCH_FLOAT(dx.dtype(), "swiglu_backward", T, {
    const T *px = x.data<T>(), *pd = dout.data<T>();
    T* pdx = dx.data<T>();
    launch_flat<kVec<T>>(
        n, kThreads,
        [&](auto e, unsigned grid) {
          swiglu_backward_kernel<T, decltype(e)::value><<<grid, kThreads, 0, stream()>>>(px, pd, pdx, n);
        },
        px, pd, pdx);
  });
  MT_CUDA_LAUNCHED("swiglu_backward_kernel");
}

}  // namespace mt::cuda
