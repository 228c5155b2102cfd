// test_ops.cpp: the CPU reference ops (core/tensor/ops.h) against plain double-precision references.
//  * Forwards: the fp32 op against a double reference of the same math.
//  * Backwards: against central finite differences, in double, of L = sum(out * W) for a fixed random W.
//  * bf16/f16: an op on bf16/f16 storage equals the fp32 op on the same values, rounded once.
//  * Layout invariance: dropout masks and vocabulary / head shards depend only on global coordinates.
//  * AdamW, the inf/NaN check, argument errors, and the fp32 <-> bf16 / fp16 conversions of dtype.h.
//
// Tolerances. Errors are measured as max_i |got_i - want_i| / max_i |want_i| (one bad element fails).
//  * kFwdTol = 1e-5: fp32 rounding of sums of a few dozen O(1) terms; the errors seen are <= 1.3e-7.
//  * kGradTol = 1e-5: the finite differences run in double on the double reference with h = 1e-5, so their
//    own error is ~h^2 + 1e-16/h ~ 1e-10 and what remains is the fp32 backward's rounding (seen: <= 1.5e-7).
//    That leaves ~60x headroom while any wrong term of a gradient formula (a missing dropout scale, a
//    dropped LayerNorm term) shows up as an error of 1e-2 or more. The inputs are small (a few hundred
//    elements), so the looser 1e-3..1e-2 bounds that fp32 finite differences would need are not required.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfenv>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numbers>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "core/tensor/ops.h"
#include "core/base/rng.h"
#include "core/tensor/tensor.h"
#include "tests/unit/op_test_util.h"

namespace mt {
namespace {

using namespace mt::test;  // Vec, rand_vec, make, values
constexpr double kFwdTol = 1e-5;
constexpr double kGradTol = 1e-5;

// ---- helpers -------------------------------------------------------------------------------------

Vec rounded(const Vec& v, DType dt) {
  Vec r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = round_to(dt, static_cast<float>(v[i]));
  return r;
}

Vec diff(const Vec& a, const Vec& b) {
  Vec d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

// max_i |got_i - want_i| / max_i |want_i|
double max_rel_err(const Vec& got, const Vec& want) {
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
Vec fd_grad(const std::function<Vec(const Vec&)>& f, Vec x, const Vec& w, double h = 1e-5) {
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
Tensor take(const Tensor& t, int dim, int64_t begin, int64_t end) {
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
Vec concat(const Tensor& a, const Tensor& b, int dim) {
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
void expect_invalid(F f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one mentioning '" << needle << "'";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// ---- dtype.h conversions -------------------------------------------------------------------------

// Independent round-to-nearest-even reference: x rounded to `mant` fraction bits with exponent floor `emin`
// (subnormals below it), in double; values beyond `max_finite` overflow to inf.
float rne_reference(float x, int mant, int emin, double max_finite) {
  if (std::isnan(x) || std::isinf(x) || x == 0.f) return x;
  const int e = std::max(std::ilogb(x), emin);
  const double ulp = std::ldexp(1.0, e - mant);
  const double r = std::nearbyint(static_cast<double>(x) / ulp) * ulp;  // FE_TONEAREST: ties to even
  if (std::abs(r) > max_finite) return std::copysign(INFINITY, x);
  return static_cast<float>(r);
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f), 0x3f80);                     // tie, down to even
  EXPECT_EQ(float_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);                 // tie, up to even
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);          // above the tie
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // overflows to inf
  EXPECT_EQ(float_to_bf16(-INFINITY), 0xff80);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::bit_cast<float>(0x7f800001u)))));  // payload in low bits
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = bf16_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_bf16(f), h) << "bf16 pattern " << h << " does not round-trip";
  }
  std::mt19937 gen(7);
  for (int i = 0; i < 400000; ++i) {
    const float f = std::bit_cast<float>(static_cast<uint32_t>(gen()));
    const float want = rne_reference(f, 7, -126, 0x1.fep127);  // bf16 max
    if (std::isnan(f)) continue;
    ASSERT_EQ(std::bit_cast<uint32_t>(bf16_to_float(float_to_bf16(f))), std::bit_cast<uint32_t>(want)) << f;
  }
}

TEST(DType, F16RoundsToNearestEvenWithSubnormalsAndOverflow) {
  EXPECT_EQ(float_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_f16(1.0f + 0x1p-11f), 0x3c00);      // tie, down to even
  EXPECT_EQ(float_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);  // tie, up to even
  EXPECT_EQ(float_to_f16(65504.f), 0x7bff);
  EXPECT_EQ(float_to_f16(std::nextafter(65520.f, 0.f)), 0x7bff);
  EXPECT_EQ(float_to_f16(65520.f), 0x7c00);  // the tie above the largest finite value goes to inf
  EXPECT_EQ(float_to_f16(-1e9f), 0xfc00);
  EXPECT_EQ(float_to_f16(0x1p-24f), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_f16(0x1p-25f), 0x0000);  // tie, down to zero
  EXPECT_EQ(float_to_f16(std::nextafter(0x1p-25f, 1.f)), 0x0001);
  EXPECT_EQ(float_to_f16(3 * 0x1p-25f), 0x0002);         // 1.5 units: tie, up to even
  EXPECT_EQ(float_to_f16(5 * 0x1p-25f), 0x0002);         // 2.5 units: tie, down to even
  EXPECT_EQ(float_to_f16(0x1p-14f - 0x1p-25f), 0x0400);  // 1023.5 units: up to the smallest normal
  EXPECT_EQ(float_to_f16(-0.f), 0x8000);
  EXPECT_EQ(f16_to_float(0x0001), 0x1p-24f);
  EXPECT_EQ(f16_to_float(0x83ff), -1023 * 0x1p-24f);
  EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(NAN))));
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_f16(f), h) << "f16 pattern " << h << " does not round-trip";
  }
  std::mt19937 gen(11);
  for (int i = 0; i < 400000; ++i) {
    // Half the samples anywhere, half where fp16 is interesting (|x| in [2^-27, 2^17)).
    uint32_t bits = static_cast<uint32_t>(gen());
    if (i % 2) bits = (bits & 0x807fffffu) | ((100u + bits % 44u) << 23);
    const float f = std::bit_cast<float>(bits);
    const float want = rne_reference(f, 10, -14, 65504.0);
    if (std::isnan(f)) continue;
    ASSERT_EQ(std::bit_cast<uint32_t>(f16_to_float(float_to_f16(f))), std::bit_cast<uint32_t>(want)) << f;
  }
}

// ---- GEMM ----------------------------------------------------------------------------------------

// op(a) (M, K) @ op(b) (K, N) in double; a stored (K, M) when ta, b stored (N, K) when tb.
Vec gemm_ref(const Vec& a, const Vec& b, int64_t M, int64_t K, int64_t N, bool ta, bool tb) {
  Vec out(M * N, 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k)
        out[m * N + n] += (ta ? a[k * M + m] : a[m * K + k]) * (tb ? b[n * K + k] : b[k * N + n]);
  return out;
}

class GemmTrans : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(GemmTrans, ForwardWithAlphaBetaMatchesDouble) {
  const auto [ta, tb] = GetParam();
  const int64_t M = 5, K = 7, N = 6;
  const Vec a = rand_vec(M * K, 1), b = rand_vec(K * N, 2), c0 = rand_vec(M * N, 3);
  Tensor A = make(a, ta ? Shape{K, M} : Shape{M, K}), B = make(b, tb ? Shape{N, K} : Shape{K, N});
  Tensor out = make(c0, {M, N});
  gemm(A, B, out, {.trans_a = ta, .trans_b = tb, .alpha = 0.5f, .beta = 0.75f});
  Vec want = gemm_ref(a, b, M, K, N, ta, tb);
  for (int64_t i = 0; i < M * N; ++i) want[i] = 0.5 * want[i] + 0.75 * c0[i];
  EXPECT_CLOSE(values(out), want, kFwdTol);
}

// The gradients of L = sum(W o op(a) op(b)) are themselves GEMMs (as in a linear layer's backward).
TEST_P(GemmTrans, BackwardGemmsMatchFiniteDifferences) {
  const auto [ta, tb] = GetParam();
  const int64_t M = 3, K = 4, N = 5;
  const Vec a = rand_vec(M * K, 4), b = rand_vec(K * N, 5), w = rand_vec(M * N, 6);
  const Shape sa = ta ? Shape{K, M} : Shape{M, K}, sb = tb ? Shape{N, K} : Shape{K, N};
  Tensor A = make(a, sa), B = make(b, sb), W = make(w, {M, N});
  Tensor dA = Tensor::zeros(sa, DType::f32), dB = Tensor::zeros(sb, DType::f32);
  if (!ta)
    gemm(W, B, dA, {.trans_b = !tb});  // dA (M, K) = W op(b)^T
  else
    gemm(B, W, dA, {.trans_a = tb, .trans_b = true});  // dA (K, M) = op(b) W^T
  if (!tb)
    gemm(A, W, dB, {.trans_a = !ta});  // dB (K, N) = op(a)^T W
  else
    gemm(W, A, dB, {.trans_a = true, .trans_b = ta});  // dB (N, K) = W^T op(a)
  EXPECT_CLOSE(values(dA), fd_grad([&](const Vec& x) { return gemm_ref(x, b, M, K, N, ta, tb); }, a, w), kGradTol);
  EXPECT_CLOSE(values(dB), fd_grad([&](const Vec& x) { return gemm_ref(a, x, M, K, N, ta, tb); }, b, w), kGradTol);
}

INSTANTIATE_TEST_SUITE_P(AllTransposes, GemmTrans, ::testing::Combine(::testing::Bool(), ::testing::Bool()));

