// norm_rows.cuh: what the row kernels of LayerNorm (layernorm.cu) and RMSNorm (rmsnorm.cu) share: the forward's
// row sums and the dx kernels' per-column terms. The formulas that differ (the normalization) are passed in.
#pragma once
#include <cstdint>

#include "core/cuda/kernels.cuh"

namespace mt::cuda {

// The sum in double of term(v) over the fp32 values v of one row of C columns (xr: the row's first), for the
// whole block (every thread gets it): each thread adds its columns in step order (for_each_row_step), then
// block_sum adds the threads' sums (a fixed order: deterministic). Must be reached by every thread of the block.
template <int E, class T, class Term>
__device__ __forceinline__ double block_row_sum(const T* xr, int64_t C, Term&& term) {
  double sum = 0.0;
  for_each_row_step<E>(C, [&](int64_t c) {
    float v[E];
    load_f32s<E>(xr + c, v);
#pragma unroll
    for (int j = 0; j < E; ++j) sum += term(v[j]);
  });
  return block_sum(sum);
}

// The dx kernels' terms of the E columns from c of one row (xr, dr: the row's first x and dout): xh = xhat =
// normalize(x) and g = dout * w, in fp32 (__fmul_rn: no FMA the CPU reference does not use).
template <int E, class T, class Normalize>
__device__ __forceinline__ void norm_dx_terms(const T* xr, const T* dr, const float* w, int64_t c, float (&xh)[E],
                                              float (&g)[E], Normalize&& normalize) {
  float dv[E], wv[E];
  load_f32s<E>(xr + c, xh);
  load_f32s<E>(dr + c, dv);
  load_f32s<E>(w + c, wv);
#pragma unroll
  for (int j = 0; j < E; ++j) {
    xh[j] = normalize(xh[j]);
    g[j] = __fmul_rn(dv[j], wv[j]);
  }
}

}  // namespace mt::cuda
