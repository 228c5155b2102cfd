// attention.cpp: causal grouped-query attention on the CPU, one (sample, query head) at a time, flash-style: the
// forward saves only the row log-sum-exp, the backward recomputes each probability row from q, k and lse.
// Rows go in blocks of kRowBlock: the block's scores, P V and the backward's products are OpenBLAS GEMMs over
// the keys the block can see (all keys before its last row when causal), the row-wise softmax and mask are
// vec_math.h loops. Memory per call is the head's q, k, v (T, D) in fp32 plus a few (kRowBlock, T) blocks.
//
// Math for one head, Z the dropout mask scaled by 1 / (1 - p) (all ones without dropout):
//   S = scale * Q K^T, P = softmax(S) = exp(S - lse), O = (P o Z) V
//   dV = (P o Z)^T dO, dP = (dO V^T) o Z, dS = P o (dP - rowsum(P o dP)), dQ = scale dS K, dK = scale dS^T Q.
// rowsum(P o dP) equals dO_i . O_i in exact arithmetic; it is summed from the recomputed row instead, so the
// backward does not depend on how out was rounded.
//
// Grouped-query attention: qkv (B, T, G, R + 2, D), query head h = g R + r reads query slot r of group g and
// the group's key (slot R) and value (slot R + 1). Loops go group by group: the group's k and v are loaded
// once, then its R query heads run one after the other exactly as single heads (R = 1 is GPT's layout and the
// same arithmetic as before grouping). The backward computes each head's dK and dV as above and sums them
// over the group in fp32 in the order r = 0..R-1 (the first head's copied, not added to zeros), storing once.
//
// Packed documents (AttentionOptions::positions) and the sliding window: query i of sample b sees keys [lo_i, i], lo_i
// the later of its document's start i - positions[b, i] and its window's i - window + 1. The blocks stay as they are;
// a row's softmax, dropout and gradients run over [lo_i, i] and its entries before lo_i are zeros, so lo_i = 0 is the
// same arithmetic as without positions or a window.
//
// Layouts: tensor parallelism splits groups and each head is computed whole (all T positions; sequence
// parallelism gathers them before attention), so every value depends only on its own group's inputs.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include <cblas.h>

#include "core/cpu/dropout_mask.h"
#include "core/cpu/float_io.h"
#include "core/cpu/ops_cpu.h"
#include "core/cpu/vec_math.h"

