// attention_context.cu: context-parallel attention's blocks on the GPU (core/tensor/ops.h; the CPU reference is
// core/cpu/attention_context.cpp). A block goes to cuDNN's fused attention first (attention_cudnn.h: bf16 / fp16,
// no dropout, a chunk pair one SDPA call expresses); otherwise, and for fp32 or dropout, to the kernels below.
// Plain warp-per-row kernels, written for clarity: a warp owns one query row (or, in the backward's key pass, one
// key row), its lanes split the head dimension, and keys (queries) are walked one
// at a time with an online softmax. Every sum has a fixed order (no atomics), so results are deterministic.
//   forward:  out_i = sum_j exp(s_ij - lse_i) v_j over the keys visible to i, lse_i = log sum_j exp(s_ij)
//   backward: Delta_i = dO_i . O_i; dq_i += sum_j dS_ij k_j; dk_j += sum_(h in group, i) dS_ij q_i;
//             dv_j += sum_(h, i) P_ij dO_i, dS_ij = scale P_ij (dO_i . v_j - Delta_i), P_ij = exp(s_ij - lse_i)
// Visibility (causality, the sliding window and packed documents, AttentionBlockOptions::window and ::positions) is
// a range of positions per row, so a row walks only the rows of the other side inside it (at most two ranges: a local
// sequence is one or two runs of consecutive positions), and a block no query sees is not launched: a window W costs
// O(W) keys a row. The key pass tests each query's document (a key's queries in its document are not one range
// known on the key side).
// The head dimension is at most kMaxHeadDim (each lane keeps kMaxHeadDim / 32 accumulators).
// Dropout: probability (i, j) of head h is kept (times 1 / (1 - p)) by the CPU's rule, dropout_uniform at
// (sample, (head_offset + h) * seq_length + position(i), position(j)): the one-rank mask at global positions.
// forward out_i = sum_j P_ij Z_ij v_j; backward dv_j += P_ij Z_ij dO_i and dS_ij = scale P_ij (Z_ij dO_i . v_j - Delta_i).
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "core/cuda/attention_cudnn.h"
#include "core/cuda/kernels.cuh"
#include "core/cuda/ops_cuda.h"

