// test_ops.gemm_grouped.cpp: the CPU grouped GEMM equals one gemm per group, bit for bit (shapes differing per
// group, every transpose, alpha and beta, half inputs with half or fp32 outputs, empty groups, outputs that are
// row slices of one tensor), and its argument errors name the group.
// One of the sources of test_ops (tests/CMakeLists.txt); the shared helpers are in op_reference.h.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"
#include "tests/unit/core/tensor/op_reference.h"

namespace mt {
namespace {

using namespace mt::test;  // Vec, rand_vec, make, values, expect_invalid

struct GroupShape {
  int64_t M, K, N;
};

// Shapes that differ per group, with an empty M, an empty N and an empty K among them.
const std::vector<GroupShape> kGroups = {{5, 7, 3}, {0, 7, 3}, {9, 2, 11}, {4, 0, 6}, {1, 1, 1}, {6, 13, 0}, {3, 8, 5}};

std::vector<uint32_t> bits_of(const Tensor& t) {
  std::vector<uint32_t> r;
  for (float f : t.to_floats()) r.push_back(std::bit_cast<uint32_t>(f));
  return r;
}

class GemmGrouped : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(GemmGrouped, EqualsOneGemmPerGroupBitForBit) {
  const auto [ta, tb] = GetParam();
  uint32_t seed = 1;
  for (DType dt : {DType::f32, DType::bf16, DType::f16})
    for (DType out_dt : {dt, DType::f32})
      for (const auto& [alpha, beta] : {std::pair{1.f, 0.f}, std::pair{0.5f, 0.75f}, std::pair{-1.25f, 1.f}}) {
        std::vector<Tensor> a, b, c, want;
        for (const GroupShape& s : kGroups) {
          a.push_back(make(rand_vec(s.M * s.K, ++seed), ta ? Shape{s.K, s.M} : Shape{s.M, s.K}, dt));
          b.push_back(make(rand_vec(s.K * s.N, ++seed), tb ? Shape{s.N, s.K} : Shape{s.K, s.N}, dt));
          c.push_back(make(rand_vec(s.M * s.N, ++seed), {s.M, s.N}, out_dt));
          want.push_back(make(values(c.back()), {s.M, s.N}, out_dt));
        }
        const GemmOptions opt{.trans_a = ta, .trans_b = tb, .alpha = alpha, .beta = beta};
        for (size_t g = 0; g < kGroups.size(); ++g) gemm(a[g], b[g], want[g], opt);
        gemm_grouped(a, b, c, opt);
        for (size_t g = 0; g < kGroups.size(); ++g)
          EXPECT_EQ(bits_of(c[g]), bits_of(want[g]))
              << "group " << g << " " << dtype_name(dt) << " -> " << dtype_name(out_dt) << " trans_a=" << ta
              << " trans_b=" << tb << " alpha=" << alpha << " beta=" << beta;
      }
}

INSTANTIATE_TEST_SUITE_P(AllTransposes, GemmGrouped, ::testing::Combine(::testing::Bool(), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "At" : "A") +
                                  (std::get<1>(info.param) ? "Bt" : "B");
                         });

// MoE's use: the groups' a and c are consecutive row slices of one tensor (zero-row experts included), the output
// written through the views; rows outside every group stay as they were.
TEST(GemmGroupedViews, WritesThroughRowSlicesOfOneTensor) {
  const int64_t C = 6, F = 5;
  const std::vector<int64_t> rows = {3, 0, 4, 1};
  const int64_t R = 9;  // the last row belongs to no group
  const Tensor x = make(rand_vec(R * C, 11), {R, C}, DType::bf16);
  Tensor y = make(Vec(static_cast<size_t>(R * F), 7.0), {R, F}, DType::bf16);
  Tensor want = make(values(y), {R, F}, DType::bf16);
  std::vector<Tensor> xs, ws, ys;
  int64_t row = 0;
  for (size_t l = 0; l < rows.size(); ++l) {
    const Tensor w = make(rand_vec(F * C, 20 + static_cast<uint32_t>(l)), {F, C}, DType::bf16);
    Tensor ws_want = want.slice(row, row + rows[l]);
    gemm(x.slice(row, row + rows[l]), w, ws_want, GemmOptions{.trans_b = true});
    xs.push_back(x.slice(row, row + rows[l]));
    ws.push_back(w);
    ys.push_back(y.slice(row, row + rows[l]));
    row += rows[l];
  }
  gemm_grouped(xs, ws, ys, GemmOptions{.trans_b = true});
  EXPECT_EQ(bits_of(y), bits_of(want));
  EXPECT_EQ(y.to_floats().back(), 7.f);
}

TEST(GemmGroupedViews, NoGroupsIsANoOp) {
  std::vector<Tensor> none;
  gemm_grouped(none, none, none, {});
}

TEST(GemmGroupedErrors, NameTheOpTheArgumentAndTheGroup) {
  auto t = [](Shape s, DType dt = DType::f32) { return Tensor::zeros(std::move(s), dt); };
  auto run = [](std::vector<Tensor> a, std::vector<Tensor> b, std::vector<Tensor> c, GemmOptions opt = {}) {
    gemm_grouped(a, b, c, opt);
  };
  expect_invalid([&] { run({t({2, 3})}, {t({3, 4})}, {}); }, "gemm_grouped: a, b and c must hold one tensor per group");
  expect_invalid(
      [&] {
        run({t({2, 3}), t({2, 3})}, {t({3, 4}), t({4, 4})}, {t({2, 4}), t({2, 4})});
      },
      "gemm_grouped: group 1: inner dimensions differ");
  expect_invalid(
      [&] {
        run({t({2, 3}), t({2, 3})}, {t({3, 4}), t({3, 4})}, {t({2, 4}), t({2, 5})});
      },
      "gemm_grouped: c[1]");
  expect_invalid(
      [&] {
        run({t({2, 3}), t({2, 3}, DType::bf16)}, {t({3, 4}), t({3, 4})}, {t({2, 4}), t({2, 4})});
      },
      "gemm_grouped: a[1]: expected dtype fp32");
  expect_invalid(
      [&] {
        run({t({2, 3}, DType::bf16)}, {t({3, 4}, DType::f16)}, {t({2, 4})});
      },
      "gemm_grouped: b[0]: expected dtype");
  expect_invalid(
      [&] {
        run({t({2, 3}, DType::bf16), t({2, 3}, DType::bf16)}, {t({3, 4}, DType::bf16), t({3, 4}, DType::bf16)},
            {t({2, 4}), t({2, 4}, DType::bf16)});
      },
      "gemm_grouped: c[1]: expected dtype");
  expect_invalid(
      [&] {
        run({t({2, 3}), t({2})}, {t({3, 4}), t({3, 4})}, {t({2, 4}), t({2, 4})});
      },
      "gemm_grouped: a[1]: expected a 2-D tensor");
  const Tensor bias = t({4});
  expect_invalid(
      [&] {
        run({t({2, 3})}, {t({3, 4})}, {t({2, 4})}, {.epilogue = Epilogue::bias, .bias = &bias});
      },
      "gemm_grouped: epilogue bias is not supported");
  expect_invalid(
      [&] {
        run({t({2, 3})}, {t({3, 4})}, {t({2, 4})}, {.bias = &bias});
      },
      "gemm_grouped: opt.bias, opt.aux and opt.dbias must be null");
}

}  // namespace
}  // namespace mt
