// test_ops.dtype_gemm.cpp: the fp32 <-> bf16 / fp16 rounding of dtype.h and the CPU GEMM (every transpose, alpha and beta,
// half storage) against double references and finite differences.
// One of the sources of test_ops (tests/CMakeLists.txt); the shared references are in op_reference.h.
#include <gtest/gtest.h>

#include <bit>
#include <cfenv>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>

#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"
#include "tests/unit/core/tensor/op_reference.h"

namespace mt {
namespace {

using namespace mt::test;  // Vec, rand_vec, make, values, the references of op_reference.h

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

}  // namespace
}  // namespace mt
