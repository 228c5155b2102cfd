// attention_backward.cu: the backward of the device attention (attention.cu has the math and the layout): the dq
// kernel (with delta), the dk/dv kernel, and their launch.
#include <cstdint>

#include "core/cuda/attention_common.cuh"
#include "core/cuda/attention_cudnn.h"
#include "core/cuda/kernels.cuh"
#include "core/cuda/ops_cuda.h"

namespace mt::cuda {

namespace {

// The two dot products of one row against tile rows lo..hi-1, as both backward kernels take them: lane t gets
// s = scale * (x . xs[t]) and d = y . ys[t] (each a warp sum of the lanes' partials, every lane computing it);
// the other lanes keep 0.
template <int DMAX, int C>
__device__ __forceinline__ void tile_dots(const float (&x)[C], const float (*xs)[DMAX], const float (&y)[C],
                                          const float (*ys)[DMAX], int lo, int hi, float scale, int lane, float& my_s,
                                          float& my_d) {
  my_s = 0.f;
  my_d = 0.f;
#pragma unroll 4
  for (int t = lo; t < hi; ++t) {
    const float s = scale * warp_sum(lane_dot<DMAX, C>(x, xs, t, lane));
    const float d = warp_sum(lane_dot<DMAX, C>(y, ys, t, lane));
    if (lane == t) {
      my_s = s;
      my_d = d;
    }
  }
}

// f(r, t) for each of this warp's rows t = row0 + r (r < ROWS) inside the sequence (t < T), in order of r.
template <int ROWS, class F>
__device__ __forceinline__ void for_each_warp_row(int64_t row0, int64_t T, F&& f) {
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const int64_t t = row0 + r;
    if (t >= T) continue;  // warp-uniform
    f(r, t);
  }
}

// ---- backward: dq and delta ----------------------------------------------------------------------------

template <class S, int DMAX>
__global__ void __launch_bounds__(kThreads)
    attention_backward_dq_kernel(const S* __restrict__ qkv, const S* __restrict__ dout, const float* __restrict__ lse,
                                 float* __restrict__ delta, S* __restrict__ dqkv, Geom g, Dropout drop) {
  using K = Cfg<DMAX>;
  constexpr int C = K::C, BK = K::BK, ROWS = K::ROWS, RB = K::RB;
  __shared__ float ks[BK][DMAX];
  __shared__ float vs[BK][DMAX];

  const int lane = threadIdx.x & 31;
  const QueryBlock at = query_block<RB, ROWS>(g);
  const int64_t bh = at.bh, b = at.b, h = at.h, row0 = at.row0, block_end = at.block_end, T = g.T;
  const int D = g.D;
  const int64_t qstride = g.qkv_stride(), ostride = g.out_stride();
  const S *q_head = qkv + at.q_at, *k_head = qkv + at.k_at, *v_head = qkv + at.v_at;
  S* dq_head = dqkv + at.q_at;
  const S* dout_head = dout + g.out_at(b, h);

  float q[ROWS][C], dO[ROWS][C], dq[ROWS][C], row_lse[ROWS], row_d[ROWS];
  double rowsum[ROWS];  // sum_j P_ij dP_ij, in double like the CPU's
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const int64_t i = row0 + r;
    load_row<S, C>(q[r], q_head, qstride, i, T, D, lane);
    load_row<S, C>(dO[r], dout_head, ostride, i, T, D, lane);
#pragma unroll
    for (int c = 0; c < C; ++c) dq[r][c] = 0.f;
    row_lse[r] = i < T ? lse[bh * T + i] : 0.f;
    row_d[r] = 0.f;
    rowsum[r] = 0.0;
  }

