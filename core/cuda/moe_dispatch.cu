// moe_dispatch.cu: the mixture-of-experts token dispatch on the GPU, as core/cpu/moe_dispatch.cpp.
//
// moe_dispatch_index sorts the choices by expert with CUB's stable radix sort (so within an expert they keep
// their (token, choice) order, as the CPU's counting sort), then writes each choice's row; the counts are a
// histogram of int atomics (their values do not depend on the order). An expert id outside [0, E) (the CPU throws)
// sorts last and gets row -1 (dropped), and no count. With a capacity, a choice is kept when its rank within its
// expert is below it: its place in that sorted order (position policy), or its place in a second sort by (expert,
// weight descending, choice) as one 64-bit key (probs policy); the kept rows are then an exclusive scan of the kept
// flags in the first order, which is expert-major and (token, choice) ordered within an expert, as the CPU's.
// With an order or a part (drops decided over more tokens than the part dispatched, core/tensor/ops.h) the second
// sort runs over every choice, each placed at its (order[n], j) before the stable sort so that ties fall in that
// order (the position policy is the same sort with every weight equal), and the first sort over the part only.
// The gathers and scatters run one block per token, its threads over the columns, in fp32 with one rounding on
// store; moe_unpermute adds in choice order, without fused multiply-adds, as the CPU. moe_unpermute_backward_probs
// reduces each dot product in a fixed tree (a warp per choice): deterministic, within fp32 rounding of the CPU's
// double sums.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>

#include <cub/device/device_scan.cuh>

#include "core/cuda/kernels.cuh"
#include "core/cuda/ops_cuda.h"
#include "core/cuda/radix_sort.cuh"

namespace mt::cuda {

namespace {

constexpr int kThreads = 256;

// keys[i] = the expert of choice i, or E when it lies outside [0, E); pos[i] = i; counts[e] += 1 for valid ones.
__global__ void dispatch_keys_kernel(const int32_t* experts, int64_t n, int32_t E, uint32_t* keys, int32_t* pos,
                                     int32_t* counts) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t e = experts[i];
    const bool ok = e >= 0 && e < E;
    keys[i] = ok ? static_cast<uint32_t>(e) : static_cast<uint32_t>(E);
    pos[i] = static_cast<int32_t>(i);
    if (ok) atomicAdd(counts + e, 1);
  }
}

// row_of[pos[r]] = r for the sorted choices r of a valid expert, -1 for the others (sorted last).
__global__ void dispatch_rows_kernel(const uint32_t* keys, const int32_t* pos, int64_t n, uint32_t E, int32_t* row_of) {
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; r < n;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x)
    row_of[pos[r]] = keys[r] < E ? static_cast<int32_t>(r) : -1;
}

// ---- token dropping (a capacity) ----

// A weight's place in the drop order, larger for a larger weight: the float's bits made monotone, -0 as 0, a NaN 0
// (below every number); the CPU's weight_rank (core/cpu/moe_dispatch.cpp).
__device__ __forceinline__ uint32_t weight_rank(float w) {
  if (isnan(w)) return 0;
  if (w == 0.f) w = 0.f;
  const uint32_t bits = __float_as_uint(w);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// start[e] = the first sorted position of expert e (the key's bits from Shift up), for the experts that have
// choices (keys sorted ascending).
template <class Key, int Shift>
__global__ void expert_starts_kernel(const Key* keys, int64_t n, uint32_t E, int32_t* start) {
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; r < n;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const auto e = static_cast<uint32_t>(keys[r] >> Shift);
    if (e < E && (r == 0 || static_cast<uint32_t>(keys[r - 1] >> Shift) != e)) start[e] = static_cast<int32_t>(r);
  }
}

// keys[d] = (expert, ~weight_rank(w)) in one 64-bit key (an expert outside [0, E) as E; every weight equal
// without probs), pos[d] = i, at d = order[i / k] * k + i % k (i without an order): sorted stably, the choices of
// each expert by weight descending, ties in that order.
__global__ void weight_keys_kernel(const int32_t* experts, const float* probs, const int32_t* order, int64_t n,
                                   int64_t k, int32_t E, uint64_t* keys, int32_t* pos) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t e = experts[i];
    const uint64_t expert = e >= 0 && e < E ? static_cast<uint64_t>(e) : static_cast<uint64_t>(E);
    const int64_t d = order ? static_cast<int64_t>(order[i / k]) * k + i % k : i;
    keys[d] = (expert << 32) | static_cast<uint64_t>(probs ? ~weight_rank(probs[i]) : 0u);
    pos[d] = static_cast<int32_t>(i);
  }
}

