// optimizer_ops.cu: reductions over f32 gradient buffers (sum of squares, inf/NaN check) and the AdamW update
// on the device, with the CPU reference's semantics (core/cpu/optimizer_ops.cpp).
//
// sum_squares is deterministic: each block of a grid whose size depends only on n sums its grid-stride share
// in double, the per-block partials land in a workspace and one block adds them in a fixed order. Both
// reductions return a host value, so they wait for the compute stream.
// The AdamW update uses the explicitly rounded intrinsics (__fmul_rn, __fadd_rn, ...), which the compiler
// never contracts into FMAs, so each element follows the CPU formula operation for operation (the CPU build
// does not contract either) and equals it bit for bit.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

#include "core/cuda/kernels.cuh"
#include "core/cuda/ops_cuda.h"

namespace mt::cuda {

namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxReduceBlocks = 1024;       // partials of sum_squares
constexpr unsigned kMaxElementwiseBlocks = 65535u * 8;

unsigned reduce_blocks(int64_t n) { return std::min<unsigned>(blocks_for(n, kThreads), kMaxReduceBlocks); }

__global__ void sum_squares_partials_kernel(const float* __restrict__ x, int64_t n, double* __restrict__ partials) {
  double s = 0.0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double v = x[i];
    s += v * v;  // the product of two floats is exact in double, fused or not
  }
  s = block_sum(s);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// One block: out[0] = the sum of partials[0, count) in an order fixed by the launch shape.
__global__ void sum_partials_kernel(const double* __restrict__ partials, int count, double* __restrict__ out) {
  double s = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) s += partials[i];
  s = block_sum(s);
  if (threadIdx.x == 0) out[0] = s;
}

// *flag = 1 when any element is inf or NaN (all exponent bits set); every writer writes the same value.
__global__ void nonfinite_kernel(const float* __restrict__ x, int64_t n, int* __restrict__ flag) {
  bool bad = false;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    bad |= (__float_as_uint(x[i]) & 0x7f800000u) == 0x7f800000u;
  if (bad) *flag = 1;
}

struct AdamWArgs {
  float lr, b1, b2, eps, wd, grad_scale;
  float inv_bc1, inv_bc2;  // 1 / (1 - beta^step), computed in double on the host and rounded, as the CPU does
};

// g = grad * grad_scale; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g g;
// p -= lr * ((m inv_bc1) / (sqrt(v inv_bc2) + eps) + wd p), with the CPU's order of operations.
__global__ void adamw_kernel(float* __restrict__ p, const float* __restrict__ grad, float* __restrict__ exp_avg,
                             float* __restrict__ exp_avg_sq, int64_t n, AdamWArgs a) {
  const float one_minus_b1 = 1.f - a.b1, one_minus_b2 = 1.f - a.b2;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = __fmul_rn(grad[i], a.grad_scale);
    const float m = __fadd_rn(__fmul_rn(a.b1, exp_avg[i]), __fmul_rn(one_minus_b1, g));
    const float v = __fadd_rn(__fmul_rn(a.b2, exp_avg_sq[i]), __fmul_rn(__fmul_rn(one_minus_b2, g), g));
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const float update =
        __fdiv_rn(__fmul_rn(m, a.inv_bc1), __fadd_rn(__fsqrt_rn(__fmul_rn(v, a.inv_bc2)), a.eps));
    const float old = p[i];
    p[i] = __fsub_rn(old, __fmul_rn(a.lr, __fadd_rn(update, __fmul_rn(a.wd, old))));
  }
}

}  // namespace

double sum_squares(const std::vector<Tensor>& xs) {
  // Each tensor's blocks write their partials into a range of one workspace; one block then adds all
  // partials in a fixed order, and one copy brings the total back.
  int64_t count = 0;
  for (const Tensor& x : xs)
    if (x.numel() > 0) count += reduce_blocks(x.numel());
  if (count == 0) return 0.0;
  if (count > std::numeric_limits<int>::max()) throw std::invalid_argument("sum_squares: too many tensors");
  // The partials and the result, as doubles in i64 storage (8 bytes each).
  Tensor work = Tensor::empty({count + 1}, DType::i64, Device::cuda, MemKind::workspace);
  double* partials = work.data<double>();
  double* total = partials + count;
  int64_t at = 0;
  for (const Tensor& x : xs) {
    const int64_t n = x.numel();
    if (n == 0) continue;
    const unsigned blocks = reduce_blocks(n);
    sum_squares_partials_kernel<<<blocks, kThreads, 0, stream()>>>(x.data<float>(), n, partials + at);
    MT_CUDA_LAUNCHED("sum_squares_partials_kernel");
    at += blocks;
  }
  sum_partials_kernel<<<1, kThreads, 0, stream()>>>(partials, static_cast<int>(count), total);
  MT_CUDA_LAUNCHED("sum_partials_kernel");
  double result = 0.0;
  copy_bytes(&result, Device::cpu, total, Device::cuda, sizeof(double));  // waits for the stream
  return result;
}

bool has_inf_or_nan(const Tensor& x) {
  const int64_t n = x.numel();
  if (n == 0) return false;
  Tensor work = Tensor::empty({1}, DType::i32, Device::cuda, MemKind::workspace);
  int* flag = work.data<int>();
  fill_zero(flag, sizeof(int));
  nonfinite_kernel<<<reduce_blocks(n), kThreads, 0, stream()>>>(x.data<float>(), n, flag);
  MT_CUDA_LAUNCHED("nonfinite_kernel");
  int result = 0;
  copy_bytes(&result, Device::cpu, flag, Device::cuda, sizeof(int));  // waits for the stream
  return result != 0;
}

void adamw_step(Tensor& master, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, const AdamWOptions& opt) {
  const int64_t n = master.numel();
  if (n == 0) return;
  const double step = static_cast<double>(opt.step);
  AdamWArgs a;
  a.lr = opt.lr;
  a.b1 = opt.beta1;
  a.b2 = opt.beta2;
  a.eps = opt.eps;
  a.wd = opt.weight_decay;
  a.grad_scale = opt.grad_scale;
  a.inv_bc1 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(opt.beta1), step)));
  a.inv_bc2 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(opt.beta2), step)));
  const unsigned blocks = std::min<unsigned>(blocks_for(n, kThreads), kMaxElementwiseBlocks);
  adamw_kernel<<<blocks, kThreads, 0, stream()>>>(master.data<float>(), grad.data<float>(), exp_avg.data<float>(),
                                                  exp_avg_sq.data<float>(), n, a);
  MT_CUDA_LAUNCHED("adamw_kernel");
}

}  // namespace mt::cuda
