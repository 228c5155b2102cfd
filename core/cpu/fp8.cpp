// fp8.cpp: the fp8 scaling ops on the CPU (amax, the scaled saturating cast to e4m3 / e5m2 and back), exact: the
// products in fp32, each rounded once (core/base/dtype.h's conversions). core/cuda/fp8.cu gives the same bits.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

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

// The reference composition: the cast (into out, or a workspace when out is not wanted), then its bytes transposed.
void fp8_quantize_transpose(const Tensor& x, const Tensor& scale, Tensor& out, Tensor& out_t, Tensor* amax_out) {
  Tensor q = out.defined() ? out : Tensor::empty(x.shape(), out_t.dtype(), Device::cpu, MemKind::workspace);
  cpu::fp8_quantize(x, scale, q, amax_out);
  if (!out_t.defined()) return;
  const int64_t R = x.dim(0), C = x.dim(1);
  const auto* src = static_cast<const uint8_t*>(q.raw());
  auto* dst = static_cast<uint8_t*>(out_t.raw());
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) dst[c * R + r] = src[r * C + c];
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

void fp8_update_scale(const Tensor& amax, Tensor& history, Tensor& scale, Tensor& scale_inv, const Tensor& fp8_max,
                      Fp8ScaleOptions opt) {
  const int64_t n = amax.numel(), H = history.dim(1);
  const float* a = amax.data<float>();
  const float* fmax = fp8_max.data<float>();
  float* h = history.data<float>();
  float* s = scale.data<float>();
  float* si = scale_inv.data<float>();
  const float pow2_margin = std::ldexp(1.f, opt.margin);
  for (int64_t i = 0; i < n; ++i) {
    float* row = h + i * H;
    for (int64_t j = H - 1; j > 0; --j) row[j] = row[j - 1];
    row[0] = a[i];
    float m = row[0];
    if (opt.use_max)
      for (int64_t j = 1; j < H; ++j) m = std::isnan(row[j]) || row[j] > m ? row[j] : m;
    if (std::isfinite(m) && m > 0) {
      float sf = fmax[i] / m / pow2_margin;
      s[i] = std::isinf(sf) ? std::numeric_limits<float>::max() : sf;
    }
    si[i] = 1.f / s[i];
  }
}

void gemm_fp8(const Tensor& a, const Tensor& scale_inv_a, const Tensor& b, const Tensor& scale_inv_b, Tensor& out,
              const GemmOptions& opt) {
  // a and b widened exactly to bf16 (every e4m3 / e5m2 value is one), the scales folded into alpha.
  const Tensor one = Tensor::from_floats(std::vector<float>{1.f}, {1});
  Tensor wa = Tensor::empty(a.shape(), DType::bf16, Device::cpu, MemKind::workspace);
  Tensor wb = Tensor::empty(b.shape(), DType::bf16, Device::cpu, MemKind::workspace);
  cpu::fp8_dequantize(a, one, wa);
  cpu::fp8_dequantize(b, one, wb);
  GemmOptions g = opt;
  g.alpha = opt.alpha * (scale_inv_a.data<float>()[0] * scale_inv_b.data<float>()[0]);
  cpu::gemm(wa, wb, out, g);
}

}  // namespace mt::cpu
