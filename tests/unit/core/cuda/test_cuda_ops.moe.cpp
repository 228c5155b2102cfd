// test_cuda_ops.moe.cpp: the CUDA mixture-of-experts router against the CPU reference: the same experts (exactly, but
// for near-ties of keys within 1e-6), the scores, weights and logit gradients within 1e-6 (relative to the largest;
// the sigmoid's gradients 1e-5), for softmax and sigmoid scores, with and
// without normalised weights and the expert bias, top_k from 1 to E, E up to 1024, and rows of tied keys; the
// load-balancing losses' stats and gradient against the CPU (and bit for bit across two GPU runs).
// One of the sources of test_cuda_ops (tests/CMakeLists.txt); each test skips where no GPU can run it, and
// cuda_op_checks.h says how the GPU is compared with the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"
#include "tests/unit/core/cuda/cuda_op_checks.h"

namespace mt {
namespace {

using namespace mt::test;  // Vec, rand_vec, make, values, Both, CudaOps, the checks of cuda_op_checks.h

// The kernels compute what the CPU does operation for operation, expf aside (within 2 ulp): scores and weights within
// 1e-6 of the largest; the sigmoid's logit gradients, s (1 - s) times sums of such values, within 1e-5 (measured on
// an H200: up to 4.7e-6 at E = 1024).
constexpr double kRouterTol = 1e-6;
constexpr double kSigmoidGradTol = 1e-5;

// Each row's chosen experts, in the CPU's order. Where `near_ties_may_swap`, two experts whose keys (score + bias, on
// the CPU) lie within 1e-6 of each other may trade places: such near-ties fall either way with expf's last bits
// (seen on an H200 at E = 1024, top_k = E). Exact ties must still break alike (lower index first).
void expect_same_experts(const Both& experts, const Both& scores, const Vec& bias, int64_t N, int64_t K, int64_t E,
                         bool near_ties_may_swap, const std::string& what) {
  if (!near_ties_may_swap) return expect_exact(experts, "moe_router_forward experts" + what);
  const std::vector<float> g = experts.gpu.to_floats(), c = experts.cpu.to_floats(), sc = scores.cpu.to_floats();
  auto key = [&](int64_t n, float e) {
    const auto i = static_cast<int64_t>(e);
    return static_cast<double>(sc[static_cast<size_t>(n * E + i)]) +
           (bias.empty() ? 0.0 : bias[static_cast<size_t>(i)]);
  };
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const size_t i = static_cast<size_t>(n * K + k);
      if (g[i] == c[i]) continue;
      const bool in_range = g[i] >= 0 && g[i] < static_cast<float>(E);
      EXPECT_TRUE(in_range && std::abs(key(n, g[i]) - key(n, c[i])) <= 1e-6 * std::max(1.0, std::abs(key(n, c[i]))))
          << "moe_router_forward experts" << what << ": row " << n << " choice " << k << " is expert " << g[i]
          << " on the GPU, " << c[i] << " on the CPU, whose keys are not a near-tie";
    }
}

// Each row's weights by expert (0 where an expert is not chosen): the same whichever order near-ties took.
Vec weights_by_expert(const Tensor& experts, const Tensor& probs, int64_t N, int64_t K, int64_t E) {
  const std::vector<float> ids = experts.to_floats(), w = probs.to_floats();
  Vec out(static_cast<size_t>(N * E), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const auto e = static_cast<int64_t>(ids[static_cast<size_t>(n * K + k)]);
      if (e >= 0 && e < E) out[static_cast<size_t>(n * E + e)] = w[static_cast<size_t>(n * K + k)];
    }
  return out;
}

// Forward and backward on both devices from the same logits, bias (empty: none) and dprobs; outputs poisoned. The
// GPU's backward gets the CPU's forward outputs, so that it is compared on the same chosen experts.
void check_router(const Vec& logits, const Vec& bias, int64_t N, int64_t E, const MoeRouterOptions& opt, uint32_t seed,
                  const std::string& what, bool near_ties_may_swap = true) {
  const int64_t K = opt.top_k;
  const Both x = both(logits, {N, E}, DType::f32);
  const Both b = bias.empty() ? Both{} : both(bias, {E}, DType::f32);
  const Both dprobs = both(rand_vec(N * K, seed), {N, K}, DType::f32);
  Both scores = poisoned({N, E}, DType::f32), probs = poisoned({N, K}, DType::f32);
  Both experts = both_ints(std::vector<int32_t>(static_cast<size_t>(N * K), -1), {N, K});
  Both dlogits = poisoned({N, E}, DType::f32);
  for (auto d : kDevices) moe_router_forward(x.*d, b.*d, scores.*d, experts.*d, probs.*d, opt);
  expect_same_experts(experts, scores, bias, N, K, E, near_ties_may_swap, what);
  expect_match(scores, kRouterTol, "moe_router_forward scores" + what);
  EXPECT_LE(max_rel_err(weights_by_expert(experts.gpu, probs.gpu, N, K, E),
                        weights_by_expert(experts.cpu, probs.cpu, N, K, E)),
            kRouterTol)
      << "moe_router_forward probs" << what;
  moe_router_backward(scores.cpu, experts.cpu, dprobs.cpu, dlogits.cpu, opt);
  moe_router_backward(scores.cpu.to(Device::cuda), experts.cpu.to(Device::cuda), dprobs.gpu, dlogits.gpu, opt);
  expect_match(dlogits, opt.score == RouterScore::sigmoid ? kSigmoidGradTol : kRouterTol,
               "moe_router_backward dlogits" + what);
}

TEST_F(CudaOps, MoeRouterMatchesCpu) {
  const int64_t N = 37;
  uint32_t seed = 500;
  for (int64_t E : {8, 64, 160, 1024})
    for (int k : {1, 2, 8, static_cast<int>(E)})
      for (RouterScore score : {RouterScore::softmax, RouterScore::sigmoid})
        for (bool norm : {false, true})
          for (bool with_bias : {false, true}) {
            if (k > E) continue;
            const Vec logits = rand_vec(N * E, ++seed, -4, 4);
            const Vec bias = with_bias ? rand_vec(E, ++seed, -0.1, 0.1) : Vec{};
            const MoeRouterOptions opt{.top_k = k, .score = score, .norm_topk_prob = norm};
            check_router(logits, bias, N, E, opt, ++seed,
                         str(" E=", E, " top_k=", k, score == RouterScore::softmax ? " softmax" : " sigmoid",
                             norm ? " norm" : "", with_bias ? " bias" : ""));
          }
}

// Many short rows, a single expert, and a row length just past a multiple of the block.
TEST_F(CudaOps, MoeRouterOddShapes) {
  for (const auto& [N, E, k] : std::vector<std::tuple<int64_t, int64_t, int>>{{3000, 6, 2}, {5, 1, 1}, {7, 257, 9}}) {
    const Vec logits = rand_vec(N * E, 520 + static_cast<uint32_t>(E), -4, 4);
    for (RouterScore score : {RouterScore::softmax, RouterScore::sigmoid})
      check_router(logits, rand_vec(E, 530, -0.1, 0.1), N, E, {.top_k = k, .score = score, .norm_topk_prob = true}, 540,
                   str(" N=", N, " E=", E, " top_k=", k));
  }
}

// Rows of equal keys (equal logits; equal score + bias sums): the GPU breaks ties like the CPU, lower index first.
TEST_F(CudaOps, MoeRouterTiesMatchCpu) {
  const int64_t N = 4, E = 96;
  Vec logits(N * E, 0.0);
  for (int64_t e = 0; e < E; ++e) {
    logits[1 * E + e] = static_cast<double>(e % 3);  // 32 tied maxima
    logits[2 * E + e] = e % 5 == 0 ? 1.0 : -1.0;
  }
  Vec bias(E, 0.0);
  for (int64_t e = 0; e < E; e += 7) bias[e] = 0.25;  // ties among the biased experts of row 0
  for (RouterScore score : {RouterScore::softmax, RouterScore::sigmoid})
    for (int k : {1, 5, 40, static_cast<int>(E)})
      for (bool with_bias : {false, true})
        check_router(logits, with_bias ? bias : Vec{}, N, E, {.top_k = k, .score = score}, 550,
                     str(" ties top_k=", k, with_bias ? " bias" : ""), /*near_ties_may_swap=*/false);
}

// ---- load-balancing losses ----------------------------------------------------------------------

// The loss ops compute what the CPU does (sums in double on both, in different orders; expf and logf within 2 ulp).
constexpr double kLossStatsTol = 1e-6;  // relative to the largest
constexpr double kLossGradTol = 1e-6;   // absolute

// max_i |gpu_i - cpu_i|
double max_abs_diff(const Both& t) {
  const Vec g = values(t.gpu), c = values(t.cpu);
  if (g.size() != c.size()) return std::numeric_limits<double>::infinity();
  double err = 0.0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double d = std::abs(g[i] - c[i]);
    if (!(d <= err)) err = std::isnan(d) ? std::numeric_limits<double>::infinity() : d;
  }
  return err;
}