namespace mt::cuda {

namespace {

constexpr int kThreads = 256;  // 8 warps a block, one row each
constexpr int kWarps = kThreads / 32;
constexpr int64_t kMaxHeadDim = 256;
constexpr int kPer = kMaxHeadDim / 32;  // accumulators per lane

struct Rows {
  int64_t begin, end;  // [begin, end)
};

// Rows [row0, row1) of a local sequence at the consecutive positions pos0 + (t - row0).
struct Run {
  int64_t row0, row1, pos0;
  // Its rows whose positions lie in [lo, hi] (empty when none). The bounds may be INT64_MIN / INT64_MAX.
  __host__ __device__ Rows rows_in(int64_t lo, int64_t hi) const {
    const int64_t begin = lo > pos0 ? (lo - pos0 < row1 - row0 ? row0 + (lo - pos0) : row1) : row0;
    const int64_t end = hi < pos0 + (row1 - row0) - 1 ? (hi >= pos0 ? row0 + (hi - pos0) + 1 : row0) : row1;
    return {begin, end > begin ? end : begin};
  }
  __host__ __device__ int64_t last() const { return pos0 + (row1 - row0) - 1; }  // the last row's position
};

// position_at (core/tensor/ops.h) on the device, and its n rows as two runs of consecutive positions (the jump at
// split_at; the second run is empty without one).
struct Pos {
  int64_t offset, split_at, split_position;
  __device__ int64_t at(int64_t t) const {
    return split_at > 0 && t >= split_at ? split_position + (t - split_at) : offset + t;
  }
  __host__ __device__ Run run(int which, int64_t n) const {
    const int64_t cut = split_at > 0 && split_at < n ? split_at : n;
    const bool first = which == 0;
    return {first ? 0 : cut, first ? cut : n, first ? offset : split_position};
  }
};
Pos pos_of(const SequencePositions& p) { return {p.position_offset, p.split_at, p.split_position}; }

// Which keys a query sees (ops.h's attention_key_visible): position kp is visible to qp iff
// (!causal || kp <= qp) && (window <= 0 || kp > qp - window) && kp >= its document's start, as the position ranges
// the kernels loop over.
struct Visibility {
  bool causal;
  int64_t window;            // 0: none
  const int32_t* positions;  // (B, Tq) packed documents' positions of the query rows; null: one document a sample
  int64_t Tq;
  // The first key position query row (b, i) at qp may see for its window and its document (the key side then
  // needs no documents' positions: a causal query's visible keys are one range of its own document).
  __device__ int64_t key_lo(int64_t qp, int64_t b, int64_t i) const {
    const int64_t lo = window > 0 ? qp - window + 1 : INT64_MIN;
    if (!positions) return lo;
    const int64_t start = qp - positions[b * Tq + i];  // its document's start
    return start > lo ? start : lo;
  }
  // Whether key position kp lies in the document of query row (b, i) at qp (the key pass's per-query test).
  __device__ bool in_document(int64_t qp, int64_t kp, int64_t b, int64_t i) const {
    return !positions || kp >= qp - positions[b * Tq + i];
  }
  __device__ int64_t key_hi(int64_t qp) const { return causal ? qp : INT64_MAX; }
  // The query positions [query_lo(kp), query_hi(kp)] are those that see key position kp; both nondecreasing in kp.
  __host__ __device__ int64_t query_lo(int64_t kp) const { return causal ? kp : INT64_MIN; }
  __host__ __device__ int64_t query_hi(int64_t kp) const {
    return window > 0 && kp <= INT64_MAX - window ? kp + window - 1 : INT64_MAX;
  }
};
// Tq: the block's query rows.
Visibility visibility_of(const AttentionBlockOptions& opt, int64_t Tq) {
  return {opt.causal, opt.window, opt.positions.defined() ? opt.positions.data<int32_t>() : nullptr, Tq};
}

// Whether any query of a block (Tq rows at opt.q's positions) sees any of its Tk keys (at opt.k's): a block wholly
// invisible (later keys under causality, keys wholly before every query's window) costs no launch.
bool block_visible(int64_t Tq, int64_t Tk, const AttentionBlockOptions& opt) {
  const Visibility vis = visibility_of(opt, Tq);
  const Pos q = pos_of(opt.q), k = pos_of(opt.k);
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 2; ++b) {
      const Run qr = q.run(a, Tq), kr = k.run(b, Tk);
      if (qr.row1 <= qr.row0 || kr.row1 <= kr.row0) continue;
      // The queries that see some key of the run: from those that see its first to those that see its last (one
      // range, as consecutive keys' ranges overlap).
      const Rows seen = qr.rows_in(vis.query_lo(kr.pos0), vis.query_hi(kr.last()));
      if (seen.begin < seen.end) return true;
    }
  return false;
}

// The dropout of a block's probabilities (AttentionBlockOptions' keys).
struct Drop {
  bool on;
  float p, keep_scale;
  uint64_t seed, site;
  int64_t sample_offset, head_offset, seq_length;
  // The keep scale (0 or 1 / (1 - p)) of (query position qp, key position kp) of head h of sample b.
  __device__ float keep(int64_t b, int64_t h, int64_t qp, int64_t kp) const {
    // dropout_uniform(seed, site, sample, row, kp), its word picked with selects rather than an index into a local
    // array (which would live in local memory).
    const Philox4 r =
        dropout_block(seed, site, static_cast<uint64_t>(sample_offset + b),
                      static_cast<uint64_t>((head_offset + h) * seq_length + qp), static_cast<uint64_t>(kp) >> 2);
    const int w = static_cast<int>(kp & 3);
    const uint32_t bits = w == 0 ? r.v[0] : w == 1 ? r.v[1] : w == 2 ? r.v[2] : r.v[3];
    return uniform_from_bits(bits) >= p ? keep_scale : 0.f;
  }
};
Drop drop_of(const AttentionBlockOptions& opt) {
  return {opt.dropout_p != 0.f, opt.dropout_p, 1.f / (1.f - opt.dropout_p), opt.seed, opt.site, opt.sample_offset,
          opt.head_offset,      opt.seq_length};
}

// Shapes: qkv (B, T, G, R + 2, D), kv (B, Tk, G, 2, D), out / dq (B, T, H, D), lse (B, H, T).
struct Dims {
  int64_t B, T, Tk, G, R, D;
  __device__ int64_t H() const { return G * R; }
  __device__ int64_t q_at(int64_t b, int64_t t, int64_t g, int64_t r) const {
    return (((b * T + t) * G + g) * (R + 2) + r) * D;
  }
  __device__ int64_t kv_at(int64_t b, int64_t t, int64_t g, int64_t s) const {
    return (((b * Tk + t) * G + g) * 2 + s) * D;
  }
  __device__ int64_t row_at(int64_t b, int64_t t, int64_t h) const { return ((b * T + t) * H() + h) * D; }
};

void check_head_dim(const char* op, int64_t D) {
  if (D > kMaxHeadDim)
    throw std::invalid_argument(std::string(op) + ": the CUDA kernel supports a head dim up to " +
                                std::to_string(kMaxHeadDim) + ", got " + std::to_string(D));
}

// The warp's dot product of a (fp32 accumulators of this lane: elements lane + 32 k) with row b of type T.
template <class T>
__device__ float warp_dot(const float (&a)[kPer], const T* b, int64_t D, int lane) {
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t d = lane + 32 * k;
    if (d < D) s += a[k] * to_f32<T>(b[d]);
  }
  return warp_sum(s);
}

