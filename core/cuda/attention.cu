// attention.cu: causal (or full) multi-head attention on the device, with the CPU reference's semantics
// (core/cpu/attention.cpp): the forward saves only each row's log-sum-exp, the backward recomputes the
// probabilities from q, k and lse. No (T, T) matrix is stored, so memory is independent of T.
//
// Math for one head, Z the dropout keep scales (0 or 1 / (1 - p), all ones without dropout):
//   S = scale * Q K^T, P = softmax(S) = exp(S - lse), O = (P o Z) V
//   dV = (P o Z)^T dO, dP = (dO V^T) o Z, dS = P o (dP - delta), delta = rowsum(P o dP),
//   dQ = scale dS K, dK = scale dS^T Q.
// Z comes from dropout_uniform at (sample_offset + b, (head_offset + h) * T + i, j), the CPU's coordinates,
// so masks agree bit for bit.
//
// Grouped-query attention: qkv (B, T, G, R + 2, D), query head h = g R + r reads query slot r of group g and the
// group's key (slot R) and value (slot R + 1); R = 1 is GPT's (B, T, H, 3, D). The forward and dq kernels run
// per query head; the dk/dv kernel runs per group and key tile and walks the group's R heads one after the
// other inside the block (r = 0..R-1, each over its query tiles), accumulating dk_j and dv_j in registers and
// storing once: the sum over the group is deterministic and needs no workspace (R = 1: the old order exactly).
//
// Layout of every kernel: a block of kWarps warps serves RB = kWarps * ROWS consecutive rows of one (b, h),
// each warp ROWS of them; a lane holds columns lane + 32 c (c < DMAX / 32) of each of its rows' vectors
// (DMAX, the head dimension rounded up to 32, 64, 128 or 256; columns >= D are zeros). The block walks the
// other side's rows in tiles of BK rows staged in shared memory as fp32. A dot product is a lane partial
// reduced over the warp (every lane gets the same value); lane jj then owns the row's entry for tile row jj
// (probability, mask, gradient), and the accumulation loops broadcast it back with a shuffle.
//   forward:        rows = queries, tiles = keys (K, V); online softmax over the tiles.
//   backward dq:    rows = queries, tiles = keys (K, V); pass 1 sums delta_i = rowsum(P o dP) in double
//                   (as the CPU), pass 2 accumulates dq_i; delta goes to a (B, H, T) f32 workspace.
//   backward dk/dv: rows = keys of one (b, g), tiles = queries (Q, dO, lse, delta) of each of the group's heads
//                   in turn; accumulates dk_j and dv_j.
// Packed documents and the sliding window (AttentionOptions::positions, ::window) narrow query i's keys to
// [first_key(i), i] (Geom::first_key, nondecreasing in i): tiles before a block's first key are never loaded, and
// the dk/dv kernel stops at the first query tile that sees none of its keys, so a window W costs O(T W).
// Every output element is written by exactly one lane, sums run in a fixed order: deterministic.
// Speed is that of a plain tiled kernel, not FlashAttention's (no tensor cores).
//
// The entry points ask cuDNN's fused flash attention first (attention_cudnn.h: bf16 / fp16 without dropout, a
// shape cuDNN supports, MEGATRAIN_ATTENTION); these kernels serve every other call.
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "core/cuda/attention_common.cuh"
#include "core/cuda/attention_cudnn.h"
#include "core/cuda/kernels.cuh"
#include "core/cuda/ops_cuda.h"
#include "core/base/rng.h"

namespace mt::cuda {

namespace {

// ---- forward -------------------------------------------------------------------------------------------

template <class S, int DMAX>
__global__ void __launch_bounds__(kThreads) attention_forward_kernel(const S* __restrict__ qkv, S* __restrict__ out,
                                                                     float* __restrict__ lse, Geom g, Dropout drop) {
  using K = Cfg<DMAX>;
  constexpr int C = K::C, BK = K::BK, ROWS = K::ROWS, RB = K::RB;
  __shared__ float ks[BK][DMAX];
  __shared__ float vs[BK][DMAX];

  const int lane = threadIdx.x & 31;
  const QueryBlock at = query_block<RB, ROWS>(g);
  const int64_t bh = at.bh, b = at.b, h = at.h, row0 = at.row0, block_end = at.block_end, T = g.T;
  const int D = g.D;
  const int64_t qstride = g.qkv_stride(), ostride = g.out_stride();  // elements between rows t and t + 1
  const S *q_head = qkv + at.q_at, *k_head = qkv + at.k_at, *v_head = qkv + at.v_at;
  S* out_head = out + g.out_at(b, h);

  float q[ROWS][C], o[ROWS][C], m[ROWS];
  double l[ROWS];  // sum of exp(s - m) over the keys so far, in double like the CPU's
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    load_row<S, C>(q[r], q_head, qstride, row0 + r, T, D, lane);
#pragma unroll
    for (int c = 0; c < C; ++c) o[r][c] = 0.f;
    m[r] = -INFINITY;
    l[r] = 0.0;
  }

