// test_ops.moe.cpp: the CPU mixture-of-experts router against a double reference and finite differences: softmax
// and sigmoid scores, with and without normalised weights, the expert bias steering the choice but not the
// weights, ties going to the lower expert, top_k = 1 and = E, and the argument errors.
// One of the sources of test_ops (tests/CMakeLists.txt); the shared references are in op_reference.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"
#include "tests/unit/core/tensor/op_reference.h"

namespace mt {
namespace {

using namespace mt::test;  // Vec, rand_vec, make, values, the references of op_reference.h

// ---- the router in double ------------------------------------------------------------------------

struct RouterRef {
  Vec scores;                    // (N, E)
  std::vector<int32_t> experts;  // (N, K)
  Vec probs;                     // (N, K)
  double min_gap = 0;            // the smallest key gap between the k-th and the (k+1)-th choice of any row
};

// The router's semantics written plainly: scores, the top k by score + bias (ties to the lower index), the
// selected scores as weights, normalised by their sum when asked.
RouterRef router_ref(const Vec& logits, const Vec& bias, int64_t N, int64_t E, const MoeRouterOptions& opt) {
  const int64_t K = opt.top_k;
  RouterRef r{Vec(N * E), std::vector<int32_t>(N * K), Vec(N * K), std::numeric_limits<double>::infinity()};
  for (int64_t n = 0; n < N; ++n) {
    const double* x = logits.data() + n * E;
    double* s = r.scores.data() + n * E;
    if (opt.score == RouterScore::softmax) {
      const double m = *std::max_element(x, x + E);
      double sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += std::exp(x[e] - m);
      for (int64_t e = 0; e < E; ++e) s[e] = std::exp(x[e] - m) / sum;
    } else {
      for (int64_t e = 0; e < E; ++e) s[e] = 1 / (1 + std::exp(-x[e]));
    }
    Vec key(E);
    for (int64_t e = 0; e < E; ++e) key[e] = s[e] + (bias.empty() ? 0.0 : bias[e]);
    std::vector<int32_t> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t i, int32_t j) { return key[i] > key[j]; });
    if (K < E) r.min_gap = std::min(r.min_gap, key[order[K - 1]] - key[order[K]]);
    double sum = 0;
    for (int64_t j = 0; j < K; ++j) sum += s[order[j]];
    for (int64_t j = 0; j < K; ++j) {
      r.experts[n * K + j] = order[j];
      r.probs[n * K + j] = opt.norm_topk_prob ? s[order[j]] / sum : s[order[j]];
    }
  }
  return r;
}

struct RouterOut {
  Tensor scores, experts, probs;
};

// The CPU op on host tensors (outputs poisoned with NaN / -1 first, so every element must be written).
RouterOut run_router(const Vec& logits, const Vec& bias, int64_t N, int64_t E, const MoeRouterOptions& opt) {
  const int64_t K = opt.top_k;
  RouterOut o{make(Vec(N * E, std::nan("")), {N, E}), Tensor::from_ints(std::vector<int32_t>(N * K, -1), {N, K}),
              make(Vec(N * K, std::nan("")), {N, K})};
  const Tensor b = bias.empty() ? Tensor() : make(bias, {E});
  moe_router_forward(make(logits, {N, E}), b, o.scores, o.experts, o.probs, opt);
  return o;
}

std::vector<int32_t> ints(const Tensor& t) {
  const int32_t* p = t.data<int32_t>();
  return std::vector<int32_t>(p, p + t.numel());
}

std::string describe(const MoeRouterOptions& opt, bool with_bias) {
  return std::string(opt.score == RouterScore::softmax ? "softmax" : "sigmoid") +
         " top_k=" + std::to_string(opt.top_k) + (opt.norm_topk_prob ? " norm" : "") + (with_bias ? " bias" : "");
}

// ---- forward -------------------------------------------------------------------------------------

