// elementwise.cu: add, scale_, GELU (tanh approximation) and the bias add of a linear layer with its
// backward, on the GPU. Every value is read as fp32, computed in fp32 and rounded once on store, as the
// CPU reference (core/cpu/elementwise.cpp). The products and sums use __fmul_rn / __fadd_rn where the
// compiler could otherwise contract them into FMAs, so the fp32 results follow the CPU's roundings.
//
// bias_backward is deterministic: a first kernel sums fixed row chunks of each column in double into a
// workspace, a second sums those chunk partials in chunk order and adds the result into dbias.
#include <algorithm>
#include <cstdint>

#include "core/cuda/kernels.cuh"
#include "core/cuda/ops_cuda.h"

namespace mt::cuda {

namespace {

constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2 / pi), as core/cpu/elementwise.cpp
constexpr float kGeluC = 0.044715f;

constexpr int kThreads = 256;

// ---- kernels -------------------------------------------------------------------------------------
// The flat kernels run E elements a thread (launch_flat: 16-byte vectors when every pointer is aligned, else
// E = 1), the tail past the last whole vector one element a thread; the arithmetic of each element is the
// same in both forms. The width W of each step is a compile-time constant (for_each_vec).

// The fp32 values of the W elements at p.
#define MT_LOAD(W, p, f) \
  float f[W];            \
  load_f32s<W>(p, f)

// out may alias a or b: each element is read and written by the same thread.
template <class T, int E>
__global__ void add_kernel(const T* a, const T* b, T* out, int64_t n) {
  for_each_vec<E>(n, [&](auto w, int64_t i) {
    constexpr int W = decltype(w)::value;
    MT_LOAD(W, a + i, x);
    MT_LOAD(W, b + i, y);
#pragma unroll
    for (int j = 0; j < W; ++j) x[j] = __fadd_rn(x[j], y[j]);
    store_f32s<W>(out + i, x);
  });
}

template <class T, int E>
__global__ void scale_kernel(T* x, float s, int64_t n) {
  for_each_vec<E>(n, [&](auto w, int64_t i) {
    constexpr int W = decltype(w)::value;
    MT_LOAD(W, x + i, v);
#pragma unroll
    for (int j = 0; j < W; ++j) v[j] = __fmul_rn(v[j], s);
    store_f32s<W>(x + i, v);
  });
}

// kGeluK * (z + kGeluC * z * z * z), evaluated left to right as the CPU does, without contractions.
__device__ __forceinline__ float gelu_inner(float z) {
  const float cube = __fmul_rn(__fmul_rn(__fmul_rn(kGeluC, z), z), z);
  return __fmul_rn(kGeluK, __fadd_rn(z, cube));
}

// 0.5f * z * (1.f + tanh(inner))
__device__ __forceinline__ float gelu(float z) {
  return __fmul_rn(__fmul_rn(0.5f, z), __fadd_rn(1.f, tanhf(gelu_inner(z))));
}

// dout * gelu'(z)
__device__ __forceinline__ float gelu_grad(float z, float d) {
  const float th = tanhf(gelu_inner(z));
  // dinner = kGeluK * (1.f + 3.f * kGeluC * z * z)
  const float dinner = __fmul_rn(kGeluK, __fadd_rn(1.f, __fmul_rn(__fmul_rn(__fmul_rn(3.f, kGeluC), z), z)));
  // grad = 0.5f * (1.f + th) + 0.5f * z * (1.f - th * th) * dinner
  const float left = __fmul_rn(0.5f, __fadd_rn(1.f, th));
  const float right = __fmul_rn(__fmul_rn(__fmul_rn(0.5f, z), __fsub_rn(1.f, __fmul_rn(th, th))), dinner);
  const float grad = __fadd_rn(left, right);
  return __fmul_rn(d, grad);
}

template <class T, int E>
__global__ void gelu_forward_kernel(const T* x, T* out, int64_t n) {
  for_each_vec<E>(n, [&](auto w, int64_t i) {
    constexpr int W = decltype(w)::value;
    MT_LOAD(W, x + i, v);
#pragma unroll
    for (int j = 0; j < W; ++j) v[j] = gelu(v[j]);
    store_f32s<W>(out + i, v);
  });
}

template <class T, int E>
__global__ void gelu_backward_kernel(const T* x, const T* dout, T* dx, int64_t n) {
  for_each_vec<E>(n, [&](auto w, int64_t i) {
    constexpr int W = decltype(w)::value;
    MT_LOAD(W, x + i, z);
    MT_LOAD(W, dout + i, d);
#pragma unroll
    for (int j = 0; j < W; ++j) z[j] = gelu_grad(z[j], d[j]);
    store_f32s<W>(dx + i, z);
  });
}

#undef MT_LOAD

// x (N, C) += bias (C): rows in a grid-stride loop over blocks, E columns a thread-step (E = 1, or a 16-byte
// vector when C is a multiple of it and x and bias are aligned).
template <class T, int E>
__global__ void add_bias_kernel(T* x, const float* bias, int64_t N, int64_t C) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    T* row = x + n * C;
    for_each_row_step<E>(C, [&](int64_t c) {
      float v[E], b[E];
      load_f32s<E>(row + c, v);
      load_f32s<E>(bias + c, b);
#pragma unroll
      for (int j = 0; j < E; ++j) v[j] = __fadd_rn(v[j], b[j]);
      store_f32s<E>(row + c, v);
    });
  }
}

