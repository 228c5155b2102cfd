// dropout.cu: dropout keyed by global coordinates on the GPU. Element (b, t, c) of a (B, T, C) tensor is kept
// when dropout_uniform(seed, site, sample_offset + b, dropout_row(opt, t), col_offset + c) >= p (dropout_row:
// core/tensor/ops.h, DropoutRows here) and then scaled by 1 / (1 - p), as core/cpu/dropout.cpp; the masks are the
// CPU's bit for bit, since both draw from the same Philox blocks (core/base/rng.h). The backward regenerates the
// same mask.
//
// Launch: one thread per Philox block of a row (four neighbouring global columns, aligned to multiples of
// four of the global column, so a shard whose col_offset is not a multiple of four starts mid-block);
// gridDim.x covers a row's blocks, gridDim.y walks the B * T rows in a grid-stride loop. Where every row is
// whole 16-byte vectors of whole Philox blocks (x and out aligned, C a multiple of the vector width, col_offset
// a multiple of four: dropout_rows_take_vectors), one thread takes a vector (4 fp32 or 8 bf16/fp16 columns,
// one or two Philox blocks) instead; each column still takes lane (gc & 3) of Philox block gc >> 2 of its
// global column gc, so the mask is the same bits either way.
#include <algorithm>
#include <cstdint>

#include "core/cuda/kernels.cuh"
#include "core/cuda/ops_cuda.h"
#include "core/base/rng.h"

namespace mt::cuda {

namespace {

// out = x * mask / (1 - p) over the N = B * T rows of C columns; out may alias x (each element is read and
// written by the same thread).
template <class T>
__global__ void dropout_kernel(const T* x, T* out, int64_t N, int64_t T_len, int64_t C, uint64_t seed, uint64_t site,
                               uint64_t sample_offset, DropoutRows rows, uint64_t col_offset, uint64_t first_block,
                               uint64_t blocks_per_row, float p, float scale) {
  const uint64_t k = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;  // Philox block of the row
  if (k >= blocks_per_row) return;
  const uint64_t block = first_block + k;
  const uint64_t col_end = col_offset + static_cast<uint64_t>(C);  // one past the last global column
  for (int64_t n = blockIdx.y; n < N; n += gridDim.y) {
    const int64_t b = n / T_len, t = n - b * T_len;
    const Philox4 r = dropout_block(seed, site, sample_offset + static_cast<uint64_t>(b), rows.at(t), block);
    const T* xr = x + n * C;
    T* yr = out + n * C;
#pragma unroll
    for (int lane = 0; lane < 4; ++lane) {
      const uint64_t gc = block * 4 + static_cast<uint64_t>(lane);  // global column
      if (gc < col_offset || gc >= col_end) continue;
      const int64_t c = static_cast<int64_t>(gc - col_offset);
      const float v = to_f32<T>(xr[c]);
      // The CPU's keep scale is 0 or `scale`; a dropped element is 0 even when x is inf or NaN.
      yr[c] = from_f32<T>(uniform_from_bits(r.v[lane]) >= p ? __fmul_rn(v, scale) : 0.f);
    }
  }
}

// The vector form: thread k of a row takes the E columns [kE, kE + E) (a 16-byte vector), whose global columns
// col_offset + kE + 4q + lane (col_offset a multiple of 4) are lane `lane` of Philox block first_block + k E/4 + q.
template <class T>
__global__ void dropout_vec_kernel(const T* x, T* out, int64_t N, int64_t T_len, int64_t C, uint64_t seed,
                                   uint64_t site, uint64_t sample_offset, DropoutRows rows, uint64_t first_block,
                                   int64_t vecs_per_row, float p, float scale) {
  constexpr int E = kVec<T>, Q = E / 4;                                           // Q Philox blocks a vector
  const int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;  // vector of the row
  if (k >= vecs_per_row) return;
  for (int64_t n = blockIdx.y; n < N; n += gridDim.y) {
    const int64_t b = n / T_len, t = n - b * T_len;
    const int64_t at = n * C + k * E;
    float v[E];
    load_f32s<E>(x + at, v);
    drop_vector(v, seed, site, sample_offset + static_cast<uint64_t>(b), rows.at(t),
                first_block + static_cast<uint64_t>(k * Q), p, scale);
    store_f32s<E>(out + at, v);
  }
}

void apply_mask(const char* op, const Tensor& x, Tensor& out, const DropoutOptions& opt) {
  const int64_t B = x.dim(0), T_len = x.dim(1), C = x.dim(2);
  if (opt.p == 0.f) {
    if (out.raw() != x.raw()) out.copy_from(x);
    return;
  }
  const int64_t N = B * T_len;
  if (N == 0 || C == 0) return;
  const float scale = 1.f / (1.f - opt.p);  // as dropout_row_scales (core/base/rng.h), computed on the host
  const uint64_t sample_offset = static_cast<uint64_t>(opt.sample_offset);
  const DropoutRows rows{static_cast<uint64_t>(opt.row_offset), opt.split_at,
                         static_cast<uint64_t>(opt.split_position)};
  MT_DISPATCH_FLOAT(x.dtype(), op, T, {
    const T* px = x.data<T>();
    T* po = out.data<T>();
    constexpr int V = kVec<T>;
    if (dropout_rows_take_vectors(C, opt.col_offset, V, px, po)) {
      const RowUnitsGrid g = row_units_grid(N, C / V);
      dropout_vec_kernel<T>
          <<<grid_dims(g), g.threads, 0, stream()>>>(px, po, N, T_len, C, opt.seed, opt.site, sample_offset, rows,
                                                     static_cast<uint64_t>(opt.col_offset) >> 2, C / V, opt.p, scale);
    } else {
      const DropoutGrid g = dropout_grid(N, C, opt.col_offset);
      dropout_kernel<T><<<grid_dims(g.grid), g.grid.threads, 0, stream()>>>(px, po, N, T_len, C, opt.seed, opt.site,
                                                                            sample_offset, rows, g.col0, g.first_block,
                                                                            g.blocks_per_row, opt.p, scale);
    }
  });
  MT_CUDA_LAUNCHED("dropout_kernel");
}

}  // namespace

void dropout_forward(const Tensor& x, Tensor& out, const DropoutOptions& opt) {
  apply_mask("dropout_forward", x, out, opt);
}

void dropout_backward(const Tensor& dout, Tensor& dx, const DropoutOptions& opt) {
  apply_mask("dropout_backward", dout, dx, opt);
}

}  // namespace mt::cuda