TEST(MoeRouter, ForwardMatchesDoubleReference) {
  const int64_t N = 9, E = 10;
  const Vec logits = rand_vec(N * E, 300, -3, 3), bias = rand_vec(E, 301, -0.05, 0.05);
  for (RouterScore score : {RouterScore::softmax, RouterScore::sigmoid})
    for (bool norm : {false, true})
      for (int k : {1, 2, 4, static_cast<int>(E)})
        for (bool with_bias : {false, true}) {
          const MoeRouterOptions opt{.top_k = k, .score = score, .norm_topk_prob = norm};
          const Vec& b = with_bias ? bias : Vec{};
          const RouterRef want = router_ref(logits, b, N, E, opt);
          ASSERT_GT(want.min_gap, 1e-5) << "inputs too close to a tie for an fp32 op: " << describe(opt, with_bias);
          const RouterOut got = run_router(logits, b, N, E, opt);
          const std::string what = describe(opt, with_bias);
          EXPECT_EQ(ints(got.experts), want.experts) << what;
          EXPECT_CLOSE(values(got.scores), want.scores, kFwdTol) << what;
          EXPECT_CLOSE(values(got.probs), want.probs, kFwdTol) << what;
          if (norm) {
            for (int64_t n = 0; n < N; ++n) {
              double sum = 0;
              for (int64_t j = 0; j < k; ++j) sum += values(got.probs)[n * k + j];
              EXPECT_NEAR(sum, 1.0, 1e-6) << what << " row " << n;
            }
          }
        }
}

// top_k = E: every expert, in descending order of its score (a sort of the row).
TEST(MoeRouter, TopKEqualToEIsTheSortedRow) {
  const int64_t N = 3, E = 7;
  const Vec logits = rand_vec(N * E, 302, -2, 2);
  const RouterOut got = run_router(logits, {}, N, E, {.top_k = static_cast<int>(E), .score = RouterScore::sigmoid});
  const Vec probs = values(got.probs), scores = values(got.scores);
  const std::vector<int32_t> experts = ints(got.experts);
  for (int64_t n = 0; n < N; ++n) {
    std::vector<int32_t> seen(experts.begin() + n * E, experts.begin() + (n + 1) * E);
    std::sort(seen.begin(), seen.end());
    for (int64_t e = 0; e < E; ++e) EXPECT_EQ(seen[e], e) << "row " << n << " is not a permutation";
    for (int64_t j = 0; j < E; ++j) {
      EXPECT_EQ(probs[n * E + j], scores[n * E + experts[n * E + j]]);
      if (j > 0) {
        EXPECT_GE(probs[n * E + j - 1], probs[n * E + j]);
      }
    }
  }
}

// The bias chooses (a low-scoring expert with a large bias gets in, a high-scoring one with a negative bias
// stays out), but the weights are the unbiased scores.
TEST(MoeRouter, BiasChangesTheChoiceNotTheWeights) {
  const int64_t N = 1, E = 4;
  const Vec logits = {2.0, 1.0, -1.0, 0.5};
  const Vec bias = {-1.0, 0.0, 1.0, 0.0};  // keys (sigmoid): 0.88 - 1, 0.73, 0.27 + 1, 0.62
  for (bool norm : {false, true}) {
    const MoeRouterOptions opt{.top_k = 2, .score = RouterScore::sigmoid, .norm_topk_prob = norm};
    const RouterOut unbiased = run_router(logits, {}, N, E, opt), biased = run_router(logits, bias, N, E, opt);
    EXPECT_EQ(ints(unbiased.experts), (std::vector<int32_t>{0, 1}));
    EXPECT_EQ(ints(biased.experts), (std::vector<int32_t>{2, 1}));
    const Vec s = values(biased.scores);
    const double s2 = 1 / (1 + std::exp(1.0)), s1 = 1 / (1 + std::exp(-1.0));
    EXPECT_NEAR(s[2], s2, 1e-7);
    const Vec want = norm ? Vec{s2 / (s2 + s1), s1 / (s2 + s1)} : Vec{s2, s1};
    EXPECT_CLOSE(values(biased.probs), want, kFwdTol) << (norm ? "norm" : "");
    EXPECT_EQ(values(biased.scores), values(unbiased.scores)) << "the bias must not change the scores";
  }
  // softmax: scores 0.61, 0.22, 0.03, 0.14; keys 0.61 - 1, 0.22, 0.03 + 1, 0.14: expert 2, weighted 0.03
  const RouterOut got = run_router(logits, bias, N, E, {.top_k = 1, .score = RouterScore::softmax});
  EXPECT_EQ(ints(got.experts), (std::vector<int32_t>{2}));
  const RouterRef want = router_ref(logits, {}, N, E, {.top_k = 1, .score = RouterScore::softmax});
  EXPECT_CLOSE(values(got.probs), (Vec{want.scores[2]}), kFwdTol);
}