// bf16/f16 operands: widened to fp32, one fp32 sgemm, one rounding of the result. Exact equality holds
// because both sides run the same sgemm on the same fp32 values.
TEST(Gemm, HalfPrecisionIsTheFp32GemmRoundedOnce) {
  const int64_t M = 9, K = 33, N = 17;
  for (DType dt : {DType::bf16, DType::f16}) {
    const Vec a = rounded(rand_vec(M * K, 7), dt), b = rounded(rand_vec(N * K, 8), dt);
    const Vec c0 = rounded(rand_vec(M * N, 9), dt);
    Tensor out = make(c0, {M, N}, dt), ref = make(c0, {M, N});
    const GemmOptions opt{.trans_b = true, .alpha = 1.5f, .beta = 0.5f};
    gemm(make(a, {M, K}, dt), make(b, {N, K}, dt), out, opt);
    gemm(make(a, {M, K}), make(b, {N, K}), ref, opt);
    EXPECT_EQ(values(out), rounded(values(ref), dt)) << dtype_name(dt);

    // The weight-gradient case: half inputs, f32 out, beta = 1 accumulates.
    const Vec g0 = rand_vec(K * N, 10);
    Tensor grad = make(g0, {K, N});
    gemm(make(a, {M, K}, dt), make(rand_vec(M * N, 11), {M, N}, dt), grad, {.trans_a = true, .beta = 1.f});
    Vec want = gemm_ref(a, rounded(rand_vec(M * N, 11), dt), K, M, N, true, false);
    for (int64_t i = 0; i < K * N; ++i) want[i] += g0[i];
    EXPECT_CLOSE(values(grad), want, kFwdTol);
  }
}

TEST(Gemm, BetaZeroIgnoresGarbageInOut) {
  Tensor out = make({NAN, INFINITY, NAN, 1.0}, {2, 2});
  gemm(make({1, 2, 3, 4}, {2, 2}), make({1, 0, 0, 1}, {2, 2}), out);
  EXPECT_EQ(values(out), (Vec{1, 2, 3, 4}));
}

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

// ---- embeddings ----------------------------------------------------------------------------------

TEST(Embedding, LookupAndBackwardSumRepeatedTokens) {
  const int64_t B = 2, T = 4, V = 7, C = 3;
  const std::vector<int32_t> ids = {3, 0, 3, 6, 1, 3, 5, 0};  // 3 repeats: its gradient rows must sum
  const Vec table = rand_vec(V * C, 26), w = rand_vec(B * T * C, 27), prior = rand_vec(V * C, 28);
  auto f = [&](const Vec& tab) {
    Vec o(B * T * C);
    for (int64_t i = 0; i < B * T; ++i)
      for (int64_t c = 0; c < C; ++c) o[i * C + c] = tab[ids[i] * C + c];
    return o;
  };
  Tensor Ids = Tensor::from_ints(ids, {B, T}), out = Tensor::empty({B, T, C}, DType::f32);
  embedding_forward(Ids, make(table, {V, C}), out);
  EXPECT_EQ(values(out), f(table));
  Tensor dtable = make(prior, {V, C});
  embedding_backward(Ids, make(w, {B, T, C}), dtable);
  EXPECT_CLOSE(diff(values(dtable), prior), fd_grad(f, table, w), kGradTol);
}

TEST(Embedding, VocabularyShardsSumToTheFullLookup) {
  const int64_t B = 2, T = 5, V = 10, C = 4;
  const std::vector<int32_t> ids = {0, 9, 4, 5, 5, 1, 8, 2, 7, 3};
  const Vec table = rand_vec(V * C, 29), dout = rand_vec(B * T * C, 30);
  Tensor Ids = Tensor::from_ints(ids, {B, T}), Table = make(table, {V, C}), Dout = make(dout, {B, T, C});
  Tensor full = Tensor::empty({B, T, C}, DType::f32), dfull = Tensor::zeros({V, C}, DType::f32);
  embedding_forward(Ids, Table, full);
  embedding_backward(Ids, Dout, dfull);
  Vec sum(B * T * C, 0.0);
  for (int64_t start : {0, 6}) {  // shards of 6 and 4 rows
    const int64_t rows = start == 0 ? 6 : 4;
    Tensor part = Tensor::empty({B, T, C}, DType::f32), dpart = Tensor::zeros({rows, C}, DType::f32);
    embedding_forward(Ids, Table.slice(start, start + rows), part, {.vocab_start = start});
    embedding_backward(Ids, Dout, dpart, {.vocab_start = start});
    const Vec p = values(part);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += p[i];
    EXPECT_EQ(values(dpart), values(dfull.slice(start, start + rows)));
  }
  EXPECT_EQ(sum, values(full));
}

TEST(Embedding, PositionEmbeddingWithOffsetMatchesFiniteDifferences) {
  const int64_t B = 3, T = 4, C = 5, P = 9, off = 3;
  const Vec x = rand_vec(B * T * C, 31), wpe = rand_vec(P * C, 32), w = rand_vec(B * T * C, 33);
  const Vec prior = rand_vec(P * C, 34);
  auto f = [&](const Vec& pe) {
    Vec o(B * T * C);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t c = 0; c < C; ++c) o[(b * T + t) * C + c] = x[(b * T + t) * C + c] + pe[(off + t) * C + c];
    return o;
  };
  Tensor X = make(x, {B, T, C});
  position_embedding_add(X, make(wpe, {P, C}), {.position_offset = off});
  EXPECT_CLOSE(values(X), f(wpe), kFwdTol);
  Tensor dwpe = make(prior, {P, C});
  position_embedding_backward(make(w, {B, T, C}), dwpe, {.position_offset = off});
  EXPECT_CLOSE(diff(values(dwpe), prior), fd_grad(f, wpe, w), kGradTol);
}

// ---- dropout -------------------------------------------------------------------------------------

Vec dropout_ref(const Vec& x, int64_t B, int64_t T, int64_t C, const DropoutOptions& o) {
  Vec out(x.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        const int64_t i = (b * T + t) * C + c;
        const float u = dropout_uniform(o.seed, o.site, o.sample_offset + b, o.row_offset + t, o.col_offset + c);
        const bool keep = u >= o.p;
        out[i] = keep ? x[i] / (1.0 - o.p) : 0.0;
      }
  return out;
}

TEST(Dropout, ForwardMatchesMaskAndBackwardMatchesFiniteDifferences) {
  const int64_t B = 2, T = 16, C = 32;
  const DropoutOptions opt{.p = 0.3f,
                           .seed = 42,
                           .site = stream_id("layers.0.mlp.out"),
                           .sample_offset = 5,
                           .row_offset = 2,
                           .col_offset = 64};
  const Vec x = rand_vec(B * T * C, 35), w = rand_vec(B * T * C, 36);
  Tensor out = Tensor::empty({B, T, C}, DType::f32);
  dropout_forward(make(x, {B, T, C}), out, opt);
  const Vec got = values(out);
  EXPECT_CLOSE(got, dropout_ref(x, B, T, C, opt), kFwdTol);
  const double dropped = static_cast<double>(std::count(got.begin(), got.end(), 0.0)) / got.size();
  EXPECT_NEAR(dropped, 0.3, 0.05);
  Tensor dx = make(w, {B, T, C});
  dropout_backward(dx, dx, opt);  // in place, as the models call it
  EXPECT_CLOSE(values(dx), fd_grad([&](const Vec& v) { return dropout_ref(v, B, T, C, opt); }, x, w), kGradTol);

  Tensor copy = Tensor::empty({B, T, C}, DType::f32);
  dropout_forward(make(x, {B, T, C}), copy, {.p = 0.f});
  EXPECT_EQ(values(copy), x);
}

// A (B, T, C) tensor dropped whole equals its pieces dropped with offsets, cut along any dimension.
TEST(Dropout, MaskDependsOnlyOnGlobalCoordinates) {
  const int64_t B = 4, T = 6, C = 10;
  const DropoutOptions opt{.p = 0.5f, .seed = 3, .site = stream_id("embedding.dropout"), .sample_offset = 8};
  Tensor x = make(rand_vec(B * T * C, 37), {B, T, C}), whole = Tensor::empty({B, T, C}, DType::f32);
  dropout_forward(x, whole, opt);
  for (int dim = 0; dim < 3; ++dim) {
    const int64_t cut = dim == 2 ? 6 : x.dim(dim) / 2;  // column cut at 6: not a multiple of 4 (Philox block)
    Tensor lo = take(x, dim, 0, cut), hi = take(x, dim, cut, x.dim(dim));
    DropoutOptions hi_opt = opt;
    (dim == 0 ? hi_opt.sample_offset : dim == 1 ? hi_opt.row_offset : hi_opt.col_offset) += cut;
    Tensor lo_out = Tensor::empty(lo.shape(), DType::f32), hi_out = Tensor::empty(hi.shape(), DType::f32);
    dropout_forward(lo, lo_out, opt);
    dropout_forward(hi, hi_out, hi_opt);
    EXPECT_EQ(concat(lo_out, hi_out, dim), values(whole)) << "cut along dim " << dim;
  }
}

// ---- attention -----------------------------------------------------------------------------------