template <class T>
__device__ void load_row(const T* p, int64_t D, int lane, float (&x)[kPer]) {
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t d = lane + 32 * k;
    x[k] = d < D ? to_f32<T>(p[d]) : 0.f;
  }
}

template <class T>
__global__ void kv_pack_kernel(const T* qkv, T* kv, int64_t rows, int64_t S, int64_t D) {
  const int64_t n = rows * 2 * D;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = e / (2 * D), k = e % (2 * D);
    kv[e] = qkv[(row * S + S - 2) * D + k];
  }
}

// One warp per query row (b, h, i).
template <class T>
__global__ void block_forward_kernel(const T* qkv, const T* kv, float* out, float* lse, Dims d, Pos qp, Pos kp,
                                     Visibility vis, float scale, Drop dr) {
  const int lane = threadIdx.x & 31;
  const int64_t row = blockIdx.x * static_cast<int64_t>(kWarps) + (threadIdx.x >> 5);
  if (row >= d.B * d.H() * d.T) return;
  const int64_t i = row % d.T, h = row / d.T % d.H(), b = row / (d.T * d.H()), g = h / d.R, r = h % d.R;
  float q[kPer], acc[kPer] = {};
  load_row(qkv + d.q_at(b, i, g, r), d.D, lane, q);
  const int64_t qpos = qp.at(i), klo = vis.key_lo(qpos, b, i), khi = vis.key_hi(qpos);
  float m = -INFINITY, sum = 0.f;
  for (int run = 0; run < 2; ++run) {  // the visible keys of each run of positions, in key order
    const Rows keys = kp.run(run, d.Tk).rows_in(klo, khi);
    for (int64_t j = keys.begin; j < keys.end; ++j) {
      const int64_t kpos = kp.at(j);
      const float s = warp_dot(q, kv + d.kv_at(b, j, g, 0), d.D, lane) * scale;
      const float m_new = fmaxf(m, s);
      const float correction = expf(m - m_new), w = expf(s - m_new);  // exp(-inf) = 0 on the first key
      sum = sum * correction + w;
      const float wz = dr.on ? w * dr.keep(b, h, qpos, kpos) : w;  // the dropped weight (the sum keeps w)
      const T* v = kv + d.kv_at(b, j, g, 1);
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const int64_t e = lane + 32 * k;
        acc[k] = acc[k] * correction + (e < d.D ? wz * to_f32<T>(v[e]) : 0.f);
      }
      m = m_new;
    }
  }
  float* o = out + d.row_at(b, i, h);
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t e = lane + 32 * k;
    if (e < d.D) o[e] = sum > 0.f ? acc[k] / sum : 0.f;
  }
  if (lane == 0) lse[(b * d.H() + h) * d.T + i] = sum > 0.f ? m + logf(sum) : -INFINITY;
}