// kept[pos[r]] = 1 when sorted position r (by expert, then weight) lies within its expert's first `capacity`.
__global__ void keep_heaviest_kernel(const uint64_t* keys, const int32_t* pos, const int32_t* start, int64_t n,
                                     uint32_t E, int64_t capacity, int32_t* kept) {
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; r < n;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const auto e = static_cast<uint32_t>(keys[r] >> 32);
    kept[pos[r]] = e < E && r - start[e] < capacity ? 1 : 0;
  }
}

// flags[r] = 1 when the choice at sorted position r (by expert) is kept: by kept[] (probs policy), or when it lies
// within its expert's first `capacity` (position policy, kept null).
__global__ void keep_flags_kernel(const uint32_t* keys, const int32_t* pos, const int32_t* start, const int32_t* kept,
                                  int64_t n, uint32_t E, int64_t capacity, int32_t* flags) {
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; r < n;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint32_t e = keys[r];
    flags[r] = e < E && (kept ? kept[pos[r]] != 0 : r - start[e] < capacity) ? 1 : 0;
  }
}

// row_of[pos[r]] = the number of kept choices before sorted position r, or -1 when r's choice is dropped.
__global__ void kept_rows_kernel(const int32_t* flags, const int32_t* before, const int32_t* pos, int64_t n,
                                 int32_t* row_of) {
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; r < n;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x)
    row_of[pos[r]] = flags[r] ? before[r] : -1;
}

// counts[e] += 1 for each kept choice of expert e (sorted position r by expert, flags[r] set).
__global__ void kept_counts_kernel(const uint32_t* keys, const int32_t* flags, int64_t n, int32_t* counts) {
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; r < n;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x)
    if (flags[r]) atomicAdd(counts + keys[r], 1);
}

// before := the exclusive prefix sum of the n flags (CUB's scan, deterministic).
void exclusive_sum(const int32_t* flags, int32_t* before, int64_t n) {
  const int count = static_cast<int>(n);
  size_t temp_bytes = 0;
  MT_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, temp_bytes, flags, before, count, stream()));
  Tensor temp = Tensor::empty({std::max<int64_t>(1, ceil_div(static_cast<int64_t>(temp_bytes), 4))}, DType::i32,
                              Device::cuda, MemKind::workspace);
  MT_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp.raw(), temp_bytes, flags, before, count, stream()));
}

// out[row_of[n, j]] = w[n, j] * x[n]; a block per token (grid-stride), its threads over the columns.
template <class T>
__global__ void permute_kernel(const T* x, const int32_t* row_of, const float* probs, T* out, int64_t N, int64_t k,
                               int64_t C) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t r = row_of[n * k + j];
      if (r < 0) continue;
      const float w = probs ? probs[n * k + j] : 1.f;
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
        out[static_cast<int64_t>(r) * C + c] = from_f32<T>(__fmul_rn(w, to_f32<T>(x[n * C + c])));
    }
}

// out[n] = sum over j of w[n, j] * y[row_of[n, j]], in j order.
template <class T>
__global__ void unpermute_kernel(const T* y, const int32_t* row_of, const float* probs, T* out, int64_t N, int64_t k,
                                 int64_t C) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x)
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      float acc = 0.f;
      for (int64_t j = 0; j < k; ++j) {
        const int32_t r = row_of[n * k + j];
        if (r < 0) continue;
        const float w = probs ? probs[n * k + j] : 1.f;
        acc = __fadd_rn(acc, __fmul_rn(w, to_f32<T>(y[static_cast<int64_t>(r) * C + c])));
      }
      out[n * C + c] = from_f32<T>(acc);
    }
}

// dprobs[i] = dot(dout[i / k], y[row_of[i]]): a warp per choice i (grid-stride over warps).
template <class T>
__global__ void unpermute_probs_backward_kernel(const T* dout, const T* y, const int32_t* row_of, float* dprobs,
                                                int64_t n_choices, int64_t k, int64_t C) {
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  const int lane = threadIdx.x % 32;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32; i < n_choices; i += warps) {
    const int32_t r = row_of[i];
    float acc = 0.f;
    if (r >= 0) {
      const T* d = dout + (i / k) * C;
      const T* v = y + static_cast<int64_t>(r) * C;
      for (int64_t c = lane; c < C; c += 32) acc = __fadd_rn(acc, __fmul_rn(to_f32<T>(d[c]), to_f32<T>(v[c])));
    }
    acc = warp_sum(acc);
    if (lane == 0) dprobs[i] = acc;
  }
}

}  // namespace

