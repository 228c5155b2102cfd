// attention_context.cpp: context-parallel attention's blocks on the CPU (core/tensor/ops.h): the queries of this
// rank against one block of keys and values, with positions (and packed documents' starts) deciding what a causal
// query sees, the log-sum-exp merge of two partial results, and the block's share of the backward. One (sample,
// query head) at a time, rows in blocks of kRowBlock whose scores and products are OpenBLAS GEMMs over the keys up to
// the last one the rows can see (visible_cols; a masked key inside weighs 0); softmax statistics in fp32 as
// attention.cpp's.
//
// Backward of one block, O and lse the whole attention's (every block merged): P = exp(S - lse) on the visible
// keys, dP = dO V^T, dS = scale P o (dP - Delta) with Delta_i = dO_i . O_i (the row sum of P o dP over all blocks),
// dQ += dS K, dK += dS^T Q, dV += P^T dO.
//
// Dropout (AttentionBlockOptions::dropout_p): probability (i, j) is kept or dropped at the coordinates attention.cpp's
// mask_row gives it over the whole sequence, (sample, (head_offset + h) * seq_length + position(i), position(j)), so
// the blocks together draw one rank's mask. Z the mask scaled by 1 / (1 - p): out = (P o Z) V with lse that of the
// undropped scores; backward dV += (P o Z)^T dO and dP = (dO V^T) o Z.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <cblas.h>

#include "core/cpu/dropout_mask.h"
#include "core/cpu/float_io.h"
#include "core/cpu/ops_cpu.h"
#include "core/cpu/vec_math.h"