// Equal keys: the lower expert index first, for equal logits and for equal score + bias sums.
TEST(MoeRouter, TiesGoToTheLowerExpert) {
  for (RouterScore score : {RouterScore::softmax, RouterScore::sigmoid}) {
    const char* what = score == RouterScore::softmax ? "softmax" : "sigmoid";
    const int64_t E = 5;
    const Vec logits = {1.0, 3.0, 3.0, 0.0, 3.0,   // three equal maxima
                        0.0, 0.0, 0.0, 0.0, 0.0};  // all equal
    const RouterOut k2 = run_router(logits, {}, 2, E, {.top_k = 2, .score = score});
    EXPECT_EQ(ints(k2.experts), (std::vector<int32_t>{1, 2, 0, 1})) << what;
    const RouterOut k4 = run_router(logits, {}, 2, E, {.top_k = 4, .score = score});
    EXPECT_EQ(ints(k4.experts), (std::vector<int32_t>{1, 2, 4, 0, 0, 1, 2, 3})) << what;
  }
  // sigmoid(0) = 0.5 everywhere; the bias makes experts 1 and 3 tie above the rest (0.5 + 0.25 is exact).
  const Vec bias = {0.0, 0.25, 0.0, 0.25};
  const RouterOut got =
      run_router(Vec(4, 0.0), bias, 1, 4, {.top_k = 3, .score = RouterScore::sigmoid, .norm_topk_prob = true});
  EXPECT_EQ(ints(got.experts), (std::vector<int32_t>{1, 3, 0}));
  EXPECT_CLOSE(values(got.probs), (Vec{1.0 / 3, 1.0 / 3, 1.0 / 3}), 1e-7);
}

// ---- backward ------------------------------------------------------------------------------------

// dlogits against central differences of L = sum(probs * dprobs) through the double reference (the choice is
// piecewise constant: the inputs keep every row's k-th and (k+1)-th keys over 1e-4 apart, 40x the most a step
// of h = 1e-5 moves a key).
TEST(MoeRouter, BackwardMatchesFiniteDifferences) {
  const int64_t N = 5, E = 8;
  const Vec logits = rand_vec(N * E, 310, -3, 3), bias = rand_vec(E, 311, -0.05, 0.05);
  for (RouterScore score : {RouterScore::softmax, RouterScore::sigmoid})
    for (bool norm : {false, true})
      for (int k : {1, 3, static_cast<int>(E)})
        for (bool with_bias : {false, true}) {
          const MoeRouterOptions opt{.top_k = k, .score = score, .norm_topk_prob = norm};
          const std::string what = describe(opt, with_bias);
          const Vec& b = with_bias ? bias : Vec{};
          ASSERT_GT(router_ref(logits, b, N, E, opt).min_gap, 1e-4) << "inputs too close to a tie: " << what;
          const Vec dprobs = rand_vec(N * k, 312);
          const RouterOut fwd = run_router(logits, b, N, E, opt);
          Tensor dlogits = make(Vec(N * E, std::nan("")), {N, E});
          moe_router_backward(fwd.scores, fwd.experts, make(dprobs, {N, k}), dlogits, opt);
          auto f = [&](const Vec& l) { return router_ref(l, b, N, E, opt).probs; };
          EXPECT_CLOSE(values(dlogits), fd_grad(f, logits, dprobs), kGradTol) << what;
        }
}

