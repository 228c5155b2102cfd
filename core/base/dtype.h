// dtype.h: storage dtypes and exact fp32 <-> bf16 / fp16 conversion (round to nearest even).
#pragma once
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace mt {

// f32, bf16 and f16 hold values; i32 and i64 hold token ids and counts; f64 holds sums exchanged between ranks.
enum class DType : uint8_t { f32, bf16, f16, i32, i64, f64 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);
// Parses "fp32"/"f32"/"float32", "bf16"/"bfloat16", "fp16"/"f16"/"float16", "i32", "i64"; throws on anything else.
DType parse_dtype(std::string_view s);
inline bool is_floating(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

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

// The value f takes once stored in dtype t (identity for f32).
inline float round_to(DType t, float f) {
  switch (t) {
    case DType::bf16:
      return bf16_to_float(float_to_bf16(f));
    case DType::f16:
      return f16_to_float(float_to_f16(f));
    default:
      return f;
  }
}

}  // namespace mt
