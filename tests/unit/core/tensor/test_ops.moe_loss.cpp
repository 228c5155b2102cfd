// test_ops.moe_loss.cpp: the CPU load-balancing losses' ops (moe_router_loss_stats, moe_router_loss_backward)
// against a double reference and central finite differences of the objective the stats define,
// sum_e g_e * score_sums_e + z * lse_sq_sum, for softmax and sigmoid scores; no term leaves dlogits untouched;
// no rows; the argument errors.
// One of the sources of test_ops (tests/CMakeLists.txt); the shared references are in op_reference.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"
#include "tests/unit/core/tensor/op_reference.h"

namespace mt {
namespace {

using namespace mt::test;  // Vec, rand_vec, make, values, the references of op_reference.h

const char* name_of(RouterScore score) { return score == RouterScore::softmax ? "softmax" : "sigmoid"; }

// ---- the statistics in double --------------------------------------------------------------------

// The router's scores of (N, E) logits: softmax over the row, or sigmoid per element.
Vec scores_ref(const Vec& logits, int64_t N, int64_t E, RouterScore score) {
  Vec s(N * E);
  for (int64_t n = 0; n < N; ++n) {
    const double* x = logits.data() + n * E;
    if (score == RouterScore::softmax) {
      const double m = *std::max_element(x, x + E);
      double sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += std::exp(x[e] - m);
      for (int64_t e = 0; e < E; ++e) s[n * E + e] = std::exp(x[e] - m) / sum;
    } else {
      for (int64_t e = 0; e < E; ++e) s[n * E + e] = 1 / (1 + std::exp(-x[e]));
    }
  }
  return s;
}

// (score_sums (E), lse_sq_sum) as one vector of E + 1: sum over rows of a_{n,e}, then of logsumexp(logits_n)^2.
Vec stats_ref(const Vec& logits, const Vec& scores, int64_t N, int64_t E, RouterScore score) {
  Vec out(E + 1, 0.0);
  for (int64_t n = 0; n < N; ++n) {
    const double* x = logits.data() + n * E;
    const double* s = scores.data() + n * E;
    double S = 0;
    for (int64_t e = 0; e < E; ++e) S += s[e];
    for (int64_t e = 0; e < E; ++e) out[e] += score == RouterScore::softmax ? s[e] : s[e] / (S + 1e-20);
    const double m = *std::max_element(x, x + E);
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += std::exp(x[e] - m);
    const double lse = m + std::log(sum);
    out[E] += lse * lse;
  }
  return out;
}

// The op's outputs (poisoned with NaN first, so both must be written) as one vector of E + 1.
Vec run_stats(const Vec& logits, const Vec& scores, int64_t N, int64_t E, RouterScore score) {
  Tensor sums = make(Vec(E, std::nan("")), {E}), lse_sq = make(Vec{std::nan("")}, {1});
  moe_router_loss_stats(make(logits, {N, E}), make(scores, {N, E}), score, sums, lse_sq);
  Vec out = values(sums);
  out.push_back(values(lse_sq)[0]);
  return out;
}

TEST(MoeRouterLoss, StatsMatchDoubleReference) {
  for (RouterScore score : {RouterScore::softmax, RouterScore::sigmoid})
    for (const auto& [N, E] : std::vector<std::pair<int64_t, int64_t>>{{13, 10}, {1, 1}, {40, 3}, {6, 64}}) {
      const Vec logits = rand_vec(N * E, 600 + static_cast<uint32_t>(E), -3, 3);
      const Vec scores = scores_ref(logits, N, E, score);
      EXPECT_CLOSE(run_stats(logits, scores, N, E, score), stats_ref(logits, scores, N, E, score), kFwdTol)
          << name_of(score) << " N=" << N << " E=" << E;
    }
  // Large logits: logsumexp subtracts the max (no overflow to inf).
  const Vec logits = {80.0, 79.0, -50.0, 100.0, 100.0, 99.5};
  const Vec scores = scores_ref(logits, 2, 3, RouterScore::softmax);
  EXPECT_CLOSE(run_stats(logits, scores, 2, 3, RouterScore::softmax),
               stats_ref(logits, scores, 2, 3, RouterScore::softmax), kFwdTol);
}

// sigmoid: each row's a_{n,.} sums to 1, so the score sums add up to N.
TEST(MoeRouterLoss, SigmoidScoreSumsAddUpToTheRows) {
  const int64_t N = 25, E = 7;
  const Vec logits = rand_vec(N * E, 610, -4, 4);
  const Vec got = run_stats(logits, scores_ref(logits, N, E, RouterScore::sigmoid), N, E, RouterScore::sigmoid);
  double total = 0;
  for (int64_t e = 0; e < E; ++e) total += got[e];
  EXPECT_NEAR(total, static_cast<double>(N), 1e-5);
}

// ---- backward ------------------------------------------------------------------------------------

// dlogits (accumulated onto a random start) against central differences of sum_e g_e score_sums_e + z lse_sq_sum
// through the double reference, the scores recomputed from the logits.
TEST(MoeRouterLoss, BackwardMatchesFiniteDifferences) {
  const int64_t N = 5, E = 8;
  const Vec logits = rand_vec(N * E, 620, -3, 3), g = rand_vec(E, 621), start = rand_vec(N * E, 622);
  for (RouterScore score : {RouterScore::softmax, RouterScore::sigmoid})
    for (const auto& [with_g, z] : std::vector<std::pair<bool, double>>{{true, 0.0}, {false, 0.7}, {true, -0.3}}) {
      const std::string what = std::string(name_of(score)) + (with_g ? " score_grad" : "") + " z=" + std::to_string(z);
      Tensor dlogits = make(start, {N, E});
      moe_router_loss_backward(make(logits, {N, E}), make(scores_ref(logits, N, E, score), {N, E}),
                               with_g ? make(g, {E}) : Tensor(), static_cast<float>(z), score, dlogits);
      Vec w = with_g ? g : Vec(E, 0.0);
      w.push_back(z);
      auto f = [&](const Vec& l) { return stats_ref(l, scores_ref(l, N, E, score), N, E, score); };
      EXPECT_CLOSE(diff(values(dlogits), start), fd_grad(f, logits, w), kGradTol) << what;
    }
}

// Neither term (score_grad undefined, z_grad 0): dlogits keeps its bytes, NaNs included.
TEST(MoeRouterLoss, NoTermLeavesDlogitsUnchanged) {
  const int64_t N = 4, E = 6;
  const Vec logits = rand_vec(N * E, 630, -3, 3);
  Vec start = rand_vec(N * E, 631);
  start[5] = std::nan("");
  for (RouterScore score : {RouterScore::softmax, RouterScore::sigmoid}) {
    Tensor dlogits = make(start, {N, E});
    const Tensor before = make(start, {N, E});
    moe_router_loss_backward(make(logits, {N, E}), make(scores_ref(logits, N, E, score), {N, E}), Tensor(), 0.f, score,
                             dlogits);
    EXPECT_EQ(std::memcmp(dlogits.raw(), before.raw(), before.nbytes()), 0) << name_of(score);
  }
}

// No rows: the sums are zero, and the backward has nothing to do.
TEST(MoeRouterLoss, NoRows) {
  const int64_t E = 5;
  for (RouterScore score : {RouterScore::softmax, RouterScore::sigmoid}) {
    EXPECT_EQ(run_stats({}, {}, 0, E, score), Vec(E + 1, 0.0)) << name_of(score);
    Tensor dlogits = Tensor::zeros({0, E}, DType::f32);
    moe_router_loss_backward(Tensor::zeros({0, E}, DType::f32), Tensor::zeros({0, E}, DType::f32),
                             make(rand_vec(E, 640), {E}), 0.5f, score, dlogits);
  }
}

// ---- argument errors -----------------------------------------------------------------------------

TEST(MoeRouterLoss, ArgumentErrorsNameTheOpAndTheArgument) {
  auto f32 = [](Shape s) { return Tensor::zeros(std::move(s), DType::f32); };
  const int64_t N = 4, E = 6;
  const RouterScore sm = RouterScore::softmax;
  Tensor logits = f32({N, E}), scores = f32({N, E}), sums = f32({E}), lse = f32({1}), g = f32({E});
  Tensor dlogits = f32({N, E}), wide = f32({N, 1025});
  Tensor sums_short = f32({E - 1}), lse2 = f32({2}), lse_bf16 = Tensor::zeros({1}, DType::bf16);
  Tensor dlogits_short = f32({N, E - 1}), dlogits_bf16 = Tensor::zeros({N, E}, DType::bf16);
  expect_invalid([&] { moe_router_loss_stats(wide, wide, sm, sums, lse); },
                 "moe_router_loss_stats: logits: the number of experts E must lie in [1, 1024], got 1025");
  expect_invalid(
      [&] {
        moe_router_loss_stats(f32({N, 0}), f32({N, 0}), sm, sums, lse);
      },
      "moe_router_loss_stats: logits: the number of experts E must lie in [1, 1024], got 0");
  expect_invalid(
      [&] {
        moe_router_loss_stats(Tensor::zeros({N, E}, DType::bf16), scores, sm, sums, lse);
      },
      "moe_router_loss_stats: logits: expected dtype fp32, got bf16");
  expect_invalid([&] { moe_router_loss_stats(f32({N * E}), scores, sm, sums, lse); },
                 "moe_router_loss_stats: logits: expected a 2-D tensor (N, E)");
  expect_invalid(
      [&] {
        moe_router_loss_stats(logits, f32({N, E + 1}), sm, sums, lse);
      },
      "moe_router_loss_stats: scores: expected shape [4, 6], got [4, 7]");
  expect_invalid(
      [&] {
        moe_router_loss_stats(logits, Tensor::zeros({N, E}, DType::f16), sm, sums, lse);
      },
      "moe_router_loss_stats: scores: expected dtype fp32, got fp16");
  expect_invalid([&] { moe_router_loss_stats(logits, scores, sm, sums_short, lse); },
                 "moe_router_loss_stats: score_sums: expected shape [6], got [5]");
  expect_invalid([&] { moe_router_loss_stats(logits, scores, sm, sums, lse2); },
                 "moe_router_loss_stats: lse_sq_sum: expected shape [1], got [2]");
  expect_invalid([&] { moe_router_loss_stats(logits, scores, sm, sums, lse_bf16); },
                 "moe_router_loss_stats: lse_sq_sum: expected dtype fp32, got bf16");
  expect_invalid([&] { moe_router_loss_stats(logits, scores, static_cast<RouterScore>(7), sums, lse); },
                 "moe_router_loss_stats: score: unknown RouterScore 7");
  expect_invalid([&] { moe_router_loss_backward(wide, wide, Tensor(), 1.f, sm, wide); },
                 "moe_router_loss_backward: logits: the number of experts E must lie in [1, 1024], got 1025");
  expect_invalid(
      [&] {
        moe_router_loss_backward(logits, f32({N + 1, E}), g, 1.f, sm, dlogits);
      },
      "moe_router_loss_backward: scores: expected shape [4, 6], got [5, 6]");
  expect_invalid([&] { moe_router_loss_backward(logits, scores, f32({E + 1}), 1.f, sm, dlogits); },
                 "moe_router_loss_backward: score_grad: expected shape [6], got [7]");
  expect_invalid([&] { moe_router_loss_backward(logits, scores, Tensor::zeros({E}, DType::bf16), 1.f, sm, dlogits); },
                 "moe_router_loss_backward: score_grad: expected dtype fp32, got bf16");
  expect_invalid([&] { moe_router_loss_backward(logits, scores, g, 1.f, sm, dlogits_short); },
                 "moe_router_loss_backward: dlogits: expected shape [4, 6], got [4, 5]");
  expect_invalid([&] { moe_router_loss_backward(logits, scores, g, 1.f, sm, dlogits_bf16); },
                 "moe_router_loss_backward: dlogits: expected dtype fp32, got bf16");
  expect_invalid([&] { moe_router_loss_backward(logits, scores, g, 1.f, static_cast<RouterScore>(7), dlogits); },
                 "moe_router_loss_backward: score: unknown RouterScore 7");
}

}  // namespace
}  // namespace mt
