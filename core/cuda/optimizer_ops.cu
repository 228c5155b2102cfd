// optimizer_ops.cu: the reduction over f32 gradient buffers (grad_stats: sum of squares and inf/NaN flag; core/
// ops.cpp's sum_squares and has_inf_or_nan read it back) and the AdamW update on the device, with the CPU
// reference's semantics (core/cpu/optimizer_ops.cpp).
//
// grad_stats and adamw_multi_step take all of a step's tensors at once: a few launches whose tensor tables are
// kernel parameters, results left on the device (no wait). The sum is deterministic: per-block partials in
// double, added by one block in a fixed order.
// The AdamW update uses the explicitly rounded intrinsics (__fmul_rn, __fadd_rn, ...), which the compiler
// never contracts into FMAs, so each element follows the CPU formula operation for operation (the CPU build
// does not contract either) and equals it bit for bit.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "core/cuda/kernels.cuh"
#include "core/cuda/ops_cuda.h"

namespace mt::cuda {

namespace {

constexpr int kThreads = 256;

struct AdamWArgs {
  float lr, b1, b2, eps, wd, grad_scale;
  float inv_bc1, inv_bc2;  // 1 / (1 - beta^step), computed in double on the host and rounded, as the CPU does
};

// g = grad * grad_scale; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g g;
// p -= lr * ((m inv_bc1) / (sqrt(v inv_bc2) + eps) + wd p), with the CPU's order of operations. Returns the new p.
__device__ __forceinline__ float adamw_element(float* __restrict__ p, const float* __restrict__ grad,
                                               float* __restrict__ exp_avg, float* __restrict__ exp_avg_sq, int64_t i,
                                               const AdamWArgs& a, float wd) {
  const float one_minus_b1 = 1.f - a.b1, one_minus_b2 = 1.f - a.b2;
  const float g = __fmul_rn(grad[i], a.grad_scale);
  const float m = __fadd_rn(__fmul_rn(a.b1, exp_avg[i]), __fmul_rn(one_minus_b1, g));
  const float v = __fadd_rn(__fmul_rn(a.b2, exp_avg_sq[i]), __fmul_rn(__fmul_rn(one_minus_b2, g), g));
  exp_avg[i] = m;
  exp_avg_sq[i] = v;
  const float update = __fdiv_rn(__fmul_rn(m, a.inv_bc1), __fadd_rn(__fsqrt_rn(__fmul_rn(v, a.inv_bc2)), a.eps));
  const float old = p[i];
  const float out = __fsub_rn(old, __fmul_rn(a.lr, __fadd_rn(update, __fmul_rn(wd, old))));
  p[i] = out;
  return out;
}

__global__ void adamw_kernel(float* __restrict__ p, const float* __restrict__ grad, float* __restrict__ exp_avg,
                             float* __restrict__ exp_avg_sq, int64_t n, AdamWArgs a) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    adamw_element(p, grad, exp_avg, exp_avg_sq, i, a, a.wd);
}

AdamWArgs adamw_args(const AdamWOptions& opt) {
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
  return a;
}

// ---- multi-tensor launches ---------------------------------------------------------------------------
// A launch covers up to kTableSize tensors whose pointers travel in the kernel's parameter (a table of at
// most ~17 KB: CUDA 12.1+ on Volta and newer takes 32 KB, and CUDA 13 builds for nothing older), so nothing
// is copied to the device and nothing waits. Tensor k owns blocks [block_start[k], block_start[k + 1]), each
// a chunk of kChunk elements; a block finds its tensor by binary search.
constexpr int kTableSize = 256;
constexpr int64_t kAdamWChunk = 4096;    // elements per block: 16 per thread
constexpr int64_t kReduceChunk = 65536;  // elements per block of the reduction: 256 per thread

struct BlockMap {
  int64_t block_start[kTableSize + 1];
  int count;
};

__device__ __forceinline__ int tensor_of_block(const BlockMap& map, int64_t block) {
  int lo = 0, hi = map.count - 1;  // the last k with block_start[k] <= block
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (map.block_start[mid] <= block)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

struct AdamWTable {
  float* p[kTableSize];
  const float* g[kTableSize];
  float* m[kTableSize];
  float* v[kTableSize];
  void* out[kTableSize];  // the value in the compute dtype, or null
  int64_t n[kTableSize];
  float wd[kTableSize];
  BlockMap map;
};

template <class T>
__global__ void adamw_multi_kernel(const __grid_constant__ AdamWTable t, AdamWArgs a) {
  const int k = tensor_of_block(t.map, blockIdx.x);
  const int64_t begin = (blockIdx.x - t.map.block_start[k]) * kAdamWChunk;
  const int64_t end = min(t.n[k], begin + kAdamWChunk);
  float* p = t.p[k];
  T* out = static_cast<T*>(t.out[k]);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float updated = adamw_element(p, t.g[k], t.m[k], t.v[k], i, a, t.wd[k]);
    if (out) out[i] = from_f32<T>(updated);
  }
}

struct NormTable {
  const float* x[kTableSize];
  int64_t n[kTableSize];
  BlockMap map;
};

// partials[b] = the sum of squares of block b's chunk (in double, in an order fixed by the launch shape);
// *flag = 1 when the chunk holds an inf or NaN.
__global__ void grad_stats_partials_kernel(const __grid_constant__ NormTable t, double* __restrict__ partials,
                                           int* __restrict__ flag) {
  const int k = tensor_of_block(t.map, blockIdx.x);
  const int64_t begin = (blockIdx.x - t.map.block_start[k]) * kReduceChunk;
  const int64_t end = min(t.n[k], begin + kReduceChunk);
  const float* x = t.x[k];
  double s = 0.0;
  bool bad = false;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float f = x[i];
    const double d = f;
    s += d * d;  // exact in double, fused or not
    bad |= (__float_as_uint(f) & 0x7f800000u) == 0x7f800000u;
  }
  s = block_sum(s);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
  if (bad) *flag = 1;
}