  const int64_t kend = g.causal ? block_end : T;
  for (int pass = 0; pass < 2; ++pass) {  // 0: delta; 1: dq (needs delta)
    if (pass == 1) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r) row_d[r] = static_cast<float>(rowsum[r]);
    }
    const int64_t kbegin = g.block_first_key(b, row0 - (threadIdx.x >> 5) * ROWS);  // as the forward
    for (int64_t j0 = kbegin; j0 < kend; j0 += BK) {
      __syncthreads();
      load_tile<S, DMAX, BK>(ks, k_head, qstride, j0, T, D);
      load_tile<S, DMAX, BK>(vs, v_head, qstride, j0, T, D);
      __syncthreads();
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        const int64_t i = row0 + r;
        if (i >= T) continue;  // warp-uniform
        const int64_t jend = g.causal ? i + 1 : T;
        const int nk = static_cast<int>(min(static_cast<int64_t>(BK), jend - j0));
        if (nk <= 0) continue;  // warp-uniform
        // Keys before lo belong to earlier documents or lie before the row's window (probability 0).
        const int lo = static_cast<int>(max(static_cast<int64_t>(0), g.first_key(b, i) - j0));
        if (lo >= nk) continue;  // warp-uniform
        float my_s, my_dv;       // lane jj: s_ij and dO_i . v_j for j = j0 + jj
        tile_dots<DMAX, C>(q[r], ks, dO[r], vs, lo, nk, g.scale, lane, my_s, my_dv);
        float p = 0.f, dp = 0.f;
        if (lane >= lo && lane < nk) {
          p = expf(my_s - row_lse[r]);
          const float z = drop.on ? keep_scale(drop, b, h, T, i, j0 + lane) : 1.f;
          dp = z == 0.f ? 0.f : my_dv * z;
        }
        if (pass == 0) {
          rowsum[r] += warp_sum(static_cast<double>(p) * static_cast<double>(dp));
        } else {
          const float ds = lane >= lo && lane < nk ? g.scale * p * (dp - row_d[r]) : 0.f;
#pragma unroll 4
          for (int jj = lo; jj < nk; ++jj) {
            const float dsj = __shfl_sync(kFull, ds, jj);
#pragma unroll
            for (int c = 0; c < C; ++c) dq[r][c] += dsj * ks[jj][lane + 32 * c];
          }
        }
      }
    }
  }

  for_each_warp_row<ROWS>(row0, T, [&](int r, int64_t i) {
    store_row<S, C>(dq[r], dq_head, qstride, i, D, lane);
    if (lane == 0) delta[bh * T + i] = row_d[r];
  });
}

// ---- backward: dk and dv -------------------------------------------------------------------------------

template <class S, int DMAX>
__global__ void __launch_bounds__(kThreads)
    attention_backward_dkv_kernel(const S* __restrict__ qkv, const S* __restrict__ dout, const float* __restrict__ lse,
                                  const float* __restrict__ delta, S* __restrict__ dqkv, Geom g, Dropout drop) {
  using K = Cfg<DMAX>;
  constexpr int C = K::C, BK = K::BK, ROWS = K::ROWS, RB = K::RB;
  __shared__ float qs[BK][DMAX];
  __shared__ float dos[BK][DMAX];
  __shared__ float lse_s[BK];
  __shared__ float delta_s[BK];
  __shared__ int64_t first_s[BK];  // the first key each query of the tile sees (its document's, its window's)

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t bg = blockIdx.x % g.BG;
  const int64_t tile = blockIdx.x / g.BG;  // causal: the first keys see the most queries, so they go first
  const int64_t b = bg / g.G, gi = bg % g.G;
  const int64_t T = g.T;
  const int D = g.D;
  const int64_t qstride = g.qkv_stride(), ostride = g.out_stride();
  const S* k_head = qkv + g.slot_at(b, gi, g.R);
  const S* v_head = qkv + g.slot_at(b, gi, g.R + 1);
  S* dk_head = dqkv + g.slot_at(b, gi, g.R);
  S* dv_head = dqkv + g.slot_at(b, gi, g.R + 1);
  const int64_t key_first = tile * RB;           // the block's first key row
  const int64_t row0 = key_first + warp * ROWS;  // this warp's first key row

  float k[ROWS][C], v[ROWS][C], dk[ROWS][C], dv[ROWS][C];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    load_row<S, C>(k[r], k_head, qstride, row0 + r, T, D, lane);
    load_row<S, C>(v[r], v_head, qstride, row0 + r, T, D, lane);
#pragma unroll
    for (int c = 0; c < C; ++c) dk[r][c] = dv[r][c] = 0.f;
  }

  // The group's query heads in order; each adds its terms to the same dk, dv registers.
  for (int64_t qr = 0; qr < g.R; ++qr) {
    const int64_t h = gi * g.R + qr;
    const S* q_head = qkv + g.slot_at(b, gi, qr);
    const S* dout_head = dout + g.out_at(b, h);
    const float* lse_head = lse + (b * g.H + h) * T;
    const float* delta_head = delta + (b * g.H + h) * T;
    for (int64_t i0 = g.causal ? key_first : 0; i0 < T; i0 += BK) {  // causal: queries i >= j only
      // Once a tile's first query sees only keys after the block's last (its document or its window starts
      // later), no later query sees any of them (first_key is nondecreasing): a window of W keys walks O(W + RB)
      // queries a key block. Block-uniform: every thread reads it. Always 0 with neither: no break.
      if (g.first_key(b, i0) >= key_first + RB) break;
      __syncthreads();
      load_tile<S, DMAX, BK>(qs, q_head, qstride, i0, T, D);
      load_tile<S, DMAX, BK>(dos, dout_head, ostride, i0, T, D);
      if (threadIdx.x < BK) {
        const int64_t t = i0 + threadIdx.x;
        lse_s[threadIdx.x] = t < T ? lse_head[t] : 0.f;
        delta_s[threadIdx.x] = t < T ? delta_head[t] : 0.f;
        first_s[threadIdx.x] = t < T ? g.first_key(b, t) : 0;
      }
      __syncthreads();
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        const int64_t j = row0 + r;
        if (j >= T) continue;  // warp-uniform
        // queries i0 + lo .. i0 + hi - 1 of this tile see key j
        const int lo =
            g.causal ? static_cast<int>(max(static_cast<int64_t>(0), min(static_cast<int64_t>(BK), j - i0))) : 0;
        const int hi = static_cast<int>(min(static_cast<int64_t>(BK), T - i0));
        if (lo >= hi) continue;  // warp-uniform
        float my_s, my_dv;       // lane ii: s_ij and dO_i . v_j for i = i0 + ii
        tile_dots<DMAX, C>(k[r], qs, v[r], dos, lo, hi, g.scale, lane, my_s, my_dv);
        float ds = 0.f, pz = 0.f;
        if (lane >= lo && lane < hi && j >= first_s[lane]) {  // query i0 + lane sees key j (document, window)
          const float p = expf(my_s - lse_s[lane]);
          const float z = drop.on ? keep_scale(drop, b, h, T, i0 + lane, j) : 1.f;
          const float dp = z == 0.f ? 0.f : my_dv * z;
          ds = g.scale * p * (dp - delta_s[lane]);
          pz = p * z;
        }
#pragma unroll 4
        for (int ii = lo; ii < hi; ++ii) {
          const float dsi = __shfl_sync(kFull, ds, ii);
          const float pzi = __shfl_sync(kFull, pz, ii);
#pragma unroll
          for (int c = 0; c < C; ++c) dk[r][c] += dsi * qs[ii][lane + 32 * c];
          if (pzi != 0.f) {  // as the CPU
#pragma unroll
            for (int c = 0; c < C; ++c) dv[r][c] += pzi * dos[ii][lane + 32 * c];
          }
        }
      }
    }
  }

  for_each_warp_row<ROWS>(row0, T, [&](int r, int64_t j) {
    store_row<S, C>(dk[r], dk_head, qstride, j, D, lane);
    store_row<S, C>(dv[r], dv_head, qstride, j, D, lane);
  });
}

