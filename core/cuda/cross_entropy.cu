// cross_entropy.cu: softmax cross-entropy on the device, split into per-row pieces (max, partial sums, loss,
// backward) like the CPU reference (core/cpu/cross_entropy.cpp), so a vocabulary-parallel caller only
// exchanges the f32 row statistics between shards.
//
// One block per row of logits, its threads striding over the row's columns; row reductions use block_max /
// block_sum, whose order is fixed by the launch shape (deterministic). Padding columns (full-vocabulary id
// >= vocab_size) are left out of the max and the sum and get gradient 0.
//
// The row kernels take E columns a thread-step (for_each_row_step): E = 1 (thread t the columns t, t + 256, ...), or a 16-byte
// vector (thread t the columns [tE, tE + E), [(t + 256)E, ...)) when V is a multiple of E and the logits (and
// dlogits) are aligned (launch_rows). A vector is read whole even where it runs past the real columns
// into padding (it stays inside the row); the padding elements are masked as in the scalar form. Each element's
// arithmetic is the same in both forms; the max is exact in any order, the sum of exps (in double) groups the
// columns differently per thread.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "core/cuda/kernels.cuh"
#include "core/cuda/ops_cuda.h"

namespace mt::cuda {

namespace {

constexpr int kThreads = 256;

// Number of leading columns of a shard that are real tokens, not vocabulary padding (as the CPU's).
int64_t real_columns(const CrossEntropyOptions& opt, int64_t V) {
  if (opt.vocab_size < 0) return V;
  return std::clamp<int64_t>(opt.vocab_size - opt.vocab_start, 0, V);
}

// One block per row: gridDim.x is limited to 2^31 - 1.
unsigned row_blocks(const char* op, int64_t N) {
  if (N > kMaxGridX)
    throw std::runtime_error(std::string(op) + ": " + std::to_string(N) +
                             " rows exceed the CUDA kernel's limit of 2^31 - 1");
  return static_cast<unsigned>(N);
}

// Column of a full-vocabulary target id in a shard whose first `real` columns from vocab_start are real
// tokens, or -1 when it lies outside them.
__device__ __forceinline__ int64_t target_column(int32_t target, int64_t vocab_start, int64_t real) {
  const int64_t c = static_cast<int64_t>(target) - vocab_start;
  return c >= 0 && c < real ? c : -1;
}

// rowmax[n] = max over the real columns of row n (-inf when there are none); fmaxf skips NaN like std::fmax.
template <class S, int E>
__global__ void __launch_bounds__(kThreads)
    rowmax_kernel(const S* __restrict__ logits, float* __restrict__ rowmax, int64_t V, int64_t real) {
  const int64_t n = blockIdx.x;
  const S* row = logits + n * V;
  float m = -INFINITY;
  for_each_row_step<E>(real, [&](int64_t v) {
    float x[E];
    load_f32s<E>(row + v, x);
#pragma unroll
    for (int j = 0; j < E; ++j)
      if (E == 1 || v + j < real) m = fmaxf(m, x[j]);
  });
  m = block_max(m);  // every thread reaches it
  if (threadIdx.x == 0) rowmax[n] = m;
}

// sumexp[n] = sum over the real columns of exp(x - rowmax[n]) (each exp in fp32, summed in double, as the
// CPU); target_logit[n] = the target's logit when it is a real column of this shard, else 0.
template <class S, int E>
__global__ void __launch_bounds__(kThreads)
    partials_kernel(const S* __restrict__ logits, const int32_t* __restrict__ targets, const float* __restrict__ rowmax,
                    float* __restrict__ sumexp, float* __restrict__ target_logit, int64_t V, int64_t real,
                    int64_t vocab_start) {
  const int64_t n = blockIdx.x;
  const S* row = logits + n * V;
  const float m = rowmax[n];
  double s = 0.0;
  for_each_row_step<E>(real, [&](int64_t v) {
    float x[E];
    load_f32s<E>(row + v, x);
#pragma unroll
    for (int j = 0; j < E; ++j)
      if (E == 1 || v + j < real) s += static_cast<double>(expf(x[j] - m));
  });
  s = block_sum(s);  // every thread reaches it
  if (threadIdx.x == 0) {
    sumexp[n] = static_cast<float>(s);
    const int64_t c = target_column(targets[n], vocab_start, real);
    target_logit[n] = c >= 0 ? to_f32<S>(row[c]) : 0.f;
  }
}

// losses[n] = log(sumexp[n]) + rowmax[n] - target_logit[n], in double, rounded once.
__global__ void loss_kernel(const float* __restrict__ rowmax, const float* __restrict__ sumexp,
                            const float* __restrict__ target_logit, float* __restrict__ losses, int64_t N) {
  for (int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; n < N;
       n += static_cast<int64_t>(gridDim.x) * blockDim.x)
    losses[n] = static_cast<float>(log(static_cast<double>(sumexp[n])) + static_cast<double>(rowmax[n]) -
                                   static_cast<double>(target_logit[n]));
}

// dlogits[n, v] = exp(x - rowmax) * (1 / sumexp) * dloss, minus dloss at the target's column, 0 on padding;
// the explicitly rounded intrinsics keep the CPU's order of operations (no contraction into an FMA).
template <class S, int E>
__global__ void __launch_bounds__(kThreads)
    backward_kernel(const S* __restrict__ logits, const int32_t* __restrict__ targets, const float* __restrict__ rowmax,
                    const float* __restrict__ sumexp, const float* __restrict__ dloss, S* __restrict__ dlogits,
                    int64_t V, int64_t real, int64_t vocab_start) {
  const int64_t n = blockIdx.x;
  const S* row = logits + n * V;
  S* drow = dlogits + n * V;
  const float m = rowmax[n];
  const float inv_sum = __fdiv_rn(1.f, sumexp[n]);
  const float dl = dloss[n];
  const int64_t c = target_column(targets[n], vocab_start, real);
  for_each_row_step<E>(V, [&](int64_t v) {
    float x[E];
    load_f32s<E>(row + v, x);
#pragma unroll
    for (int j = 0; j < E; ++j) {
      float g = 0.f;
      if (v + j < real) {
        g = __fmul_rn(__fmul_rn(expf(x[j] - m), inv_sum), dl);
        if (v + j == c) g = __fsub_rn(g, dl);
      }
      x[j] = g;
    }
    store_f32s<E>(drow + v, x);
  });
}

}  // namespace

void cross_entropy_rowmax(const Tensor& logits, Tensor& rowmax, const CrossEntropyOptions& opt) {
  const int64_t N = logits.dim(0), V = logits.dim(1), real = real_columns(opt, V);
  if (N == 0) return;
  const unsigned blocks = row_blocks("cross_entropy_rowmax", N);
  MT_DISPATCH_FLOAT(logits.dtype(), "cross_entropy_rowmax", S, {
    const S* pl = logits.data<S>();
    launch_rows<kVec<S>>(
        V,
        [&](auto e) {
          rowmax_kernel<S, decltype(e)::value><<<blocks, kThreads, 0, stream()>>>(pl, rowmax.data<float>(), V, real);
        },
        pl);
  });
  MT_CUDA_LAUNCHED("rowmax_kernel");
}

void cross_entropy_partials(const Tensor& logits, const Tensor& targets, const Tensor& rowmax, Tensor& sumexp,
                            Tensor& target_logit, const CrossEntropyOptions& opt) {
  const int64_t N = logits.dim(0), V = logits.dim(1), real = real_columns(opt, V);
  if (N == 0) return;
  const unsigned blocks = row_blocks("cross_entropy_partials", N);
  MT_DISPATCH_FLOAT(logits.dtype(), "cross_entropy_partials", S, {
    const S* pl = logits.data<S>();
    launch_rows<kVec<S>>(
        V,
        [&](auto e) {
          partials_kernel<S, decltype(e)::value><<<blocks, kThreads, 0, stream()>>>(
              pl, targets.data<int32_t>(), rowmax.data<float>(), sumexp.data<float>(), target_logit.data<float>(), V,
              real, opt.vocab_start);
        },
        pl);
  });
  MT_CUDA_LAUNCHED("partials_kernel");
}

void cross_entropy_loss(const Tensor& rowmax, const Tensor& sumexp, const Tensor& target_logit, Tensor& losses) {
  const int64_t N = losses.numel();
  if (N == 0) return;
  const unsigned blocks = grid_1d(N, kThreads);
  loss_kernel<<<blocks, kThreads, 0, stream()>>>(rowmax.data<float>(), sumexp.data<float>(), target_logit.data<float>(),
                                                 losses.data<float>(), N);
  MT_CUDA_LAUNCHED("loss_kernel");
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& rowmax, const Tensor& sumexp,
                            const Tensor& dloss, Tensor& dlogits, const CrossEntropyOptions& opt) {
  const int64_t N = logits.dim(0), V = logits.dim(1), real = real_columns(opt, V);
  if (N == 0 || V == 0) return;
  const unsigned blocks = row_blocks("cross_entropy_backward", N);
  MT_DISPATCH_FLOAT(logits.dtype(), "cross_entropy_backward", S, {
    const S* pl = logits.data<S>();
    S* pd = dlogits.data<S>();
    launch_rows<kVec<S>>(
        V,
        [&](auto e) {
          backward_kernel<S, decltype(e)::value><<<blocks, kThreads, 0, stream()>>>(
              pl, targets.data<int32_t>(), rowmax.data<float>(), sumexp.data<float>(), dloss.data<float>(), pd, V, real,
              opt.vocab_start);
        },
        pl, pd);
  });
  MT_CUDA_LAUNCHED("backward_kernel");
}

}  // namespace mt::cuda