namespace mt::cpu {

namespace {

constexpr int64_t kRowBlock = 64;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
           int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

// qkv (B, T, G, R + 2, D), kv (B, Tk, G, 2, D).
struct BlockDims {
  int64_t B, T, Tk, G, R, D;
  int64_t H() const { return G * R; }
  int64_t q_at(int64_t b, int64_t t, int64_t g, int64_t r) const { return (((b * T + t) * G + g) * (R + 2) + r) * D; }
  int64_t kv_at(int64_t b, int64_t t, int64_t g, int64_t s) const { return (((b * Tk + t) * G + g) * 2 + s) * D; }
  int64_t out_at(int64_t b, int64_t t, int64_t h) const { return ((b * T + t) * H() + h) * D; }
};

BlockDims dims_of(const Tensor& qkv, const Tensor& kv) {
  return {qkv.dim(0), qkv.dim(1), kv.dim(1), qkv.dim(2), qkv.dim(3) - 2, qkv.dim(4)};
}

std::vector<int64_t> positions(const SequencePositions& p, int64_t n) {
  std::vector<int64_t> pos(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) pos[static_cast<size_t>(t)] = position_at(p, t);
  return pos;
}

// The document start of each query row of sample b: its position less its position in the document (0 for all
// without documents).
void document_starts(const AttentionBlockOptions& opt, int64_t b, const std::vector<int64_t>& qpos,
                     std::vector<int64_t>& starts) {
  const int64_t T = static_cast<int64_t>(qpos.size());
  const int32_t* in_doc = opt.positions.defined() ? opt.positions.data<int32_t>() + b * T : nullptr;
  for (int64_t i = 0; i < T; ++i)
    starts[static_cast<size_t>(i)] = in_doc ? qpos[static_cast<size_t>(i)] - in_doc[i] : 0;
}

// The keys visible to query row i (at qpos[i], its document from starts[i]): a 0/1 row over the block's keys.
void visible_row(const std::vector<int64_t>& kpos, const std::vector<int64_t>& qpos, const std::vector<int64_t>& starts,
                 int64_t i, const AttentionBlockOptions& opt, std::vector<char>& vis) {
  const auto r = static_cast<size_t>(i);
  for (size_t j = 0; j < kpos.size(); ++j)
    vis[j] = attention_key_visible(qpos[r], kpos[j], opt.causal, opt.window, starts[r]);
}

// The keys a row block [r0, r0 + rows) can see lie in [0, cols): past the last key some row of the block sees nothing
// is visible (a block's later keys, a later chunk's block, the masked half of a diagonal one, a block wholly before
// the window or the rows' documents cost nothing). The per-key mask still decides inside [0, cols).
int64_t visible_cols(const std::vector<int64_t>& qpos, const std::vector<int64_t>& starts,
                     const std::vector<int64_t>& kpos, int64_t r0, int64_t rows, const AttentionBlockOptions& opt) {
  const int64_t Tk = static_cast<int64_t>(kpos.size());
  if (!opt.causal) return Tk;
  for (int64_t j = Tk - 1; j >= 0; --j)
    for (int64_t i = r0; i < r0 + rows; ++i) {
      const auto r = static_cast<size_t>(i);
      if (attention_key_visible(qpos[r], kpos[static_cast<size_t>(j)], true, opt.window, starts[r])) return j + 1;
    }
  return 0;
}

// z[j], j < cols: the dropout keep scale of the query at position qp against key j (position kpos[j]) of head h of
// sample b; each run of consecutive key positions is one segment of the one-rank mask row.
void block_mask_row(const AttentionBlockOptions& opt, int64_t b, int64_t h, int64_t qp,
                    const std::vector<int64_t>& kpos, int64_t cols, float* z) {
  const DropoutRow row{.seed = opt.seed,
                       .site = opt.site,
                       .sample = static_cast<uint64_t>(opt.sample_offset + b),
                       .row = static_cast<uint64_t>((opt.head_offset + h) * opt.seq_length + qp),
                       .p = opt.dropout_p};
  for (int64_t j0 = 0; j0 < cols;) {
    int64_t j1 = j0 + 1;
    while (j1 < cols && kpos[static_cast<size_t>(j1)] == kpos[static_cast<size_t>(j1 - 1)] + 1) ++j1;
    dropout_keep_scales(row, static_cast<uint64_t>(kpos[static_cast<size_t>(j0)]), j1 - j0, z + j0);
    j0 = j1;
  }
}

// One head's q (T, D), its group's k and v (Tk, D), fp32.
struct HeadIo {
  std::vector<float> q, k, v;
  HeadIo(int64_t T, int64_t Tk, int64_t D) : q(T * D), k(Tk * D), v(Tk * D) {}
};

void load_kv(const Tensor& kv, const BlockDims& d, int64_t b, int64_t g, HeadIo& io) {
  for (int64_t t = 0; t < d.Tk; ++t) {
    load_f32(kv, d.kv_at(b, t, g, 0), d.D, io.k.data() + t * d.D);
    load_f32(kv, d.kv_at(b, t, g, 1), d.D, io.v.data() + t * d.D);
  }
}

void load_q(const Tensor& qkv, const BlockDims& d, int64_t b, int64_t g, int64_t r, HeadIo& io) {
  for (int64_t t = 0; t < d.T; ++t) load_f32(qkv, d.q_at(b, t, g, r), d.D, io.q.data() + t * d.D);
}

}  // namespace

void attention_kv_pack(const Tensor& qkv, Tensor& kv) {
  const int64_t B = qkv.dim(0), T = qkv.dim(1), G = qkv.dim(2), S = qkv.dim(3), D = qkv.dim(4);
  std::vector<float> row(2 * D);  // one group's key and value
  for (int64_t n = 0; n < B * T * G; ++n) {
    load_f32(qkv, (n * S + S - 2) * D, 2 * D, row.data());
    store_f32(row.data(), 2 * D, kv, n * 2 * D);
  }
}

void attention_block_forward(const Tensor& qkv, const Tensor& kv, Tensor& out, Tensor& lse,
                             const AttentionBlockOptions& opt) {
  const BlockDims d = dims_of(qkv, kv);
  const int64_t T = d.T, Tk = d.Tk, D = d.D, H = d.H();
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  const std::vector<int64_t> qpos = positions(opt.q, T), kpos = positions(opt.k, Tk);
  HeadIo io(T, Tk, D);
  std::vector<float> s(kRowBlock * Tk);           // (kRowBlock, Tk) scores, then probabilities
  std::vector<float> z(static_cast<size_t>(Tk));  // one row of the dropout mask
  std::vector<char> vis(static_cast<size_t>(Tk));
  std::vector<int64_t> starts(static_cast<size_t>(T));  // sample b's rows' document starts
  const bool drop = opt.dropout_p != 0.f;
  float* o = out.data<float>();  // (B, T, H, D)
  float* l = lse.data<float>();  // (B, H, T)
  for (int64_t b = 0; b < d.B; ++b) {
    document_starts(opt, b, qpos, starts);
    for (int64_t g = 0; g < d.G; ++g) {
      load_kv(kv, d, b, g, io);
      for (int64_t r = 0; r < d.R; ++r) {
        const int64_t h = g * d.R + r;
        load_q(qkv, d, b, g, r, io);
        for (int64_t r0 = 0; r0 < T; r0 += kRowBlock) {
          const int64_t rows = std::min(kRowBlock, T - r0);
          const int64_t cols = visible_cols(qpos, starts, kpos, r0, rows, opt);
          if (cols == 0) {  // no key of this block is visible to these rows
            for (int64_t i = r0; i < r0 + rows; ++i) {
              std::fill(o + d.out_at(b, i, h), o + d.out_at(b, i, h) + D, 0.f);
              l[(b * H + h) * T + i] = kNegInf;
            }
            continue;
          }
          sgemm(false, true, rows, cols, D, scale, io.q.data() + r0 * D, D, io.k.data(), D, 0.f, s.data(), Tk);
          for (int64_t i = r0; i < r0 + rows; ++i) {
            float* row = s.data() + (i - r0) * Tk;
            visible_row(kpos, qpos, starts, i, opt, vis);
            float m = kNegInf;
            for (int64_t j = 0; j < cols; ++j)
              if (vis[j]) m = std::max(m, row[j]);
            float row_lse = kNegInf;
            if (m != kNegInf) {
              double sum = 0;
              for (int64_t j = 0; j < cols; ++j)
                if (vis[j]) sum += std::exp(static_cast<double>(row[j] - m));
              row_lse = m + static_cast<float>(std::log(sum));
            }
            for (int64_t j = 0; j < cols; ++j) row[j] = vis[j] && m != kNegInf ? std::exp(row[j] - row_lse) : 0.f;
            if (drop) {
              block_mask_row(opt, b, h, qpos[static_cast<size_t>(i)], kpos, cols, z.data());
              for (int64_t j = 0; j < cols; ++j) row[j] *= z[j];
            }
            l[(b * H + h) * T + i] = row_lse;
          }
          // out rows (stride H * D) = P V over the keys [0, cols)
          sgemm(false, false, rows, D, cols, 1.f, s.data(), Tk, io.v.data(), D, 0.f, o + d.out_at(b, r0, h), H * D);
        }
      }
    }
  }
}

void attention_merge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b) {
  const int64_t B = out.dim(0), T = out.dim(1), H = out.dim(2), D = out.dim(3);
  float* o = out.data<float>();
  float* l = lse.data<float>();
  const float* ob = out_b.data<float>();
  const float* lb = lse_b.data<float>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t li = (b * H + h) * T + t;
        const float l1 = l[li], l2 = lb[li], m = std::max(l1, l2);
        if (m == kNegInf) continue;  // neither saw a key
        const float merged = m + std::log(std::exp(l1 - m) + std::exp(l2 - m));
        const float w1 = std::exp(l1 - merged), w2 = std::exp(l2 - merged);
        float* row = o + ((b * T + t) * H + h) * D;
        const float* row_b = ob + ((b * T + t) * H + h) * D;
        for (int64_t e = 0; e < D; ++e) row[e] = w1 * row[e] + w2 * row_b[e];
        l[li] = merged;
      }
}