struct AttnRef {
  Vec out, lse;
};
// qkv (B, T, H, 3, D) -> out (B, T, H, D), lse (B, H, T); dropout mask as documented in ops.h.
AttnRef attention_ref(const Vec& qkv, int64_t B, int64_t T, int64_t H, int64_t D, const AttentionOptions& o) {
  AttnRef r{Vec(B * T * H * D, 0.0), Vec(B * H * T)};
  auto at = [&](int64_t b, int64_t t, int64_t h, int64_t w, int64_t d) {  // w: 0 query, 1 key, 2 value
    return qkv[(((b * T + t) * H + h) * 3 + w) * D + d];
  };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const int64_t len = o.causal ? i + 1 : T;
        Vec s(len);
        for (int64_t j = 0; j < len; ++j) {
          s[j] = 0;
          for (int64_t d = 0; d < D; ++d) s[j] += at(b, i, h, 0, d) * at(b, j, h, 1, d) / std::sqrt(double(D));
        }
        const double m = *std::max_element(s.begin(), s.end());
        double sum = 0;
        for (double v : s) sum += std::exp(v - m);
        const double lse = m + std::log(sum);
        r.lse[(b * H + h) * T + i] = lse;
        for (int64_t j = 0; j < len; ++j) {
          double p = std::exp(s[j] - lse);
          if (o.dropout_p > 0)
            p = dropout_uniform(o.seed, o.site, o.sample_offset + b, (o.head_offset + h) * T + i, j) >= o.dropout_p
                    ? p / (1.0 - o.dropout_p)
                    : 0.0;
          for (int64_t d = 0; d < D; ++d) r.out[((b * T + i) * H + h) * D + d] += p * at(b, j, h, 2, d);
        }
      }
  return r;
}

struct AttnCase {
  bool causal;
  float dropout_p;
};
class AttentionCases : public ::testing::TestWithParam<AttnCase> {};

TEST_P(AttentionCases, ForwardMatchesDoubleAndBackwardMatchesFiniteDifferences) {
  const int64_t B = 2, T = 6, H = 2, D = 4;
  const AttentionOptions opt{.causal = GetParam().causal,
                             .dropout_p = GetParam().dropout_p,
                             .seed = 9,
                             .site = stream_id("layers.1.attn.probs"),
                             .sample_offset = 3,
                             .head_offset = 2};
  const Vec qkv = rand_vec(B * T * H * 3 * D, 38, -1.5, 1.5), w = rand_vec(B * T * H * D, 39);
  Tensor QKV = make(qkv, {B, T, H, 3, D}), out = Tensor::empty({B, T, H, D}, DType::f32);
  Tensor lse = Tensor::empty({B, H, T}, DType::f32), dqkv = Tensor::empty({B, T, H, 3, D}, DType::f32);
  attention_forward(QKV, out, lse, opt);
  const AttnRef ref = attention_ref(qkv, B, T, H, D, opt);
  EXPECT_CLOSE(values(out), ref.out, kFwdTol);
  EXPECT_CLOSE(values(lse), ref.lse, kFwdTol);
  attention_backward(QKV, out, lse, make(w, {B, T, H, D}), dqkv, opt);
  auto f = [&](const Vec& v) { return attention_ref(v, B, T, H, D, opt).out; };
  EXPECT_CLOSE(values(dqkv), fd_grad(f, qkv, w), kGradTol);
}

INSTANTIATE_TEST_SUITE_P(Attention, AttentionCases,
                         ::testing::Values(AttnCase{true, 0.f}, AttnCase{true, 0.25f}, AttnCase{false, 0.f},
                                           AttnCase{false, 0.25f}),
                         [](const auto& info) {
                           return std::string(info.param.causal ? "Causal" : "Full") +
                                  (info.param.dropout_p > 0 ? "WithDropout" : "NoDropout");
                         });

// Heads split over two "tensor-parallel ranks" with head_offset give the whole computation's out, lse and
// dqkv exactly (the dropout mask is keyed by the global head).
TEST(Attention, HeadShardsWithHeadOffsetEqualTheWhole) {
  const int64_t B = 2, T = 5, H = 4, D = 3;
  const AttentionOptions opt{.dropout_p = 0.2f, .seed = 1, .site = 77, .sample_offset = 6};
  Tensor qkv = make(rand_vec(B * T * H * 3 * D, 40), {B, T, H, 3, D});
  Tensor dout = make(rand_vec(B * T * H * D, 41), {B, T, H, D});
  auto run = [&](const Tensor& q, const Tensor& d, int64_t head_offset) {
    const int64_t h = q.dim(2);
    AttentionOptions o = opt;
    o.head_offset = head_offset;
    std::vector<Tensor> r = {Tensor::empty({B, T, h * D}, DType::f32), Tensor::empty({B, h, T}, DType::f32),
                             Tensor::empty(q.shape(), DType::f32)};
    attention_forward(q, r[0], r[1], o);  // out as the (B, T, H * D) view the models use
    attention_backward(q, r[0], r[1], d.view({B, T, h * D}), r[2], o);
    r[0] = r[0].view({B, T, h, D});
    return r;
  };
  const std::vector<Tensor> whole = run(qkv, dout, 0);
  const std::vector<Tensor> lo = run(take(qkv, 2, 0, 1), take(dout, 2, 0, 1), 0);
  const std::vector<Tensor> hi = run(take(qkv, 2, 1, H), take(dout, 2, 1, H), 1);
  EXPECT_EQ(concat(lo[0], hi[0], 2), values(whole[0]));
  EXPECT_EQ(concat(lo[1], hi[1], 1), values(whole[1]));
  EXPECT_EQ(concat(lo[2], hi[2], 2), values(whole[2]));
}

// ---- grouped-query attention ----
// qkv (B, T, G, R + 2, D) expanded to the one-head-per-key layout (B, T, H = G R, 3, D): head h = g R + r gets
// query slot r of group g and the group's key and value. The straightforward reference of grouped-query
// attention is attention on this expansion.
Vec expand_groups(const Vec& qkv, int64_t B, int64_t T, int64_t G, int64_t R, int64_t D) {
  Vec e(B * T * G * R * 3 * D);
  for (int64_t bt = 0; bt < B * T; ++bt)
    for (int64_t g = 0; g < G; ++g)
      for (int64_t r = 0; r < R; ++r)
        for (int64_t w = 0; w < 3; ++w) {  // query, key, value
          const int64_t slot = w == 0 ? r : R + w - 1;
          for (int64_t d = 0; d < D; ++d)
            e[(((bt * G + g) * R + r) * 3 + w) * D + d] = qkv[((bt * G + g) * (R + 2) + slot) * D + d];
        }
  return e;
}

// The gradient of the grouped qkv from that of its expansion: each query slot takes its head's query gradient,
// the group's key and value take the sums of their R heads' gradients in the order r = 0..R-1 (in F: double
// for references, float to replay the op's fp32 sums).
template <class F>
std::vector<F> collapse_groups(const Vec& dexp, int64_t B, int64_t T, int64_t G, int64_t R, int64_t D) {
  const int64_t BT = B * T;
  std::vector<F> d(BT * G * (R + 2) * D, F(0));
  for (int64_t bt = 0; bt < BT; ++bt)
    for (int64_t g = 0; g < G; ++g)
      for (int64_t r = 0; r < R; ++r)
        for (int64_t w = 0; w < 3; ++w) {
          const int64_t slot = w == 0 ? r : R + w - 1;
          for (int64_t dd = 0; dd < D; ++dd) {
            F& to = d[((bt * G + g) * (R + 2) + slot) * D + dd];
            const F x = static_cast<F>(dexp[(((bt * G + g) * R + r) * 3 + w) * D + dd]);
            to = (w == 0 || r == 0) ? x : to + x;  // the first head's copied (no 0 + x), as the op does
          }
        }
  return d;
}

struct GqaCase {
  int64_t G, R;
  float dropout_p;
};
class GroupedQueryAttention : public ::testing::TestWithParam<GqaCase> {};

// The op on qkv (B, T, G, R + 2, D) against the double reference on the expansion: out and lse directly, dqkv
// against the expansion's finite-difference gradients collapsed (dk, dv: summed over the group's heads).
TEST_P(GroupedQueryAttention, MatchesTheExpandedReference) {
  const auto [G, R, p] = GetParam();
  const int64_t B = 2, T = 5, D = 4, H = G * R;
  const AttentionOptions opt{.dropout_p = p, .seed = 4, .site = 17, .sample_offset = 1, .head_offset = 3};
  const Vec qkv = rand_vec(B * T * G * (R + 2) * D, 42, -1.5, 1.5), w = rand_vec(B * T * H * D, 43);
  const Vec qkv_e = expand_groups(qkv, B, T, G, R, D);
  Tensor QKV = make(qkv, {B, T, G, R + 2, D}), out = Tensor::empty({B, T, H, D}, DType::f32);
  Tensor lse = Tensor::empty({B, H, T}, DType::f32), dqkv = Tensor::empty({B, T, G, R + 2, D}, DType::f32);
  attention_forward(QKV, out, lse, opt);
  const AttnRef ref = attention_ref(qkv_e, B, T, H, D, opt);
  EXPECT_CLOSE(values(out), ref.out, kFwdTol);
  EXPECT_CLOSE(values(lse), ref.lse, kFwdTol);
  attention_backward(QKV, out, lse, make(w, {B, T, H, D}), dqkv, opt);
  auto f = [&](const Vec& v) { return attention_ref(v, B, T, H, D, opt).out; };
  EXPECT_CLOSE(values(dqkv), collapse_groups<double>(fd_grad(f, qkv_e, w), B, T, G, R, D), kGradTol);
}

