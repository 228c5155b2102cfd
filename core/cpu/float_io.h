// float_io.h: reading any floating dtype (f32, bf16, f16, and the fp8 storage dtypes e4m3, e5m2) as fp32 and
// storing fp32 back with one round-to-nearest-even (saturating into fp8), a contiguous run of elements at a time
// (the dtype switch is per run, not per element).
#pragma once
#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "core/tensor/tensor.h"

namespace mt::cpu {

// dst[0, n) = fp32 values of elements [begin, begin + n) of t.
inline void load_f32(const Tensor& t, int64_t begin, int64_t n, float* dst) {
  switch (t.dtype()) {
    case DType::f32:
      std::memcpy(dst, t.data<float>() + begin, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::bf16: {
      const uint16_t* src = t.data<uint16_t>() + begin;
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
      return;
    }
    case DType::f16: {
      const uint16_t* src = t.data<uint16_t>() + begin;
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_float(src[i]);
      return;
    }
    case DType::e4m3: {
      const uint8_t* src = t.data<uint8_t>() + begin;
      for (int64_t i = 0; i < n; ++i) dst[i] = e4m3_to_float(src[i]);
      return;
    }
    case DType::e5m2: {
      const uint8_t* src = t.data<uint8_t>() + begin;
      for (int64_t i = 0; i < n; ++i) dst[i] = e5m2_to_float(src[i]);
      return;
    }
    default:
      break;
  }
  throw std::invalid_argument("load_f32: " + t.describe() + " is not a floating tensor");
}

// Elements [begin, begin + n) of t = src[0, n), rounded once to t's dtype.
inline void store_f32(const float* src, int64_t n, Tensor& t, int64_t begin) {
  switch (t.dtype()) {
    case DType::f32:
      std::memmove(t.data<float>() + begin, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::bf16: {
      uint16_t* dst = t.data<uint16_t>() + begin;
      for (int64_t i = 0; i < n; ++i) dst[i] = float_to_bf16(src[i]);
      return;
    }
    case DType::f16: {
      uint16_t* dst = t.data<uint16_t>() + begin;
      for (int64_t i = 0; i < n; ++i) dst[i] = float_to_f16(src[i]);
      return;
    }
    case DType::e4m3: {
      uint8_t* dst = t.data<uint8_t>() + begin;
      for (int64_t i = 0; i < n; ++i) dst[i] = float_to_e4m3(src[i]);
      return;
    }
    case DType::e5m2: {
      uint8_t* dst = t.data<uint8_t>() + begin;
      for (int64_t i = 0; i < n; ++i) dst[i] = float_to_e5m2(src[i]);
      return;
    }
    default:
      break;
  }
  throw std::invalid_argument("store_f32: " + t.describe() + " is not a floating tensor");
}

// Elementwise loops work on chunks of this many elements held in fp32 stack buffers.
inline constexpr int64_t kChunk = 1024;

}  // namespace mt::cpu