// partial[k, c] = sum of dout[n, c] over the rows n of chunk k ([k * rows_per, (k + 1) * rows_per) within
// N), in double and in row order. Grid: (column blocks, chunks); one thread per column.
template <class T>
__global__ void bias_partials_kernel(const T* dout, double* partial, int64_t N, int64_t C, int64_t rows_per) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  const int64_t k = blockIdx.y;
  const int64_t n0 = k * rows_per, n1 = n0 + rows_per < N ? n0 + rows_per : N;
  double acc = 0.0;
  for (int64_t n = n0; n < n1; ++n) acc += static_cast<double>(to_f32<T>(dout[n * C + c]));
  partial[k * C + c] = acc;
}

// dbias[c] += the chunk partials of column c summed in chunk order, rounded once to fp32.
__global__ void bias_finish_kernel(const double* partial, int64_t chunks, int64_t C, float* dbias) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  double acc = 0.0;
  for (int64_t k = 0; k < chunks; ++k) acc += partial[k * C + c];
  dbias[c] += static_cast<float>(acc);
}

}  // namespace

// ---- entry points --------------------------------------------------------------------------------

void add_bias(Tensor& x, const Tensor& bias) {
  const int64_t N = x.dim(0), C = x.dim(1);
  if (N == 0 || C == 0) return;
  Tensor hold;
  const float* b = f32_values(bias, hold);
  const unsigned grid = row_grid(N, kMaxStrideBlocks);
  MT_DISPATCH_FLOAT(x.dtype(), "add_bias", T, {
    T* px = x.data<T>();
    launch_rows<kVec<T>>(
        C,
        [&](auto e) {
          constexpr int E = decltype(e)::value;
          add_bias_kernel<T, E><<<grid, threads_for_cols(C / E, kThreads), 0, stream()>>>(px, b, N, C);
        },
        px, b);
  });
  MT_CUDA_LAUNCHED("add_bias_kernel");
}

void bias_backward(const Tensor& dout, Tensor& dbias) {
  const int64_t N = dout.dim(0), C = dout.dim(1);
  if (N == 0 || C == 0) return;
  const auto [col_blocks, rows_per, chunks] = column_chunks(N, C, kThreads);
  Tensor partial = Tensor::empty({chunks * C}, DType::i64, Device::cuda, MemKind::workspace);  // doubles
  double* part = static_cast<double*>(partial.raw());
  const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(chunks));
  MT_DISPATCH_FLOAT(dout.dtype(), "bias_backward", T,
                    bias_partials_kernel<T><<<grid, kThreads, 0, stream()>>>(dout.data<T>(), part, N, C, rows_per));
  MT_CUDA_LAUNCHED("bias_partials_kernel");
  bias_finish_kernel<<<static_cast<unsigned>(col_blocks), kThreads, 0, stream()>>>(part, chunks, C,
                                                                                   dbias.data<float>());
  MT_CUDA_LAUNCHED("bias_finish_kernel");
}

void add(const Tensor& a, const Tensor& b, Tensor& out) {
  const int64_t n = out.numel();
  if (n == 0) return;
  MT_DISPATCH_FLOAT(out.dtype(), "add", T, {
    const T *pa = a.data<T>(), *pb = b.data<T>();
    T* po = out.data<T>();
    launch_flat<kVec<T>>(
        n, kThreads,
        [&](auto e, unsigned grid) {
          add_kernel<T, decltype(e)::value><<<grid, kThreads, 0, stream()>>>(pa, pb, po, n);
        },
        pa, pb, po);
  });
  MT_CUDA_LAUNCHED("add_kernel");
}

void scale_(Tensor& x, float s) {
  const int64_t n = x.numel();
  if (n == 0) return;
  MT_DISPATCH_FLOAT(x.dtype(), "scale_", T, {
    T* px = x.data<T>();
    launch_flat<kVec<T>>(
        n, kThreads,
        [&](auto e, unsigned grid) { scale_kernel<T, decltype(e)::value><<<grid, kThreads, 0, stream()>>>(px, s, n); },
        px);
  });
  MT_CUDA_LAUNCHED("scale_kernel");
}

void gelu_forward(const Tensor& x, Tensor& out) {
  const int64_t n = out.numel();
  if (n == 0) return;
  MT_DISPATCH_FLOAT(out.dtype(), "gelu_forward", T, {
    const T* px = x.data<T>();
    T* po = out.data<T>();
    launch_flat<kVec<T>>(
        n, kThreads,
        [&](auto e, unsigned grid) {
          gelu_forward_kernel<T, decltype(e)::value><<<grid, kThreads, 0, stream()>>>(px, po, n);
        },
        px, po);
  });
  MT_CUDA_LAUNCHED("gelu_forward_kernel");
}

void gelu_backward(const Tensor& x, const Tensor& dout, Tensor& dx) {
  const int64_t n = dx.numel();
  if (n == 0) return;
  MT_DISPATCH_FLOAT(dx.dtype(), "gelu_backward", T, {
    const T *px = x.data<T>(), *pd = dout.data<T>();
    T* pdx = dx.data<T>();
    launch_flat<kVec<T>>(
        n, kThreads,
        [&](auto e, unsigned grid) {
          gelu_backward_kernel<T, decltype(e)::value><<<grid, kThreads, 0, stream()>>>(px, pd, pdx, n);
        },
        px, pd, pdx);
  });
  MT_CUDA_LAUNCHED("gelu_backward_kernel");
}

}  // namespace mt::cuda
