// attention.cpp: causal multi-head attention on the CPU, one (sample, head) at a time, flash-style: the
// forward saves only the row log-sum-exp, the backward recomputes each probability row from q, k and lse.
// Memory per call is the head's q, k, v (T, D) in fp32 plus a few rows of T; no (T, T) matrix.
//
// Math for one head, Z the dropout mask scaled by 1 / (1 - p) (all ones without dropout):
//   S = scale * Q K^T, P = softmax(S) = exp(S - lse), O = (P o Z) V
//   dV = (P o Z)^T dO, dP = (dO V^T) o Z, dS = P o (dP - rowsum(P o dP)), dQ = scale dS K, dK = scale dS^T Q.
// rowsum(P o dP) equals dO_i . O_i in exact arithmetic; it is summed from the recomputed row instead, so the
// backward does not depend on how out was rounded.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/cpu/float_io.h"
#include "core/cpu/ops_cpu.h"
#include "core/rng.h"

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

float dot(const float* x, const float* y, int64_t n) {
  float s = 0.f;
  for (int64_t i = 0; i < n; ++i) s += x[i] * y[i];
  return s;
}

// Row i of one head, for j < len (len = i + 1 when causal, else T): s[j] = scale * q_i . k_j.
void score_row(const float* qi, const float* k, int64_t len, int64_t D, float scale, float* s) {
  for (int64_t j = 0; j < len; ++j) s[j] = scale * dot(qi, k + j * D, D);
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
  dropout_row_scales(opt.seed, opt.site, sample, row, 0, len, opt.dropout_p, z);
}

}  // namespace

void attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse, const AttentionOptions& opt) {
  const HeadDims d = dims_of(qkv);
  const int64_t T = d.T, D = d.D;
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  std::vector<float> q(T * D), k(T * D), v(T * D);  // (T, D) each
  std::vector<float> s(T), z(T);                    // (T) each: one row of scores and of the mask
  std::vector<float> o(D);                          // (D)
  float* lse_out = lse.data<float>();               // (B, H, T)
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t h = 0; h < d.H; ++h) {
      load_head(qkv, d, b, h, q.data(), k.data(), v.data());
      for (int64_t i = 0; i < T; ++i) {
        const int64_t len = opt.causal ? i + 1 : T;
        score_row(q.data() + i * D, k.data(), len, D, scale, s.data());
        float m = s[0];
        for (int64_t j = 1; j < len; ++j) m = std::max(m, s[j]);
        double sum = 0.0;
        for (int64_t j = 0; j < len; ++j) sum += std::exp(s[j] - m);
        const float row_lse = m + static_cast<float>(std::log(sum));
        mask_row(opt, b, h, T, i, len, z.data());
        for (int64_t c = 0; c < D; ++c) o[c] = 0.f;
        for (int64_t j = 0; j < len; ++j) {
          const float pz = std::exp(s[j] - row_lse) * z[j];
          if (pz == 0.f) continue;
          const float* vj = v.data() + j * D;
          for (int64_t c = 0; c < D; ++c) o[c] += pz * vj[c];
        }
        store_f32(o.data(), D, out, d.out_at(b, i, h));
        lse_out[(b * d.H + h) * T + i] = row_lse;
      }
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
  std::vector<float> p(T), z(T), dp(T);                            // (T) each: one row
  const float* lse_in = lse.data<float>();                         // (B, H, T)
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t h = 0; h < d.H; ++h) {
      load_head(qkv, d, b, h, q.data(), k.data(), v.data());
      for (int64_t t = 0; t < T; ++t) load_f32(dout, d.out_at(b, t, h), D, dout_h.data() + t * D);
      std::fill(dq.begin(), dq.end(), 0.f);
      std::fill(dk.begin(), dk.end(), 0.f);
      std::fill(dv.begin(), dv.end(), 0.f);
      for (int64_t i = 0; i < T; ++i) {
        const int64_t len = opt.causal ? i + 1 : T;
        const float* qi = q.data() + i * D;
        const float* doi = dout_h.data() + i * D;
        const float row_lse = lse_in[(b * d.H + h) * T + i];
        score_row(qi, k.data(), len, D, scale, p.data());
        mask_row(opt, b, h, T, i, len, z.data());
        double rowsum = 0.0;  // sum_j P_ij dP_ij
        for (int64_t j = 0; j < len; ++j) {
          p[j] = std::exp(p[j] - row_lse);
          dp[j] = z[j] == 0.f ? 0.f : dot(doi, v.data() + j * D, D) * z[j];
          rowsum += static_cast<double>(p[j]) * dp[j];
          const float pz = p[j] * z[j];
          if (pz != 0.f) {
            float* dvj = dv.data() + j * D;
            for (int64_t c = 0; c < D; ++c) dvj[c] += pz * doi[c];
          }
        }
        const float row_d = static_cast<float>(rowsum);
        float* dqi = dq.data() + i * D;
        for (int64_t j = 0; j < len; ++j) {
          const float ds = scale * p[j] * (dp[j] - row_d);
          const float* kj = k.data() + j * D;
          float* dkj = dk.data() + j * D;
          for (int64_t c = 0; c < D; ++c) {
            dqi[c] += ds * kj[c];
            dkj[c] += ds * qi[c];
          }
        }
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
