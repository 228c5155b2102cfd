// ops_cuda.h: the CUDA backend of core/tensor/ops.h and core/tensor/ops_fp8.h, registered as the CUDA op table by
// core/cuda/backend_cuda.cpp. Arguments arrive checked (shapes, dtypes, devices) by core/tensor/ops*.cpp. Every op
// is enqueued on the compute stream (runtime.h) and returns without waiting. Values are read as fp32, computed in
// fp32 and rounded once to the output dtype, as the CPU reference.
#pragma once
#include "core/tensor/ops.h"

namespace mt::cuda {

#define MT_BACKEND_OP(name, params) void name params;
#include "core/tensor/backend_ops.inc"
#undef MT_BACKEND_OP

// CUDA-internal: out (C, R) = q (R, C)^T for an fp8 (one-byte) matrix (fp8.cu), for the TN layout of the fp8
// GEMM (gemm.cpp).
void fp8_transpose(const Tensor& q, Tensor& out);

}  // namespace mt::cuda