// Stats and backward (both terms) on both devices from the same logits and their router scores; the GPU twice, its
// two runs bit for bit equal.
void check_router_loss(int64_t N, int64_t E, RouterScore score, uint32_t seed) {
  const std::string what = str(" N=", N, " E=", E, score == RouterScore::softmax ? " softmax" : " sigmoid");
  const Vec logits = rand_vec(N * E, seed, -4, 4);
  Tensor scores_cpu = Tensor::empty({N, E}, DType::f32), experts = Tensor::empty({N, 1}, DType::i32);
  Tensor probs = Tensor::empty({N, 1}, DType::f32);
  moe_router_forward(make(logits, {N, E}), Tensor(), scores_cpu, experts, probs, {.top_k = 1, .score = score});
  const Both x = both(logits, {N, E}, DType::f32);
  const Both s{scores_cpu, scores_cpu.to(Device::cuda)};
  const Both g = both(rand_vec(E, seed + 1), {E}, DType::f32);
  const Vec start = rand_vec(N * E, seed + 2);
  const float z = 0.05f;
  std::vector<Tensor> runs[3];  // the GPU's score_sums, lse_sq_sum, dlogits of each run
  for (int run = 0; run < 2; ++run) {
    Both sums = poisoned({E}, DType::f32), lse = poisoned({1}, DType::f32);
    Both dlogits = both(start, {N, E}, DType::f32);
    for (auto d : kDevices) {
      moe_router_loss_stats(x.*d, s.*d, score, sums.*d, lse.*d);
      moe_router_loss_backward(x.*d, s.*d, g.*d, z, score, dlogits.*d);
    }
    expect_match(sums, kLossStatsTol, "moe_router_loss_stats score_sums" + what);
    expect_match(lse, kLossStatsTol, "moe_router_loss_stats lse_sq_sum" + what);
    EXPECT_LE(max_abs_diff(dlogits), kLossGradTol) << "moe_router_loss_backward dlogits" << what;
    runs[0].push_back(sums.gpu);
    runs[1].push_back(lse.gpu);
    runs[2].push_back(dlogits.gpu);
  }
  for (const auto& r : runs) EXPECT_TRUE(bytes_of(r[0]) == bytes_of(r[1])) << "two GPU runs differ" << what;
}

