// vec_math.h: the CPU backend's vectorizable math: exp, the tanh-GELU and its derivative, row max and row sums of
// exponentials, written as branch-free scalar code that the compiler turns into SIMD loops (SSE2, and AVX2 where
// the CPU has it: the loops in vec_math.cpp are compiled for both and picked at run time).
//
// Every function computes an element by the same sequence of IEEE operations wherever that element sits in an
// array, in a SIMD lane or in the scalar tail, with or without AVX2 (no FMA: the build is ISO C++, which does not
// contract a * b + c). So a value never depends on how a tensor is split across ranks. Sums over a row put
// element j in accumulator j % kLanes and combine the accumulators in a fixed order: a sum depends only on the
// row's values and length.
#pragma once
#include <bit>
#include <cstdint>
#include <limits>

namespace mt::cpu {

// c ? a : b through bit masks: GCC keeps a float `?:` whose operand is computed as a branch (the computation might
// raise an FP exception), which blocks vectorization; the masks are if-converted.
inline float select_f32(bool c, float a, float b) {
  const uint32_t m = 0u - static_cast<uint32_t>(c);
  return std::bit_cast<float>((std::bit_cast<uint32_t>(a) & m) | (std::bit_cast<uint32_t>(b) & ~m));
}

// exp(x) within 2 ulp for x in [-87.33, 88.72]: round(x / ln 2) = n, r = x - n ln 2 in two steps (Cody and Waite),
// Cephes' degree-6 polynomial for exp(r) on |r| <= ln 2 / 2, times 2^n applied as two halves (n = 128 stays
// finite until the product). Below the range the result is 0 (exp is subnormal there), above it +inf; NaN stays NaN.
inline float exp_f32(float x) {
  constexpr float kLo = -87.33654f, kHi = 88.72284f;
  constexpr float kLog2e = 1.44269504088896341f, kC1 = 0.693359375f, kC2 = -2.12194440e-4f;
  constexpr float kShift = 12582912.f;  // 1.5 * 2^23: adding it rounds to an integer held in the low mantissa bits
  float xc = select_f32(x < kLo, kLo, x);
  xc = select_f32(xc > kHi, kHi, xc);
  const float t = xc * kLog2e + kShift;
  const int32_t n = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(kShift);
  const float nf = t - kShift;
  float r = xc - nf * kC1;
  r = r - nf * kC2;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * (r * r) + r + 1.f;
  const int32_t n1 = n >> 1;
  const float s1 = std::bit_cast<float>((n1 + 127) << 23);
  const float s2 = std::bit_cast<float>((n - n1 + 127) << 23);
  const float e = y * s1 * s2;
  return select_f32(x > kHi, std::numeric_limits<float>::infinity(), select_f32(x < kLo, 0.f, e));
}

// The tanh-GELU, 0.5 z (1 + tanh(u)) with u = sqrt(2 / pi) (z + 0.044715 z^3), written as z * sigmoid(2u) =
// z / (1 + exp(-2u)): the same function without tanh's cancellation near 1 + tanh(u) = 0.
inline constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2 / pi)
inline constexpr float kGeluC = 0.044715f;

// y[i] = gelu(x[i]); y may alias x.
void gelu_tanh(const float* x, int64_t n, float* y);
// d[i] *= gelu'(x[i]) = s + 2 z s (1 - s) u'(z), s = sigmoid(2u), 1 - s = exp(-2u) s; d may not alias x.
void gelu_tanh_backward(const float* x, int64_t n, float* d);

// y[i] = exp(x[i] - shift); y may alias x.
void exp_shifted(const float* x, int64_t n, float shift, float* y);
// max of x[0, n), n >= 1 (exact, so independent of the order; -0 and +0 may come back as either).
float row_max(const float* x, int64_t n);
// sum of exp(x[i] - shift) over [0, n), in double, element i in accumulator i % 8.
double sum_exp_shifted(const float* x, int64_t n, float shift);
// sum of a[i] * b[i] over [0, n), products and sums in double, element i in accumulator i % 8.
double dot_f64(const float* a, const float* b, int64_t n);

}  // namespace mt::cpu
