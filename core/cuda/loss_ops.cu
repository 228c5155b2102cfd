// loss_ops.cu: the loss head's small device-side helpers: the mean loss accumulated into an f64 scalar on the
// device (the trainer reads losses once per logging interval instead of once per microbatch) and a fill (the
// loss-gradient seed, built on the device rather than copied from the host).
#include <algorithm>
#include <cstdint>

#include "core/cuda/kernels.cuh"
#include "core/cuda/ops_cuda.h"

namespace mt::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kSumThreads = 1024;

// One block: sum[0] += float(sum of x in double / n), as the CPU reference (the order of the double sum is
// fixed by the launch shape, so the result is deterministic; it differs from the CPU's in the last bits).
__global__ void accumulate_mean_kernel(const float* __restrict__ x, int64_t n, double* __restrict__ sum) {
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
  s = block_sum(s);
  if (threadIdx.x == 0) sum[0] += static_cast<double>(__double2float_rn(s / static_cast<double>(n)));
}

// One block: sum[0] += sum of float(x[i] * w[i]) in double (deterministic order, fixed by the launch shape).
__global__ void accumulate_weighted_sum_kernel(const float* __restrict__ x, const float* __restrict__ w, int64_t n,
                                               double* __restrict__ sum) {
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += static_cast<double>(__fmul_rn(x[i], w[i]));
  s = block_sum(s);
  if (threadIdx.x == 0) sum[0] += s;
}

template <class T>
__global__ void fill_kernel(T* __restrict__ x, float f, int64_t n) {
  const T v = from_f32<T>(f);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = v;
}

}  // namespace

void accumulate_mean(const Tensor& x, Tensor& sum) {
  accumulate_mean_kernel<<<1, kSumThreads, 0, stream()>>>(x.data<float>(), x.numel(), sum.data<double>());
  MT_CUDA_LAUNCHED("accumulate_mean_kernel");
}

void accumulate_weighted_sum(const Tensor& x, const Tensor& w, Tensor& sum) {
  accumulate_weighted_sum_kernel<<<1, kSumThreads, 0, stream()>>>(x.data<float>(), w.data<float>(), x.numel(),
                                                                  sum.data<double>());
  MT_CUDA_LAUNCHED("accumulate_weighted_sum_kernel");
}

void fill_(Tensor& x, float v) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const unsigned blocks = grid_1d(n, kThreads);
  MT_DISPATCH_FLOAT(x.dtype(), "fill_", T, fill_kernel<T><<<blocks, kThreads, 0, stream()>>>(x.data<T>(), v, n));
  MT_CUDA_LAUNCHED("fill_kernel");
}

}  // namespace mt::cuda