void moe_dispatch_index(const Tensor& experts, Tensor& row_of, Tensor& counts, const MoeCapacityOptions& cap) {
  const int64_t n = experts.numel(), k = experts.dim(1), E = counts.dim(0);
  const int64_t first = cap.part_begin * k, P = row_of.numel();  // the part's choices [first, first + P)
  fill_zero(counts.raw(), static_cast<size_t>(E) * sizeof(int32_t));
  if (P == 0) return;
  if (n > INT_MAX)
    throw std::invalid_argument("moe_dispatch_index: " + std::to_string(n) +
                                " choices, more than the CUDA backend "
                                "sorts (2^31 - 1)");
  // The part's choices by expert.
  Tensor keys_in = Tensor::empty({P}, DType::i32, Device::cuda, MemKind::workspace);  // uint32 keys
  Tensor keys_out = Tensor::empty({P}, DType::i32, Device::cuda, MemKind::workspace);
  Tensor pos_in = Tensor::empty({P}, DType::i32, Device::cuda, MemKind::workspace);
  Tensor pos_out = Tensor::empty({P}, DType::i32, Device::cuda, MemKind::workspace);
  auto* kin = static_cast<uint32_t*>(keys_in.raw());
  auto* kout = static_cast<uint32_t*>(keys_out.raw());
  const unsigned blocks = grid_1d(P, kThreads);
  dispatch_keys_kernel<<<blocks, kThreads, 0, stream()>>>(experts.data<int32_t>() + first, P, static_cast<int32_t>(E),
                                                          kin, pos_in.data<int32_t>(), counts.data<int32_t>());
  MT_CUDA_LAUNCHED("dispatch_keys_kernel");
  stable_sort_pairs(kin, kout, pos_in.data<int32_t>(), pos_out.data<int32_t>(), P, static_cast<uint64_t>(E));
  const int32_t* pos = pos_out.data<int32_t>();
  if (cap.capacity == 0) {  // dropless: every choice's row is its sorted position
    dispatch_rows_kernel<<<blocks, kThreads, 0, stream()>>>(kout, pos, P, static_cast<uint32_t>(E),
                                                            row_of.data<int32_t>());
    MT_CUDA_LAUNCHED("dispatch_rows_kernel");
    return;
  }
  // Token dropping. start (E) i32: each expert's first sorted position (in the sort that decides).
  Tensor start = Tensor::empty({E}, DType::i32, Device::cuda, MemKind::workspace);
  Tensor kept;  // (n) i32, by choice: kept by the sort over every choice
  if (cap.probs || cap.order || P != n) {
    const unsigned all_blocks = grid_1d(n, kThreads);
    Tensor wkeys_in = Tensor::empty({n}, DType::i64, Device::cuda, MemKind::workspace);  // uint64 keys
    Tensor wkeys_out = Tensor::empty({n}, DType::i64, Device::cuda, MemKind::workspace);
    // A part of every choice reuses the first sort's buffers: its input keys and positions are free again.
    const Tensor wpos_in = P == n ? pos_in : Tensor::empty({n}, DType::i32, Device::cuda, MemKind::workspace);
    const Tensor wpos_out = P == n ? keys_in : Tensor::empty({n}, DType::i32, Device::cuda, MemKind::workspace);
    auto* win = static_cast<uint64_t*>(wkeys_in.raw());
    auto* wout = static_cast<uint64_t*>(wkeys_out.raw());
    weight_keys_kernel<<<all_blocks, kThreads, 0, stream()>>>(
        experts.data<int32_t>(), cap.probs ? cap.probs->data<float>() : nullptr,
        cap.order ? cap.order->data<int32_t>() : nullptr, n, k, static_cast<int32_t>(E), win, wpos_in.data<int32_t>());
    MT_CUDA_LAUNCHED("weight_keys_kernel");
    stable_sort_pairs(win, wout, wpos_in.data<int32_t>(), wpos_out.data<int32_t>(), n,
                      (static_cast<uint64_t>(E) << 32) | uint64_t{0xFFFFFFFF});
    expert_starts_kernel<uint64_t, 32>
        <<<all_blocks, kThreads, 0, stream()>>>(wout, n, static_cast<uint32_t>(E), start.data<int32_t>());
    MT_CUDA_LAUNCHED("expert_starts_kernel");
    kept = Tensor::empty({n}, DType::i32, Device::cuda, MemKind::workspace);
    keep_heaviest_kernel<<<all_blocks, kThreads, 0, stream()>>>(wout, wpos_out.data<int32_t>(), start.data<int32_t>(),
                                                                n, static_cast<uint32_t>(E), cap.capacity,
                                                                kept.data<int32_t>());
    MT_CUDA_LAUNCHED("keep_heaviest_kernel");
  } else {  // the position policy over the part, which is every choice
    expert_starts_kernel<uint32_t, 0>
        <<<blocks, kThreads, 0, stream()>>>(kout, P, static_cast<uint32_t>(E), start.data<int32_t>());
    MT_CUDA_LAUNCHED("expert_starts_kernel");
  }
  int32_t* flags = pos_in.data<int32_t>();  // free again
  keep_flags_kernel<<<blocks, kThreads, 0, stream()>>>(kout, pos, start.data<int32_t>(),
                                                       kept.defined() ? kept.data<int32_t>() + first : nullptr, P,
                                                       static_cast<uint32_t>(E), cap.capacity, flags);
  MT_CUDA_LAUNCHED("keep_flags_kernel");
  Tensor before = Tensor::empty({P}, DType::i32, Device::cuda, MemKind::workspace);
  exclusive_sum(flags, before.data<int32_t>(), P);
  kept_rows_kernel<<<blocks, kThreads, 0, stream()>>>(flags, before.data<int32_t>(), pos, P, row_of.data<int32_t>());
  MT_CUDA_LAUNCHED("kept_rows_kernel");
  fill_zero(counts.raw(), static_cast<size_t>(E) * sizeof(int32_t));  // the kept choices only
  kept_counts_kernel<<<blocks, kThreads, 0, stream()>>>(kout, flags, P, counts.data<int32_t>());
  MT_CUDA_LAUNCHED("kept_counts_kernel");
}