TEST_F(CudaOps, MoeRouterLossMatchesCpu) {
  uint32_t seed = 700;
  for (const auto& [N, E] :
       std::vector<std::pair<int64_t, int64_t>>{{37, 8}, {1000, 64}, {300, 1024}, {3000, 6}, {5, 1}, {7, 257}, {1, 33}})
    for (RouterScore score : {RouterScore::softmax, RouterScore::sigmoid}) check_router_loss(N, E, score, seed += 3);
}

// One term at a time (score_grad alone, z alone), neither (dlogits untouched), and no rows (zero sums).
TEST_F(CudaOps, MoeRouterLossTermsAndNoRows) {
  const int64_t N = 50, E = 40;
  const Both x = both(rand_vec(N * E, 720, -4, 4), {N, E}, DType::f32);
  const Both s = both(rand_vec(N * E, 721, 0, 1), {N, E}, DType::f32);
  const Both g = both(rand_vec(E, 722), {E}, DType::f32);
  const Vec start = rand_vec(N * E, 723);
  for (RouterScore score : {RouterScore::softmax, RouterScore::sigmoid}) {
    const std::string what = score == RouterScore::softmax ? " softmax" : " sigmoid";
    for (const auto& [with_g, z] : std::vector<std::pair<bool, float>>{{true, 0.f}, {false, 0.2f}, {false, 0.f}}) {
      Both dlogits = both(start, {N, E}, DType::f32);
      for (auto d : kDevices) moe_router_loss_backward(x.*d, s.*d, with_g ? g.*d : Tensor(), z, score, dlogits.*d);
      EXPECT_LE(max_abs_diff(dlogits), kLossGradTol)
          << "dlogits" << what << (with_g ? " score_grad" : "") << " z=" << z;
      if (!with_g && z == 0.f) expect_exact(dlogits, "dlogits untouched" + what);
    }
    Both sums = poisoned({E}, DType::f32), lse = poisoned({1}, DType::f32);
    const Both none = both({}, {0, E}, DType::f32);
    Both dnone = both({}, {0, E}, DType::f32);
    for (auto d : kDevices) {
      moe_router_loss_stats(none.*d, none.*d, score, sums.*d, lse.*d);
      moe_router_loss_backward(none.*d, none.*d, g.*d, 0.5f, score, dnone.*d);
    }
    EXPECT_EQ(values(sums.gpu), Vec(E, 0.0)) << what;
    EXPECT_EQ(values(lse.gpu), Vec{0.0}) << what;
  }
}

}  // namespace
}  // namespace mt
