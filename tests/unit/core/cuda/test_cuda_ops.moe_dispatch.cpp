// test_cuda_ops.moe_dispatch.cpp: the mixture-of-experts token dispatch on the GPU against the CPU reference:
// the same rows and counts (a stable sort by expert), permute and unpermute exactly in every dtype (one
// rounding, no fused multiply-adds, on both), the probs gradient within fp32 rounding, dropped choices skipped,
// an expert id outside the range given no row, token dropping with a capacity (both policies, the same rows and
// counts, up to 40000 choices; decided over every token in a given order with rows for a part, as context
// parallelism dispatches). Outputs are poisoned first.
// One of the sources of test_cuda_ops (tests/CMakeLists.txt); skips where no GPU can run it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"
#include "tests/unit/core/cuda/cuda_op_checks.h"

namespace mt {
namespace {

using namespace mt::test;  // NOLINT(google-build-using-namespace)

std::vector<int32_t> host_ints(const Tensor& t) {
  const Tensor h = t.to(Device::cpu);
  const int32_t* p = h.data<int32_t>();
  return {p, p + h.numel()};
}

// Token n's k distinct experts: (n * 7 + j * 3 + seed) mod E rotated, distinct because 3 and E are coprime.
std::vector<int32_t> choices(int64_t N, int64_t k, int32_t E, int32_t seed) {
  std::vector<int32_t> out;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < k; ++j) out.push_back(static_cast<int32_t>((n * 7 + j * 3 + seed) % E));
  return out;
}

TEST_F(CudaOps, MoeDispatchMatchesCpu) {
  for (const auto& [N, k, E, C] : {std::tuple<int64_t, int64_t, int32_t, int64_t>{37, 2, 8, 64},
                                   {1, 1, 1, 5},
                                   {300, 4, 64, 257},
                                   {1000, 8, 256, 96}}) {
    const Both experts = both_ints(choices(N, k, E, 5), {N, k});
    Both row_of = both_ints(std::vector<int32_t>(static_cast<size_t>(N * k), -7), {N, k});
    Both counts = both_ints(std::vector<int32_t>(static_cast<size_t>(E), -7), {E});
    for (auto dev : kDevices) moe_dispatch_index(experts.*dev, row_of.*dev, counts.*dev);
    ASSERT_EQ(host_ints(row_of.gpu), host_ints(row_of.cpu)) << str("rows, N=", N, " k=", k, " E=", E);
    ASSERT_EQ(host_ints(counts.gpu), host_ints(counts.cpu)) << str("counts, E=", E);

    for (DType dt : kFloatTypes) {
      const std::string what = str("N=", N, " k=", k, " C=", C, " ", dtype_name(dt));
      const Both x = both(rand_vec(N * C, 1), {N, C}, dt), y = both(rand_vec(N * k * C, 2), {N * k, C}, dt);
      const Both probs = both(rand_vec(N * k, 3, 0.1, 1.0), {N, k}, DType::f32);
      const Both dout = both(rand_vec(N * C, 4), {N, C}, dt);
      Both xp = poisoned({N * k, C}, dt), xp1 = poisoned({N * k, C}, dt), out = poisoned({N, C}, dt),
           out1 = poisoned({N, C}, dt), dprobs = poisoned({N, k}, DType::f32);
      for (auto dev : kDevices) {
        moe_permute(x.*dev, row_of.*dev, &(probs.*dev), xp.*dev);
        moe_permute(x.*dev, row_of.*dev, nullptr, xp1.*dev);
        moe_unpermute(y.*dev, row_of.*dev, &(probs.*dev), out.*dev);
        moe_unpermute(y.*dev, row_of.*dev, nullptr, out1.*dev);
        moe_unpermute_backward_probs(dout.*dev, y.*dev, row_of.*dev, dprobs.*dev);
      }
      expect_exact(xp, "moe_permute " + what);
      expect_exact(xp1, "moe_permute without weights " + what);
      expect_exact(out, "moe_unpermute " + what);
      expect_exact(out1, "moe_unpermute without weights " + what);
      expect_match(dprobs, 1e-5, "moe_unpermute_backward_probs " + what);
    }
  }
}

TEST_F(CudaOps, MoeDispatchSkipsDroppedChoicesAndGivesBadExpertsNoRow) {
  const Both row_of = both_ints({1, -1, -1, 0}, {2, 2});
  const Both x = both({1, 2, 3, 4}, {2, 2}, DType::f32), probs = both({0.5, 0.25, 0.75, 2.0}, {2, 2}, DType::f32);
  Both xp = both({9, 9, 9, 9}, {2, 2}, DType::f32), out = poisoned({2, 2}, DType::f32),
       dprobs = poisoned({2, 2}, DType::f32);
  for (auto dev : kDevices) {
    moe_permute(x.*dev, row_of.*dev, &(probs.*dev), xp.*dev);
    moe_unpermute(xp.*dev, row_of.*dev, &(probs.*dev), out.*dev);
    moe_unpermute_backward_probs(x.*dev, xp.*dev, row_of.*dev, dprobs.*dev);
  }
  expect_exact(xp, "dropped choices, permute");
  expect_exact(out, "dropped choices, unpermute");
  expect_exact(dprobs, "dropped choices, probs gradient");
  // The CPU throws on an expert outside [0, E); the GPU gives that choice no row and no count.
  const Tensor bad = Tensor::from_ints(std::vector<int32_t>{0, 5, 1, 0}, {2, 2}).to(Device::cuda);
  Tensor rows = Tensor::empty({2, 2}, DType::i32, Device::cuda), counts = Tensor::empty({3}, DType::i32, Device::cuda);
  moe_dispatch_index(bad, rows, counts);
  EXPECT_EQ(host_ints(rows), (std::vector<int32_t>{0, -1, 2, 1}));
  EXPECT_EQ(host_ints(counts), (std::vector<int32_t>{2, 1, 0}));
}

// Skewed choices (the smaller of two draws, so low experts overflow) and weights on `levels` values (many ties)
// or continuous (levels 0), from a seed.
std::vector<int32_t> skewed_choices(int64_t n, int32_t E, uint32_t seed) {
  std::vector<int32_t> out;
  for (int64_t i = 0; i < n; ++i) {
    seed = seed * 1664525u + 1013904223u;
    const auto a = static_cast<int32_t>((seed >> 8) % static_cast<uint32_t>(E));
    seed = seed * 1664525u + 1013904223u;
    const auto b = static_cast<int32_t>((seed >> 8) % static_cast<uint32_t>(E));
    out.push_back(std::min(a, b));
  }
  return out;
}

Vec weights(int64_t n, uint32_t seed, int levels) {
  Vec w = rand_vec(n, seed, 0.0, 1.0);
  if (levels > 0)
    for (double& v : w) v = std::floor(v * levels) / levels;
  return w;
}

TEST_F(CudaOps, MoeDispatchWithCapacityMatchesCpu) {
  for (const auto& [N, k, E] :
       {std::tuple<int64_t, int64_t, int32_t>{5000, 8, 8}, {10000, 4, 128}, {37, 2, 8}, {1, 1, 1}, {300, 3, 64}}) {
    const int64_t n = N * k, mean = std::max<int64_t>(1, n / E);
    const Both experts = both_ints(skewed_choices(n, E, static_cast<uint32_t>(N + E)), {N, k});
    for (const int levels : {0, 4}) {
      const Both probs = both(weights(n, 17, levels), {N, k}, DType::f32);
      for (const int64_t capacity : {int64_t{1}, int64_t{7}, mean / 2 + 1, mean, mean * 5 / 4 + 1, n}) {
        for (const bool weighted : {false, true}) {
          Both row_of = both_ints(std::vector<int32_t>(static_cast<size_t>(n), -7), {N, k});
          Both counts = both_ints(std::vector<int32_t>(static_cast<size_t>(E), -7), {E});
          for (auto dev : kDevices)
            moe_dispatch_index(experts.*dev, row_of.*dev, counts.*dev,
                               {.capacity = capacity, .probs = weighted ? &(probs.*dev) : nullptr});
          const std::string what = str("N=", N, " k=", k, " E=", E, " capacity=", capacity,
                                       weighted ? " probs" : " position", " levels=", levels);
          ASSERT_EQ(host_ints(counts.gpu), host_ints(counts.cpu)) << "counts, " << what;
          ASSERT_EQ(host_ints(row_of.gpu), host_ints(row_of.cpu)) << "rows, " << what;
        }
      }
    }
  }
}

TEST_F(CudaOps, MoeDispatchOfAPartInAGivenOrderMatchesCpu) {
  for (const auto& [N, k, E, parts] :
       {std::tuple<int64_t, int64_t, int32_t, int64_t>{4096, 8, 8, 4}, {600, 2, 16, 2}, {37, 1, 4, 1}, {8, 2, 2, 8}}) {
    const int64_t n = N * k, P = N / parts, mean = std::max<int64_t>(1, n / E);
    const Both experts = both_ints(skewed_choices(n, E, static_cast<uint32_t>(N + 3)), {N, k});
    std::vector<int32_t> order(static_cast<size_t>(N));  // a permutation: 7919 is prime, coprime to these N
    for (int64_t g = 0; g < N; ++g) order[static_cast<size_t>(g)] = static_cast<int32_t>((g * 7919 + 3) % N);
    const Both ord = both_ints(order, {N});
    for (const int levels : {0, 2}) {
      const Both probs = both(weights(n, 23, levels), {N, k}, DType::f32);
      for (const int64_t capacity : {int64_t{1}, mean / 2 + 1, mean, n}) {
        for (const bool weighted : {false, true}) {
          for (int64_t part = 0; part < parts; ++part) {
            Both row_of = both_ints(std::vector<int32_t>(static_cast<size_t>(P * k), -7), {P, k});
            Both counts = both_ints(std::vector<int32_t>(static_cast<size_t>(E), -7), {E});
            for (auto dev : kDevices)
              moe_dispatch_index(experts.*dev, row_of.*dev, counts.*dev,
                                 {.capacity = capacity,
                                  .probs = weighted ? &(probs.*dev) : nullptr,
                                  .order = &(ord.*dev),
                                  .part_begin = part * P});
            const std::string what = str("N=", N, " k=", k, " E=", E, " capacity=", capacity,
                                         weighted ? " probs" : " position", " levels=", levels, " part ", part);
            ASSERT_EQ(host_ints(counts.gpu), host_ints(counts.cpu)) << "counts, " << what;
            ASSERT_EQ(host_ints(row_of.gpu), host_ints(row_of.cpu)) << "rows, " << what;
          }
        }
      }
    }
  }
}

TEST_F(CudaOps, MoeDispatchWithCapacityRanksNanAndSignedZerosAsTheCpu) {
  const int64_t N = 8;
  const Both experts = both_ints({0, 0, 0, 0, 0, 0, 0, 0}, {N, 1});
  const Both probs = both({std::nan(""), -0.0, 0.0, -INFINITY, INFINITY, 0.0, -1.0, std::nan("")}, {N, 1}, DType::f32);
  for (const int64_t capacity : {1, 2, 3, 4, 5, 6, 7}) {
    Both row_of = both_ints(std::vector<int32_t>(N, -7), {N, 1}), counts = both_ints({-7}, {1});
    for (auto dev : kDevices)
      moe_dispatch_index(experts.*dev, row_of.*dev, counts.*dev, {.capacity = capacity, .probs = &(probs.*dev)});
    ASSERT_EQ(host_ints(row_of.gpu), host_ints(row_of.cpu)) << "capacity " << capacity;
    ASSERT_EQ(host_ints(counts.gpu), host_ints(counts.cpu)) << "capacity " << capacity;
  }
}

}  // namespace
}  // namespace mt