namespace mt::cpu {

namespace {

// qkv (B, T, G, R + 2, D), out (B, T, H, D) with H = G R.
struct HeadDims {
  int64_t B, T, G, R, D;
  int64_t H() const { return G * R; }
  // Element offset of slot s (0..R-1 queries, R key, R + 1 value) of group g at (b, t).
  int64_t qkv_at(int64_t b, int64_t t, int64_t g, int64_t s) const { return (((b * T + t) * G + g) * (R + 2) + s) * D; }
  int64_t out_at(int64_t b, int64_t t, int64_t h) const { return ((b * T + t) * H() + h) * D; }
};

HeadDims dims_of(const Tensor& qkv) { return {qkv.dim(0), qkv.dim(1), qkv.dim(2), qkv.dim(3) - 2, qkv.dim(4)}; }

// x (T, D) = slot s of group g of sample b, as fp32.
void load_slot(const Tensor& qkv, const HeadDims& d, int64_t b, int64_t g, int64_t s, float* x) {
  for (int64_t t = 0; t < d.T; ++t) load_f32(qkv, d.qkv_at(b, t, g, s), d.D, x + t * d.D);
}

// Stores x (T, D) into slot s of group g of sample b of dqkv.
void store_slot(const float* x, const HeadDims& d, int64_t b, int64_t g, int64_t s, Tensor& dqkv) {
  for (int64_t t = 0; t < d.T; ++t) store_f32(x + t * d.D, d.D, dqkv, d.qkv_at(b, t, g, s));
}

constexpr int64_t kRowBlock = 64;

// Rows [r0, r0 + rows) of a block and the keys they see: [0, cols).
struct RowBlock {
  int64_t r0, rows, cols;
};
RowBlock row_block(int64_t r0, int64_t T, bool causal) {
  const int64_t rows = std::min(kRowBlock, T - r0);
  return {r0, rows, causal ? r0 + rows : T};
}

// c (m, n), row stride ldc = alpha * op(a) op(b) + beta * c, op(a) (m, k), op(b) (k, n); row-major fp32.
void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
           int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

// s (rows, cols), row stride T: the scores scale * q_i . k_j of a row block.
void block_scores(const float* q, const float* k, const RowBlock& rb, int64_t T, int64_t D, float scale, float* s) {
  sgemm(false, true, rb.rows, rb.cols, D, scale, q + rb.r0 * D, D, k, D, 0.f, s, T);
}

// z[j] = the dropout keep scale of P_ij (0 or 1 / (1 - p)) at coordinates
// (sample_offset + b, (head_offset + h) * T + i, j), for j < len.
void mask_row(const AttentionOptions& opt, int64_t b, int64_t h, int64_t T, int64_t i, int64_t len, float* z) {
  if (opt.dropout_p == 0.f) {
    for (int64_t j = 0; j < len; ++j) z[j] = 1.f;
    return;
  }
  const uint64_t sample = static_cast<uint64_t>(opt.sample_offset + b);
  const uint64_t row = static_cast<uint64_t>((opt.head_offset + h) * T + i);
  dropout_keep_scales({.seed = opt.seed, .site = opt.site, .sample = sample, .row = row, .p = opt.dropout_p}, 0, len,
                      z);
}

// One query head h of sample b: its query q, its group's key k and value v (T, D each, fp32); first[i] the first
// key query i sees (null: 0 for every row).
struct Head {
  int64_t b, h, T, D;
  float scale;
  const float *q, *k, *v;
  const int64_t* first = nullptr;
};

// Per (b, i) the first key query i of sample b sees, from packed documents' positions and the sliding window
// (B * T; empty with neither). Throws std::invalid_argument for a position outside [0, i].
std::vector<int64_t> first_keys(const AttentionOptions& opt, int64_t B, int64_t T) {
  if (!opt.positions.defined() && opt.window == 0) return {};
  const int32_t* pos = opt.positions.defined() ? opt.positions.data<int32_t>() : nullptr;
  std::vector<int64_t> first(static_cast<size_t>(B * T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < T; ++i) {
      const int64_t p = pos ? pos[b * T + i] : i;
      if (p < 0 || p > i)
        throw std::invalid_argument("attention: positions[" + std::to_string(b) + ", " + std::to_string(i) +
                                    "] = " + std::to_string(p) + " lies outside [0, " + std::to_string(i) + "]");
      first[static_cast<size_t>(b * T + i)] = attention_first_key(i, p, opt.window);
    }
  return first;
}

// o (T, D) and lse_row (T) of one head.
void head_forward(const Head& hd, const AttentionOptions& opt, std::vector<float>& p, std::vector<float>& z, float* o,
                  float* lse_row) {
  const int64_t T = hd.T, D = hd.D;
  for (int64_t r0 = 0; r0 < T; r0 += kRowBlock) {
    const RowBlock rb = row_block(r0, T, opt.causal);
    block_scores(hd.q, hd.k, rb, T, D, hd.scale, p.data());
    for (int64_t i = r0; i < r0 + rb.rows; ++i) {
      const int64_t len = opt.causal ? i + 1 : T, lo = hd.first ? hd.first[i] : 0;
      float* row = p.data() + (i - r0) * T;
      const float m = row_max(row + lo, len - lo);
      const float row_lse = m + static_cast<float>(std::log(sum_exp_shifted(row + lo, len - lo, m)));
      exp_shifted(row + lo, len - lo, row_lse, row + lo);
      if (opt.dropout_p != 0.f) {
        mask_row(opt, hd.b, hd.h, T, i, len, z.data());
        for (int64_t j = lo; j < len; ++j) row[j] *= z[j];
      }
      std::fill(row, row + lo, 0.f);
      std::fill(row + len, row + rb.cols, 0.f);
      lse_row[i] = row_lse;
    }
    sgemm(false, false, rb.rows, D, rb.cols, 1.f, p.data(), T, hd.v, D, 0.f, o + r0 * D, D);
  }
}

// Scratch of head_backward: (kRowBlock, T) blocks and one mask row (T).
struct BackwardScratch {
  std::vector<float> p, dp, pz, z;  // P and dP (then dS), P o Z, the mask row
  explicit BackwardScratch(int64_t T) : p(kRowBlock * T), dp(kRowBlock * T), pz(kRowBlock * T), z(T) {}
};

// dq, dk, dv (T, D) of one head (all written) from its dout (T, D) and lse_row (T).
void head_backward(const Head& hd, const AttentionOptions& opt, const float* dout_h, const float* lse_row,
                   BackwardScratch& w, float* dq, float* dk, float* dv) {
  const int64_t T = hd.T, D = hd.D;
  std::fill(dk, dk + T * D, 0.f);
  std::fill(dv, dv + T * D, 0.f);
  for (int64_t r0 = 0; r0 < T; r0 += kRowBlock) {
    const RowBlock rb = row_block(r0, T, opt.causal);
    block_scores(hd.q, hd.k, rb, T, D, hd.scale, w.p.data());
    // dO_i . v_j for the block's rows and keys.
    sgemm(false, true, rb.rows, rb.cols, D, 1.f, dout_h + r0 * D, D, hd.v, D, 0.f, w.dp.data(), T);
    for (int64_t i = r0; i < r0 + rb.rows; ++i) {
      const int64_t len = opt.causal ? i + 1 : T, lo = hd.first ? hd.first[i] : 0;
      float* prow = w.p.data() + (i - r0) * T;
      float* dprow = w.dp.data() + (i - r0) * T;
      float* pzrow = w.pz.data() + (i - r0) * T;
      exp_shifted(prow + lo, len - lo, lse_row[i], prow + lo);
      if (opt.dropout_p != 0.f) {
        mask_row(opt, hd.b, hd.h, T, i, len, w.z.data());
        for (int64_t j = lo; j < len; ++j) {
          dprow[j] = w.z[j] == 0.f ? 0.f : dprow[j] * w.z[j];
          pzrow[j] = prow[j] * w.z[j];
        }
      } else {
        std::copy(prow + lo, prow + len, pzrow + lo);
      }
      const float row_d = static_cast<float>(dot_f64(prow + lo, dprow + lo, len - lo));  // sum_j P_ij dP_ij
      for (int64_t j = lo; j < len; ++j) dprow[j] = hd.scale * prow[j] * (dprow[j] - row_d);
      std::fill(dprow, dprow + lo, 0.f);
      std::fill(pzrow, pzrow + lo, 0.f);
      std::fill(dprow + len, dprow + rb.cols, 0.f);
      std::fill(pzrow + len, pzrow + rb.cols, 0.f);
    }
    // dV[:cols] += (P o Z)^T dO, dQ = dS K, dK[:cols] += dS^T Q over the block's rows.
    sgemm(true, false, rb.cols, D, rb.rows, 1.f, w.pz.data(), T, dout_h + r0 * D, D, 1.f, dv, D);
    sgemm(false, false, rb.rows, D, rb.cols, 1.f, w.dp.data(), T, hd.k, D, 0.f, dq + r0 * D, D);
    sgemm(true, false, rb.cols, D, rb.rows, 1.f, w.dp.data(), T, hd.q + r0 * D, D, 1.f, dk, D);
  }
}

}  // namespace

void attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse, const AttentionOptions& opt) {
  const HeadDims d = dims_of(qkv);
  const int64_t T = d.T, D = d.D, H = d.H();
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  std::vector<float> q(T * D), k(T * D), v(T * D), o(T * D);  // (T, D) each
  std::vector<float> p(kRowBlock * T);                        // (kRowBlock, T): scores, then P o Z, of a block
  std::vector<float> z(T);                                    // (T): one row of the mask
  float* lse_out = lse.data<float>();                         // (B, H, T)
  const std::vector<int64_t> first = first_keys(opt, d.B, T);
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t g = 0; g < d.G; ++g) {
      load_slot(qkv, d, b, g, d.R, k.data());
      load_slot(qkv, d, b, g, d.R + 1, v.data());
      for (int64_t r = 0; r < d.R; ++r) {
        const int64_t h = g * d.R + r;
        load_slot(qkv, d, b, g, r, q.data());
        const int64_t* fb = first.empty() ? nullptr : first.data() + b * T;
        head_forward({b, h, T, D, scale, q.data(), k.data(), v.data(), fb}, opt, p, z, o.data(),
                     lse_out + (b * H + h) * T);
        for (int64_t t = 0; t < T; ++t) store_f32(o.data() + t * D, D, out, d.out_at(b, t, h));
      }
    }
  }
}

