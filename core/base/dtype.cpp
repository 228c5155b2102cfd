#include "core/base/dtype.h"

#include <stdexcept>

namespace mt {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32:
      return 4;
    case DType::bf16:
      return 2;
    case DType::f16:
      return 2;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
    case DType::f64:
      return 8;
    case DType::e4m3:
    case DType::e5m2:
      return 1;
  }
  return 0;
}

std::string_view dtype_name(DType t) { return name_of(t); }

DType parse_dtype(std::string_view s) {
  if (s == "fp32" || s == "f32" || s == "float32") return DType::f32;
  if (s == "bf16" || s == "bfloat16") return DType::bf16;
  if (s == "fp16" || s == "f16" || s == "float16") return DType::f16;
  if (s == "i32" || s == "int32") return DType::i32;
  if (s == "i64" || s == "int64") return DType::i64;
  if (s == "f64" || s == "float64") return DType::f64;
  if (s == "e4m3" || s == "fp8_e4m3" || s == "float8_e4m3fn") return DType::e4m3;
  if (s == "e5m2" || s == "fp8_e5m2" || s == "float8_e5m2") return DType::e5m2;
  throw std::invalid_argument("unknown dtype '" + std::string(s) +
                              "' (expected fp32, bf16, fp16, i32, i64, f64, e4m3 or e5m2)");
}

}  // namespace mt
