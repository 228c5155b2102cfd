// fused.cu: the fused residual + dropout op on the GPU, out = residual + dropout(x), in one pass. It rounds
// as the CPU reference (core/cpu/fused.cpp) and the unfused dropout_forward + add do: the dropped value is
// rounded to the storage dtype first, then added to the residual in fp32 and rounded again (free in a fused
// kernel, and it keeps the GPU on the CPU's numbers). The mask is dropout_forward's bit for bit (the same
// Philox blocks and launch shape as core/cuda/dropout.cu).
#include <algorithm>
#include <cstdint>

#include "core/cuda/kernels.cuh"
#include "core/cuda/ops_cuda.h"
#include "core/rng.h"

namespace mt::cuda {

namespace {

// One thread per Philox block of a row (four neighbouring global columns); gridDim.y walks the B * T rows.
// out may alias x or residual: each element is read and written by the same thread.
template <class T>
__global__ void dropout_add_kernel(const T* x, const T* residual, T* out, int64_t N, int64_t T_len, int64_t C,
                                   uint64_t seed, uint64_t site, uint64_t sample_offset, uint64_t row_offset,
                                   uint64_t col_offset, uint64_t first_block, uint64_t blocks_per_row, float p,
                                   float scale) {
  const uint64_t k = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;  // Philox block of the row
  if (k >= blocks_per_row) return;
  const uint64_t block = first_block + k;
  const uint64_t col_end = col_offset + static_cast<uint64_t>(C);
  for (int64_t n = blockIdx.y; n < N; n += gridDim.y) {
    const int64_t b = n / T_len, t = n - b * T_len;
    Philox4 r{};
    if (p != 0.f)
      r = dropout_block(seed, site, sample_offset + static_cast<uint64_t>(b), row_offset + static_cast<uint64_t>(t),
                        block);
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

}  // namespace

void dropout_add(const Tensor& x, const Tensor& residual, Tensor& out, const DropoutOptions& opt) {
  const int64_t B = x.dim(0), T_len = x.dim(1), C = x.dim(2);
  const int64_t N = B * T_len;
  if (N == 0 || C == 0) return;
  const float scale = opt.p == 0.f ? 1.f : 1.f / (1.f - opt.p);  // as dropout_row_scales, on the host
  const DropoutGrid g = dropout_grid(N, C, opt.col_offset);
  MT_DISPATCH_FLOAT(x.dtype(), "dropout_add", T,
                    dropout_add_kernel<T><<<grid_dims(g.grid), g.grid.threads, 0, stream()>>>(
                        x.data<T>(), residual.data<T>(), out.data<T>(), N, T_len, C, opt.seed, opt.site,
                        static_cast<uint64_t>(opt.sample_offset), static_cast<uint64_t>(opt.row_offset), g.col0,
                        g.first_block, g.blocks_per_row, opt.p, scale));
  MT_CUDA_LAUNCHED("dropout_add_kernel");
}

}  // namespace mt::cuda
