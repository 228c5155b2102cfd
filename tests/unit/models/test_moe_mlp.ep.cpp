// test_moe_mlp.ep.cpp: expert parallelism in the MoE MLP (models/moe_mlp.h): EP ranks (threads over Gloo), each with
// its own tokens and a share of the experts, compute what one rank holding every expert computes for those tokens:
// the output, the input gradient and the router's gradient per rank, and each expert's gradient summed over the
// ranks' tokens; experts no token chose and ranks that receive nothing included.
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "core/tensor/ops.h"
#include "models/moe_mlp.h"
#include "parallel/store/store.h"
#include "parallel/comm/thread_ranks.h"
#include "tests/unit/tiny_models.h"

namespace mt {
namespace {

Tensor rows(int64_t n, int64_t C, uint32_t seed) {
  std::vector<float> v(static_cast<size_t>(n * C));
  for (auto& x : v) {
    seed = seed * 1664525u + 1013904223u;
    x = static_cast<float>(seed >> 8) / static_cast<float>(1u << 24) * 2.f - 1.f;
  }
  return Tensor::from_floats(v, {n, C});
}

double rel_diff(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_floats(), y = b.to_floats();
  EXPECT_EQ(x.size(), y.size());
  double err = 0, scale = 1e-12;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    err = std::max(err, std::abs(static_cast<double>(x[i]) - y[i]));
    scale = std::max(scale, std::abs(static_cast<double>(y[i])));
  }
  return err / scale;
}

// EP ranks `P` of E experts, top-k; rank r holds n[r] tokens (0 allowed).
void check_expert_parallel(Arch arch, int64_t E, int64_t k, int P, const std::vector<int64_t>& n) {
  ModelConfig m = arch == Arch::llama ? testing_util::tiny_llama(2, false, 10000) : testing_util::tiny_gpt(true);
  m.moe.num_experts = E;
  m.moe.top_k = k;
  m.moe.ffn_hidden_size = 8;
  m.moe.aux_loss_coeff = 0.1;  // per rank, on its own tokens: the same on one rank
  m.init_std = 0.3f;
  const int64_t C = m.hidden_size;
  // The reference: one rank with every expert, each EP rank's tokens in turn (gradients accumulate).
  MoeMlp one(m, "layers.0.mlp", DType::f32, 0.2f, 3);
  std::vector<Tensor> out(static_cast<size_t>(P)), dx(static_cast<size_t>(P)), router(static_cast<size_t>(P));
  for (int r = 0; r < P; ++r) {
    fill_(one.router().grad, 0.f);
    MoeMlp::Saved s;
    out[static_cast<size_t>(r)] = one.forward(rows(n[static_cast<size_t>(r)], C, 10 + r), s);
    dx[static_cast<size_t>(r)] = one.backward(rows(n[static_cast<size_t>(r)], C, 20 + r), s, {.dloss = 0.5f});
    router[static_cast<size_t>(r)] = one.router().grad.to(Device::cpu);
  }
  auto store = make_hash_store();
  run_ranks(P, [&](int r) {
    auto comm = join_gloo(store, "ep", first_ranks(P), r);
    MoeMlp moe(m, "layers.0.mlp", DType::f32, 0.2f, 3, Device::cpu, {},
               ExpertParallel{.comm = comm.get(), .rank = r, .size = P});
    std::vector<Parameter*> params = moe.parameters();
    ASSERT_EQ(static_cast<int64_t>(params.size()), 1 + 2 * E / P);
    EXPECT_EQ(params[1]->name, "layers.0.mlp.experts." + std::to_string(r * E / P) + ".fc1.weight");
    MoeMlp::Saved s;
    const Tensor o = moe.forward(rows(n[static_cast<size_t>(r)], C, 10 + r), s);
    const Tensor d = moe.backward(rows(n[static_cast<size_t>(r)], C, 20 + r), s, {.dloss = 0.5f});
    EXPECT_LE(rel_diff(o, out[static_cast<size_t>(r)]), 1e-6) << "rank " << r << " out";
    EXPECT_LE(rel_diff(d, dx[static_cast<size_t>(r)]), 1e-6) << "rank " << r << " dx";
    EXPECT_LE(rel_diff(moe.router().grad, router[static_cast<size_t>(r)]), 1e-6) << "rank " << r << " router";
    for (int64_t e = r * E / P; e < (r + 1) * E / P; ++e) {
      EXPECT_EQ(moe.fc1(e).name, one.fc1(e).name);
      EXPECT_LE(rel_diff(moe.fc1(e).value, one.fc1(e).value), 0.0) << "the same initial values";
      EXPECT_LE(rel_diff(moe.fc1(e).grad, one.fc1(e).grad), 1e-5) << "rank " << r << " expert " << e << " fc1";
      EXPECT_LE(rel_diff(moe.fc2(e).grad, one.fc2(e).grad), 1e-5) << "rank " << r << " expert " << e << " fc2";
    }
  });
}

TEST(MoeMlpExpertParallel, TwoRanksComputeWhatOneRankDoes) {
  check_expert_parallel(Arch::gpt, 4, 2, 2, {7, 5});
  check_expert_parallel(Arch::llama, 8, 2, 2, {6, 9});
}

TEST(MoeMlpExpertParallel, FourRanksWithOneExpertEachAndARankWithoutTokens) {
  check_expert_parallel(Arch::gpt, 4, 1, 4, {5, 0, 3, 8});
  check_expert_parallel(Arch::llama, 8, 3, 4, {4, 4, 1, 6});
}

TEST(MoeMlpExpertParallel, ASizeThatDoesNotDivideTheExpertsIsRefused) {
  ModelConfig m = testing_util::tiny_gpt(true);
  m.moe.num_experts = 6;
  m.moe.top_k = 2;
  m.moe.ffn_hidden_size = 8;
  EXPECT_THROW(MoeMlp(m, "mlp", DType::f32, 0.1f, 1, Device::cpu, {}, ExpertParallel{.rank = 0, .size = 4}),
               std::invalid_argument);
}

}  // namespace
}  // namespace mt