void attention_block_backward(const Tensor& qkv, const Tensor& kv, const Tensor& out, const Tensor& lse,
                              const Tensor& dout, Tensor& dq, Tensor& dkv, const AttentionBlockOptions& opt) {
  const BlockDims d = dims_of(qkv, kv);
  const int64_t T = d.T, Tk = d.Tk, D = d.D, H = d.H(), G = d.G;
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  const std::vector<int64_t> qpos = positions(opt.q, T), kpos = positions(opt.k, Tk);
  HeadIo io(T, Tk, D);
  std::vector<float> dout_h(T * D), out_row(D), delta(T);
  std::vector<float> p(kRowBlock * Tk), dp(kRowBlock * Tk);  // (kRowBlock, Tk) each: P, dP then dS
  std::vector<char> vis(static_cast<size_t>(Tk));
  const float* lse_in = lse.data<float>();  // (B, H, T)
  float* dq_out = dq.data<float>();         // (B, T, H, D)
  float* dkv_out = dkv.data<float>();       // (B, Tk, G, 2, D)
  const bool drop = opt.dropout_p != 0.f;
  // With dropout: P o Z (kRowBlock, Tk) and one mask row (Tk).
  std::vector<float> pz(drop ? kRowBlock * Tk : 0), z(drop ? Tk : 0);
  std::vector<int64_t> starts(static_cast<size_t>(T));  // sample b's rows' document starts
  for (int64_t b = 0; b < d.B; ++b) {
    document_starts(opt, b, qpos, starts);
    for (int64_t g = 0; g < G; ++g) {
      load_kv(kv, d, b, g, io);
      float* dk = dkv_out + d.kv_at(b, 0, g, 0);  // rows of stride G * 2 * D
      float* dv = dkv_out + d.kv_at(b, 0, g, 1);
      for (int64_t r = 0; r < d.R; ++r) {
        const int64_t h = g * d.R + r;
        load_q(qkv, d, b, g, r, io);
        for (int64_t t = 0; t < T; ++t) {
          load_f32(dout, d.out_at(b, t, h), D, dout_h.data() + t * D);
          load_f32(out, d.out_at(b, t, h), D, out_row.data());
          delta[t] = static_cast<float>(dot_f64(dout_h.data() + t * D, out_row.data(), D));
        }
        for (int64_t r0 = 0; r0 < T; r0 += kRowBlock) {
          const int64_t rows = std::min(kRowBlock, T - r0);
          const int64_t cols = visible_cols(qpos, starts, kpos, r0, rows, opt);
          if (cols == 0) continue;  // nothing of this block reaches these rows
          sgemm(false, true, rows, cols, D, scale, io.q.data() + r0 * D, D, io.k.data(), D, 0.f, p.data(), Tk);
          sgemm(false, true, rows, cols, D, 1.f, dout_h.data() + r0 * D, D, io.v.data(), D, 0.f, dp.data(), Tk);
          for (int64_t i = r0; i < r0 + rows; ++i) {
            float* prow = p.data() + (i - r0) * Tk;
            float* dprow = dp.data() + (i - r0) * Tk;
            visible_row(kpos, qpos, starts, i, opt, vis);
            const float row_lse = lse_in[(b * H + h) * T + i];
            for (int64_t j = 0; j < cols; ++j)
              prow[j] = vis[j] && row_lse != kNegInf ? std::exp(prow[j] - row_lse) : 0.f;
            if (drop) {
              block_mask_row(opt, b, h, qpos[static_cast<size_t>(i)], kpos, cols, z.data());
              float* pzrow = pz.data() + (i - r0) * Tk;
              for (int64_t j = 0; j < cols; ++j) {
                dprow[j] = z[j] == 0.f ? 0.f : dprow[j] * z[j];
                pzrow[j] = prow[j] * z[j];
              }
            }
            for (int64_t j = 0; j < cols; ++j) dprow[j] = scale * prow[j] * (dprow[j] - delta[i]);
          }
          // dV[:cols] += (P o Z)^T dO, dQ += dS K, dK[:cols] += dS^T Q
          sgemm(true, false, cols, D, rows, 1.f, drop ? pz.data() : p.data(), Tk, dout_h.data() + r0 * D, D, 1.f, dv,
                G * 2 * D);
          sgemm(false, false, rows, D, cols, 1.f, dp.data(), Tk, io.k.data(), D, 1.f, dq_out + d.out_at(b, r0, h),
                H * D);
          sgemm(true, false, cols, D, rows, 1.f, dp.data(), Tk, io.q.data() + r0 * D, D, 1.f, dk, G * 2 * D);
        }
      }
    }
  }
}

void attention_qkv_grad(const Tensor& dq, const Tensor& dkv, Tensor& dqkv) {
  const int64_t B = dqkv.dim(0), T = dqkv.dim(1), G = dqkv.dim(2), S = dqkv.dim(3), D = dqkv.dim(4), R = S - 2;
  const float* q = dq.data<float>();    // (B, T, G, R, D)
  const float* kv = dkv.data<float>();  // (B, T, G, 2, D)
  for (int64_t n = 0; n < B * T * G; ++n) {
    store_f32(q + n * R * D, R * D, dqkv, n * S * D);
    store_f32(kv + n * 2 * D, 2 * D, dqkv, (n * S + R) * D);
  }
}

}  // namespace mt::cpu
