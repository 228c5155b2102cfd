// dtype.h: storage dtypes and exact fp32 <-> bf16 / fp16 / fp8 (e4m3, e5m2) conversion (round to nearest even).
#pragma once
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/base/enum_names.h"

namespace mt {

// f32, bf16 and f16 hold values; i32 and i64 hold token ids and counts; f64 holds sums exchanged between ranks;
// e4m3 and e5m2 (OCP FP8: PyTorch's float8_e4m3fn and float8_e5m2) hold scaled GEMM inputs (docs/fp8.md).
enum class DType : uint8_t { f32, bf16, f16, i32, i64, f64, e4m3, e5m2 };
template <>
struct EnumNames<DType> {
  static constexpr std::array<const char*, 8> names = {"fp32", "bf16", "fp16", "i32", "i64", "f64", "e4m3", "e5m2"};
};

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);
// Parses "fp32"/"f32"/"float32", "bf16"/"bfloat16", "fp16"/"f16"/"float16", "i32", "i64", "f64",
// "e4m3"/"fp8_e4m3"/"float8_e4m3fn", "e5m2"/"fp8_e5m2"/"float8_e5m2"; throws on anything else.
DType parse_dtype(std::string_view s);
// The dtypes ops compute on (f32, bf16, f16). The fp8 dtypes are not among them: they are storage only, written
// by fp8_quantize and read by fp8_dequantize (core/tensor/ops.h), and every other op refuses them.
inline bool is_floating(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }
inline bool is_fp8(DType t) { return t == DType::e4m3 || t == DType::e5m2; }

inline uint16_t float_to_bf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);  // quiet NaN
  uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}
inline float bf16_to_float(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

inline uint16_t float_to_f16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (ax < 0x38800000u) {                                               // below 2^-14: subnormal or zero
    if (ax < 0x33000000u) return static_cast<uint16_t>(sign);           // below half of 2^-24: zero
    uint32_t exp = ax >> 23;
    uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - exp;  // value in units of 2^-24 is mant >> shift
    uint32_t q = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t rounding = 0xfffu + ((ax >> 13) & 1u);
  ax += rounding;
  return static_cast<uint16_t>(sign | (((ax >> 13) - (112u << 10)) & 0x7fffu));
}
inline float f16_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

// ---- fp8 (OCP FP8 formats; NVIDIA's __nv_fp8_e4m3 / __nv_fp8_e5m2, PyTorch's float8_e4m3fn / float8_e5m2) ----
// e4m3: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities, NaN = S.1111.111 (0x7f, 0xff); largest
//       finite 448 (0x7e), smallest normal 2^-6 (0x08), smallest subnormal 2^-9 (0x01).
// e5m2: 1 sign, 5 exponent (bias 15), 2 mantissa bits, IEEE-like: inf = S.11111.00 (0x7c, 0xfc), NaN = exponent 31
//       with a non-zero mantissa; largest finite 57344 (0x7b), smallest normal 2^-14 (0x04), smallest subnormal
//       2^-16 (0x01).
// float -> fp8 rounds to nearest even and SATURATES, as __nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...) (PTX
// cvt.rn.satfinite), the cast Transformer Engine and cuBLASLt use: a finite value that would round beyond the
// largest finite one becomes +-max, and so does +-inf (e5m2 included: the cast never makes an infinity); a NaN
// becomes the canonical NaN 0x7f whatever its sign, as CUDA does (PyTorch keeps the sign: 0xff; both are NaN).
// Values below half the smallest subnormal become a zero of their sign. fp8 -> float is exact.

// float -> fp8 with M mantissa bits, exponent bias B and largest finite code max_code (internal: the two
// formats below differ only in these constants).
template <int M, int B>
inline uint8_t float_to_fp8_satfinite(float f, uint8_t max_code) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint8_t>((x >> 24) & 0x80u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return 0x7f;                            // NaN: canonical, sign dropped (as CUDA)
  constexpr uint32_t kMinNormal = uint32_t{127 + 1 - B} << 23;  // float bits of 2^(1 - B)
  if (ax >= kMinNormal) {                                       // normal (or beyond the range: saturate below)
    const uint32_t rounded = (ax + ((1u << (22 - M)) - 1u) + ((ax >> (23 - M)) & 1u)) >> (23 - M);
    const uint32_t code = rounded - (uint32_t{127 - B} << M);                 // rebias the exponent
    return static_cast<uint8_t>(sign | (code > max_code ? max_code : code));  // inf too: > max_code
  }
  // Subnormal: the code is |f| in units of the smallest subnormal 2^(1 - B - M), rounded to nearest even (it
  // may round up to 2^M, the smallest normal's code).
  const uint32_t exp = ax >> 23;
  if (exp == 0) return sign;  // zero or a float subnormal: far below half the smallest fp8 subnormal
  const uint32_t mant = (ax & 0x7fffffu) | 0x800000u;  // |f| = mant * 2^(exp - 150)
  const uint32_t shift = 151u - B - M - exp;           // >= 24 - M
  if (shift > 24) return sign;                         // below half the smallest subnormal
  uint32_t q = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return static_cast<uint8_t>(sign | q);
}

inline uint8_t float_to_e4m3(float f) { return float_to_fp8_satfinite<3, 7>(f, 0x7e); }
inline uint8_t float_to_e5m2(float f) { return float_to_fp8_satfinite<2, 15>(f, 0x7b); }

inline float e4m3_to_float(uint8_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x80u) << 24;
  const uint32_t exp = (h >> 3) & 0xfu;
  const uint32_t mant = h & 0x7u;
  if (exp == 0xf && mant == 0x7) return std::bit_cast<float>(sign | 0x7fc00000u);  // NaN
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(mant), -9);
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((exp + 120u) << 23) | (mant << 20));
}

inline float e5m2_to_float(uint8_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x80u) << 24;
  const uint32_t exp = (h >> 2) & 0x1fu;
  const uint32_t mant = h & 0x3u;
  if (exp == 31) return std::bit_cast<float>(sign | (mant ? 0x7fc00000u : 0x7f800000u));  // NaN (quiet) or inf
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(mant), -16);
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 21));
}

// The value f takes once stored in dtype t (identity for f32).
inline float round_to(DType t, float f) {
  switch (t) {
    case DType::bf16:
      return bf16_to_float(float_to_bf16(f));
    case DType::f16:
      return f16_to_float(float_to_f16(f));
    case DType::e4m3:
      return e4m3_to_float(float_to_e4m3(f));
    case DType::e5m2:
      return e5m2_to_float(float_to_e5m2(f));
    default:
      return f;
  }
}

}  // namespace mt
