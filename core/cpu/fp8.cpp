// fp8.cpp: the fp8 scaling ops on the CPU (amax, the scaled saturating cast to e4m3 / e5m2 and back), exact: the
// products in fp32, each rounded once (core/base/dtype.h's conversions). core/cuda/fp8.cu gives the same bits.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/cpu/float_io.h"
#include "core/cpu/ops_cpu.h"

namespace mt::cpu {

namespace {

// The bits of |v|: for non-negative floats the unsigned order of the bits is the order of the values, and a NaN
// (whatever its sign) comes above +inf, so a max over these bits is max |x| with NaN propagating.
inline uint32_t abs_bits(float v) { return std::bit_cast<uint32_t>(v) & 0x7fffffffu; }

// max(amax, m), m the bits of the largest |x|; NaN (the canonical quiet one) when either is NaN. An explicit
// comparison rather than std::fmax, so that the sign of a zero result is fixed (amax's), as on the GPU.
float combine_amax(float amax, uint32_t m) {
  const float x = std::bit_cast<float>(m);
  if (std::isnan(amax) || std::isnan(x)) return std::numeric_limits<float>::quiet_NaN();
  return x > amax ? x : amax;
}

// The bits of max |x| over elements [0, n) of x (0 when empty), kChunk at a time.
uint32_t max_abs_bits(const Tensor& x) {
  float buf[kChunk];
  uint32_t m = 0;
  for (int64_t at = 0; at < x.numel(); at += kChunk) {
    const int64_t n = std::min(kChunk, x.numel() - at);
    load_f32(x, at, n, buf);
    for (int64_t i = 0; i < n; ++i) m = std::max(m, abs_bits(buf[i]));
  }
  return m;
}

}  // namespace

void fp8_amax(const Tensor& x, Tensor& amax) {
  if (x.numel() == 0) return;
  float& a = amax.data<float>()[0];
  a = combine_amax(a, max_abs_bits(x));
}

void fp8_quantize(const Tensor& x, const Tensor& scale, Tensor& out, Tensor* amax_out) {
  const float s = scale.data<float>()[0];
  float buf[kChunk];
  uint32_t m = 0;
  for (int64_t at = 0; at < x.numel(); at += kChunk) {
    const int64_t n = std::min(kChunk, x.numel() - at);
    load_f32(x, at, n, buf);
    for (int64_t i = 0; i < n; ++i) {
      m = std::max(m, abs_bits(buf[i]));
      buf[i] *= s;  // fp32 product, rounded once; store_f32 casts it with saturation
    }
    store_f32(buf, n, out, at);
  }
  if (amax_out && x.numel() > 0) {
    float& a = amax_out->data<float>()[0];
    a = combine_amax(a, m);
  }
}

void fp8_dequantize(const Tensor& q, const Tensor& scale_inv, Tensor& out) {
  const float s = scale_inv.data<float>()[0];
  float buf[kChunk];
  for (int64_t at = 0; at < q.numel(); at += kChunk) {
    const int64_t n = std::min(kChunk, q.numel() - at);
    load_f32(q, at, n, buf);
    for (int64_t i = 0; i < n; ++i) buf[i] *= s;
    store_f32(buf, n, out, at);
  }
}

}  // namespace mt::cpu
