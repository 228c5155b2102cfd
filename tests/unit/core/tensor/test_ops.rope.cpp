// test_ops.rope.cpp: the CPU rotary position embedding against a double reference and finite differences, for
// GPT-shaped, grouped-query and multi-query qkv, with position offsets.
// One of the sources of test_ops (tests/CMakeLists.txt); the shared references are in op_reference.h.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <stdexcept>
#include <vector>

#include "core/base/rope_scaling.h"
#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"
#include "tests/unit/core/tensor/op_reference.h"

namespace mt {
namespace {

using namespace mt::test;  // Vec, rand_vec, make, values, the references of op_reference.h

// ---- rotary position embedding ------------------------------------------------------------------

// rope_ in double: inv_freq, angle, cos and sin all in double (the op rounds them to fp32, an error of a few
// fp32 ulps of the angle, well inside kFwdTol for the small positions used here). fp32_angle: the angle as
// ops.h defines it, float(p) * float(inv_freq) rounded to fp32 (what far positions need: an fp32 angle of
// 1e5 rad is only good to 4e-3 rad, by definition).
// inv_freqs (D/2), when given, replace the plain frequencies; every rotated value is then scaled by `scale`.
Vec rope_ref(Vec x, const QkvShape& q, double theta, int64_t offset, bool inverse, bool fp32_angle = false,
             const std::vector<float>& inv_freqs = {}, double scale = 1) {
  const int64_t half = q.D / 2;
  for (int64_t b = 0; b < q.B; ++b)
    for (int64_t t = 0; t < q.T; ++t)
      for (int64_t g = 0; g < q.G; ++g)
        for (int64_t slot = 0; slot <= q.R; ++slot) {
          double* v = x.data() + (((b * q.T + t) * q.G + g) * q.S() + slot) * q.D;
          for (int64_t i = 0; i < half; ++i) {
            const double inv_freq = inv_freqs.empty() ? 1 / std::pow(theta, 2.0 * i / q.D) : inv_freqs[size_t(i)];
            double a = double(offset + t) * inv_freq;
            if (fp32_angle) a = static_cast<float>(offset + t) * static_cast<float>(inv_freq);
            if (inverse) a = -a;
            const double x0 = v[i], x1 = v[i + half];
            v[i] = scale * (x0 * std::cos(a) - x1 * std::sin(a));
            v[i + half] = scale * (x1 * std::cos(a) + x0 * std::sin(a));
          }
        }
  return x;
}

// The elements of the value slot (R + 1) of every group.
Vec value_slots(const Vec& x, const QkvShape& q) {
  Vec r;
  for (int64_t btg = 0; btg < q.B * q.T * q.G; ++btg)
    for (int64_t d = 0; d < q.D; ++d) r.push_back(x[(btg * q.S() + q.R + 1) * q.D + d]);
  return r;
}

class RopeShapes : public ::testing::TestWithParam<QkvShape> {};

// Forward against double; the value slots bit for bit untouched; the backward (the inverse rotation of dout)
// against finite differences of L = sum(rope(x) * w); rope then inverse rope gives x back.
TEST_P(RopeShapes, ForwardMatchesDoubleBackwardMatchesFiniteDifferencesValuesUntouched) {
  const QkvShape q = GetParam();
  const RopeOptions opt{.theta = 500.f, .position_offset = 3};
  const Vec x = rand_vec(q.numel(), 80, -2, 2), w = rand_vec(q.numel(), 81);
  Tensor X = make(x, q.shape());
  rope_(X, opt);
  const Vec got = values(X);
  EXPECT_CLOSE(got, rope_ref(x, q, 500.0, 3, false), kFwdTol);
  EXPECT_EQ(value_slots(got, q), value_slots(x, q));
  EXPECT_NE(got, x);

  Tensor dX = make(w, q.shape());
  rope_(dX, {.theta = 500.f, .position_offset = 3, .inverse = true});
  auto f = [&](const Vec& v) { return rope_ref(v, q, 500.0, 3, false); };
  EXPECT_CLOSE(values(dX), fd_grad(f, x, w), kGradTol);

  rope_(X, {.theta = 500.f, .position_offset = 3, .inverse = true});
  EXPECT_CLOSE(values(X), x, 1e-6);
  EXPECT_EQ(value_slots(values(X), q), value_slots(x, q));
}

INSTANTIATE_TEST_SUITE_P(Rope, RopeShapes,
                         ::testing::Values(QkvShape{2, 5, 3, 1, 8},   // GPT: G = H, R = 1 (B, T, H, 3, D)
                                           QkvShape{1, 4, 2, 4, 6},   // grouped-query: H = 8, G = 2
                                           QkvShape{2, 3, 1, 3, 2}),  // multi-query, D = 2
                         [](const auto& info) {
                           const QkvShape& q = info.param;
                           return "G" + std::to_string(q.G) + "R" + std::to_string(q.R) + "D" + std::to_string(q.D);
                         });

// A later slice of a sequence rotated with position_offset = its start equals that slice of the whole
// sequence rotated from 0, bit for bit (each element's angle is float(offset + t) * inv_freq either way).
TEST(Rope, PositionOffsetShiftsLikeASliceOfALongerSequence) {
  const QkvShape whole{2, 9, 2, 2, 8};
  const Vec x = rand_vec(whole.numel(), 82, -2, 2);
  Tensor W = make(x, whole.shape());
  Tensor Tl = take(W, 1, 4, 9);
  rope_(W, {.theta = 10000.f});
  rope_(Tl, {.theta = 10000.f, .position_offset = 4});
  EXPECT_EQ(values(Tl), values(take(W, 1, 4, 9)));
  // Sequence-parallel shards (offset 0 and 4) together are the whole; far positions use fp32 angles.
  Tensor head = take(make(x, whole.shape()), 1, 0, 4), far = make(x, whole.shape());
  rope_(head, {});
  EXPECT_EQ(concat(head, Tl, 1), values(W));
  rope_(far, {.position_offset = 100000});
  EXPECT_CLOSE(values(far), rope_ref(x, whole, 10000.0, 100000, false, true), kFwdTol);
}

// A scaled model's frequencies (llama3's, yarn's with its attention factor) handed in: the forward against double
// at those frequencies, the inverse against finite differences of the scaled rotation (its transpose: the scale
// stays, the angle flips), rope then inverse rope gives x scaled twice; a table of the wrong length is refused.
TEST(Rope, GivenFrequenciesAndAttentionFactorRotateAndScale) {
  const QkvShape q{2, 6, 2, 2, 8};
  const RopeFrequencies yarn =
      rope_frequencies(500.0, q.D, {.type = RopeScalingType::yarn, .factor = 4, .original_max_position_embeddings = 4});
  ASSERT_NE(yarn.attention_factor, 1.f);
  const RopeOptions opt{
      .theta = 500.f, .inv_freq = yarn.inv_freq, .attention_factor = yarn.attention_factor, .position_offset = 2};
  const Vec x = rand_vec(q.numel(), 83, -2, 2), w = rand_vec(q.numel(), 84);
  Tensor X = make(x, q.shape());
  rope_(X, opt);
  EXPECT_CLOSE(values(X), rope_ref(x, q, 500.0, 2, false, false, yarn.inv_freq, yarn.attention_factor), kFwdTol);
  EXPECT_NE(values(X), rope_ref(x, q, 500.0, 2, false, false, {}, yarn.attention_factor));  // not the plain ones
  RopeOptions back = opt;
  back.inverse = true;
  Tensor dX = make(w, q.shape());
  rope_(dX, back);
  auto f = [&](const Vec& v) { return rope_ref(v, q, 500.0, 2, false, false, yarn.inv_freq, yarn.attention_factor); };
  EXPECT_CLOSE(values(dX), fd_grad(f, x, w), kGradTol);
  rope_(X, back);
  Vec twice = x;
  const Vec slots = value_slots(x, q);
  for (int64_t btg = 0; btg < q.B * q.T * q.G; ++btg)
    for (int64_t k = 0; k < (q.R + 1) * q.D; ++k)
      twice[size_t(btg * q.S() * q.D + k)] *= double(yarn.attention_factor) * yarn.attention_factor;
  EXPECT_CLOSE(values(X), twice, 1e-5);
  EXPECT_EQ(value_slots(values(X), q), slots);
  const std::vector<float> three(3, 1.f);
  Tensor Y = make(x, q.shape());
  EXPECT_THROW(rope_(Y, {.inv_freq = three}), std::invalid_argument);
  EXPECT_THROW(rope_(Y, {.attention_factor = 0.f}), std::invalid_argument);
}

}  // namespace
}  // namespace mt