// ---- host side -----------------------------------------------------------------------------------------

template <class S, int DMAX>
void backward_launch(const S* qkv, const S* dout, const float* lse, float* delta, S* dqkv, Geom g,
                     const Dropout& drop) {
  const unsigned blocks = grid_for<DMAX>("attention_backward", g);
  attention_backward_dq_kernel<S, DMAX><<<blocks, kThreads, 0, stream()>>>(qkv, dout, lse, delta, dqkv, g, drop);
  MT_CUDA_LAUNCHED("attention_backward_dq_kernel");
  const auto group_blocks = static_cast<unsigned>(g.tiles * g.BG);  // one per (b, g) and key tile
  attention_backward_dkv_kernel<S, DMAX><<<group_blocks, kThreads, 0, stream()>>>(qkv, dout, lse, delta, dqkv, g, drop);
  MT_CUDA_LAUNCHED("attention_backward_dkv_kernel");
}

template <class S>
void backward_typed(const Tensor& qkv, const Tensor& lse, const Tensor& dout, Tensor& dqkv, float* delta, const Geom& g,
                    const Dropout& drop) {
  const S* q = qkv.data<S>();
  const S* d = dout.data<S>();
  const float* l = lse.data<float>();
  S* dq = dqkv.data<S>();
  switch (dmax_for("attention_backward", g.D)) {
    case 32:
      return backward_launch<S, 32>(q, d, l, delta, dq, g, drop);
    case 64:
      return backward_launch<S, 64>(q, d, l, delta, dq, g, drop);
    case 128:
      return backward_launch<S, 128>(q, d, l, delta, dq, g, drop);
    default:
      return backward_launch<S, 256>(q, d, l, delta, dq, g, drop);
  }
}

}  // namespace

void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout, Tensor& dqkv,
                        const AttentionOptions& opt) {
  dmax_for("attention_backward", qkv.dim(4));
  const Geom g = geom_of(qkv, opt);
  if (g.BH == 0 || g.T == 0) return;
  if (attention_backward_on_cudnn(qkv, out, lse, dout, dqkv, opt)) return;
  note_attention_kernel();
  // The kernels do not read out: delta is summed from the recomputed probabilities, as the CPU does.
  const Dropout drop = dropout_of(opt);
  // delta_i = rowsum(P o dP) per (b, h, i), from the dq kernel to the dk/dv kernel.
  Tensor delta = Tensor::empty({g.BH * g.T}, DType::f32, Device::cuda, MemKind::workspace);
  MT_DISPATCH_FLOAT(qkv.dtype(), "attention_backward", S,
                    backward_typed<S>(qkv, lse, dout, dqkv, delta.data<float>(), g, drop));
}

}  // namespace mt::cuda
