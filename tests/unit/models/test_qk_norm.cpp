// test_qk_norm.cpp: QK-norm (models/qk_norm.h) against a double reference: each query head normalized with the
// query weight and each key head with the key weight, the values untouched; the input's and both weights'
// gradients against finite differences; the weights marked as partial sums over the tensor-parallel group.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "models/qk_norm.h"
#include "tests/unit/core/tensor/op_reference.h"

namespace mt {
namespace {

using namespace mt::test;  // Vec, rand_vec, make, values, fd_grad, EXPECT_CLOSE

constexpr int64_t B = 2, T = 3, G = 2, R = 2, S = R + 2, D = 8;
constexpr double kEps = 1e-5;

// qk_norm in double: x (B, T, G, S, D), the query weight wq (D) and the key weight wk (D).
Vec reference(Vec x, const Vec& wq, const Vec& wk) {
  for (int64_t btg = 0; btg < B * T * G; ++btg)
    for (int64_t slot = 0; slot <= R; ++slot) {
      double* v = x.data() + (btg * S + slot) * D;
      double ms = 0;
      for (int64_t d = 0; d < D; ++d) ms += v[d] * v[d];
      const double rstd = 1 / std::sqrt(ms / D + kEps);
      const Vec& w = slot < R ? wq : wk;
      for (int64_t d = 0; d < D; ++d) v[d] *= rstd * w[static_cast<size_t>(d)];
    }
  return x;
}

TEST(QkNorm, NormalizesEachQueryAndKeyHeadAndMatchesFiniteDifferences) {
  QkNorm qk(PartOptions{.layer = 3, .dtype = DType::f32, .seed = 5}, D, static_cast<float>(kEps));
  const std::vector<Parameter*> ps = qk.parameters();
  ASSERT_EQ(ps.size(), 2u);
  EXPECT_EQ(ps[0]->name, "layers.3.attn.q_norm.weight");
  EXPECT_EQ(ps[1]->name, "layers.3.attn.k_norm.weight");
  EXPECT_TRUE(ps[0]->grad_sums.tensor && ps[1]->grad_sums.tensor);  // each rank's gradient covers its own heads
  const Vec wq = rand_vec(D, 90, 0.5, 1.5), wk = rand_vec(D, 91, 0.5, 1.5);
  ps[0]->value.copy_from(make(wq, {D}));
  ps[1]->value.copy_from(make(wk, {D}));

  const Shape shape{B, T, G, S, D};
  const Vec x = rand_vec(B * T * G * S * D, 92, -2, 2), w = rand_vec(B * T * G * S * D, 93);
  QkNorm::Saved s;
  const Tensor out = qk.forward(make(x, shape), s);
  EXPECT_EQ(out.shape(), shape);
  EXPECT_CLOSE(values(out), reference(x, wq, wk), kFwdTol);
  const Vec got = values(out);
  for (int64_t btg = 0; btg < B * T * G; ++btg)  // the value slots bit for bit
    for (int64_t d = 0; d < D; ++d)
      EXPECT_EQ(got[static_cast<size_t>((btg * S + R + 1) * D + d)], x[static_cast<size_t>((btg * S + R + 1) * D + d)]);

  const Tensor dx = qk.backward(make(w, shape), s);
  EXPECT_CLOSE(values(dx), fd_grad([&](const Vec& v) { return reference(v, wq, wk); }, x, w), kGradTol);
  EXPECT_CLOSE(values(ps[0]->grad), fd_grad([&](const Vec& v) { return reference(x, v, wk); }, wq, w), kGradTol);
  EXPECT_CLOSE(values(ps[1]->grad), fd_grad([&](const Vec& v) { return reference(x, wq, v); }, wk, w), kGradTol);
}

}  // namespace
}  // namespace mt
