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

#include "core/cuda/attention_cudnn.h"
#include "core/cuda/kernels.cuh"
#include "core/cuda/ops_cuda.h"
#include "core/base/rng.h"

namespace mt::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr unsigned kFull = 0xffffffffu;
constexpr int kMaxHeadDim = 256;

template <int DMAX>
struct Cfg {
  static constexpr int C = DMAX / 32;               // columns per lane
  static constexpr int BK = DMAX <= 128 ? 32 : 16;  // rows per shared tile (at most 32: one per lane)
  static constexpr int ROWS = DMAX <= 128 ? 4 : 2;  // rows per warp
  static constexpr int RB = kWarps * ROWS;          // rows per block
  static_assert(BK <= 32 && BK <= kThreads, "a tile row per lane");
  static_assert(2 * BK * DMAX * sizeof(float) + 2 * BK * sizeof(float) <= 48 * 1024, "static shared memory");
};

struct Geom {
  int64_t T;      // sequence length
  int64_t G;      // query groups (key/value heads)
  int64_t R;      // query heads per group
  int64_t H;      // query heads, G * R
  int64_t BH;     // B * H
  int64_t BG;     // B * G
  int64_t tiles;  // row tiles (of RB rows) per (b, h) or (b, g)
  int D;          // head dimension
  bool causal;
  float scale;  // 1 / sqrt(D)

  // Elements between rows t and t + 1 of a qkv slot (G (R + 2) D) and of out (H D).
  __host__ __device__ int64_t qkv_stride() const { return G * (R + 2) * D; }
  __host__ __device__ int64_t out_stride() const { return H * D; }
  // Slot s (0..R-1 queries, R key, R + 1 value) of group gi of sample b at t = 0.
  __host__ __device__ int64_t slot_at(int64_t b, int64_t gi, int64_t s) const {
    return ((b * T * G + gi) * (R + 2) + s) * D;
  }
  // Query head h of sample b in out (B, T, H, D) at t = 0.
  __host__ __device__ int64_t out_at(int64_t b, int64_t h) const { return (b * T * H + h) * D; }
};

struct Dropout {
  bool on;  // p > 0
  float p;
  float keep_scale;  // 1 / (1 - p), as the CPU computes it
  uint64_t seed, site;
  int64_t sample_offset, head_offset;
};

// The keep scale (0 or 1 / (1 - p)) of probability (i, j) of head h of sample b: the CPU's mask_row.
__device__ __forceinline__ float keep_scale(const Dropout& d, int64_t b, int64_t h, int64_t T, int64_t i, int64_t j) {
  const uint64_t sample = static_cast<uint64_t>(d.sample_offset + b);
  const uint64_t row = static_cast<uint64_t>((d.head_offset + h) * T + i);
  // dropout_uniform(d.seed, d.site, sample, row, j), its word picked with selects rather than an index into a
  // local array (which would live in local memory).
  const Philox4 r = dropout_block(d.seed, d.site, sample, row, static_cast<uint64_t>(j) >> 2);
  const int w = static_cast<int>(j & 3);
  const uint32_t bits = w == 0 ? r.v[0] : w == 1 ? r.v[1] : w == 2 ? r.v[2] : r.v[3];
  return uniform_from_bits(bits) >= d.p ? d.keep_scale : 0.f;
}

// tile[r][c] = fp32 element c of row first + r of a (T, D) matrix whose rows lie `stride` elements apart from
// `base`, for r < ROWS_T; zeros for rows >= T and columns >= D. Called by every thread of the block.
template <class S, int DMAX, int ROWS_T>
__device__ __forceinline__ void load_tile(float (*tile)[DMAX], const S* __restrict__ base, int64_t stride,
                                          int64_t first, int64_t T, int D) {
  for (int idx = threadIdx.x; idx < ROWS_T * DMAX; idx += blockDim.x) {
    const int r = idx / DMAX, c = idx % DMAX;
    const int64_t t = first + r;
    tile[r][c] = (t < T && c < D) ? to_f32<S>(base[t * stride + c]) : 0.f;
  }
}

