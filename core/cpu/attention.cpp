// attention.cpp: causal multi-head attention on the CPU, one (sample, head) at a time, flash-style: the
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
// Layouts: tensor parallelism splits heads and each head is computed whole (all T positions; sequence
// parallelism gathers them before attention), so every value depends only on its own head's inputs.
#include <algorithm>
#include <cmath>
#include <vector>

#include <cblas.h>

#include "core/cpu/dropout_mask.h"
#include "core/cpu/float_io.h"
#include "core/cpu/ops_cpu.h"
#include "core/cpu/vec_math.h"

namespace mt::cpu {

namespace {

struct HeadDims {
  int64_t B, T, H, D;
  int64_t qkv_at(int64_t b, int64_t t, int64_t h) const { return ((b * T + t) * H + h) * 3 * D; }  // q; k +D, v +2D
  int64_t out_at(int64_t b, int64_t t, int64_t h) const { return ((b * T + t) * H + h) * D; }
};

HeadDims dims_of(const Tensor& qkv) { return {qkv.dim(0), qkv.dim(1), qkv.dim(2), qkv.dim(4)}; }

// q, k, v (T, D) of head h of sample b, as fp32.
void load_head(const Tensor& qkv, const HeadDims& d, int64_t b, int64_t h, float* q, float* k, float* v) {
  for (int64_t t = 0; t < d.T; ++t) {
    const int64_t at = d.qkv_at(b, t, h);
    load_f32(qkv, at, d.D, q + t * d.D);
    load_f32(qkv, at + d.D, d.D, k + t * d.D);
    load_f32(qkv, at + 2 * d.D, d.D, v + t * d.D);
  }
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

}  // namespace

void attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse, const AttentionOptions& opt) {
  const HeadDims d = dims_of(qkv);
  const int64_t T = d.T, D = d.D;
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  std::vector<float> q(T * D), k(T * D), v(T * D), o(T * D);  // (T, D) each
  std::vector<float> p(kRowBlock * T);                        // (kRowBlock, T): scores, then P o Z, of a block
  std::vector<float> z(T);                                    // (T): one row of the mask
  float* lse_out = lse.data<float>();                         // (B, H, T)
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t h = 0; h < d.H; ++h) {
      load_head(qkv, d, b, h, q.data(), k.data(), v.data());
      for (int64_t r0 = 0; r0 < T; r0 += kRowBlock) {
        const RowBlock rb = row_block(r0, T, opt.causal);
        block_scores(q.data(), k.data(), rb, T, D, scale, p.data());
        for (int64_t i = r0; i < r0 + rb.rows; ++i) {
          const int64_t len = opt.causal ? i + 1 : T;
          float* row = p.data() + (i - r0) * T;
          const float m = row_max(row, len);
          const float row_lse = m + static_cast<float>(std::log(sum_exp_shifted(row, len, m)));
          exp_shifted(row, len, row_lse, row);
          if (opt.dropout_p != 0.f) {
            mask_row(opt, b, h, T, i, len, z.data());
            for (int64_t j = 0; j < len; ++j) row[j] *= z[j];
          }
          std::fill(row + len, row + rb.cols, 0.f);
          lse_out[(b * d.H + h) * T + i] = row_lse;
        }
        sgemm(false, false, rb.rows, D, rb.cols, 1.f, p.data(), T, v.data(), D, 0.f, o.data() + r0 * D, D);
      }
      for (int64_t t = 0; t < T; ++t) store_f32(o.data() + t * D, D, out, d.out_at(b, t, h));
    }
  }
}

void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout, Tensor& dqkv,
                        const AttentionOptions& opt) {
  const HeadDims d = dims_of(qkv);
  const int64_t T = d.T, D = d.D;
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  std::vector<float> q(T * D), k(T * D), v(T * D), dout_h(T * D);  // (T, D) each
  std::vector<float> dq(T * D), dk(T * D), dv(T * D);              // (T, D) each
  std::vector<float> p(kRowBlock * T), dp(kRowBlock * T);          // (kRowBlock, T): P and dP, then dS
  std::vector<float> pz(kRowBlock * T);                            // (kRowBlock, T): P o Z
  std::vector<float> z(T);                                         // (T): one row of the mask
  const float* lse_in = lse.data<float>();                         // (B, H, T)
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t h = 0; h < d.H; ++h) {
      load_head(qkv, d, b, h, q.data(), k.data(), v.data());
      for (int64_t t = 0; t < T; ++t) load_f32(dout, d.out_at(b, t, h), D, dout_h.data() + t * D);
      std::fill(dk.begin(), dk.end(), 0.f);
      std::fill(dv.begin(), dv.end(), 0.f);
      for (int64_t r0 = 0; r0 < T; r0 += kRowBlock) {
        const RowBlock rb = row_block(r0, T, opt.causal);
        block_scores(q.data(), k.data(), rb, T, D, scale, p.data());
        // dO_i . v_j for the block's rows and keys.
        sgemm(false, true, rb.rows, rb.cols, D, 1.f, dout_h.data() + r0 * D, D, v.data(), D, 0.f, dp.data(), T);
        for (int64_t i = r0; i < r0 + rb.rows; ++i) {
          const int64_t len = opt.causal ? i + 1 : T;
          float* prow = p.data() + (i - r0) * T;
          float* dprow = dp.data() + (i - r0) * T;
          float* pzrow = pz.data() + (i - r0) * T;
          exp_shifted(prow, len, lse_in[(b * d.H + h) * T + i], prow);
          if (opt.dropout_p != 0.f) {
            mask_row(opt, b, h, T, i, len, z.data());
            for (int64_t j = 0; j < len; ++j) {
              dprow[j] = z[j] == 0.f ? 0.f : dprow[j] * z[j];
              pzrow[j] = prow[j] * z[j];
            }
          } else {
            std::copy(prow, prow + len, pzrow);
          }
          const float row_d = static_cast<float>(dot_f64(prow, dprow, len));  // sum_j P_ij dP_ij
          for (int64_t j = 0; j < len; ++j) dprow[j] = scale * prow[j] * (dprow[j] - row_d);
          std::fill(dprow + len, dprow + rb.cols, 0.f);
          std::fill(pzrow + len, pzrow + rb.cols, 0.f);
        }
        // dV[:cols] += (P o Z)^T dO, dQ = dS K, dK[:cols] += dS^T Q over the block's rows.
        sgemm(true, false, rb.cols, D, rb.rows, 1.f, pz.data(), T, dout_h.data() + r0 * D, D, 1.f, dv.data(), D);
        sgemm(false, false, rb.rows, D, rb.cols, 1.f, dp.data(), T, k.data(), D, 0.f, dq.data() + r0 * D, D);
        sgemm(true, false, rb.cols, D, rb.rows, 1.f, dp.data(), T, q.data() + r0 * D, D, 1.f, dk.data(), D);
      }
      for (int64_t t = 0; t < T; ++t) {
        const int64_t at = d.qkv_at(b, t, h);
        store_f32(dq.data() + t * D, D, dqkv, at);
        store_f32(dk.data() + t * D, D, dqkv, at + D);
        store_f32(dv.data() + t * D, D, dqkv, at + 2 * D);
      }
    }
  }
}

}  // namespace mt::cpu