// One thread per row (b, t, h).
__global__ void merge_kernel(float* out, float* lse, const float* out_b, const float* lse_b, int64_t B, int64_t T,
                             int64_t H, int64_t D) {
  const int64_t n = B * T * H;
  for (int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; row < n;
       row += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t h = row % H, t = row / H % T, b = row / (H * T);
    const int64_t li = (b * H + h) * T + t;
    const float l1 = lse[li], l2 = lse_b[li], m = fmaxf(l1, l2);
    if (m == -INFINITY) continue;
    const float merged = m + logf(expf(l1 - m) + expf(l2 - m));
    const float w1 = expf(l1 - merged), w2 = expf(l2 - merged);
    for (int64_t e = 0; e < D; ++e) out[row * D + e] = w1 * out[row * D + e] + w2 * out_b[row * D + e];
    lse[li] = merged;
  }
}

// Delta (B, H, T) = dO_i . O_i, one warp per row.
template <class T>
__global__ void delta_kernel(const T* out, const T* dout, float* delta, Dims d) {
  const int lane = threadIdx.x & 31;
  const int64_t row = blockIdx.x * static_cast<int64_t>(kWarps) + (threadIdx.x >> 5);
  if (row >= d.B * d.H() * d.T) return;
  const int64_t i = row % d.T, h = row / d.T % d.H(), b = row / (d.T * d.H());
  float o[kPer];
  load_row(out + d.row_at(b, i, h), d.D, lane, o);
  const float s = warp_dot(o, dout + d.row_at(b, i, h), d.D, lane);
  if (lane == 0) delta[(b * d.H() + h) * d.T + i] = s;
}

// dq of one query row: one warp per (b, h, i), keys in order.
template <class T>
__global__ void block_dq_kernel(const T* qkv, const T* kv, const float* lse, const float* delta, const T* dout,
                                float* dq, Dims d, Pos qp, Pos kp, Visibility vis, float scale, Drop dr) {
  const int lane = threadIdx.x & 31;
  const int64_t row = blockIdx.x * static_cast<int64_t>(kWarps) + (threadIdx.x >> 5);
  if (row >= d.B * d.H() * d.T) return;
  const int64_t i = row % d.T, h = row / d.T % d.H(), b = row / (d.T * d.H()), g = h / d.R, r = h % d.R;
  const int64_t li = (b * d.H() + h) * d.T + i;
  const float row_lse = lse[li], row_delta = delta[li];
  if (row_lse == -INFINITY) return;
  float q[kPer], go[kPer], acc[kPer] = {};
  load_row(qkv + d.q_at(b, i, g, r), d.D, lane, q);
  load_row(dout + d.row_at(b, i, h), d.D, lane, go);
  const int64_t qpos = qp.at(i), klo = vis.key_lo(qpos, b, i), khi = vis.key_hi(qpos);
  for (int run = 0; run < 2; ++run) {  // as the forward
    const Rows keys = kp.run(run, d.Tk).rows_in(klo, khi);
    for (int64_t j = keys.begin; j < keys.end; ++j) {
      const int64_t kpos = kp.at(j);
      const T* k = kv + d.kv_at(b, j, g, 0);
      const float p = expf(warp_dot(q, k, d.D, lane) * scale - row_lse);
      float dp = warp_dot(go, kv + d.kv_at(b, j, g, 1), d.D, lane);
      if (dr.on) {
        const float z = dr.keep(b, h, qpos, kpos);
        dp = z == 0.f ? 0.f : dp * z;
      }
      const float ds = scale * p * (dp - row_delta);
#pragma unroll
      for (int kk = 0; kk < kPer; ++kk) {
        const int64_t e = lane + 32 * kk;
        if (e < d.D) acc[kk] += ds * to_f32<T>(k[e]);
      }
    }
  }
  float* o = dq + d.row_at(b, i, h);
#pragma unroll
  for (int kk = 0; kk < kPer; ++kk) {
    const int64_t e = lane + 32 * kk;
    if (e < d.D) o[e] += acc[kk];
  }
}

