// cuda_types.h: the CUDA library data type of a tensor dtype, as cuBLAS and cuBLASLt take it (core/cuda/gemm.cpp,
// core/cuda/gemm_grouped.cpp).
#pragma once
#include <library_types.h>

#include <stdexcept>

#include <fmt/format.h>

#include "core/base/dtype.h"

namespace mt::cuda {

// f32, bf16, f16, e4m3 or e5m2; any other dtype throws, naming `op` (the caller) and the dtype.
inline cudaDataType_t cuda_data_type(DType t, const char* op) {
  switch (t) {
    case DType::f32:
      return CUDA_R_32F;
    case DType::bf16:
      return CUDA_R_16BF;
    case DType::f16:
      return CUDA_R_16F;
    case DType::e4m3:
      return CUDA_R_8F_E4M3;
    case DType::e5m2:
      return CUDA_R_8F_E5M2;
    default:
      break;
  }
  throw std::invalid_argument(fmt::format("{}: no cuBLAS type for dtype {}", op, dtype_name(t)));
}

}  // namespace mt::cuda
