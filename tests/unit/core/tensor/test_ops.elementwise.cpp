// test_ops.elementwise.cpp: the CPU bias, add, scale, GELU and SwiGLU ops against double references and finite
// differences.
// One of the sources of test_ops (tests/CMakeLists.txt); the shared references are in op_reference.h.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"
#include "tests/unit/core/tensor/op_reference.h"

namespace mt {
namespace {

using namespace mt::test;  // Vec, rand_vec, make, values, the references of op_reference.h

// ---- bias and elementwise ------------------------------------------------------------------------

double gelu_ref(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
}

TEST(Elementwise, AddScaleAndGeluForwardMatchDouble) {
  const Vec a = rand_vec(3000, 12, -4, 4), b = rand_vec(3000, 13);
  Tensor A = make(a, {3, 1000}), B = make(b, {3, 1000}), out = Tensor::empty({3, 1000}, DType::f32);
  add(A, B, out);
  Vec want(a.size());
  for (size_t i = 0; i < a.size(); ++i) want[i] = a[i] + b[i];
  EXPECT_CLOSE(values(out), want, kFwdTol);
  add(A, B, A);  // out may alias an input
  EXPECT_EQ(values(A), values(out));
  scale_(out, -0.25f);
  for (auto& x : want) x *= -0.25;
  EXPECT_CLOSE(values(out), want, kFwdTol);
  Tensor g = Tensor::empty({3, 1000}, DType::f32);
  gelu_forward(make(a, {3, 1000}), g);
  for (size_t i = 0; i < a.size(); ++i) want[i] = gelu_ref(a[i]);
  EXPECT_CLOSE(values(g), want, kFwdTol);
}

TEST(Elementwise, GeluBackwardMatchesFiniteDifferences) {
  const Vec x = rand_vec(64, 14, -3, 3), w = rand_vec(64, 15);
  Tensor dx = Tensor::empty({8, 8}, DType::f32);
  gelu_backward(make(x, {8, 8}), make(w, {8, 8}), dx);
  auto f = [](const Vec& in) {
    Vec o(in.size());
    for (size_t i = 0; i < in.size(); ++i) o[i] = gelu_ref(in[i]);
    return o;
  };
  EXPECT_CLOSE(values(dx), fd_grad(f, x, w), kGradTol);
}

TEST(Elementwise, AddBiasForwardAndBiasBackwardAccumulates) {
  const int64_t N = 6, C = 5;
  const Vec x = rand_vec(N * C, 16), bias = rand_vec(C, 17), w = rand_vec(N * C, 18), prior = rand_vec(C, 19);
  auto f = [&](const Vec& bb) {
    Vec o(N * C);
    for (int64_t i = 0; i < N * C; ++i) o[i] = x[i] + bb[i % C];
    return o;
  };
  Tensor X = make(x, {N, C});
  add_bias(X, make(bias, {C}));
  EXPECT_CLOSE(values(X), f(bias), kFwdTol);
  Tensor dbias = make(prior, {C});
  bias_backward(make(w, {N, C}), dbias);
  EXPECT_CLOSE(diff(values(dbias), prior), fd_grad(f, bias, w), kGradTol);
}

// ---- SwiGLU --------------------------------------------------------------------------------------

// x (N, 2F) of interleaved (gate, up) pairs -> (N, F) = silu(gate) * up.
Vec swiglu_ref(const Vec& x) {
  Vec o(x.size() / 2);
  for (size_t i = 0; i < o.size(); ++i) {
    const double g = x[2 * i], u = x[2 * i + 1];
    o[i] = g / (1 + std::exp(-g)) * u;
  }
  return o;
}

TEST(SwiGlu, ForwardMatchesDoubleAndBackwardMatchesFiniteDifferences) {
  const int64_t N = 5, F = 7;
  const Vec x = rand_vec(N * 2 * F, 70, -6, 6), dout = rand_vec(N * F, 71);
  Tensor out = Tensor::empty({N, F}, DType::f32), dx = Tensor::empty({N, 2 * F}, DType::f32);
  swiglu_forward(make(x, {N, 2 * F}), out);
  EXPECT_CLOSE(values(out), swiglu_ref(x), kFwdTol);
  swiglu_backward(make(x, {N, 2 * F}), make(dout, {N, F}), dx);
  EXPECT_CLOSE(values(dx), fd_grad(swiglu_ref, x, dout), kGradTol);
  Tensor X = make(x, {N, 2 * F});  // dx may alias x
  swiglu_backward(X, make(dout, {N, F}), X);
  EXPECT_EQ(values(X), values(dx));
}

// Rows wider than the CPU's fp32 batches, and gates far out in both tails: silu(g) -> g above, -> -0 below,
// and the gradients stay finite (exp(-g) is capped, so (1 - s) = e * s never becomes inf * 0).
TEST(SwiGlu, WideRowsAndExtremeGatesStayFinite) {
  const int64_t N = 3, F = 1500;
  Vec x = rand_vec(N * 2 * F, 72, -4, 4);
  const Vec dout = rand_vec(N * F, 73);
  for (double g : {-200.0, -90.0, -30.0, 30.0, 90.0, 200.0}) x[2 * static_cast<size_t>(g + 500)] = g;
  Tensor out = Tensor::empty({N, F}, DType::f32), dx = Tensor::empty({N, 2 * F}, DType::f32);
  swiglu_forward(make(x, {N, 2 * F}), out);
  swiglu_backward(make(x, {N, 2 * F}), make(dout, {N, F}), dx);
  EXPECT_CLOSE(values(out), swiglu_ref(x), kFwdTol);
  Vec want(x.size());  // the analytic gradient in double
  for (int64_t i = 0; i < N * F; ++i) {
    const double g = x[2 * i], u = x[2 * i + 1], s = 1 / (1 + std::exp(-g));
    want[2 * i] = dout[i] * u * (s + g * s * (1 - s));
    want[2 * i + 1] = dout[i] * g * s;
  }
  EXPECT_CLOSE(values(dx), want, kGradTol);
  for (double v : values(dx)) ASSERT_TRUE(std::isfinite(v));
}

}  // namespace
}  // namespace mt