void moe_permute(const Tensor& x, const Tensor& row_of, const Tensor* probs, Tensor& out) {
  const int64_t N = x.dim(0), C = x.dim(1), k = row_of.dim(1);
  if (N == 0 || C == 0 || k == 0) return;
  const float* w = probs ? probs->data<float>() : nullptr;
  MT_DISPATCH_FLOAT(x.dtype(), "moe_permute", T,
                    permute_kernel<T><<<row_grid(N, kMaxStrideBlocks), threads_for_cols(C, kThreads), 0, stream()>>>(
                        x.data<T>(), row_of.data<int32_t>(), w, out.data<T>(), N, k, C));
  MT_CUDA_LAUNCHED("permute_kernel");
}

void moe_unpermute(const Tensor& y, const Tensor& row_of, const Tensor* probs, Tensor& out) {
  const int64_t N = out.dim(0), C = out.dim(1), k = row_of.dim(1);
  if (N == 0 || C == 0) return;
  const float* w = probs ? probs->data<float>() : nullptr;
  MT_DISPATCH_FLOAT(y.dtype(), "moe_unpermute", T,
                    unpermute_kernel<T><<<row_grid(N, kMaxStrideBlocks), threads_for_cols(C, kThreads), 0, stream()>>>(
                        y.data<T>(), row_of.data<int32_t>(), w, out.data<T>(), N, k, C));
  MT_CUDA_LAUNCHED("unpermute_kernel");
}

void moe_unpermute_backward_probs(const Tensor& dout, const Tensor& y, const Tensor& row_of, Tensor& dprobs) {
  const int64_t n = row_of.numel(), k = row_of.dim(1), C = dout.dim(1);
  if (n == 0) return;
  const unsigned blocks = grid_1d(n * 32, kThreads);
  MT_DISPATCH_FLOAT(dout.dtype(), "moe_unpermute_backward_probs", T,
                    unpermute_probs_backward_kernel<T><<<blocks, kThreads, 0, stream()>>>(
                        dout.data<T>(), y.data<T>(), row_of.data<int32_t>(), dprobs.data<float>(), n, k, C));
  MT_CUDA_LAUNCHED("unpermute_probs_backward_kernel");
}

}  // namespace mt::cuda