// x[c] = fp32 columns lane + 32 c of row t of a (T, D) matrix (zeros for columns >= D or t >= T).
template <class S, int C>
__device__ __forceinline__ void load_row(float (&x)[C], const S* __restrict__ base, int64_t stride, int64_t t,
                                         int64_t T, int D, int lane) {
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const int col = lane + 32 * c;
    x[c] = (t < T && col < D) ? to_f32<S>(base[t * stride + col]) : 0.f;
  }
}

template <class S, int C>
__device__ __forceinline__ void store_row(const float (&x)[C], S* __restrict__ base, int64_t stride, int64_t t, int D,
                                          int lane) {
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const int col = lane + 32 * c;
    if (col < D) base[t * stride + col] = from_f32<S>(x[c]);
  }
}

// Lane partial of the dot product of a lane-distributed row x with row jj of a shared tile.
template <int DMAX, int C>
__device__ __forceinline__ float lane_dot(const float (&x)[C], const float (*tile)[DMAX], int jj, int lane) {
  float s = 0.f;
#pragma unroll
  for (int c = 0; c < C; ++c) s += x[c] * tile[jj][lane + 32 * c];
  return s;
}

// ---- forward -------------------------------------------------------------------------------------------

template <class S, int DMAX>
__global__ void __launch_bounds__(kThreads) attention_forward_kernel(const S* __restrict__ qkv, S* __restrict__ out,
                                                                     float* __restrict__ lse, Geom g, Dropout drop) {
  using K = Cfg<DMAX>;
  constexpr int C = K::C, BK = K::BK, ROWS = K::ROWS, RB = K::RB;
  __shared__ float ks[BK][DMAX];
  __shared__ float vs[BK][DMAX];

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t bh = blockIdx.x % g.BH;
  const int64_t tile = g.tiles - 1 - blockIdx.x / g.BH;  // the longest causal rows first
  const int64_t b = bh / g.H, h = bh % g.H, gi = h / g.R;
  const int64_t T = g.T;
  const int D = g.D;
  const int64_t qstride = g.qkv_stride(), ostride = g.out_stride();  // elements between rows t and t + 1
  const S* q_head = qkv + g.slot_at(b, gi, h % g.R);                 // (b, t = 0): the query, its group's key
  const S* k_head = qkv + g.slot_at(b, gi, g.R);                     // and value
  const S* v_head = qkv + g.slot_at(b, gi, g.R + 1);
  S* out_head = out + g.out_at(b, h);
  const int64_t row0 = tile * RB + warp * ROWS;       // this warp's first query row
  const int64_t block_end = min(T, (tile + 1) * RB);  // one past the block's last query row

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
  for (int64_t j0 = 0; j0 < kend; j0 += BK) {
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
      float my_s = -INFINITY, tile_max = -INFINITY;
#pragma unroll 4
      for (int jj = 0; jj < nk; ++jj) {
        const float s = g.scale * warp_sum(lane_dot<DMAX, C>(q[r], ks, jj, lane));
        if (lane == jj) my_s = s;
        tile_max = fmaxf(tile_max, s);
      }
      const float m_new = fmaxf(m[r], tile_max);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // no -inf - -inf while every score is -inf
      const float alpha = expf(m[r] - m_use);                // 0 on the first tile (m = -inf)
      float p = 0.f, pz = 0.f;
      if (lane < nk) {
        p = expf(my_s - m_use);
        pz = drop.on ? p * keep_scale(drop, b, h, T, i, j0 + lane) : p;
      }
      l[r] = l[r] * alpha + static_cast<double>(warp_sum(p));
#pragma unroll
      for (int c = 0; c < C; ++c) o[r][c] *= alpha;
#pragma unroll 4
      for (int jj = 0; jj < nk; ++jj) {
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

// ---- backward: dq and delta ----------------------------------------------------------------------------

template <class S, int DMAX>
__global__ void __launch_bounds__(kThreads)
    attention_backward_dq_kernel(const S* __restrict__ qkv, const S* __restrict__ dout, const float* __restrict__ lse,
                                 float* __restrict__ delta, S* __restrict__ dqkv, Geom g, Dropout drop) {
  using K = Cfg<DMAX>;
  constexpr int C = K::C, BK = K::BK, ROWS = K::ROWS, RB = K::RB;
  __shared__ float ks[BK][DMAX];
  __shared__ float vs[BK][DMAX];

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t bh = blockIdx.x % g.BH;
  const int64_t tile = g.tiles - 1 - blockIdx.x / g.BH;  // the longest causal rows first
  const int64_t b = bh / g.H, h = bh % g.H, gi = h / g.R;
  const int64_t T = g.T;
  const int D = g.D;
  const int64_t qstride = g.qkv_stride(), ostride = g.out_stride();
  const S* q_head = qkv + g.slot_at(b, gi, h % g.R);
  const S* k_head = qkv + g.slot_at(b, gi, g.R);
  const S* v_head = qkv + g.slot_at(b, gi, g.R + 1);
  S* dq_head = dqkv + g.slot_at(b, gi, h % g.R);
  const S* dout_head = dout + g.out_at(b, h);
  const int64_t row0 = tile * RB + warp * ROWS;
  const int64_t block_end = min(T, (tile + 1) * RB);

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
    for (int64_t j0 = 0; j0 < kend; j0 += BK) {
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
        if (nk <= 0) continue;          // warp-uniform
        float my_s = 0.f, my_dv = 0.f;  // lane jj: s_ij and dO_i . v_j for j = j0 + jj
#pragma unroll 4
        for (int jj = 0; jj < nk; ++jj) {
          const float s = g.scale * warp_sum(lane_dot<DMAX, C>(q[r], ks, jj, lane));
          const float dv = warp_sum(lane_dot<DMAX, C>(dO[r], vs, jj, lane));
          if (lane == jj) {
            my_s = s;
            my_dv = dv;
          }
        }
        float p = 0.f, dp = 0.f;
        if (lane < nk) {
          p = expf(my_s - row_lse[r]);
          const float z = drop.on ? keep_scale(drop, b, h, T, i, j0 + lane) : 1.f;
          dp = z == 0.f ? 0.f : my_dv * z;
        }
        if (pass == 0) {
          rowsum[r] += warp_sum(static_cast<double>(p) * static_cast<double>(dp));
        } else {
          const float ds = lane < nk ? g.scale * p * (dp - row_d[r]) : 0.f;
#pragma unroll 4
          for (int jj = 0; jj < nk; ++jj) {
            const float dsj = __shfl_sync(kFull, ds, jj);
#pragma unroll
            for (int c = 0; c < C; ++c) dq[r][c] += dsj * ks[jj][lane + 32 * c];
          }
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const int64_t i = row0 + r;
    if (i >= T) continue;
    store_row<S, C>(dq[r], dq_head, qstride, i, D, lane);
    if (lane == 0) delta[bh * T + i] = row_d[r];
  }
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
      __syncthreads();
      load_tile<S, DMAX, BK>(qs, q_head, qstride, i0, T, D);
      load_tile<S, DMAX, BK>(dos, dout_head, ostride, i0, T, D);
      if (threadIdx.x < BK) {
        const int64_t t = i0 + threadIdx.x;
        lse_s[threadIdx.x] = t < T ? lse_head[t] : 0.f;
        delta_s[threadIdx.x] = t < T ? delta_head[t] : 0.f;
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
        if (lo >= hi) continue;         // warp-uniform
        float my_s = 0.f, my_dv = 0.f;  // lane ii: s_ij and dO_i . v_j for i = i0 + ii
#pragma unroll 4
        for (int ii = lo; ii < hi; ++ii) {
          const float s = g.scale * warp_sum(lane_dot<DMAX, C>(k[r], qs, ii, lane));
          const float dd = warp_sum(lane_dot<DMAX, C>(v[r], dos, ii, lane));
          if (lane == ii) {
            my_s = s;
            my_dv = dd;
          }
        }
        float ds = 0.f, pz = 0.f;
        if (lane >= lo && lane < hi) {
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

#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const int64_t j = row0 + r;
    if (j >= T) continue;
    store_row<S, C>(dk[r], dk_head, qstride, j, D, lane);
    store_row<S, C>(dv[r], dv_head, qstride, j, D, lane);
  }
}

// ---- host side -----------------------------------------------------------------------------------------

// DMAX for head dimension D: the smallest of 32, 64, 128, 256 that holds it.
int dmax_for(const char* op, int64_t D) {
  if (D <= 32) return 32;
  if (D <= 64) return 64;
  if (D <= 128) return 128;
  if (D <= kMaxHeadDim) return 256;
  throw std::runtime_error(std::string(op) + ": head dimension D = " + std::to_string(D) +
                           " exceeds 256, the most the CUDA attention kernels support");
}

Geom geom_of(const Tensor& qkv, const AttentionOptions& opt) {
  Geom g;
  g.T = qkv.dim(1);
  g.G = qkv.dim(2);
  g.R = qkv.dim(3) - 2;
  g.H = g.G * g.R;
  g.BH = qkv.dim(0) * g.H;
  g.BG = qkv.dim(0) * g.G;
  g.tiles = 0;
  g.D = static_cast<int>(qkv.dim(4));
  g.causal = opt.causal;
  g.scale = 1.f / std::sqrt(static_cast<float>(qkv.dim(4)));  // the CPU's expression
  return g;
}

Dropout dropout_of(const AttentionOptions& opt) {
  Dropout d;
  d.on = opt.dropout_p != 0.f;  // the CPU's mask_row draws nothing for p == 0
  d.p = opt.dropout_p;
  d.keep_scale = 1.f / (1.f - opt.dropout_p);
  d.seed = opt.seed;
  d.site = opt.site;
  d.sample_offset = opt.sample_offset;
  d.head_offset = opt.head_offset;
  return d;
}

// Blocks for RB rows per block over every (b, h) (g.BH of them; the dk/dv kernel's (b, g) are fewer); sets
// g.tiles. A one-dimensional grid: at most 2^31 - 1.
template <int DMAX>
unsigned grid_for(const char* op, Geom& g) {
  g.tiles = (g.T + Cfg<DMAX>::RB - 1) / Cfg<DMAX>::RB;
  const int64_t blocks = g.tiles * g.BH;
  if (blocks > static_cast<int64_t>(std::numeric_limits<int32_t>::max()))
    throw std::runtime_error(std::string(op) + ": B * H * T = " + std::to_string(g.BH * g.T) +
                             " is too large for the CUDA attention kernels' grid");
  return static_cast<unsigned>(blocks);
}

template <class S, int DMAX>
void forward_launch(const S* qkv, S* out, float* lse, Geom g, const Dropout& drop) {
  const unsigned blocks = grid_for<DMAX>("attention_forward", g);
  attention_forward_kernel<S, DMAX><<<blocks, kThreads, 0, stream()>>>(qkv, out, lse, g, drop);
  MT_CUDA_LAUNCHED("attention_forward_kernel");
}

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

void attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse, const AttentionOptions& opt) {
  dmax_for("attention_forward", qkv.dim(4));  // a head dimension the kernels cannot serve fails, even when empty
  const Geom g = geom_of(qkv, opt);
  if (g.BH == 0 || g.T == 0) return;
  if (attention_forward_on_cudnn(qkv, out, lse, opt)) return;
  note_attention_kernel();
  const Dropout drop = dropout_of(opt);
  MT_DISPATCH_FLOAT(qkv.dtype(), "attention_forward", S, forward_typed<S>(qkv, out, lse, g, drop));
}

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
