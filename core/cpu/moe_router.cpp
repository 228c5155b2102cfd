// moe_router.cpp: the mixture-of-experts router on the CPU, the reference of core/cuda/moe_router.cu: the same
// fp32 operations in the same order per element (the softmax's sum of exps in double), so the two choose the same
// experts and agree within an ulp or two (expf) on the values.
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

}  // namespace mt::cpu