// One block: stats = [the sum of partials in a fixed order, flag as 0 or 1].
__global__ void grad_stats_total_kernel(const double* __restrict__ partials, int64_t count,
                                        const int* __restrict__ flag, double* __restrict__ stats) {
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) s += partials[i];
  s = block_sum(s);
  if (threadIdx.x == 0) {
    stats[0] = s;
    stats[1] = *flag ? 1.0 : 0.0;
  }
}

// Splits `count` tensors (numel given by n(i)) into launches of at most kTableSize tensors, empty ones left
// out; calls launch(first index of each tensor in the launch..., map) with the map filled.
template <class NumelFn, class LaunchFn>
void for_each_launch(size_t count, int64_t chunk, NumelFn n, LaunchFn launch) {
  std::vector<size_t> members;
  BlockMap map{};
  auto flush = [&] {
    if (members.empty()) return;
    map.count = static_cast<int>(members.size());
    launch(members, map);
    members.clear();
  };
  for (size_t i = 0; i < count; ++i) {
    const int64_t numel = n(i);
    if (numel == 0) continue;
    if (members.size() == static_cast<size_t>(kTableSize)) flush();
    const int64_t start = members.empty() ? 0 : map.block_start[members.size()];
    map.block_start[members.size()] = start;
    map.block_start[members.size() + 1] = start + ceil_div(numel, chunk);
    members.push_back(i);
  }
  flush();
}

}  // namespace

void adamw_step(Tensor& master, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, const AdamWOptions& opt) {
  const int64_t n = master.numel();
  if (n == 0) return;
  const unsigned blocks = grid_1d(n, kThreads);
  adamw_kernel<<<blocks, kThreads, 0, stream()>>>(master.data<float>(), grad.data<float>(), exp_avg.data<float>(),
                                                  exp_avg_sq.data<float>(), n, adamw_args(opt));
  MT_CUDA_LAUNCHED("adamw_kernel");
}

// ---- fused step ops --------------------------------------------------------------------------------

void grad_stats(const std::vector<Tensor>& xs, Tensor& stats) {
  int64_t count = 0;  // partials: one per chunk of every tensor
  for (const Tensor& x : xs) count += ceil_div(x.numel(), kReduceChunk);
  // The partials and the inf/NaN flag, in one workspace (8 bytes a slot).
  Tensor work = Tensor::empty({count + 1}, DType::i64, Device::cuda, MemKind::workspace);
  double* partials = work.data<double>();
  int* flag = reinterpret_cast<int*>(partials + count);
  fill_zero(flag, sizeof(int));
  int64_t at = 0;
  for_each_launch(
      xs.size(), kReduceChunk, [&](size_t i) { return xs[i].numel(); },
      [&](const std::vector<size_t>& members, const BlockMap& map) {
        NormTable t{};
        for (size_t j = 0; j < members.size(); ++j) {
          t.x[j] = xs[members[j]].data<float>();
          t.n[j] = xs[members[j]].numel();
        }
        t.map = map;
        const int64_t blocks = map.block_start[map.count];
        grad_stats_partials_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream()>>>(t, partials + at, flag);
        MT_CUDA_LAUNCHED("grad_stats_partials_kernel");
        at += blocks;
      });
  grad_stats_total_kernel<<<1, 1024, 0, stream()>>>(partials, count, flag, stats.data<double>());
  MT_CUDA_LAUNCHED("grad_stats_total_kernel");
}

void adamw_multi_step(const std::vector<AdamWTensors>& ts, const AdamWOptions& opt) {
  const AdamWArgs a = adamw_args(opt);
  DType out_dtype = DType::f32;  // one dtype for every value (checked by core/tensor/ops.cpp)
  for (const AdamWTensors& t : ts)
    if (t.value.defined()) out_dtype = t.value.dtype();
  for_each_launch(
      ts.size(), kAdamWChunk, [&](size_t i) { return ts[i].master.numel(); },
      [&](const std::vector<size_t>& members, const BlockMap& map) {
        AdamWTable t{};
        for (size_t j = 0; j < members.size(); ++j) {
          const AdamWTensors& e = ts[members[j]];
          t.p[j] = e.master.data<float>();
          t.g[j] = e.grad.data<float>();
          t.m[j] = e.exp_avg.data<float>();
          t.v[j] = e.exp_avg_sq.data<float>();
          // A value that is the master itself (f32 parameters) is already written.
          t.out[j] = e.value.defined() && e.value.raw() != e.master.raw() ? e.value.raw() : nullptr;
          t.n[j] = e.master.numel();
          t.wd[j] = e.decay ? opt.weight_decay : 0.f;
        }
        t.map = map;
        const unsigned blocks = static_cast<unsigned>(map.block_start[map.count]);
        MT_DISPATCH_FLOAT(out_dtype, "adamw_multi_step", T,
                          adamw_multi_kernel<T><<<blocks, kThreads, 0, stream()>>>(t, a));
        MT_CUDA_LAUNCHED("adamw_multi_kernel");
      });
}

}  // namespace mt::cuda
