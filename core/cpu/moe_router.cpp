// moe_router.cpp: the mixture-of-experts router on the CPU, the reference of core/cuda/moe_router.cu: the same
// fp32 operations in the same order per element (the softmax's sum of exps in double), so the two choose the same
// experts and agree within an ulp or two (expf) on the values. The load-balancing losses' statistics and gradient
// (moe_router_loss_stats, moe_router_loss_backward) likewise.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "core/cpu/ops_cpu.h"

namespace mt::cpu {

namespace {

// The selection key of an expert: its score plus its bias (if any), NaN ranked below every number.
float router_key(float score, const float* bias, int64_t e) {
  const float k = bias ? score + bias[e] : score;
  return std::isnan(k) ? -INFINITY : k;
}

// dp (K): the gradient of the selected experts' scores from that of their weights dw (K), the forward's
// selected scores p (K) given; the sums run in the k order.
void selected_score_grad(const float* p, const float* dw, int64_t K, bool norm, float* dp) {
  if (!norm) {
    std::copy(dw, dw + K, dp);
    return;
  }
  float S = 0.f;
  for (int64_t j = 0; j < K; ++j) S += p[j];
  float dot = 0.f;  // sum_i dw_i w_i
  for (int64_t j = 0; j < K; ++j) dot += dw[j] * (p[j] / S);
  for (int64_t j = 0; j < K; ++j) dp[j] = (dw[j] - dot) / S;
}

// logsumexp of a row of E logits: max + log of the sum of exps (exps in fp32, their sum in double, rounded once).
// m and total, when given, receive the max and that sum (the row's softmax is exp(x_e - m) / total).
float row_logsumexp(const float* x, int64_t E, float* m_out = nullptr, float* total_out = nullptr) {
  float m = -INFINITY;
  for (int64_t e = 0; e < E; ++e) m = std::fmax(m, x[e]);
  double sum = 0.0;
  for (int64_t e = 0; e < E; ++e) sum += static_cast<double>(std::exp(x[e] - m));
  const float total = static_cast<float>(sum);
  if (m_out) *m_out = m;
  if (total_out) *total_out = total;
  return m + std::log(total);
}

}  // namespace

void moe_router_forward(const Tensor& logits, const Tensor& bias, Tensor& scores, Tensor& experts, Tensor& probs,
                        const MoeRouterOptions& opt) {
  const int64_t N = logits.dim(0), E = logits.dim(1), K = opt.top_k;
  const float* x = logits.data<float>();                           // (N, E)
  const float* b = bias.defined() ? bias.data<float>() : nullptr;  // (E) or none
  float* s = scores.data<float>();                                 // (N, E)
  int32_t* ex = experts.data<int32_t>();                           // (N, K)
  float* pr = probs.data<float>();                                 // (N, K)
  std::vector<float> key(E);
  std::vector<int32_t> order(E);
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * E;
    float* sr = s + n * E;
    if (opt.score == RouterScore::softmax) {
      float m = -INFINITY;
      for (int64_t e = 0; e < E; ++e) m = std::fmax(m, xr[e]);
      double sum = 0.0;
      for (int64_t e = 0; e < E; ++e) {
        sr[e] = std::exp(xr[e] - m);
        sum += static_cast<double>(sr[e]);
      }
      const float total = static_cast<float>(sum);
      for (int64_t e = 0; e < E; ++e) sr[e] = sr[e] / total;
    } else {
      for (int64_t e = 0; e < E; ++e) sr[e] = 1.f / (1.f + std::exp(-xr[e]));
    }
    for (int64_t e = 0; e < E; ++e) key[e] = router_key(sr[e], b, e);
    // A strict total order (key descending, then index ascending): the first K are unique.
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + K, order.end(),
                      [&](int32_t i, int32_t j) { return key[i] > key[j] || (key[i] == key[j] && i < j); });
    float S = 0.f;
    for (int64_t j = 0; j < K; ++j) S += sr[order[j]];
    for (int64_t j = 0; j < K; ++j) {
      ex[n * K + j] = order[j];
      pr[n * K + j] = opt.norm_topk_prob ? sr[order[j]] / S : sr[order[j]];
    }
  }
}