// Bit for bit: each query head of the grouped op computes exactly what the one-head-per-key op (R = 1, GPT's
// layout) computes on the expansion, and the group's dk, dv are the fp32 sums of those heads' gradients in
// the order r = 0..R-1. With R = 1 the expansion is the input itself: the old layout and arithmetic.
TEST_P(GroupedQueryAttention, EqualsTheOneHeadPerKeyOpOnTheExpansion) {
  const auto [G, R, p] = GetParam();
  const int64_t B = 2, T = 70, D = 8, H = G * R;  // T > 64: two row blocks
  const AttentionOptions opt{.dropout_p = p, .seed = 5, .site = 23, .sample_offset = 2, .head_offset = 1};
  const Vec qkv = rand_vec(B * T * G * (R + 2) * D, 44, -2, 2), w = rand_vec(B * T * H * D, 45);
  auto run = [&](const Tensor& q) {
    std::vector<Tensor> r = {Tensor::empty({B, T, H, D}, DType::f32), Tensor::empty({B, H, T}, DType::f32),
                             Tensor::empty(q.shape(), DType::f32)};
    attention_forward(q, r[0], r[1], opt);
    attention_backward(q, r[0], r[1], make(w, {B, T, H, D}), r[2], opt);
    return r;
  };
  const std::vector<Tensor> grouped = run(make(qkv, {B, T, G, R + 2, D}));
  const std::vector<Tensor> expanded = run(make(expand_groups(qkv, B, T, G, R, D), {B, T, H, 3, D}));
  EXPECT_EQ(values(grouped[0]), values(expanded[0]));
  EXPECT_EQ(values(grouped[1]), values(expanded[1]));
  const std::vector<float> want = collapse_groups<float>(values(expanded[2]), B, T, G, R, D);
  EXPECT_EQ(grouped[2].to_floats(), want);
}

INSTANTIATE_TEST_SUITE_P(Attention, GroupedQueryAttention,
                         ::testing::Values(GqaCase{2, 1, 0.f}, GqaCase{2, 2, 0.f}, GqaCase{2, 4, 0.f},
                                           GqaCase{1, 2, 0.f}, GqaCase{1, 4, 0.f}, GqaCase{1, 1, 0.25f},
                                           GqaCase{2, 2, 0.25f}, GqaCase{1, 4, 0.25f}),
                         [](const auto& info) {
                           return "G" + std::to_string(info.param.G) + "R" + std::to_string(info.param.R) +
                                  (info.param.dropout_p > 0 ? "WithDropout" : "NoDropout");
                         });

// Groups split over two "tensor-parallel ranks" (head_offset = the first rank's query heads) give the whole
// computation's out, lse and dqkv exactly.
TEST(Attention, GroupShardsWithHeadOffsetEqualTheWhole) {
  const int64_t B = 2, T = 5, G = 4, R = 2, D = 3, H = G * R;
  const AttentionOptions opt{.dropout_p = 0.2f, .seed = 1, .site = 78, .sample_offset = 6};
  Tensor qkv = make(rand_vec(B * T * G * (R + 2) * D, 46), {B, T, G, R + 2, D});
  Tensor dout = make(rand_vec(B * T * H * D, 47), {B, T, H, D});
  auto run = [&](const Tensor& q, const Tensor& d, int64_t head_offset) {
    const int64_t h = q.dim(2) * R;
    AttentionOptions o = opt;
    o.head_offset = head_offset;
    std::vector<Tensor> r = {Tensor::empty({B, T, h * D}, DType::f32), Tensor::empty({B, h, T}, DType::f32),
                             Tensor::empty(q.shape(), DType::f32)};
    attention_forward(q, r[0], r[1], o);
    attention_backward(q, r[0], r[1], d.view({B, T, h * D}), r[2], o);
    r[0] = r[0].view({B, T, h, D});
    return r;
  };
  const std::vector<Tensor> whole = run(qkv, dout, 0);
  const std::vector<Tensor> lo = run(take(qkv, 2, 0, 1), take(dout, 2, 0, R), 0);
  const std::vector<Tensor> hi = run(take(qkv, 2, 1, G), take(dout, 2, R, H), R);
  EXPECT_EQ(concat(lo[0], hi[0], 2), values(whole[0]));
  EXPECT_EQ(concat(lo[1], hi[1], 1), values(whole[1]));
  EXPECT_EQ(concat(lo[2], hi[2], 2), values(whole[2]));
}

// bf16 / fp16 storage: the fp32 op on the same values, rounded once (dk, dv summed over the group in fp32).
TEST(Attention, GroupedHalfStorageIsTheFp32OpRoundedOnce) {
  const int64_t B = 2, T = 4, G = 2, R = 3, D = 4, H = G * R;
  const Vec qkv = rand_vec(B * T * G * (R + 2) * D, 48, -2, 2), w = rand_vec(B * T * H * D, 49);
  const AttentionOptions opt{.dropout_p = 0.1f, .seed = 2, .site = 3};
  for (DType dt : {DType::bf16, DType::f16}) {
    auto run = [&](DType io, const Vec& in, const Vec& dout) {
      std::vector<Tensor> r = {Tensor::empty({B, T, H, D}, io), Tensor::empty({B, H, T}, DType::f32),
                               Tensor::empty({B, T, G, R + 2, D}, io)};
      const Tensor q = make(in, {B, T, G, R + 2, D}, io);
      attention_forward(q, r[0], r[1], opt);
      attention_backward(q, r[0], r[1], make(dout, {B, T, H, D}, io), r[2], opt);
      return r;
    };
    const std::vector<Tensor> got = run(dt, qkv, w), ref = run(DType::f32, rounded(qkv, dt), rounded(w, dt));
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_EQ(values(got[i]), rounded(values(ref[i]), got[i].dtype())) << "output " << i << " in " << dtype_name(dt);
  }
}

TEST(Attention, GroupedShapeErrorsNameTheShapes) {
  auto f32 = [](Shape s) { return Tensor::zeros(std::move(s), DType::f32); };
  Tensor qkv = f32({1, 4, 2, 4, 8}), out = f32({1, 4, 4, 8}), lse = f32({1, 4, 4});  // G 2, R 2: H 4
  Tensor out_g = f32({1, 4, 2, 8}), lse_g = f32({1, 2, 4}), qkv_r0 = f32({1, 4, 2, 2, 8}), qkv4 = f32({1, 4, 8, 8});
  expect_invalid([&] { attention_forward(qkv, out_g, lse, {}); },
                 "attention_forward: out: expected shape [1, 4, 4, 8] (B, T, H = G * R, D) or its view [1, 4, 32] "
                 "for qkv [1, 4, 2, 4, 8], got [1, 4, 2, 8]");
  expect_invalid([&] { attention_forward(qkv, out, lse_g, {}); },
                 "attention_forward: lse: expected shape [1, 4, 4] (B, H = G * R, T) for qkv [1, 4, 2, 4, 8], got "
                 "[1, 2, 4]");
  expect_invalid([&] { attention_forward(qkv_r0, out, lse, {}); },
                 "attention_forward: qkv: expected shape (B, T, G, R + 2, D) with R >= 1");
  expect_invalid([&] { attention_forward(qkv4, out, lse, {}); },
                 "attention_forward: qkv: expected a 5-D tensor (B, T, G, R + 2, D)");
  Tensor dqkv = f32({1, 4, 2, 3, 8});
  expect_invalid([&] { attention_backward(qkv, out, lse, out, dqkv, {}); },
                 "attention_backward: dqkv: expected shape [1, 4, 2, 4, 8]");
  Tensor view = out.view({1, 4, 32});
  attention_forward(qkv, view, lse, {});  // the (B, T, H * D) view is accepted
}

// Every attention call is counted by the implementation that ran it (the log and metrics.jsonl report the
// counts): on the CPU each forward and each backward counts one CPU call, and a call refused by its checks none.
TEST(Attention, CallsAreCountedByImplementation) {
  auto f32 = [](Shape s) { return Tensor::zeros(std::move(s), DType::f32); };
  Tensor qkv = f32({1, 4, 2, 3, 8}), out = f32({1, 4, 2, 8}), lse = f32({1, 2, 4}), dqkv = f32({1, 4, 2, 3, 8});
  const AttentionCalls before = attention_calls();
  attention_forward(qkv, out, lse, {});
  attention_backward(qkv, out, lse, out, dqkv, {});
  attention_forward(qkv, out, lse, {});
  Tensor bad_lse = f32({1, 3, 4});
  EXPECT_THROW(attention_forward(qkv, out, bad_lse, {}), std::invalid_argument);
  const AttentionCalls after = attention_calls();
  EXPECT_EQ(after.cpu - before.cpu, 3);
  EXPECT_EQ(after.cudnn - before.cudnn, 0);
  EXPECT_EQ(after.kernel - before.kernel, 0);
}
// ---- end grouped-query attention ----

// ---- rotary position embedding ------------------------------------------------------------------

struct QkvShape {
  int64_t B, T, G, R, D;
  int64_t S() const { return R + 2; }
  int64_t numel() const { return B * T * G * S() * D; }
  Shape shape() const { return {B, T, G, S(), D}; }
};
void PrintTo(const QkvShape& q, std::ostream* os) {
  *os << "(B " << q.B << ", T " << q.T << ", G " << q.G << ", R " << q.R << ", D " << q.D << ")";
}

