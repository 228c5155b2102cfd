// op_reference.h: what the CPU op tests (test_ops.*.cpp) share: the tolerances, rounding, relative error,
// finite differences, slices and concatenations of tensors, the argument-error check, the qkv shape of the
// rotary tests and the four cross-entropy ops run on one shard.
//
// Tolerances. Errors are measured as max_i |got_i - want_i| / max_i |want_i| (one bad element fails).
//  * kFwdTol = 1e-5: fp32 rounding of sums of a few dozen O(1) terms; the errors seen are <= 1.3e-7.
//  * kGradTol = 1e-5: the finite differences run in double on the double reference with h = 1e-5, so their
//    own error is ~h^2 + 1e-16/h ~ 1e-10 and what remains is the fp32 backward's rounding (seen: <= 1.5e-7).
//    That leaves ~60x headroom while any wrong term of a gradient formula (a missing dropout scale, a
//    dropped LayerNorm term) shows up as an error of 1e-2 or more. The inputs are small (a few hundred
//    elements), so the looser 1e-3..1e-2 bounds that fp32 finite differences would need are not required.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"
#include "tests/unit/op_test_util.h"

namespace mt::test {

inline constexpr double kFwdTol = 1e-5;
inline constexpr double kGradTol = 1e-5;

inline Vec rounded(const Vec& v, DType dt) {
  Vec r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = round_to(dt, static_cast<float>(v[i]));
  return r;
}

inline Vec diff(const Vec& a, const Vec& b) {
  Vec d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

// max_i |got_i - want_i| / max_i |want_i|
inline double max_rel_err(const Vec& got, const Vec& want) {
  EXPECT_EQ(got.size(), want.size());
  double err = 0.0, scale = 0.0;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    err = std::max(err, std::abs(got[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return err / std::max(scale, 1e-30);
}

#define EXPECT_CLOSE(got, want, tol) EXPECT_LE(max_rel_err(got, want), tol) << #got " vs " #want

// Central finite differences of L(x) = sum_i f(x)_i * w_i, in double.
inline Vec fd_grad(const std::function<Vec(const Vec&)>& f, Vec x, const Vec& w, double h = 1e-5) {
  auto L = [&](const Vec& in) {
    Vec out = f(in);
    double s = 0.0;
    for (size_t i = 0; i < out.size(); ++i) s += out[i] * w[i];
    return s;
  };
  Vec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double up = L(x);
    x[i] = x0 - h;
    const double down = L(x);
    x[i] = x0;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

// A copy (f32) of rows [begin, end) of dimension `dim` of t.
inline Tensor take(const Tensor& t, int dim, int64_t begin, int64_t end) {
  Shape s = t.shape();
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < dim; ++i) outer *= s[i];
  for (int i = dim + 1; i < t.ndim(); ++i) inner *= s[i];
  const int64_t len = s[dim];
  s[dim] = end - begin;
  Vec v = values(t), r;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = begin; i < end; ++i)
      for (int64_t k = 0; k < inner; ++k) r.push_back(v[(o * len + i) * inner + k]);
  return make(r, s, t.dtype() == DType::i32 ? DType::f32 : t.dtype());
}

// Concatenation of a and b along dimension `dim` (values as f32).
inline Vec concat(const Tensor& a, const Tensor& b, int dim) {
  int64_t outer = 1;
  for (int i = 0; i < dim; ++i) outer *= a.dim(i);
  const int64_t na = a.numel() / outer, nb = b.numel() / outer;
  Vec va = values(a), vb = values(b), r;
  for (int64_t o = 0; o < outer; ++o) {
    r.insert(r.end(), va.begin() + o * na, va.begin() + (o + 1) * na);
    r.insert(r.end(), vb.begin() + o * nb, vb.begin() + (o + 1) * nb);
  }
  return r;
}

template <class F>
inline void expect_invalid(F f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one mentioning '" << needle << "'";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

struct QkvShape {
  int64_t B, T, G, R, D;
  int64_t S() const { return R + 2; }
  int64_t numel() const { return B * T * G * S() * D; }
  Shape shape() const { return {B, T, G, S(), D}; }
};
inline void PrintTo(const QkvShape& q, std::ostream* os) {
  *os << "(B " << q.B << ", T " << q.T << ", G " << q.G << ", R " << q.R << ", D " << q.D << ")";
}

// The four split functions on one shard; returns (losses, dlogits).
inline std::pair<Tensor, Tensor> cross_entropy_all(const Tensor& logits, const Tensor& targets, const Tensor& dloss) {
  const int64_t N = logits.dim(0);
  Tensor rowmax = Tensor::empty({N}, DType::f32), sumexp = Tensor::empty({N}, DType::f32),
         tl = Tensor::empty({N}, DType::f32), losses = Tensor::empty({N}, DType::f32);
  Tensor dlogits = Tensor::empty(logits.shape(), logits.dtype());
  cross_entropy_rowmax(logits, rowmax);
  cross_entropy_partials(logits, targets, rowmax, sumexp, tl);
  cross_entropy_loss(rowmax, sumexp, tl, losses);
  cross_entropy_backward(logits, targets, rowmax, sumexp, dloss, dlogits);
  return {losses, dlogits};
}

}  // namespace mt::test
