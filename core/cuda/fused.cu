// fused.cu: the fused residual + dropout op on the GPU, out = residual + dropout(x), in one pass. It rounds
// as the CPU reference (core/cpu/fused.cpp) and the unfused dropout_forward + add do: the dropped value is
// rounded to the storage dtype first, then added to the residual in fp32 and rounded again (free in a fused
// kernel, and it keeps the GPU on the CPU's numbers). The mask is dropout_forward's bit for bit (the same
// Philox blocks and launch shapes as core/cuda/dropout.cu: one thread per Philox block, or one per 16-byte
// vector of whole Philox blocks where x, residual and out are aligned, C is a multiple of the vector width and
// col_offset of four).
#include <algorithm>
#include <cstdint>

#include "core/cuda/kernels.cuh"
#include "core/cuda/ops_cuda.h"
#include "core/base/rng.h"

namespace mt::cuda {

namespace {

// One thread per Philox block of a row (four neighbouring global columns); gridDim.y walks the B * T rows.
// out may alias x or residual: each element is read and written by the same thread.
template <class T>
__global__ void dropout_add_kernel(const T* x, const T* residual, T* out, int64_t N, int64_t T_len, int64_t C,
                                   uint64_t seed, uint64_t site, uint64_t sample_offset, DropoutRows rows,
                                   uint64_t col_offset, uint64_t first_block, uint64_t blocks_per_row, float p,
                                   float scale) {
  const uint64_t k = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;  // Philox block of the row
  if (k >= blocks_per_row) return;
  const uint64_t block = first_block + k;
  const uint64_t col_end = col_offset + static_cast<uint64_t>(C);
  for (int64_t n = blockIdx.y; n < N; n += gridDim.y) {
    const int64_t b = n / T_len, t = n - b * T_len;
    Philox4 r{};
    if (p != 0.f) r = dropout_block(seed, site, sample_offset + static_cast<uint64_t>(b), rows.at(t), block);
#pragma unroll
    for (int lane = 0; lane < 4; ++lane) {
      const uint64_t gc = block * 4 + static_cast<uint64_t>(lane);  // global column
      if (gc < col_offset || gc >= col_end) continue;
      const int64_t i = n * C + static_cast<int64_t>(gc - col_offset);
      float v = to_f32<T>(x[i]);
      // p == 0 copies x (already in the storage dtype); else a dropped element is 0 even when x is inf or
      // NaN, and the kept one is rounded to the storage dtype as dropout_forward stores it.
      if (p != 0.f) v = to_f32<T>(from_f32<T>(uniform_from_bits(r.v[lane]) >= p ? __fmul_rn(v, scale) : 0.f));
      out[i] = from_f32<T>(__fadd_rn(to_f32<T>(residual[i]), v));
    }
  }
}

// The vector form: thread k of a row takes the E columns [kE, kE + E) (a 16-byte vector), whose global columns
// col_offset + kE + 4q + lane (col_offset a multiple of 4) are lane `lane` of Philox block first_block + k E/4 + q.
// Each element rounds as the scalar kernel's.
template <class T>
__global__ void dropout_add_vec_kernel(const T* x, const T* residual, T* out, int64_t N, int64_t T_len, int64_t C,
                                       uint64_t seed, uint64_t site, uint64_t sample_offset, DropoutRows rows,
                                       uint64_t first_block, int64_t vecs_per_row, float p, float scale) {
  constexpr int E = kVec<T>, Q = E / 4;                                           // Q Philox blocks a vector
  const int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;  // vector of the row
  if (k >= vecs_per_row) return;
  for (int64_t n = blockIdx.y; n < N; n += gridDim.y) {
    const int64_t b = n / T_len, t = n - b * T_len;
    const int64_t at = n * C + k * E;
    float v[E], res[E];
    load_f32s<E>(x + at, v);
    load_f32s<E>(residual + at, res);
    if (p != 0.f) {
      drop_vector(v, seed, site, sample_offset + static_cast<uint64_t>(b), rows.at(t),
                  first_block + static_cast<uint64_t>(k * Q), p, scale);
#pragma unroll
      for (int j = 0; j < E; ++j) v[j] = to_f32<T>(from_f32<T>(v[j]));  // rounded as dropout_forward stores it
    }
#pragma unroll
    for (int j = 0; j < E; ++j) v[j] = __fadd_rn(res[j], v[j]);
    store_f32s<E>(out + at, v);
  }
}

}  // namespace

void dropout_add(const Tensor& x, const Tensor& residual, Tensor& out, const DropoutOptions& opt) {
  const int64_t B = x.dim(0), T_len = x.dim(1), C = x.dim(2);
  const int64_t N = B * T_len;
  if (N == 0 || C == 0) return;
  const float scale = opt.p == 0.f ? 1.f : 1.f / (1.f - opt.p);  // as dropout_row_scales, on the host
  const uint64_t sample_offset = static_cast<uint64_t>(opt.sample_offset);
  const DropoutRows rows{static_cast<uint64_t>(opt.row_offset), opt.split_at,
                         static_cast<uint64_t>(opt.split_position)};
  MT_DISPATCH_FLOAT(x.dtype(), "dropout_add", T, {
    const T *px = x.data<T>(), *pr = residual.data<T>();
    T* po = out.data<T>();
    constexpr int V = kVec<T>;
    if (dropout_rows_take_vectors(C, opt.col_offset, V, px, pr, po)) {
      const RowUnitsGrid g = row_units_grid(N, C / V);
      dropout_add_vec_kernel<T>
          <<<grid_dims(g), g.threads, 0, stream()>>>(px, pr, po, N, T_len, C, opt.seed, opt.site, sample_offset, rows,
                                                     static_cast<uint64_t>(opt.col_offset) >> 2, C / V, opt.p, scale);
    } else {
      const DropoutGrid g = dropout_grid(N, C, opt.col_offset);
      dropout_add_kernel<T><<<grid_dims(g.grid), g.grid.threads, 0, stream()>>>(
          px, pr, po, N, T_len, C, opt.seed, opt.site, sample_offset, rows, g.col0, g.first_block, g.blocks_per_row,
          opt.p, scale);
    }
  });
  MT_CUDA_LAUNCHED("dropout_add_kernel");
}

}  // namespace mt::cuda