// rope_ in double: inv_freq, angle, cos and sin all in double (the op rounds them to fp32, an error of a few
// fp32 ulps of the angle, well inside kFwdTol for the small positions used here). fp32_angle: the angle as
// ops.h defines it, float(p) * float(inv_freq) rounded to fp32 (what far positions need: an fp32 angle of
// 1e5 rad is only good to 4e-3 rad, by definition).
Vec rope_ref(Vec x, const QkvShape& q, double theta, int64_t offset, bool inverse, bool fp32_angle = false) {
  const int64_t half = q.D / 2;
  for (int64_t b = 0; b < q.B; ++b)
    for (int64_t t = 0; t < q.T; ++t)
      for (int64_t g = 0; g < q.G; ++g)
        for (int64_t slot = 0; slot <= q.R; ++slot) {
          double* v = x.data() + (((b * q.T + t) * q.G + g) * q.S() + slot) * q.D;
          for (int64_t i = 0; i < half; ++i) {
            const double inv_freq = 1 / std::pow(theta, 2.0 * i / q.D);
            double a = double(offset + t) * inv_freq;
            if (fp32_angle) a = static_cast<float>(offset + t) * static_cast<float>(inv_freq);
            if (inverse) a = -a;
            const double x0 = v[i], x1 = v[i + half];
            v[i] = x0 * std::cos(a) - x1 * std::sin(a);
            v[i + half] = x1 * std::cos(a) + x0 * std::sin(a);
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

// ---- cross-entropy -------------------------------------------------------------------------------

Vec cross_entropy_ref(const Vec& logits, const std::vector<int32_t>& targets, int64_t N, int64_t V) {
  Vec loss(N);
  for (int64_t n = 0; n < N; ++n) {
    const double m = *std::max_element(logits.begin() + n * V, logits.begin() + (n + 1) * V);
    double sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(logits[n * V + v] - m);
    loss[n] = std::log(sum) + m - logits[n * V + targets[n]];
  }
  return loss;
}

// The four split functions on one shard; returns (losses, dlogits).
std::pair<Tensor, Tensor> cross_entropy_all(const Tensor& logits, const Tensor& targets, const Tensor& dloss) {
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

TEST(CrossEntropy, LossMatchesDoubleAndBackwardMatchesFiniteDifferences) {
  const int64_t N = 5, V = 11;
  const std::vector<int32_t> targets = {0, 10, 3, 3, 7};
  const Vec logits = rand_vec(N * V, 42, -3, 3), dloss = rand_vec(N, 43);
  auto [losses, dlogits] = cross_entropy_all(make(logits, {N, V}), Tensor::from_ints(targets, {N}), make(dloss, {N}));
  EXPECT_CLOSE(values(losses), cross_entropy_ref(logits, targets, N, V), kFwdTol);
  auto f = [&](const Vec& l) { return cross_entropy_ref(l, targets, N, V); };
  EXPECT_CLOSE(values(dlogits), fd_grad(f, logits, dloss), kGradTol);
}

// Two vocabulary shards exchanging only row statistics (max of rowmax, sums of sumexp and target_logit)
// give the unsharded loss and, shard by shard, the unsharded dlogits.
TEST(CrossEntropy, VocabularyShardsCombineToTheUnshardedLoss) {
  const int64_t N = 6, V = 13, V0 = 7;
  const std::vector<int32_t> targets = {0, 12, 6, 7, 3, 9};  // on both sides of the shard boundary
  const Vec logits = rand_vec(N * V, 44, -4, 4), dl = rand_vec(N, 45);
  Tensor Logits = make(logits, {N, V}), Targets = Tensor::from_ints(targets, {N}), dloss = make(dl, {N});
  auto [want_loss, want_dlogits] = cross_entropy_all(Logits, Targets, dloss);

  const Tensor shard[2] = {take(Logits, 1, 0, V0), take(Logits, 1, V0, V)};
  const int64_t start[2] = {0, V0};
  Tensor rowmax[2], sumexp[2], tl[2];
  Tensor gmax = Tensor::empty({N}, DType::f32), gsum = Tensor::zeros({N}, DType::f32),
         gtl = Tensor::zeros({N}, DType::f32), losses = Tensor::empty({N}, DType::f32);
  for (int s = 0; s < 2; ++s) {
    rowmax[s] = Tensor::empty({N}, DType::f32);
    cross_entropy_rowmax(shard[s], rowmax[s]);
  }
  for (int64_t n = 0; n < N; ++n)
    gmax.data<float>()[n] = std::max(rowmax[0].data<float>()[n], rowmax[1].data<float>()[n]);
  for (int s = 0; s < 2; ++s) {
    sumexp[s] = Tensor::empty({N}, DType::f32);
    tl[s] = Tensor::empty({N}, DType::f32);
    cross_entropy_partials(shard[s], Targets, gmax, sumexp[s], tl[s], {.vocab_start = start[s]});
    add(gsum, sumexp[s], gsum);
    add(gtl, tl[s], gtl);
  }
  cross_entropy_loss(gmax, gsum, gtl, losses);
  EXPECT_CLOSE(values(losses), values(want_loss), 1e-6);
  Tensor d[2] = {Tensor::empty(shard[0].shape(), DType::f32), Tensor::empty(shard[1].shape(), DType::f32)};
  for (int s = 0; s < 2; ++s)
    cross_entropy_backward(shard[s], Targets, gmax, gsum, dloss, d[s], {.vocab_start = start[s]});
  EXPECT_CLOSE(concat(d[0], d[1], 1), values(want_dlogits), 1e-6);
}

// Vocabulary padding (columns >= vocab_size, here spread over two shards) is left out of the softmax:
// the loss equals that of the unpadded logits and the padding columns get zero gradient.
TEST(CrossEntropy, PaddingColumnsAreExcluded) {
  const int64_t N = 4, V = 9, Vpad = 12, V0 = 6;
  const std::vector<int32_t> targets = {0, 8, 5, 6};
  const Vec logits = rand_vec(N * Vpad, 48, -3, 3), dl = rand_vec(N, 49);
  Tensor Logits = make(logits, {N, Vpad}), Targets = Tensor::from_ints(targets, {N}), dloss = make(dl, {N});
  Vec real(N * V);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t v = 0; v < V; ++v) real[n * V + v] = logits[n * Vpad + v];
  auto [want_loss, want_dlogits] = cross_entropy_all(make(real, {N, V}), Targets, dloss);

  const Tensor shard[2] = {take(Logits, 1, 0, V0), take(Logits, 1, V0, Vpad)};
  Tensor rowmax[2], sumexp[2], tl[2], d[2];
  Tensor gmax = Tensor::empty({N}, DType::f32), gsum = Tensor::zeros({N}, DType::f32),
         gtl = Tensor::zeros({N}, DType::f32), losses = Tensor::empty({N}, DType::f32);
  for (int s = 0; s < 2; ++s) {
    rowmax[s] = Tensor::empty({N}, DType::f32);
    cross_entropy_rowmax(shard[s], rowmax[s], {.vocab_start = s * V0, .vocab_size = V});
  }
  for (int64_t n = 0; n < N; ++n)
    gmax.data<float>()[n] = std::max(rowmax[0].data<float>()[n], rowmax[1].data<float>()[n]);
  for (int s = 0; s < 2; ++s) {
    sumexp[s] = Tensor::empty({N}, DType::f32);
    tl[s] = Tensor::empty({N}, DType::f32);
    cross_entropy_partials(shard[s], Targets, gmax, sumexp[s], tl[s], {.vocab_start = s * V0, .vocab_size = V});
    add(gsum, sumexp[s], gsum);
    add(gtl, tl[s], gtl);
    d[s] = Tensor::empty(shard[s].shape(), DType::f32);
  }
  cross_entropy_loss(gmax, gsum, gtl, losses);
  EXPECT_CLOSE(values(losses), values(want_loss), 1e-6);
  for (int s = 0; s < 2; ++s)
    cross_entropy_backward(shard[s], Targets, gmax, gsum, dloss, d[s], {.vocab_start = s * V0, .vocab_size = V});
  const Vec got = concat(d[0], d[1], 1), want = values(want_dlogits);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t v = 0; v < Vpad; ++v)
      EXPECT_NEAR(got[n * Vpad + v], v < V ? want[n * V + v] : 0.0, 1e-6) << n << "," << v;
}

// ---- optimizer ops -------------------------------------------------------------------------------

TEST(OptimizerOps, AdamWMatchesADoubleReferenceOverSteps) {
  const int64_t n = 50;
  const AdamWOptions base{
      .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_scale = 0.5f};
  Vec p = rand_vec(n, 46), m(n, 0.0), v(n, 0.0);
  Tensor master = make(p, {n}), exp_avg = Tensor::zeros({n}, DType::f32), exp_avg_sq = Tensor::zeros({n}, DType::f32);
  for (int64_t step = 1; step <= 3; ++step) {
    const Vec g = rand_vec(n, 47 + static_cast<uint32_t>(step), -2, 2);
    AdamWOptions o = base;
    o.step = step;
    adamw_step(master, make(g, {n}), exp_avg, exp_avg_sq, o);
    const double b1 = o.beta1, b2 = o.beta2, lr = o.lr, wd = o.weight_decay;
    for (int64_t i = 0; i < n; ++i) {
      const double gi = g[i] * o.grad_scale;
      m[i] = b1 * m[i] + (1 - b1) * gi;
      v[i] = b2 * v[i] + (1 - b2) * gi * gi;
      const double mhat = m[i] / (1 - std::pow(b1, step)), vhat = v[i] / (1 - std::pow(b2, step));
      p[i] -= lr * (mhat / (std::sqrt(vhat) + o.eps) + wd * p[i]);
    }
    EXPECT_CLOSE(values(exp_avg), m, 1e-6);
    EXPECT_CLOSE(values(exp_avg_sq), v, 1e-6);
    EXPECT_CLOSE(values(master), p, 1e-6);
  }
}

TEST(OptimizerOps, SumSquaresAndInfNanCheck) {
  const Vec x = rand_vec(1000, 50, -3, 3);
  double want = 0;
  for (double v : x) want += v * v;
  EXPECT_NEAR(sum_squares(make(x, {10, 100})), want, 1e-9 * want);
  // Several tensors at once (the gradient norm): the same total, empty tensors and lists included.
  const Tensor whole = make(x, {1000});
  EXPECT_NEAR(sum_squares(std::vector<Tensor>{whole.slice(0, 1), whole.slice(1, 1), whole.slice(1, 600),
                                              whole.slice(600, 1000)}),
              want, 1e-9 * want);
  EXPECT_EQ(sum_squares(std::vector<Tensor>{}), 0.0);
  EXPECT_THROW(sum_squares(std::vector<Tensor>{whole, make(x, {1000}, DType::bf16)}), std::invalid_argument);
  EXPECT_FALSE(has_inf_or_nan(make(x, {1000})));
  EXPECT_FALSE(has_inf_or_nan(make({3e38, -3e38, 0}, {3})));
  for (double bad : {double(INFINITY), -double(INFINITY), double(NAN)})
    for (int64_t at : {0, 517, 999}) {
      Vec y = x;
      y[at] = bad;
      EXPECT_TRUE(has_inf_or_nan(make(y, {1000}))) << bad << " at " << at;
    }
}

// ---- fused step ops ------------------------------------------------------------------------------

std::vector<uint32_t> bits(const Tensor& t) {
  std::vector<uint32_t> out;
  for (float f : t.to_floats()) out.push_back(std::bit_cast<uint32_t>(f));
  return out;
}

// The multi-tensor AdamW is the per-tensor one bit for bit (masters, moments), decay flags and all, and
// writes each value as the master rounded to its dtype, over several steps.
TEST(FusedStepOps, MultiTensorAdamWEqualsPerTensorBitForBit) {
  for (DType value_dt : {DType::f32, DType::bf16, DType::f16}) {
    const std::vector<int64_t> sizes{7, 0, 300, 1, 4097};
    struct State {
      Tensor master, m, v, value;
    };
    std::vector<State> fused, single;
    for (size_t k = 0; k < sizes.size(); ++k) {
      const Vec p = rand_vec(sizes[k], 600 + static_cast<uint32_t>(k));
      for (auto* set : {&fused, &single})
        set->push_back({make(p, {sizes[k]}), Tensor::zeros({sizes[k]}, DType::f32),
                        Tensor::zeros({sizes[k]}, DType::f32), make(p, {sizes[k]}, value_dt)});
    }
    for (int64_t step = 1; step <= 4; ++step) {
      const AdamWOptions opt{.lr = 1e-2f,
                             .beta1 = 0.9f,
                             .beta2 = 0.95f,
                             .eps = 1e-8f,
                             .weight_decay = 0.1f,
                             .step = step,
                             .grad_scale = 0.37f};
      std::vector<AdamWTensors> ts;
      for (size_t k = 0; k < sizes.size(); ++k) {
        const Tensor g = make(rand_vec(sizes[k], 700 + static_cast<uint32_t>(10 * step + k), -2, 2), {sizes[k]});
        const bool decay = k % 2 == 0;
        ts.push_back({.master = fused[k].master,
                      .grad = g,
                      .exp_avg = fused[k].m,
                      .exp_avg_sq = fused[k].v,
                      .value = value_dt == DType::f32 ? Tensor() : fused[k].value,
                      .decay = decay});
        AdamWOptions one = opt;
        one.weight_decay = decay ? opt.weight_decay : 0.f;
        adamw_step(single[k].master, g, single[k].m, single[k].v, one);
        single[k].value.copy_from(single[k].master);
      }
      adamw_multi_step(ts, opt);
      for (size_t k = 0; k < sizes.size(); ++k) {
        const std::string what =
            std::string(dtype_name(value_dt)) + " tensor " + std::to_string(k) + " step " + std::to_string(step);
        EXPECT_EQ(bits(fused[k].master), bits(single[k].master)) << what;
        EXPECT_EQ(bits(fused[k].m), bits(single[k].m)) << what;
        EXPECT_EQ(bits(fused[k].v), bits(single[k].v)) << what;
        if (value_dt != DType::f32) {
          EXPECT_EQ(bits(fused[k].value), bits(single[k].value)) << what;
        }
      }
    }
  }
}

// One pass gives the sum of squares in buffer order, in double (the reference order, exactly) and the inf/NaN
// verdict; sum_squares and has_inf_or_nan report the same pass.
TEST(FusedStepOps, GradStatsEqualSumSquaresAndInfCheck) {
  const Vec x = rand_vec(1000, 610, -3, 3);
  const Tensor whole = make(x, {1000});
  const std::vector<Tensor> parts{whole.slice(0, 1), whole.slice(1, 1), whole.slice(1, 600), whole.slice(600, 1000)};
  const GradStats st = grad_stats(parts);
  double in_order = 0.0;
  for (float v : whole.to_floats()) in_order += static_cast<double>(v) * v;
  EXPECT_EQ(st.sum_squares, in_order);
  EXPECT_EQ(sum_squares(parts), in_order);
  EXPECT_FALSE(st.found_inf);
  // The device-side form: [sum, flag] as f64.
  Tensor out = f64_zeros(2, Device::cpu);
  grad_stats(parts, out);
  EXPECT_EQ(read_f64(out), (std::vector<double>{st.sum_squares, 0.0}));
  const GradStats none = grad_stats(std::vector<Tensor>{});
  EXPECT_EQ(none.sum_squares, 0.0);
  EXPECT_FALSE(none.found_inf);
  EXPECT_FALSE(grad_stats({make({3e38, -3e38, 0}, {3})}).found_inf);  // large but finite
  for (double bad : {double(INFINITY), -double(INFINITY), double(NAN)})
    for (int64_t at : {0, 517, 999}) {
      Vec y = x;
      y[at] = bad;
      const Tensor t = make(y, {1000});
      const GradStats b = grad_stats({whole.slice(0, 10), t.slice(0, 600), t.slice(600, 1000)});
      EXPECT_TRUE(b.found_inf) << bad << " at " << at;
      EXPECT_EQ(b.found_inf, has_inf_or_nan(t));
      EXPECT_FALSE(std::isfinite(b.sum_squares)) << bad << " at " << at;
    }
}

// The loss accumulated on the device is the host reading's value: the double sum, the mean rounded to f32.
TEST(FusedStepOps, AccumulateMeanIsTheHostReading) {
  Tensor sum = f64_zeros(1, Device::cpu);
  double want = 0;
  for (uint32_t k = 0; k < 3; ++k) {
    const Vec l = rand_vec(37 + k, 620 + k, 0, 9);
    double s = 0;
    for (double v : l) s += static_cast<float>(v);
    want += static_cast<float>(s / static_cast<double>(l.size()));
    accumulate_mean(make(l, {static_cast<int64_t>(l.size())}), sum);
  }
  EXPECT_EQ(read_f64(sum)[0], want);
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    Tensor x = Tensor::zeros({1500}, dt);
    fill_(x, 0.1f);
    for (float v : x.to_floats()) ASSERT_EQ(v, round_to(dt, 0.1f)) << dtype_name(dt);
  }
}

TEST(FusedStepOps, ArgumentErrors) {
  const Tensor a = Tensor::zeros({4}, DType::f32), b = Tensor::zeros({5}, DType::f32);
  Tensor stats = f64_zeros(3, Device::cpu);
  EXPECT_THROW(grad_stats({a}, stats), std::invalid_argument);
  EXPECT_THROW(grad_stats({Tensor::zeros({4}, DType::bf16)}), std::invalid_argument);
  EXPECT_THROW(adamw_multi_step({{.master = a, .grad = b, .exp_avg = a, .exp_avg_sq = a}}, {}), std::invalid_argument);
  EXPECT_THROW(adamw_multi_step(
                   {{.master = a, .grad = a, .exp_avg = a, .exp_avg_sq = a, .value = Tensor::zeros({4}, DType::bf16)},
                    {.master = a, .grad = a, .exp_avg = a, .exp_avg_sq = a, .value = Tensor::zeros({4}, DType::f16)}},
                   {}),
               std::invalid_argument);
  Tensor sum = f64_zeros(1, Device::cpu);
  EXPECT_THROW(accumulate_mean(Tensor::zeros({0}, DType::f32), sum), std::invalid_argument);
}

// ---- bf16 / fp16 storage -------------------------------------------------------------------------

// run(dt, in) makes its inputs with in(values, shape) and its outputs in dtype dt (f32 for parameter
// gradients and statistics) and returns them. With half storage the outputs must equal those of the fp32
// op on the same (rounded) input values, rounded to the half dtype: bit-exact emulation.
using MakeInput = std::function<Tensor(const Vec&, Shape)>;
void expect_emulated(const std::function<std::vector<Tensor>(DType, const MakeInput&)>& run, const char* what) {
  for (DType dt : {DType::bf16, DType::f16}) {
    const std::vector<Tensor> got = run(dt, [&](const Vec& v, Shape s) { return make(v, std::move(s), dt); });
    const std::vector<Tensor> ref =
        run(DType::f32, [&](const Vec& v, Shape s) { return make(rounded(v, dt), std::move(s), DType::f32); });
    ASSERT_EQ(got.size(), ref.size());
    for (size_t i = 0; i < got.size(); ++i) {
      const Vec want = rounded(values(ref[i]), got[i].dtype());
      EXPECT_EQ(values(got[i]), want) << what << " output " << i << " in " << dtype_name(dt);
    }
  }
}

TEST(HalfStorage, OpsEqualTheFp32OpRoundedOnce) {
  const int64_t N = 6, C = 8, B = 2, T = 3, H = 2, D = 4, V = 9;
  const Vec a = rand_vec(N * C, 51, -3, 3), b = rand_vec(N * C, 52), c = rand_vec(C, 53), c2 = rand_vec(C, 60);
  const std::vector<int32_t> ids = {1, 8, 0, 4, 4, 7};
  auto f32 = [](Shape s) { return Tensor::empty(std::move(s), DType::f32); };
  expect_emulated(
      [&](DType dt, const MakeInput& in) {
        Tensor out = Tensor::empty({N, C}, dt);
        add(in(a, {N, C}), in(b, {N, C}), out);
        Tensor x = in(a, {N, C}), y = in(b, {N, C});
        scale_(x, 0.3f);
        add_bias(y, in(c, {C}));
        return std::vector<Tensor>{out, x, y};
      },
      "add, scale_, add_bias");
  expect_emulated(
      [&](DType dt, const MakeInput& in) {
        Tensor g = Tensor::empty({N, C}, dt), dg = Tensor::empty({N, C}, dt), db = Tensor::zeros({C}, DType::f32);
        gelu_forward(in(a, {N, C}), g);
        gelu_backward(in(a, {N, C}), in(b, {N, C}), dg);
        bias_backward(in(b, {N, C}), db);
        return std::vector<Tensor>{g, dg, db};
      },
      "gelu, bias_backward");
  expect_emulated(
      [&](DType dt, const MakeInput& in) {
        Tensor out = Tensor::empty({N, C}, dt), mean = f32({N}), rstd = f32({N}), dx = Tensor::empty({N, C}, dt);
        Tensor dw = Tensor::zeros({C}, DType::f32), db = Tensor::zeros({C}, DType::f32);
        layernorm_forward(in(a, {N, C}), in(c, {C}), in(c2, {C}), out, mean, rstd);
        layernorm_backward(in(b, {N, C}), in(a, {N, C}), in(c, {C}), mean, rstd, dx, dw, db);
        return std::vector<Tensor>{out, mean, rstd, dx, dw, db};
      },
      "layernorm");
  expect_emulated(
      [&](DType dt, const MakeInput& in) {
        Tensor out = Tensor::empty({B, T, C}, dt), dtab = Tensor::zeros({V, C}, DType::f32);
        Tensor dwpe = Tensor::zeros({4, C}, DType::f32);
        embedding_forward(Tensor::from_ints(ids, {B, T}), in(rand_vec(V * C, 54), {V, C}), out);
        position_embedding_add(out, in(rand_vec(4 * C, 55), {4, C}), {.position_offset = 1});
        embedding_backward(Tensor::from_ints(ids, {B, T}), in(b, {B, T, C}), dtab);
        position_embedding_backward(in(b, {B, T, C}), dwpe, {.position_offset = 1});
        Tensor drop = Tensor::empty({B, T, C}, dt);
        dropout_forward(in(a, {B, T, C}), drop, {.p = 0.4f, .seed = 5, .site = 6});
        return std::vector<Tensor>{out, dtab, dwpe, drop};
      },
      "embeddings, dropout");
  expect_emulated(
      [&](DType dt, const MakeInput& in) {
        const Vec qkv = rand_vec(B * T * H * 3 * D, 56, -2, 2), dout = rand_vec(B * T * H * D, 57);
        const AttentionOptions opt{.dropout_p = 0.1f, .seed = 2, .site = 3};
        Tensor out = Tensor::empty({B, T, H, D}, dt), lse = f32({B, H, T}), dqkv = Tensor::empty({B, T, H, 3, D}, dt);
        attention_forward(in(qkv, {B, T, H, 3, D}), out, lse, opt);
        attention_backward(in(qkv, {B, T, H, 3, D}), out, lse, in(dout, {B, T, H, D}), dqkv, opt);
        return std::vector<Tensor>{out, lse, dqkv};
      },
      "attention");
  expect_emulated(
      [&](DType dt, const MakeInput& in) {
        auto [losses, dlogits] = cross_entropy_all(in(rand_vec(N * V, 58, -5, 5), {N, V}), Tensor::from_ints(ids, {N}),
                                                   make(rand_vec(N, 59), {N}));
        return std::vector<Tensor>{losses, dlogits};
      },
      "cross_entropy");
}

// ---- argument errors -----------------------------------------------------------------------------

TEST(OpErrors, NameTheOpAndTheArgument) {
  auto f32 = [](Shape s) { return Tensor::zeros(std::move(s), DType::f32); };
  Tensor x = f32({4, 64}), out = f32({4, 64}), mean = f32({4}), rstd = f32({4});
  expect_invalid([&] { layernorm_forward(x, f32({32}), f32({64}), out, mean, rstd); },
                 "layernorm_forward: weight: expected shape [64], got [32]");
  expect_invalid(
      [&] {
        Tensor dw = Tensor::zeros({64}, DType::bf16), db = f32({64}), dx = f32({4, 64});
        layernorm_backward(out, x, f32({64}), mean, rstd, dx, dw, db);
      },
      "layernorm_backward: dweight: expected dtype fp32, got bf16");
  Tensor c = f32({4, 5});
  expect_invalid([&] { gemm(f32({4, 3}), f32({5, 3}), c); }, "gemm: inner dimensions differ");
  expect_invalid([&] { gemm(f32({4, 3}), Tensor::zeros({3, 5}, DType::bf16), c); }, "gemm: b: expected dtype fp32");
  expect_invalid([&] { gemm(f32({4, 3}), f32({3, 6}), c); }, "gemm: out: expected shape [4, 6], got [4, 5]");
  expect_invalid([&] { add(x, Tensor::zeros({4, 64}, DType::bf16), out); }, "add: b: expected dtype fp32");
  expect_invalid([&] { add_bias(x, f32({63})); }, "add_bias: bias");
  expect_invalid([&] { dropout_forward(x, out, {.p = 0.1f}); }, "dropout_forward: x: expected a 3-D tensor");
  Tensor x3 = f32({2, 2, 64});
  expect_invalid([&] { dropout_forward(x3, x3, {.p = 1.f}); }, "dropout_forward: dropout probability");
  Tensor ids = Tensor::from_ints(std::vector<int32_t>{0, 1, 2, 3}, {2, 2});
  expect_invalid([&] { embedding_forward(ids, f32({5, 64}), out); }, "embedding_forward: out");
  expect_invalid(
      [&] {
        embedding_forward(f32({2, 2}), f32({5, 64}), x3);
      },
      "embedding_forward: ids: expected dtype i32");
  expect_invalid(
      [&] {
        position_embedding_add(x3, f32({3, 64}), {.position_offset = 2});
      },
      "position_embedding_add: position_offset");
  Tensor qkv = f32({1, 4, 2, 3, 8}), att = f32({1, 4, 2, 8}), lse = f32({1, 2, 4});
  expect_invalid([&] { attention_forward(qkv, att, mean, {}); }, "attention_forward: lse: expected shape [1, 2, 4]");
  expect_invalid([&] { attention_forward(f32({1, 4, 2, 2, 8}), att, lse, {}); }, "attention_forward: qkv");
  Tensor rowmax22 = f32({2, 2});
  expect_invalid([&] { cross_entropy_rowmax(x, rowmax22); }, "cross_entropy_rowmax: rowmax: expected shape [4]");
  expect_invalid([&] { cross_entropy_partials(x, f32({4}), mean, rstd, rstd); }, "cross_entropy_partials: targets");
  expect_invalid([&] { adamw_step(mean, rstd, rstd, rstd, {.step = 0}); }, "adamw_step: step");
  expect_invalid([&] { sum_squares(Tensor::zeros({3}, DType::bf16)); }, "sum_squares: x: expected dtype fp32");
  expect_invalid([&] { has_inf_or_nan(Tensor()); }, "has_inf_or_nan: x");
}

TEST(HalfStorage, LlamaOpsEqualTheFp32OpRoundedOnce) {
  const int64_t N = 6, C = 8, F = 5;
  const QkvShape q{2, 3, 2, 2, 6};
  const Vec a = rand_vec(N * C, 90, -3, 3), b = rand_vec(N * C, 91), c = rand_vec(C, 92, 0.5, 1.5);
  const Vec g = rand_vec(N * 2 * F, 93, -5, 5), dg = rand_vec(N * F, 94), qkv = rand_vec(q.numel(), 95, -2, 2);
  expect_emulated(
      [&](DType dt, const MakeInput& in) {
        Tensor out = Tensor::empty({N, C}, dt), rstd = Tensor::empty({N}, DType::f32), dx = Tensor::empty({N, C}, dt);
        Tensor dw = Tensor::zeros({C}, DType::f32);
        rmsnorm_forward(in(a, {N, C}), in(c, {C}), out, rstd);
        rmsnorm_backward(in(b, {N, C}), in(a, {N, C}), in(c, {C}), rstd, dx, dw);
        return std::vector<Tensor>{out, rstd, dx, dw};
      },
      "rmsnorm");
  expect_emulated(
      [&](DType dt, const MakeInput& in) {
        Tensor out = Tensor::empty({N, F}, dt), dx = Tensor::empty({N, 2 * F}, dt);
        swiglu_forward(in(g, {N, 2 * F}), out);
        swiglu_backward(in(g, {N, 2 * F}), in(dg, {N, F}), dx);
        return std::vector<Tensor>{out, dx};
      },
      "swiglu");
  expect_emulated(
      [&](DType dt, const MakeInput& in) {
        Tensor x = in(qkv, q.shape()), back = in(qkv, q.shape());
        rope_(x, {.position_offset = 2});
        rope_(back, {.position_offset = 2, .inverse = true});
        return std::vector<Tensor>{x, back};
      },
      "rope");
}

TEST(OpErrors, LlamaOpsNameTheOpAndTheArgument) {
  auto f32 = [](Shape s) { return Tensor::zeros(std::move(s), DType::f32); };
  Tensor x = f32({4, 64}), out = f32({4, 64}), rstd = f32({4}), dw = f32({64});
  expect_invalid([&] { rmsnorm_forward(x, f32({32}), out, rstd); },
                 "rmsnorm_forward: weight: expected shape [64], got [32]");
  Tensor rstd41 = f32({4, 1}), dw63 = f32({63});
  expect_invalid([&] { rmsnorm_forward(x, f32({64}), out, rstd41); },
                 "rmsnorm_forward: rstd: expected shape [4], got [4, 1]");
  expect_invalid([&] { rmsnorm_forward(x, f32({64}), out, rstd, {.eps = -1.f}); }, "rmsnorm_forward: eps");
  expect_invalid(
      [&] {
        Tensor dx = Tensor::zeros({4, 64}, DType::bf16);
        rmsnorm_backward(out, x, f32({64}), rstd, dx, dw);
      },
      "rmsnorm_backward: dx: expected dtype fp32 (that of x), got bf16");
  expect_invalid([&] { rmsnorm_backward(out, x, f32({64}), rstd, out, dw63); },
                 "rmsnorm_backward: dweight: expected shape [64], got [63]");

  expect_invalid([&] { swiglu_forward(f32({4, 7}), out); }, "swiglu_forward: x: expected (N, 2F) with an even");
  expect_invalid([&] { swiglu_forward(x, out); }, "swiglu_forward: out: expected shape [4, 32], got [4, 64]");
  expect_invalid(
      [&] {
        Tensor o = Tensor::zeros({4, 32}, DType::f16);
        swiglu_forward(x, o);
      },
      "swiglu_forward: out: expected dtype fp32, got fp16");
  expect_invalid(
      [&] {
        swiglu_backward(x, f32({4, 31}), out);
      },
      "swiglu_backward: dout: expected shape [4, 32], got [4, 31]");
  expect_invalid([&] { swiglu_backward(x, f32({4, 32}), rstd); }, "swiglu_backward: dx");

  Tensor qkv = f32({1, 4, 2, 3, 8});
  expect_invalid([&] { rope_(x, {}); }, "rope_: qkv: expected a 5-D tensor (B, T, G, R + 2, D), got [4, 64]");
  expect_invalid(
      [&] {
        Tensor odd = f32({1, 4, 2, 3, 7});
        rope_(odd, {});
      },
      "rope_: qkv: expected shape (B, T, G, R + 2, D) with R >= 1 and an even D > 0, got [1, 4, 2, 3, 7]");
  expect_invalid(
      [&] {
        Tensor no_query = f32({1, 4, 2, 2, 8});
        rope_(no_query, {});
      },
      "rope_: qkv: expected shape (B, T, G, R + 2, D) with R >= 1");
  expect_invalid([&] { rope_(qkv, {.theta = 0.f}); }, "rope_: theta: must be a finite number > 0, got 0");
  expect_invalid([&] { rope_(qkv, {.position_offset = -1}); }, "rope_: position_offset: must be >= 0, got -1");
  expect_invalid(
      [&] {
        Tensor ids = Tensor::from_ints(std::vector<int32_t>(64, 0), {1, 4, 2, 1, 8});
        rope_(ids, {});
      },
      "rope_: qkv: expected a floating dtype");
}

// ---- fused ops: each equals the unfused sequence bit for bit -------------------------------------
// The GEMM epilogues and dropout_add exist for the GPU; on the CPU they must compute exactly what the models
// computed with the separate ops, so CPU losses do not move.

void expect_same_bits(const Tensor& got, const Tensor& want, const std::string& what) {
  const std::vector<float> g = got.to_floats(), w = want.to_floats();
  ASSERT_EQ(g.size(), w.size()) << what;
  EXPECT_EQ(0, std::memcmp(g.data(), w.data(), g.size() * sizeof(float))) << what;
}

TEST(FusedOps, GemmEpiloguesEqualTheSeparateOps) {
  const int64_t M = 7, K = 9, N = 12;
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    const std::string in_dt = std::string(" ") + std::string(dtype_name(dt));
    const Tensor x = make(rand_vec(M * K, 801, -2, 2), {M, K}, dt), w = make(rand_vec(N * K, 802), {N, K}, dt);
    const Tensor bias = make(rand_vec(N, 803), {N}, dt);
    for (float beta : {0.f, 0.75f}) {
      const Tensor start = make(rand_vec(M * N, 804), {M, N}, dt);
      Tensor fused = start.clone(), ref = start.clone();
      gemm(x, w, fused, {.trans_b = true, .beta = beta, .epilogue = Epilogue::bias, .bias = &bias});
      gemm(x, w, ref, {.trans_b = true, .beta = beta});
      add_bias(ref, bias);
      expect_same_bits(fused, ref, "bias" + in_dt);
    }

    Tensor out = Tensor::empty({M, N}, dt), aux = Tensor::empty({M, N}, dt);
    gemm(x, w, out, {.trans_b = true, .epilogue = Epilogue::gelu_bias, .bias = &bias, .aux = &aux});
    Tensor pre = Tensor::empty({M, N}, dt), act = Tensor::empty({M, N}, dt);
    gemm(x, w, pre, {.trans_b = true});
    add_bias(pre, bias);
    gelu_forward(pre, act);
    expect_same_bits(aux, pre, "gelu_bias aux" + in_dt);
    expect_same_bits(out, act, "gelu_bias out" + in_dt);

    // Backward of fc1 through fc2: dfc1 = (dy @ w2) * gelu'(pre), dbias += its column sums.
    const Tensor dy = make(rand_vec(M * K, 805), {M, K}, dt), w2 = make(rand_vec(K * N, 806), {K, N}, dt);
    const Vec prior = rand_vec(N, 807, -3, 3);
    Tensor dfc1 = Tensor::empty({M, N}, dt), dbias = make(prior, {N});
    gemm(dy, w2, dfc1, {.epilogue = Epilogue::dgelu_bgrad, .aux = &pre, .dbias = &dbias});
    Tensor dgelu = Tensor::empty({M, N}, dt), dfc1_ref = Tensor::empty({M, N}, dt), dbias_ref = make(prior, {N});
    gemm(dy, w2, dgelu);
    gelu_backward(pre, dgelu, dfc1_ref);
    bias_backward(dfc1_ref, dbias_ref);
    expect_same_bits(dfc1, dfc1_ref, "dgelu_bgrad out" + in_dt);
    expect_same_bits(dbias, dbias_ref, "dgelu_bgrad dbias" + in_dt);

    // Weight gradient dW (N, K) += dout^T x with the bias gradient of dout (M tokens, N features).
    const Tensor dout = make(rand_vec(M * N, 808), {M, N}, dt);
    const Tensor dw0 = make(rand_vec(N * K, 809), {N, K});
    Tensor dw = dw0.clone(), dw_ref = dw0.clone(), db = make(prior, {N}), db_ref = make(prior, {N});
    gemm(dout, x, dw, {.trans_a = true, .beta = 1.f, .epilogue = Epilogue::bgrad_a, .dbias = &db});
    gemm(dout, x, dw_ref, {.trans_a = true, .beta = 1.f});
    bias_backward(dout, db_ref);
    expect_same_bits(dw, dw_ref, "bgrad_a dW" + in_dt);
    expect_same_bits(db, db_ref, "bgrad_a dbias" + in_dt);
  }
}