// dk and dv of one key row: one warp per (b, g, j), the group's query heads and rows in order.
template <class T>
__global__ void block_dkv_kernel(const T* qkv, const T* kv, const float* lse, const float* delta, const T* dout,
                                 float* dkv, Dims d, Pos qp, Pos kp, Visibility vis, float scale, Drop dr) {
  const int lane = threadIdx.x & 31;
  const int64_t row = blockIdx.x * static_cast<int64_t>(kWarps) + (threadIdx.x >> 5);
  if (row >= d.B * d.G * d.Tk) return;
  const int64_t j = row % d.Tk, g = row / d.Tk % d.G, b = row / (d.Tk * d.G);
  float k[kPer], v[kPer], dk[kPer] = {}, dv[kPer] = {};
  load_row(kv + d.kv_at(b, j, g, 0), d.D, lane, k);
  load_row(kv + d.kv_at(b, j, g, 1), d.D, lane, v);
  const int64_t kpos = kp.at(j), qlo = vis.query_lo(kpos), qhi = vis.query_hi(kpos);
  for (int64_t r = 0; r < d.R; ++r) {
    const int64_t h = g * d.R + r;
    for (int run = 0; run < 2; ++run) {  // the queries that see key j, in query order
      const Rows queries = qp.run(run, d.T).rows_in(qlo, qhi);
      for (int64_t i = queries.begin; i < queries.end; ++i) {
        const int64_t qpos = qp.at(i);
        if (!vis.in_document(qpos, kpos, b, i)) continue;  // key j lies before this query's document
        const int64_t li = (b * d.H() + h) * d.T + i;
        const float row_lse = lse[li];
        if (row_lse == -INFINITY) continue;
        const T* q = qkv + d.q_at(b, i, g, r);
        const T* go = dout + d.row_at(b, i, h);
        const float p = expf(warp_dot(k, q, d.D, lane) * scale - row_lse);
        float dp = warp_dot(v, go, d.D, lane), pz = p;
        if (dr.on) {
          const float z = dr.keep(b, h, qpos, kpos);
          dp = z == 0.f ? 0.f : dp * z;
          pz = p * z;
        }
        const float ds = scale * p * (dp - delta[li]);
#pragma unroll
        for (int kk = 0; kk < kPer; ++kk) {
          const int64_t e = lane + 32 * kk;
          if (e < d.D) {
            dk[kk] += ds * to_f32<T>(q[e]);
            dv[kk] += pz * to_f32<T>(go[e]);
          }
        }
      }
    }
  }
  float* ok = dkv + d.kv_at(b, j, g, 0);
  float* ov = dkv + d.kv_at(b, j, g, 1);
#pragma unroll
  for (int kk = 0; kk < kPer; ++kk) {
    const int64_t e = lane + 32 * kk;
    if (e < d.D) {
      ok[e] += dk[kk];
      ov[e] += dv[kk];
    }
  }
}

template <class T>
__global__ void qkv_grad_kernel(const float* dq, const float* dkv, T* dqkv, int64_t rows, int64_t S, int64_t D) {
  const int64_t n = rows * S * D, R = S - 2;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = e / (S * D), s = e / D % S, k = e % D;
    const float v = s < R ? dq[(row * R + s) * D + k] : dkv[(row * 2 + s - R) * D + k];
    dqkv[e] = from_f32<T>(v);
  }
}

Dims dims_of(const Tensor& qkv, const Tensor& kv) {
  return {qkv.dim(0), qkv.dim(1), kv.dim(1), qkv.dim(2), qkv.dim(3) - 2, qkv.dim(4)};
}

unsigned warp_blocks(int64_t rows) { return static_cast<unsigned>((rows + kWarps - 1) / kWarps); }

}  // namespace

void attention_kv_pack(const Tensor& qkv, Tensor& kv) {
  const int64_t rows = qkv.dim(0) * qkv.dim(1) * qkv.dim(2), S = qkv.dim(3), D = qkv.dim(4);
  if (rows * D == 0) return;
  MT_DISPATCH_FLOAT(qkv.dtype(), "attention_kv_pack", T,
                    kv_pack_kernel<T><<<grid_1d(rows * 2 * D, kThreads), kThreads, 0, stream()>>>(
                        qkv.data<T>(), kv.data<T>(), rows, S, D));
  MT_CUDA_LAUNCHED("kv_pack_kernel");
}

