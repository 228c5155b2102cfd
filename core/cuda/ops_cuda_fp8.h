// ops_cuda_fp8.h: the CUDA backend of core/tensor/ops_fp8.h (core/cuda/fp8.cu), as ops_cuda.h for core/tensor/ops.h.
#pragma once
#include "core/tensor/ops_fp8.h"

namespace mt::cuda {

void fp8_quantize_transpose(const Tensor& x, const Tensor& scale, Tensor& out, Tensor& out_t, Tensor* amax_out);

}  // namespace mt::cuda