TEST(FusedOps, DropoutAddEqualsDropoutThenAdd) {
  const int64_t B = 2, T = 5, C = 13;
  for (DType dt : {DType::f32, DType::bf16, DType::f16})
    for (float p : {0.f, 0.3f}) {
      const std::string what = std::string(dtype_name(dt)) + " p=" + std::to_string(p);
      const DropoutOptions opt{.p = p,
                               .seed = 77,
                               .site = stream_id("layers.1.mlp.out"),
                               .sample_offset = 2,
                               .row_offset = 3,
                               .col_offset = 5};
      const Tensor x = make(rand_vec(B * T * C, 820, -3, 3), {B, T, C}, dt);
      const Tensor residual = make(rand_vec(B * T * C, 821, -3, 3), {B, T, C}, dt);
      Tensor out = Tensor::empty({B, T, C}, dt), dropped = Tensor::empty({B, T, C}, dt);
      Tensor ref = Tensor::empty({B, T, C}, dt);
      dropout_add(x, residual, out, opt);
      dropout_forward(x, dropped, opt);
      add(residual, dropped, ref);
      expect_same_bits(out, ref, "dropout_add " + what);
      Tensor inplace = residual.clone();  // out aliasing the residual
      dropout_add(x, inplace, inplace, opt);
      expect_same_bits(inplace, ref, "dropout_add in place " + what);
    }
}

