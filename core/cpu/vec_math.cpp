// vec_math.cpp: the array loops of vec_math.h. Each is compiled twice, for AVX2 and for the x86-64 baseline
// (SSE2), and the loader picks one by the CPU (GCC's target_clones); both run the same IEEE operations per
// element, so they give the same bits.
#include "core/cpu/vec_math.h"

namespace mt::cpu {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MT_VEC_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define MT_VEC_CLONES
#endif

namespace {

constexpr int64_t kLanes = 8;

// sigmoid(2u) and exp(-2u) of the tanh-GELU at z. -2u is capped at 80 (z below about -9.4) so that e stays finite
// and e * s (= 1 - s) stays a number: there s is below 2e-35 either way.
inline void gelu_parts(float z, float& s, float& e) {
  const float u = kGeluK * (z + kGeluC * z * z * z);
  const float a = -2.f * u;
  e = exp_f32(select_f32(a > 80.f, 80.f, a));
  s = 1.f / (1.f + e);
}

// Adds the kLanes accumulators in a fixed tree order.
inline double combine(const double* acc) {
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

}  // namespace

MT_VEC_CLONES void gelu_tanh(const float* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) {
    const float z = x[i];
    float s, e;
    gelu_parts(z, s, e);
    y[i] = z * s;
  }
}

MT_VEC_CLONES void gelu_tanh_backward(const float* x, int64_t n, float* d) {
  for (int64_t i = 0; i < n; ++i) {
    const float z = x[i];
    float s, e;
    gelu_parts(z, s, e);
    const float du = kGeluK * (1.f + 3.f * kGeluC * z * z);
    d[i] *= s + 2.f * z * s * (e * s) * du;
  }
}

MT_VEC_CLONES void exp_shifted(const float* x, int64_t n, float shift, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = exp_f32(x[i] - shift);
}

MT_VEC_CLONES float row_max(const float* x, int64_t n) {
  float acc[kLanes];
  for (int64_t l = 0; l < kLanes; ++l) acc[l] = x[0];
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) acc[l] = select_f32(acc[l] < x[i + l], x[i + l], acc[l]);
  for (; i < n; ++i) acc[0] = select_f32(acc[0] < x[i], x[i], acc[0]);
  float m = acc[0];
  for (int64_t l = 1; l < kLanes; ++l) m = select_f32(m < acc[l], acc[l], m);
  return m;
}

MT_VEC_CLONES double sum_exp_shifted(const float* x, int64_t n, float shift) {
  double acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) acc[l] += static_cast<double>(exp_f32(x[i + l] - shift));
  for (int64_t l = 0; i < n; ++i, ++l) acc[l] += static_cast<double>(exp_f32(x[i] - shift));
  return combine(acc);
}

MT_VEC_CLONES double dot_f64(const float* a, const float* b, int64_t n) {
  double acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) acc[l] += static_cast<double>(a[i + l]) * static_cast<double>(b[i + l]);
  for (int64_t l = 0; i < n; ++i, ++l) acc[l] += static_cast<double>(a[i]) * static_cast<double>(b[i]);
  return combine(acc);
}

}  // namespace mt::cpu
