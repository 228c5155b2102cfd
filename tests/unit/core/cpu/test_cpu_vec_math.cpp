// test_cpu_vec_math.cpp: the CPU backend's SIMD building blocks (core/cpu/vec_math.h, core/cpu/dropout_mask.h).
//  * exp_f32 within 2 ulp of the double exp over its range, 0 below, +inf above, NaN kept.
//  * Position invariance: an element's value does not depend on where it sits in an array (SIMD lane, scalar
//    tail, array length), which is what keeps tensor- and sequence-parallel shards equal to one rank.
//  * The sigmoid-form GELU and its derivative against the double tanh formula.
//  * dropout_keep_scales equals rng.h's dropout_row_scales bit for bit, at any column offset and length.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/cpu/dropout_mask.h"
#include "core/cpu/vec_math.h"
#include "core/base/rng.h"

namespace mt::cpu {
namespace {

int64_t ulp_distance(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  return std::abs(static_cast<int64_t>(ia) - ib);
}

TEST(VecMath, ExpIsWithinTwoUlpAndHandlesTheEdges) {
  int64_t worst = 0;
  for (float x = -87.3f; x < 88.7f; x += 0.0137f)
    worst = std::max(worst, ulp_distance(exp_f32(x), static_cast<float>(std::exp(static_cast<double>(x)))));
  EXPECT_LE(worst, 2);
  EXPECT_EQ(exp_f32(0.f), 1.f);
  EXPECT_EQ(exp_f32(-100.f), 0.f);
  EXPECT_EQ(exp_f32(-std::numeric_limits<float>::infinity()), 0.f);
  EXPECT_EQ(exp_f32(100.f), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(exp_f32(std::numeric_limits<float>::quiet_NaN())));
}

TEST(VecMath, AnElementsValueDoesNotDependOnItsPositionOrTheArrayLength) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-30.f, 30.f);
  std::vector<float> x(203);
  for (float& v : x) v = dist(rng);
  std::vector<float> whole(x.size()), g_whole(x.size()), d_whole(x.size(), 1.5f);
  exp_shifted(x.data(), static_cast<int64_t>(x.size()), 0.75f, whole.data());
  gelu_tanh(x.data(), static_cast<int64_t>(x.size()), g_whole.data());
  gelu_tanh_backward(x.data(), static_cast<int64_t>(x.size()), d_whole.data());
  for (size_t start : {0, 1, 3, 7, 8, 17, 100}) {
    for (size_t len : {1, 2, 5, 8, 9, 31, 64, 100}) {
      if (start + len > x.size()) continue;
      std::vector<float> part(len), g_part(len), d_part(len, 1.5f);
      exp_shifted(x.data() + start, static_cast<int64_t>(len), 0.75f, part.data());
      gelu_tanh(x.data() + start, static_cast<int64_t>(len), g_part.data());
      gelu_tanh_backward(x.data() + start, static_cast<int64_t>(len), d_part.data());
      for (size_t i = 0; i < len; ++i) {
        ASSERT_EQ(part[i], whole[start + i]) << "exp at " << start + i << " in [" << start << ", +" << len << ")";
        ASSERT_EQ(part[i], exp_f32(x[start + i] - 0.75f));
        ASSERT_EQ(g_part[i], g_whole[start + i]) << "gelu at " << start + i;
        ASSERT_EQ(d_part[i], d_whole[start + i]) << "gelu' at " << start + i;
      }
    }
  }
}

TEST(VecMath, GeluAndItsDerivativeMatchTheDoubleTanhFormula) {
  constexpr double k = 0.7978845608028654, c = 0.044715;
  double err = 0, derr = 0;
  for (float z = -30.f; z <= 30.f; z += 0.001f) {
    const double zd = z, th = std::tanh(k * (zd + c * zd * zd * zd));
    const double want = 0.5 * zd * (1 + th);
    const double dwant = 0.5 * (1 + th) + 0.5 * zd * (1 - th * th) * k * (1 + 3 * c * zd * zd);
    float got, dgot = 1.f;
    gelu_tanh(&z, 1, &got);
    gelu_tanh_backward(&z, 1, &dgot);
    ASSERT_TRUE(std::isfinite(got) && std::isfinite(dgot)) << "z = " << z;
    err = std::max(err, std::abs(got - want) / std::max(std::abs(want), 1e-3));
    derr = std::max(derr, std::abs(dgot - dwant) / std::max(std::abs(dwant), 1e-2));
  }
  EXPECT_LT(err, 1e-5);   // seen: 1.1e-6 (the float tanh form it replaced: 7.7e-5)
  EXPECT_LT(derr, 1e-4);  // seen: 6e-6 (before: 5.5e-5)
}

TEST(VecMath, RowReductionsMatchSequentialDoubleSums) {
  std::mt19937 rng(6);
  std::uniform_real_distribution<float> dist(-5.f, 5.f);
  for (int64_t n : {1, 7, 8, 9, 64, 257}) {
    std::vector<float> a(n), b(n);
    for (int64_t i = 0; i < n; ++i) a[i] = dist(rng), b[i] = dist(rng);
    double se = 0, dot = 0;
    float m = a[0];
    for (int64_t i = 0; i < n; ++i) {
      se += std::exp(static_cast<double>(a[i]) - 1.0);
      dot += static_cast<double>(a[i]) * b[i];
      m = std::max(m, a[i]);
    }
    EXPECT_EQ(row_max(a.data(), n), m);
    EXPECT_NEAR(sum_exp_shifted(a.data(), n, 1.f), se, 1e-6 * se);
    EXPECT_NEAR(dot_f64(a.data(), b.data(), n), dot, 1e-12 * n * 25);
  }
}

TEST(DropoutMask, KeepScalesEqualRngRowScalesAtAnyOffsetAndLength) {
  std::vector<float> want(300), got(300);
  for (uint64_t col0 : {0ull, 1ull, 2ull, 3ull, 5ull, 64ull, 131ull, 0xFFFFFFF0ull * 4})
    for (int64_t n : {0, 1, 3, 4, 5, 31, 32, 33, 35, 64, 100, 300})
      for (uint64_t row : {0ull, 7ull, (1ull << 33) + 5})
        for (float p : {0.1f, 0.5f}) {
          const DropoutRow key{.seed = 1234, .site = stream_id("layers.0.attn"), .sample = 3, .row = row, .p = p};
          dropout_row_scales(key, col0, n, want.data());
          dropout_keep_scales(key, col0, n, got.data());
          for (int64_t j = 0; j < n; ++j)
            ASSERT_EQ(got[j], want[j]) << "col0 " << col0 << " n " << n << " row " << row << " j " << j;
        }
}

}  // namespace
}  // namespace mt::cpu