TEST(FusedOps, EpilogueArgumentErrors) {
  auto f32 = [](Shape s) { return Tensor::zeros(std::move(s), DType::f32); };
  Tensor a = f32({4, 3}), b = f32({5, 3}), out = f32({4, 5}), bias = f32({5}), aux = f32({4, 5});
  expect_invalid([&] { gemm(a, b, out, {.trans_b = true, .epilogue = Epilogue::gelu_bias, .bias = &bias}); },
                 "gemm: epilogue gelu_bias needs opt.aux");
  expect_invalid([&] { gemm(a, b, out, {.trans_b = true, .bias = &bias}); },
                 "gemm: opt.bias is set but epilogue none does not use it");
  Tensor short_bias = f32({4});
  expect_invalid([&] { gemm(a, b, out, {.trans_b = true, .epilogue = Epilogue::bias, .bias = &short_bias}); },
                 "gemm: bias: expected shape [5]");
  expect_invalid(
      [&] {
        gemm(a, b, out, {.trans_b = true, .beta = 1.f, .epilogue = Epilogue::gelu_bias, .bias = &bias, .aux = &aux});
      },
      "gemm: epilogue gelu_bias needs beta == 0");
  Tensor dbias4 = f32({4}), dbias_half = Tensor::zeros({5}, DType::bf16);
  expect_invalid([&] { gemm(a, b, out, {.trans_b = true, .epilogue = Epilogue::bgrad_a, .dbias = &dbias4}); },
                 "gemm: epilogue bgrad_a needs trans_a");
  expect_invalid(
      [&] { gemm(a, b, out, {.trans_b = true, .epilogue = Epilogue::dgelu_bgrad, .aux = &aux, .dbias = &dbias_half}); },
      "gemm: dbias: expected dtype fp32");
  Tensor x3 = f32({2, 2, 8});
  expect_invalid([&] { dropout_add(x3, f32({2, 2, 7}), x3, {.p = 0.1f}); }, "dropout_add: residual");
}

}  // namespace
}  // namespace mt
