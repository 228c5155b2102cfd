// test_ops.norms.cpp: the CPU LayerNorm and RMSNorm, forward against double references, backward against finite
// differences, with eps, aliasing and accumulation.
// One of the sources of test_ops (tests/CMakeLists.txt); the shared references are in op_reference.h.
#include <gtest/gtest.h>

#include <cmath>

#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"
#include "tests/unit/core/tensor/op_reference.h"

namespace mt {
namespace {

using namespace mt::test;  // Vec, rand_vec, make, values, the references of op_reference.h

// ---- LayerNorm -----------------------------------------------------------------------------------

struct LnRef {
  Vec out, mean, rstd;
};
LnRef layernorm_ref(const Vec& x, const Vec& w, const Vec& b, int64_t N, int64_t C, double eps) {
  LnRef r{Vec(N * C), Vec(N), Vec(N)};
  for (int64_t n = 0; n < N; ++n) {
    double mu = 0, var = 0;
    for (int64_t c = 0; c < C; ++c) mu += x[n * C + c] / C;
    for (int64_t c = 0; c < C; ++c) var += (x[n * C + c] - mu) * (x[n * C + c] - mu) / C;
    r.mean[n] = mu;
    r.rstd[n] = 1 / std::sqrt(var + eps);
    for (int64_t c = 0; c < C; ++c) r.out[n * C + c] = (x[n * C + c] - mu) * r.rstd[n] * w[c] + b[c];
  }
  return r;
}

TEST(LayerNorm, ForwardMatchesDoubleAndBackwardMatchesFiniteDifferences) {
  const int64_t N = 4, C = 16;
  const double eps = 1e-5;
  const Vec x = rand_vec(N * C, 20, -2, 3), w = rand_vec(C, 21, 0.5, 1.5), b = rand_vec(C, 22);
  const Vec dout = rand_vec(N * C, 23), prior_w = rand_vec(C, 24), prior_b = rand_vec(C, 25);
  Tensor out = Tensor::empty({N, C}, DType::f32), mean = Tensor::empty({N}, DType::f32),
         rstd = Tensor::empty({N}, DType::f32);
  layernorm_forward(make(x, {N, C}), make(w, {C}), make(b, {C}), out, mean, rstd, {.eps = 1e-5f});
  const LnRef ref = layernorm_ref(x, w, b, N, C, eps);
  EXPECT_CLOSE(values(out), ref.out, kFwdTol);
  EXPECT_CLOSE(values(mean), ref.mean, kFwdTol);
  EXPECT_CLOSE(values(rstd), ref.rstd, kFwdTol);

  Tensor dx = Tensor::empty({N, C}, DType::f32), dw = make(prior_w, {C}), db = make(prior_b, {C});
  layernorm_backward(make(dout, {N, C}), make(x, {N, C}), make(w, {C}), mean, rstd, dx, dw, db);
  auto fx = [&](const Vec& v) { return layernorm_ref(v, w, b, N, C, eps).out; };
  auto fw = [&](const Vec& v) { return layernorm_ref(x, v, b, N, C, eps).out; };
  auto fb = [&](const Vec& v) { return layernorm_ref(x, w, v, N, C, eps).out; };
  EXPECT_CLOSE(values(dx), fd_grad(fx, x, dout), kGradTol);
  EXPECT_CLOSE(diff(values(dw), prior_w), fd_grad(fw, w, dout), kGradTol);
  EXPECT_CLOSE(diff(values(db), prior_b), fd_grad(fb, b, dout), kGradTol);
}

// ---- RMSNorm -------------------------------------------------------------------------------------

struct RmsRef {
  Vec out, rstd;
};
RmsRef rmsnorm_ref(const Vec& x, const Vec& w, int64_t N, int64_t C, double eps) {
  RmsRef r{Vec(N * C), Vec(N)};
  for (int64_t n = 0; n < N; ++n) {
    double ms = 0;
    for (int64_t c = 0; c < C; ++c) ms += x[n * C + c] * x[n * C + c] / C;
    r.rstd[n] = 1 / std::sqrt(ms + eps);
    for (int64_t c = 0; c < C; ++c) r.out[n * C + c] = x[n * C + c] * r.rstd[n] * w[c];
  }
  return r;
}

TEST(RmsNorm, ForwardMatchesDoubleAndBackwardMatchesFiniteDifferences) {
  const int64_t N = 4, C = 16;
  const double eps = 1e-5;
  const Vec x = rand_vec(N * C, 26, -2, 3), w = rand_vec(C, 27, 0.5, 1.5);
  const Vec dout = rand_vec(N * C, 28), prior_w = rand_vec(C, 29);
  Tensor out = Tensor::empty({N, C}, DType::f32), rstd = Tensor::empty({N}, DType::f32);
  rmsnorm_forward(make(x, {N, C}), make(w, {C}), out, rstd, {.eps = 1e-5f});
  const RmsRef ref = rmsnorm_ref(x, w, N, C, eps);
  EXPECT_CLOSE(values(out), ref.out, kFwdTol);
  EXPECT_CLOSE(values(rstd), ref.rstd, kFwdTol);

  Tensor dx = Tensor::empty({N, C}, DType::f32), dw = make(prior_w, {C});
  rmsnorm_backward(make(dout, {N, C}), make(x, {N, C}), make(w, {C}), rstd, dx, dw);
  auto fx = [&](const Vec& v) { return rmsnorm_ref(v, w, N, C, eps).out; };
  auto fw = [&](const Vec& v) { return rmsnorm_ref(x, v, N, C, eps).out; };
  EXPECT_CLOSE(values(dx), fd_grad(fx, x, dout), kGradTol);
  EXPECT_CLOSE(diff(values(dw), prior_w), fd_grad(fw, w, dout), kGradTol);
}

// eps enters inside the square root (a near-zero row is scaled by about 1 / sqrt(eps), not blown up), out and
// dx may alias their inputs, and two backward calls accumulate dweight.
TEST(RmsNorm, EpsAliasingAndAccumulation) {
  const int64_t N = 3, C = 8;
  const double eps = 1e-2;
  Vec x = rand_vec(N * C, 30, -1, 1);
  for (int64_t c = 0; c < C; ++c) x[C + c] = 1e-4 * x[C + c];  // row 1 nearly zero
  const Vec w = rand_vec(C, 31, 0.5, 1.5), dout = rand_vec(N * C, 32);
  Tensor out = Tensor::empty({N, C}, DType::f32), rstd = Tensor::empty({N}, DType::f32);
  rmsnorm_forward(make(x, {N, C}), make(w, {C}), out, rstd, {.eps = 1e-2f});
  const RmsRef ref = rmsnorm_ref(x, w, N, C, eps);
  EXPECT_CLOSE(values(out), ref.out, kFwdTol);
  EXPECT_CLOSE(values(rstd), ref.rstd, kFwdTol);
  Tensor X = make(x, {N, C}), rstd2 = Tensor::empty({N}, DType::f32);
  rmsnorm_forward(X, make(w, {C}), X, rstd2, {.eps = 1e-2f});
  EXPECT_EQ(values(X), values(out));

  Tensor dx = Tensor::empty({N, C}, DType::f32), dw = Tensor::zeros({C}, DType::f32);
  rmsnorm_backward(make(dout, {N, C}), make(x, {N, C}), make(w, {C}), rstd, dx, dw);
  Tensor D = make(dout, {N, C}), dw2 = Tensor::zeros({C}, DType::f32);
  rmsnorm_backward(D, make(x, {N, C}), make(w, {C}), rstd, D, dw2);  // dx aliasing dout
  EXPECT_EQ(values(D), values(dx));
  rmsnorm_backward(make(dout, {N, C}), make(x, {N, C}), make(w, {C}), rstd, dx, dw2);
  Vec twice = values(dw);
  for (auto& v : twice) v *= 2;
  EXPECT_CLOSE(values(dw2), twice, 1e-7);
}

}  // namespace
}  // namespace mt