void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout, Tensor& dqkv,
                        const AttentionOptions& opt) {
  const HeadDims d = dims_of(qkv);
  const int64_t T = d.T, D = d.D, H = d.H();
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  std::vector<float> q(T * D), k(T * D), v(T * D), dout_h(T * D);  // (T, D) each
  std::vector<float> dq(T * D), dk(T * D), dv(T * D);              // (T, D) each: one head's gradients
  std::vector<float> dk_g(T * D), dv_g(T * D);                     // (T, D) each: their sums over the group
  BackwardScratch scratch(T);
  const float* lse_in = lse.data<float>();  // (B, H, T)
  const std::vector<int64_t> first = first_keys(opt, d.B, T);
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t g = 0; g < d.G; ++g) {
      load_slot(qkv, d, b, g, d.R, k.data());
      load_slot(qkv, d, b, g, d.R + 1, v.data());
      for (int64_t r = 0; r < d.R; ++r) {
        const int64_t h = g * d.R + r;
        load_slot(qkv, d, b, g, r, q.data());
        for (int64_t t = 0; t < T; ++t) load_f32(dout, d.out_at(b, t, h), D, dout_h.data() + t * D);
        const int64_t* fb = first.empty() ? nullptr : first.data() + b * T;
        head_backward({b, h, T, D, scale, q.data(), k.data(), v.data(), fb}, opt, dout_h.data(),
                      lse_in + (b * H + h) * T, scratch, dq.data(), dk.data(), dv.data());
        store_slot(dq.data(), d, b, g, r, dqkv);
        if (r == 0) {  // the group's sums start as the first head's gradients (copied: no 0 + x)
          dk_g.swap(dk);
          dv_g.swap(dv);
        } else {
          for (int64_t e = 0; e < T * D; ++e) {
            dk_g[e] += dk[e];
            dv_g[e] += dv[e];
          }
        }
      }
      store_slot(dk_g.data(), d, b, g, d.R, dqkv);
      store_slot(dv_g.data(), d, b, g, d.R + 1, dqkv);
    }
  }
}

}  // namespace mt::cpu