void moe_router_backward(const Tensor& scores, const Tensor& experts, const Tensor& dprobs, Tensor& dlogits,
                         const MoeRouterOptions& opt) {
  const int64_t N = scores.dim(0), E = scores.dim(1), K = opt.top_k;
  const float* s = scores.data<float>();        // (N, E)
  const int32_t* ex = experts.data<int32_t>();  // (N, K)
  const float* dw = dprobs.data<float>();       // (N, K)
  float* dl = dlogits.data<float>();            // (N, E)
  std::vector<float> p(K), dp(K);
  for (int64_t n = 0; n < N; ++n) {
    const float* sr = s + n * E;
    const int32_t* er = ex + n * K;
    float* dr = dl + n * E;
    // An expert id outside [0, E) (never one the forward wrote) counts as a score of 0 and is not scattered.
    for (int64_t j = 0; j < K; ++j) p[j] = er[j] >= 0 && er[j] < E ? sr[er[j]] : 0.f;
    selected_score_grad(p.data(), dw + n * K, K, opt.norm_topk_prob, dp.data());
    std::fill(dr, dr + E, 0.f);  // dscore
    for (int64_t j = 0; j < K; ++j)
      if (er[j] >= 0 && er[j] < E) dr[er[j]] = dp[j];
    if (opt.score == RouterScore::softmax) {
      float dot = 0.f;  // sum_e dscore_e s_e: only the selected columns are non-zero
      for (int64_t j = 0; j < K; ++j) dot += dp[j] * p[j];
      for (int64_t e = 0; e < E; ++e) dr[e] = sr[e] * (dr[e] - dot);
    } else {
      for (int64_t e = 0; e < E; ++e) dr[e] = dr[e] * sr[e] * (1.f - sr[e]);
    }
  }
}

void moe_router_loss_stats(const Tensor& logits, const Tensor& scores, RouterScore score, Tensor& score_sums,
                           Tensor& lse_sq_sum) {
  const int64_t N = logits.dim(0), E = logits.dim(1);
  const float* x = logits.data<float>();  // (N, E)
  const float* s = scores.data<float>();  // (N, E)
  std::vector<double> col(E, 0.0);        // sum over rows of a_{n,e}
  double lse_sq = 0.0;
  for (int64_t n = 0; n < N; ++n) {
    const float* sr = s + n * E;
    if (score == RouterScore::softmax) {
      for (int64_t e = 0; e < E; ++e) col[e] += static_cast<double>(sr[e]);
    } else {
      float S = 0.f;  // in fp32, e order
      for (int64_t e = 0; e < E; ++e) S += sr[e];
      const float denom = S + 1e-20f;
      for (int64_t e = 0; e < E; ++e) col[e] += static_cast<double>(sr[e] / denom);
    }
    const float lse = row_logsumexp(x + n * E, E);
    const float sq = lse * lse;
    lse_sq += static_cast<double>(sq);
  }
  float* out = score_sums.data<float>();  // (E)
  for (int64_t e = 0; e < E; ++e) out[e] = static_cast<float>(col[e]);
  lse_sq_sum.data<float>()[0] = static_cast<float>(lse_sq);
}

void moe_router_loss_backward(const Tensor& logits, const Tensor& scores, const Tensor& score_grad, float z_grad,
                              RouterScore score, Tensor& dlogits) {
  const bool with_scores = score_grad.defined(), with_z = z_grad != 0.f;
  if (!with_scores && !with_z) return;
  const int64_t N = logits.dim(0), E = logits.dim(1);
  const float* x = logits.data<float>();                              // (N, E)
  const float* s = scores.data<float>();                              // (N, E)
  const float* g = with_scores ? score_grad.data<float>() : nullptr;  // (E)
  float* dl = dlogits.data<float>();                                  // (N, E)
  const bool softmax = score == RouterScore::softmax;
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * E;
    const float* sr = s + n * E;
    float* dr = dl + n * E;
    // The score term's row scalars: softmax: dot = sum_j g_j s_j; sigmoid: S (with the 1e-20), dot = sum_j g_j a_j.
    float S = 1.f, dot = 0.f;
    if (with_scores) {
      if (!softmax) {
        double sum = 0.0;
        for (int64_t e = 0; e < E; ++e) sum += static_cast<double>(sr[e]);
        S = static_cast<float>(sum) + 1e-20f;
      }
      double d = 0.0;
      for (int64_t e = 0; e < E; ++e)
        d += static_cast<double>(g[e]) * static_cast<double>(softmax ? sr[e] : sr[e] / S);  // exact products
      dot = static_cast<float>(d);
    }
    // The z term: c * softmax(logits)_e with c = 2 z_grad lse.
    float m = 0.f, total = 1.f, c = 0.f;
    if (with_z) c = (2.f * z_grad) * row_logsumexp(xr, E, &m, &total);
    for (int64_t e = 0; e < E; ++e) {
      float ts = 0.f, tz = 0.f;
      if (with_scores) {
        const float se = sr[e];
        if (softmax) {
          ts = se * (g[e] - dot);
        } else {
          const float ds = (g[e] - dot) / S;
          ts = (ds * se) * (1.f - se);
        }
      }
      if (with_z) tz = c * (std::exp(xr[e] - m) / total);
      dr[e] += ts + tz;
    }
  }
}

}  // namespace mt::cpu