  const int64_t kend = g.causal ? block_end : T;  // keys any row of the block sees
  // Packed documents and the window: key tiles start at the block's first row's first key (earlier keys are no
  // row's), so a window of W keys costs O(W + RB) keys a block, not O(T).
  const int64_t kbegin = g.block_first_key(b, row0 - (threadIdx.x >> 5) * ROWS);
  for (int64_t j0 = kbegin; j0 < kend; j0 += BK) {
    __syncthreads();  // the previous tile has been read by every warp
    load_tile<S, DMAX, BK>(ks, k_head, qstride, j0, T, D);
    load_tile<S, DMAX, BK>(vs, v_head, qstride, j0, T, D);
    __syncthreads();
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const int64_t i = row0 + r;
      if (i >= T) continue;  // warp-uniform
      const int64_t jend = g.causal ? i + 1 : T;
      const int nk = static_cast<int>(min(static_cast<int64_t>(BK), jend - j0));  // keys j0 .. j0 + nk - 1
      if (nk <= 0) continue;                                                      // warp-uniform
      // Keys before lo belong to earlier documents or lie before the row's window (score -inf, probability 0).
      const int lo = static_cast<int>(max(static_cast<int64_t>(0), g.first_key(b, i) - j0));
      if (lo >= nk) continue;  // warp-uniform: the whole tile lies before the row's first key
      float my_s = -INFINITY, tile_max = -INFINITY;
#pragma unroll 4
      for (int jj = lo; jj < nk; ++jj) {
        const float s = g.scale * warp_sum(lane_dot<DMAX, C>(q[r], ks, jj, lane));
        if (lane == jj) my_s = s;
        tile_max = fmaxf(tile_max, s);
      }
      const float m_new = fmaxf(m[r], tile_max);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // no -inf - -inf while every score is -inf
      const float alpha = expf(m[r] - m_use);                // 0 on the first tile (m = -inf)
      float p = 0.f, pz = 0.f;
      if (lane >= lo && lane < nk) {
        p = expf(my_s - m_use);
        pz = drop.on ? p * keep_scale(drop, b, h, T, i, j0 + lane) : p;
      }
      l[r] = l[r] * alpha + static_cast<double>(warp_sum(p));
#pragma unroll
      for (int c = 0; c < C; ++c) o[r][c] *= alpha;
#pragma unroll 4
      for (int jj = lo; jj < nk; ++jj) {
        const float pzj = __shfl_sync(kFull, pz, jj);
        if (pzj != 0.f) {  // as the CPU, a dropped or underflowed probability adds nothing
#pragma unroll
          for (int c = 0; c < C; ++c) o[r][c] += pzj * vs[jj][lane + 32 * c];
        }
      }
      m[r] = m_new;
    }
  }

#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const int64_t i = row0 + r;
    if (i >= T) continue;
    const float lf = static_cast<float>(l[r]);
    float y[C];
#pragma unroll
    for (int c = 0; c < C; ++c) y[c] = o[r][c] / lf;
    store_row<S, C>(y, out_head, ostride, i, D, lane);
    if (lane == 0) lse[bh * T + i] = m[r] + static_cast<float>(log(l[r]));
  }
}

// ---- host side -----------------------------------------------------------------------------------------

template <class S, int DMAX>
void forward_launch(const S* qkv, S* out, float* lse, Geom g, const Dropout& drop) {
  const unsigned blocks = grid_for<DMAX>("attention_forward", g);
  attention_forward_kernel<S, DMAX><<<blocks, kThreads, 0, stream()>>>(qkv, out, lse, g, drop);
  MT_CUDA_LAUNCHED("attention_forward_kernel");
}

template <class S>
void forward_typed(const Tensor& qkv, Tensor& out, Tensor& lse, const Geom& g, const Dropout& drop) {
  const S* q = qkv.data<S>();
  S* o = out.data<S>();
  float* l = lse.data<float>();
  switch (dmax_for("attention_forward", g.D)) {
    case 32:
      return forward_launch<S, 32>(q, o, l, g, drop);
    case 64:
      return forward_launch<S, 64>(q, o, l, g, drop);
    case 128:
      return forward_launch<S, 128>(q, o, l, g, drop);
    default:
      return forward_launch<S, 256>(q, o, l, g, drop);
  }
}

}  // namespace

void attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse, const AttentionOptions& opt) {
  dmax_for("attention_forward", qkv.dim(4));  // a head dimension the kernels cannot serve fails, even when empty
  const Geom g = geom_of(qkv, opt);
  if (g.BH == 0 || g.T == 0) return;
  if (attention_forward_on_cudnn(qkv, out, lse, opt)) return;
  note_attention_kernel();
  const Dropout drop = dropout_of(opt);
  MT_DISPATCH_FLOAT(qkv.dtype(), "attention_forward", S, forward_typed<S>(qkv, out, lse, g, drop));
}

}  // namespace mt::cuda
