// rmsnorm.cu: RMSNorm over the last dimension on the GPU, with the formulas of core/cpu/rmsnorm.cpp: the row's
// mean square in double, saved as an f32 rstd; the output and the backward use that saved f32 value. fp32
// products and sums use __fmul_rn / __fsub_rn so the compiler does not contract them into FMAs the CPU
// reference does not use.
//
// Forward and dx: one block per row (grid-stride over rows), the threads striding over the columns, block_sum
// for the row sums (a fixed order, so deterministic), as core/cuda/layernorm.cu.
// dweight: a column kernel sums dout * xhat over fixed row chunks in double into a workspace, a second kernel
// adds the chunk partials in chunk order into dweight (deterministic, no atomics). It runs before the dx
// kernel, so dx may alias dout or x.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/cuda/kernels.cuh"
#include "core/cuda/norm_rows.cuh"
#include "core/cuda/ops_cuda.h"

namespace mt::cuda {

namespace {

constexpr int kColThreads = 256;

// The row kernels take E columns a thread-step (for_each_row_step): E = 1 (thread t the columns t,
// t + blockDim.x, ...), or a 16-byte vector (thread t the columns [tE, tE + E), [(t + blockDim.x)E, ...)) when
// C is a multiple of E and every pointer is aligned (launch_rows). Each element's arithmetic is the same in
// both forms; the row sums, in double, group the columns differently per thread (a different, still fixed,
// order).

// ---- forward -------------------------------------------------------------------------------------

// out may alias x: the last pass reads and writes each element from the same thread, after the reduction.
template <class T, int E>
__global__ void __launch_bounds__(1024)
    rmsnorm_forward_kernel(const T* x, const float* w, T* out, float* rstd, int64_t N, int64_t C, float eps) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {  // uniform over the block: block_sum is safe
    const T* xr = x + n * C;
    T* yr = out + n * C;
    const double sq = block_row_sum<E>(xr, C, [](float v) {
      const double d = static_cast<double>(v);
      return d * d;
    });
    const double ms = sq / static_cast<double>(C);
    const float s = static_cast<float>(1.0 / sqrt(ms + static_cast<double>(eps)));
    for_each_row_step<E>(C, [&](int64_t c) {
      float v[E], wv[E];
      load_f32s<E>(xr + c, v);
      load_f32s<E>(w + c, wv);
#pragma unroll
      for (int j = 0; j < E; ++j) v[j] = __fmul_rn(__fmul_rn(v[j], s), wv[j]);  // x[c] * s * w[c]
      store_f32s<E>(yr + c, v);
    });
    if (threadIdx.x == 0) rstd[n] = s;
  }
}

// ---- backward ------------------------------------------------------------------------------------

// With xhat = x * rstd and g = dout * weight: dx = rstd * (g - xhat * mean(g * xhat)).
// dx may alias dout or x: the second pass reads and writes each element from the same thread.
template <class T, int E>
__global__ void __launch_bounds__(1024)
    rmsnorm_dx_kernel(const T* dout, const T* x, const float* w, const float* rstd, T* dx, int64_t N, int64_t C) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {  // uniform over the block: block_sum is safe
    const T* xr = x + n * C;
    const T* dr = dout + n * C;
    T* dxr = dx + n * C;
    const float s = rstd[n];
    // xhat and g of the E columns from c.
    auto terms = [&](int64_t c, float(&xh)[E], float(&g)[E]) {
      norm_dx_terms<E>(xr, dr, w, c, xh, g, [&](float x) { return __fmul_rn(x, s); });
    };
    double sum_gx = 0.0;
    for_each_row_step<E>(C, [&](int64_t c) {
      float xh[E], g[E];
      terms(c, xh, g);
#pragma unroll
      for (int j = 0; j < E; ++j) sum_gx += static_cast<double>(g[j]) * static_cast<double>(xh[j]);
    });
    sum_gx = block_sum(sum_gx);
    const float mean_gx = static_cast<float>(sum_gx / static_cast<double>(C));
    for_each_row_step<E>(C, [&](int64_t c) {
      float xh[E], g[E];
      terms(c, xh, g);
#pragma unroll
      for (int j = 0; j < E; ++j) xh[j] = __fmul_rn(s, __fsub_rn(g[j], __fmul_rn(xh[j], mean_gx)));
      store_f32s<E>(dxr + c, xh);  // s * (d[c] * w[c] - xhat[c] * mean_gx)
    });
  }
}

