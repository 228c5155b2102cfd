// attention_common.cuh: what the attention kernels (attention.cu: forward; attention_backward.cu: dq, dk and dv)
// share: the block layout, the geometry and dropout of a call, the tile and row loads, and the launch helpers.
// Private to those two files; its anonymous namespace keeps the kernels' names (and bench/ptxas_sm90.tsv) as they
// were when everything was one file.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

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
  // Packed documents (AttentionOptions::positions, (B, T) i32; null: none): query i of sample b sees keys
  // [i - positions[b, i], i] only (causal).
  const int32_t* positions;
  int64_t window;  // sliding window (AttentionOptions::window; causal): query i sees keys > i - window; 0: none

  // The first key query i of sample b sees: the latest of 0, its document's start and its window's start
  // (ops.h's attention_first_key). Nondecreasing in i.
  __device__ int64_t first_key(int64_t b, int64_t i) const {
    const int64_t doc = positions ? i - positions[b * T + i] : 0, band = window > 0 ? i - window + 1 : 0;
    return doc > band ? doc : band > 0 ? band : 0;
  }
  // The first key any query row of a block starting at row `first_row` sees (its first row's: first_key is
  // nondecreasing), where the forward and dq kernels start their key tiles: keys before it (an earlier document,
  // before the window) cost nothing.
  __device__ int64_t block_first_key(int64_t b, int64_t first_row) const {
    return first_row < T ? first_key(b, first_row) : 0;
  }

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

// What one block of the forward or the dq kernel works on: one (batch b, query head h) and a block of RB query rows,
// the longest causal rows first (the last tile with block 0); each warp holds ROWS rows from row0.
struct QueryBlock {
  int64_t bh, b, h;
  int64_t q_at;        // the query slot of head h at t = 0 in qkv (and dqkv)
  int64_t k_at, v_at;  // its group's key and value slots
  int64_t row0;        // this warp's first query row
  int64_t block_end;   // one past the block's last query row
};

template <int RB, int ROWS>
__device__ __forceinline__ QueryBlock query_block(const Geom& g) {
  const int warp = threadIdx.x >> 5;
  const int64_t bh = blockIdx.x % g.BH;
  const int64_t tile = g.tiles - 1 - blockIdx.x / g.BH;
  const int64_t b = bh / g.H, h = bh % g.H, gi = h / g.R;
  return {bh,
          b,
          h,
          g.slot_at(b, gi, h % g.R),
          g.slot_at(b, gi, g.R),
          g.slot_at(b, gi, g.R + 1),
          tile * RB + warp * ROWS,
          min(g.T, (tile + 1) * RB)};
}

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
  g.positions = opt.positions.defined() ? opt.positions.data<int32_t>() : nullptr;
  g.window = opt.window;
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

}  // namespace

}  // namespace mt::cuda