// ---- argument errors -----------------------------------------------------------------------------

TEST(MoeRouter, ArgumentErrorsNameTheOpAndTheArgument) {
  auto f32 = [](Shape s) { return Tensor::zeros(std::move(s), DType::f32); };
  const int64_t N = 4, E = 6;
  Tensor logits = f32({N, E}), scores = f32({N, E}), probs = f32({N, 2}), dlogits = f32({N, E});
  Tensor experts = Tensor::zeros({N, 2}, DType::i32);
  Tensor bf16_ne = Tensor::zeros({N, E}, DType::bf16), wide = f32({N, 1025}), scores_short = f32({N, E - 1});
  Tensor experts_f32 = f32({N, 2}), probs3 = f32({N, 3});
  const MoeRouterOptions k2{.top_k = 2};
  expect_invalid([&] { moe_router_forward(logits, Tensor(), scores, experts, probs, {.top_k = 0}); },
                 "moe_router_forward: top_k: must lie in [1, E] = [1, 6], got 0");
  expect_invalid([&] { moe_router_forward(logits, Tensor(), scores, experts, probs, {.top_k = 7}); },
                 "moe_router_forward: top_k: must lie in [1, E] = [1, 6], got 7");
  expect_invalid([&] { moe_router_backward(scores, experts, probs, dlogits, {.top_k = 0}); },
                 "moe_router_backward: top_k: must lie in [1, E]");
  expect_invalid(
      [&] {
        moe_router_forward(Tensor::zeros({N, E}, DType::bf16), Tensor(), scores, experts, probs, k2);
      },
      "moe_router_forward: logits: expected dtype fp32, got bf16");
  expect_invalid(
      [&] {
        moe_router_forward(f32({N, E, 1}), Tensor(), scores, experts, probs, k2);
      },
      "moe_router_forward: logits: expected a 2-D tensor (N, E)");
  expect_invalid([&] { moe_router_forward(wide, Tensor(), wide, experts, probs, k2); },
                 "moe_router_forward: logits: the number of experts E must lie in [1, 1024], got 1025");
  expect_invalid([&] { moe_router_forward(logits, f32({E + 1}), scores, experts, probs, k2); },
                 "moe_router_forward: bias: expected shape [6], got [7]");
  expect_invalid([&] { moe_router_forward(logits, Tensor::zeros({E}, DType::bf16), scores, experts, probs, k2); },
                 "moe_router_forward: bias: expected dtype fp32, got bf16");
  expect_invalid([&] { moe_router_forward(logits, Tensor(), scores, experts_f32, probs, k2); },
                 "moe_router_forward: experts: expected dtype i32");
  expect_invalid([&] { moe_router_forward(logits, Tensor(), scores, experts, probs, {.top_k = 3}); },
                 "moe_router_forward: experts: expected shape [4, 3], got [4, 2]");
  expect_invalid([&] { moe_router_forward(logits, Tensor(), scores_short, experts, probs, k2); },
                 "moe_router_forward: scores: expected shape [4, 6]");
  expect_invalid([&] { moe_router_forward(logits, Tensor(), scores, experts, probs3, k2); },
                 "moe_router_forward: probs: expected shape [4, 2]");
  expect_invalid(
      [&] {
        moe_router_backward(scores, experts, f32({N, 3}), dlogits, k2);
      },
      "moe_router_backward: dprobs: expected shape [4, 2]");
  expect_invalid([&] { moe_router_backward(scores, experts, probs, bf16_ne, k2); },
                 "moe_router_backward: dlogits: expected dtype fp32, got bf16");
  expect_invalid(
      [&] {
        moe_router_backward(scores, f32({N, 2}), probs, dlogits, k2);
      },
      "moe_router_backward: experts: expected dtype i32");
}

}  // namespace
}  // namespace mt