// pw[k, c] = sum of dout * xhat over the rows of chunk k ([k * rows_per, (k + 1) * rows_per) within N), in
// double and in row order. Grid: (column blocks, chunks).
template <class T>
__global__ void rmsnorm_weight_partials_kernel(const T* dout, const T* x, const float* rstd, double* pw, int64_t N,
                                               int64_t C, int64_t rows_per) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= C) return;  // no block-wide synchronisation in this kernel
  const int64_t k = blockIdx.y;
  const int64_t n0 = k * rows_per, n1 = n0 + rows_per < N ? n0 + rows_per : N;
  double dw = 0.0;
  for (int64_t n = n0; n < n1; ++n) {
    const float d = to_f32<T>(dout[n * C + c]);
    const float xh = __fmul_rn(to_f32<T>(x[n * C + c]), rstd[n]);
    dw += static_cast<double>(d) * static_cast<double>(xh);
  }
  pw[k * C + c] = dw;
}

// dweight[c] += sum_k pw[k, c], in chunk order, rounded once to fp32.
__global__ void rmsnorm_weight_finish_kernel(const double* pw, int64_t chunks, int64_t C, float* dweight) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  double dw = 0.0;
  for (int64_t k = 0; k < chunks; ++k) dw += pw[k * C + c];
  dweight[c] += static_cast<float>(dw);
}

}  // namespace

void rmsnorm_forward(const Tensor& x, const Tensor& weight, Tensor& out, Tensor& rstd, const RmsNormOptions& opt) {
  const int64_t N = x.dim(0), C = x.dim(1);
  if (N == 0) return;
  // C == 0 still writes the rows' rstd (NaN: 0 / 0), as the CPU.
  Tensor hold_w;
  const float* w = f32_values(weight, hold_w);
  MT_DISPATCH_FLOAT(x.dtype(), "rmsnorm_forward", T, {
    const T* px = x.data<T>();
    T* po = out.data<T>();
    float* ps = rstd.data<float>();
    launch_rows<kVec<T>>(
        C,
        [&](auto e) {
          rmsnorm_forward_kernel<T, decltype(e)::value>
              <<<row_grid(N, kNormRowBlocks), norm_row_threads(C), 0, stream()>>>(px, w, po, ps, N, C, opt.eps);
        },
        px, po, w);
  });
  MT_CUDA_LAUNCHED("rmsnorm_forward_kernel");
}

void rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& rstd, Tensor& dx,
                      Tensor& dweight) {
  const int64_t N = x.dim(0), C = x.dim(1);
  if (N == 0 || C == 0) return;

  // dweight first: it reads dout and x, which dx may alias.
  const auto [col_blocks, rows_per, chunks] = column_chunks(N, C, kColThreads);
  Tensor partials = Tensor::empty({chunks * C}, DType::i64, Device::cuda, MemKind::workspace);  // doubles
  double* pw = static_cast<double*>(partials.raw());
  const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(chunks));
  MT_DISPATCH_FLOAT(x.dtype(), "rmsnorm_backward", T,
                    rmsnorm_weight_partials_kernel<T><<<grid, kColThreads, 0, stream()>>>(
                        dout.data<T>(), x.data<T>(), rstd.data<float>(), pw, N, C, rows_per));
  MT_CUDA_LAUNCHED("rmsnorm_weight_partials_kernel");
  rmsnorm_weight_finish_kernel<<<static_cast<unsigned>(col_blocks), kColThreads, 0, stream()>>>(pw, chunks, C,
                                                                                                dweight.data<float>());
  MT_CUDA_LAUNCHED("rmsnorm_weight_finish_kernel");

  Tensor hold_w;
  const float* w = f32_values(weight, hold_w);
  MT_DISPATCH_FLOAT(x.dtype(), "rmsnorm_backward", T, {
    const T *pd = dout.data<T>(), *px = x.data<T>();
    T* pdx = dx.data<T>();
    const float* ps = rstd.data<float>();
    launch_rows<kVec<T>>(
        C,
        [&](auto e) {
          rmsnorm_dx_kernel<T, decltype(e)::value>
              <<<row_grid(N, kNormRowBlocks), norm_row_threads(C), 0, stream()>>>(pd, px, w, ps, pdx, N, C);
        },
        pd, px, pdx, w);
  });
  MT_CUDA_LAUNCHED("rmsnorm_dx_kernel");
}

}  // namespace mt::cuda
