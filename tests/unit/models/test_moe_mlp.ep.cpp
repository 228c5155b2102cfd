// test_moe_mlp.ep.cpp: expert parallelism in the MoE MLP (models/moe_mlp.h): EP ranks (threads over Gloo), each with
// its own tokens and a share of the experts, compute what one rank holding every expert computes for those tokens:
// the output, the input gradient and the router's gradient per rank, and each expert's gradient summed over the
// ranks' tokens; experts no token chose and ranks that receive nothing included. And context parallelism with a
// capacity factor: context ranks holding chunks of the microbatch drop what one rank drops of the whole of it.
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "core/tensor/ops.h"
#include "models/moe_mlp.h"
#include "parallel/layers/context_parallel.h"
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

// Context rank r's rows of a microbatch x (B T, C): its chunks r and 2 cp - 1 - r of each sample, in that order.
Tensor chunk_rows(const Tensor& x, int64_t B, int cp, int r) {
  const int64_t C = x.dim(1), T = x.dim(0) / B, L = T / (2 * cp);
  const std::vector<float> v = x.to_floats();
  std::vector<float> out;
  for (int64_t b = 0; b < B; ++b)
    for (const int64_t chunk : {static_cast<int64_t>(r), 2 * static_cast<int64_t>(cp) - 1 - r})
      out.insert(out.end(), v.begin() + (b * T + chunk * L) * C, v.begin() + (b * T + (chunk + 1) * L) * C);
  return Tensor::from_floats(out, {static_cast<int64_t>(out.size()) / C, C});
}

// The gathered chunks' one-rank order: cp 2, 2 samples of 8 tokens (chunks of 2): rank 0 holds positions 0-1 and
// 6-7 of each sample, rank 1 positions 2-5.
TEST(MoeMlpContextParallel, TheTokenOrderOfTheGatheredChunks) {
  const Tensor order = context_token_order(ContextParallel{.rank = 1, .size = 2}, 2, 4);
  const int32_t* o = order.data<int32_t>();
  EXPECT_EQ(std::vector<int32_t>(o, o + order.numel()),
            (std::vector<int32_t>{0, 1, 6, 7, 8, 9, 14, 15, 2, 3, 4, 5, 10, 11, 12, 13}));
}

// With a capacity factor, CP ranks (each its chunks of B samples) keep the choices one rank keeps of the whole
// microbatch: the same outputs and input gradients on their rows, drops summing to one rank's, and the router's
// and experts' gradients summing to one rank's.
void check_context_capacity(int cp, int64_t B, int64_t T, double factor) {
  ModelConfig m = testing_util::tiny_llama(2, false, 10000);
  m.moe.num_experts = 4;
  m.moe.top_k = 2;
  m.moe.ffn_hidden_size = 8;
  m.moe.capacity_factor = factor;
  m.init_std = 0.3f;
  const int64_t C = m.hidden_size;
  const Tensor x = rows(B * T, C, 31), dout = rows(B * T, C, 32);
  MoeMlp one(m, "layers.0.mlp", DType::f32, 0.2f, 3);
  MoeMlp::Saved s;
  const Tensor out = one.forward(x, s, {.samples = B, .record = true});
  const Tensor dx = one.backward(dout, s, {.samples = B});
  const int64_t dropped = one.take_load().dropped;
  ASSERT_GT(dropped, 0) << "capacity factor " << factor << " drops nothing";
  std::vector<Tensor> router(static_cast<size_t>(cp)), fc1(static_cast<size_t>(cp * 4));
  std::vector<int64_t> drops(static_cast<size_t>(cp));
  auto store = make_hash_store();
  run_ranks(cp, [&](int r) {
    auto comm = join_gloo(store, "cp", first_ranks(cp), r);
    MoeMlp moe(m, "layers.0.mlp", DType::f32, 0.2f, 3, Device::cpu, {}, {},
               ContextParallel{.comm = comm.get(), .rank = r, .size = cp});
    MoeMlp::Saved sr;
    const Tensor o = moe.forward(chunk_rows(x, B, cp, r), sr, {.samples = B, .record = true});
    const Tensor d = moe.backward(chunk_rows(dout, B, cp, r), sr, {.samples = B});
    EXPECT_LE(rel_diff(o, chunk_rows(out, B, cp, r)), 1e-6) << "rank " << r << " out";
    EXPECT_LE(rel_diff(d, chunk_rows(dx, B, cp, r)), 1e-6) << "rank " << r << " dx";
    drops[static_cast<size_t>(r)] = moe.take_load().dropped;
    router[static_cast<size_t>(r)] = moe.router().grad.to(Device::cpu);
    for (int64_t e = 0; e < 4; ++e) fc1[static_cast<size_t>(r * 4 + e)] = moe.fc1(e).grad.to(Device::cpu);
  });
  int64_t summed = 0;
  for (int64_t d : drops) summed += d;
  EXPECT_EQ(summed, dropped);
  auto sum = [&](const std::vector<Tensor>& ts, int64_t stride, int64_t at) {
    Tensor acc = Tensor::zeros(ts[static_cast<size_t>(at)].shape(), DType::f32);
    for (int r = 0; r < cp; ++r) add(acc, ts[static_cast<size_t>(r * stride + at)], acc);
    return acc;
  };
  EXPECT_LE(rel_diff(sum(router, 1, 0), one.router().grad), 1e-5) << "router";
  for (int64_t e = 0; e < 4; ++e) EXPECT_LE(rel_diff(sum(fc1, 4, e), one.fc1(e).grad), 1e-5) << "expert " << e;
}

TEST(MoeMlpContextParallel, ContextRanksDropWhatOneRankDropsOfTheWholeMicrobatch) {
  check_context_capacity(2, 2, 8, 1.0);
  check_context_capacity(4, 3, 16, 0.75);
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
