// rope.cu: rotary position embedding on the GPU, in place on the query and key slots of a (B, T, G, R + 2, D)
// qkv activation, with the numerics of core/cpu/rope.cpp (core/tensor/ops.h gives them exactly):
//  * inv_freq_i (plain, or a scaled model's: rope_inv_freq) is computed on the host with the CPU's code (bit for bit
//    the same) and passed by value in the kernel's parameters, so D is limited to kMaxHeadDim;
//  * a first kernel fills a (T, D/2) table of fp32 cos and sin of a = float(p) * inv_freq_i (an fp32 product),
//    taken in double and rounded (CUDA's double cos and sin are within 2 ulp of double, so the fp32 table
//    equals the CPU's but where a double result lies within an ulp of an fp32 rounding boundary);
//  * a second kernel rotates each (x_i, x_{i+D/2}) pair of the R queries and the key of every group, one
//    thread per pair, in fp32 without FMA contractions, rounded once on store. The value slots are untouched.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/cuda/kernels.cuh"
#include "core/cuda/ops_cuda.h"

namespace mt::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxHeadDim = 512;

struct InvFreq {
  float v[kMaxHeadDim / 2];  // (D/2)
};

// cos_t[t, i] = float(cos(a)) * scale, sin_t[t, i] = float(sin(a)) * scale (negated for the inverse),
// a = float(p) * inv_freq_i.
__global__ void rope_table_kernel(InvFreq inv_freq, float* cos_t, float* sin_t, int64_t T, int64_t half,
                                  int64_t position_offset, int64_t split_at, int64_t split_position, bool inverse,
                                  float scale) {
  const int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (k >= T * half) return;
  const int64_t t = k / half, i = k % half;
  const float p =
      static_cast<float>(split_at > 0 && t >= split_at ? split_position + (t - split_at) : position_offset + t);
  const double a = static_cast<double>(__fmul_rn(p, inv_freq.v[i]));
  double s, c;
  sincos(a, &s, &c);
  const float cf = static_cast<float>(c), sf = static_cast<float>(s);
  cos_t[k] = __fmul_rn(cf, scale);  // yarn's attention factor, as the CPU's fp32 product (exact for 1)
  sin_t[k] = __fmul_rn(inverse ? -sf : sf, scale);
}

// One thread per rotated pair: n = B * T * G * (R + 1) * half pairs, pair index ((btg * (R + 1) + slot) * half + i).
// With packed documents' positions (B, T) i32, token (b, t) takes the table's row positions[b, t] (the table then
// holds positions 0..position_rows-1), else row t.
template <class T>
__global__ void rope_apply_kernel(T* qkv, const float* cos_t, const float* sin_t, int64_t n, int64_t T_len, int64_t G,
                                  int64_t S, int64_t D, const int32_t* positions) {
  const int64_t half = D / 2, rotated = S - 1;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = k % half;
    const int64_t slot = (k / half) % rotated;
    const int64_t btg = k / (half * rotated);  // ((b * T + t) * G + g)
    const int64_t bt = btg / G, t = positions ? positions[bt] : bt % T_len;
    T* x = qkv + (btg * S + slot) * D;
    const float c = cos_t[t * half + i], s = sin_t[t * half + i];
    const float x0 = to_f32<T>(x[i]), x1 = to_f32<T>(x[i + half]);
    x[i] = from_f32<T>(__fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s)));         // x0 cos - x1 sin
    x[i + half] = from_f32<T>(__fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s)));  // x1 cos + x0 sin
  }
}

}  // namespace

void rope_(Tensor& qkv, const RopeOptions& opt) {
  const int64_t B = qkv.dim(0), T = qkv.dim(1), G = qkv.dim(2), S = qkv.dim(3), D = qkv.dim(4);
  const int64_t half = D / 2;
  if (D > kMaxHeadDim)
    throw std::invalid_argument("rope_: the CUDA kernel supports a head dim D up to " + std::to_string(kMaxHeadDim) +
                                ", got " + std::to_string(D));
  const int64_t n = B * T * G * (S - 1) * half;
  if (n == 0) return;

  InvFreq inv_freq{};  // as core/cpu/rope.cpp's: rope_inv_freq
  const std::vector<float> freqs = rope_inv_freq(opt, D);
  std::copy(freqs.begin(), freqs.end(), inv_freq.v);

  // Packed documents' positions lie in [0, rows): T, or the whole sequence's length for a context rank's chunks.
  const int64_t rows = opt.positions.defined() && opt.position_rows > 0 ? opt.position_rows : T;
  Tensor table =
      Tensor::empty({2 * rows * half}, DType::f32, Device::cuda, MemKind::workspace);  // cos (rows, D/2), sin
  float* cos_t = table.data<float>();
  float* sin_t = cos_t + rows * half;
  rope_table_kernel<<<blocks_for(rows * half, kThreads), kThreads, 0, stream()>>>(
      inv_freq, cos_t, sin_t, rows, half, opt.position_offset, opt.split_at, opt.split_position, opt.inverse,
      opt.attention_factor);
  MT_CUDA_LAUNCHED("rope_table_kernel");
  const unsigned grid = grid_1d(n, kThreads);
  MT_DISPATCH_FLOAT(qkv.dtype(), "rope_", T_,
                    rope_apply_kernel<T_><<<grid, kThreads, 0, stream()>>>(
                        qkv.data<T_>(), cos_t, sin_t, n, T, G, S, D,
                        opt.positions.defined() ? opt.positions.data<int32_t>() : nullptr));
  MT_CUDA_LAUNCHED("rope_apply_kernel");
}

}  // namespace mt::cuda