void attention_block_forward(const Tensor& qkv, const Tensor& kv, Tensor& out, Tensor& lse,
                             const AttentionBlockOptions& opt) {
  if (attention_block_forward_on_cudnn(qkv, kv, out, lse, opt)) return;
  const Dims d = dims_of(qkv, kv);
  check_head_dim("attention_block_forward", d.D);
  const int64_t rows = d.B * d.G * d.R * d.T;
  if (rows == 0) return;
  if (!block_visible(d.T, d.Tk, opt)) {  // no row sees a key of this block: out 0, lse -inf (the merge keeps out)
    out.zero_();
    cuda::fill_(lse, -INFINITY);
    return;
  }
  const float scale = 1.f / std::sqrt(static_cast<float>(d.D));
  MT_DISPATCH_FLOAT(qkv.dtype(), "attention_block_forward", T,
                    block_forward_kernel<T><<<warp_blocks(rows), kThreads, 0, stream()>>>(
                        qkv.data<T>(), kv.data<T>(), out.data<float>(), lse.data<float>(), d, pos_of(opt.q),
                        pos_of(opt.k), visibility_of(opt, d.T), scale, drop_of(opt)));
  MT_CUDA_LAUNCHED("block_forward_kernel");
}

void attention_merge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b) {
  const int64_t B = out.dim(0), T = out.dim(1), H = out.dim(2), D = out.dim(3);
  if (B * T * H == 0) return;
  merge_kernel<<<grid_1d(B * T * H, kThreads), kThreads, 0, stream()>>>(
      out.data<float>(), lse.data<float>(), out_b.data<float>(), lse_b.data<float>(), B, T, H, D);
  MT_CUDA_LAUNCHED("merge_kernel");
}

void attention_block_backward(const Tensor& qkv, const Tensor& kv, const Tensor& out, const Tensor& lse,
                              const Tensor& dout, Tensor& dq, Tensor& dkv, const AttentionBlockOptions& opt) {
  if (attention_block_backward_on_cudnn(qkv, kv, out, lse, dout, dq, dkv, opt)) return;
  const Dims d = dims_of(qkv, kv);
  check_head_dim("attention_block_backward", d.D);
  const int64_t rows = d.B * d.G * d.R * d.T, key_rows = d.B * d.G * d.Tk;
  if (rows == 0 || key_rows == 0) return;
  if (!block_visible(d.T, d.Tk, opt)) return;  // nothing of this block reaches a query: dq, dkv stay as they are
  const float scale = 1.f / std::sqrt(static_cast<float>(d.D));
  Tensor delta = Tensor::empty({rows}, DType::f32, Device::cuda, MemKind::workspace);  // (B, H, T)
  MT_DISPATCH_FLOAT(qkv.dtype(), "attention_block_backward", T, {
    delta_kernel<T>
        <<<warp_blocks(rows), kThreads, 0, stream()>>>(out.data<T>(), dout.data<T>(), delta.data<float>(), d);
    MT_CUDA_LAUNCHED("delta_kernel");
    block_dq_kernel<T><<<warp_blocks(rows), kThreads, 0, stream()>>>(
        qkv.data<T>(), kv.data<T>(), lse.data<float>(), delta.data<float>(), dout.data<T>(), dq.data<float>(), d,
        pos_of(opt.q), pos_of(opt.k), visibility_of(opt, d.T), scale, drop_of(opt));
    MT_CUDA_LAUNCHED("block_dq_kernel");
    block_dkv_kernel<T><<<warp_blocks(key_rows), kThreads, 0, stream()>>>(
        qkv.data<T>(), kv.data<T>(), lse.data<float>(), delta.data<float>(), dout.data<T>(), dkv.data<float>(), d,
        pos_of(opt.q), pos_of(opt.k), visibility_of(opt, d.T), scale, drop_of(opt));
    MT_CUDA_LAUNCHED("block_dkv_kernel");
  });
}

void attention_qkv_grad(const Tensor& dq, const Tensor& dkv, Tensor& dqkv) {
  const int64_t rows = dqkv.dim(0) * dqkv.dim(1) * dqkv.dim(2), S = dqkv.dim(3), D = dqkv.dim(4);
  if (rows * D == 0) return;
  MT_DISPATCH_FLOAT(dqkv.dtype(), "attention_qkv_grad", T,
                    qkv_grad_kernel<T><<<grid_1d(rows * S * D, kThreads), kThreads, 0, stream()>>>(
                        dq.data<float>(), dkv.data<float>(), dqkv.data<T>(), rows, S, D));
  MT_CUDA_LAUNCHED("qkv_grad_kernel");
}

}  // namespace mt::cuda
