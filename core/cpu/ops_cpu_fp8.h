// ops_cpu_fp8.h: the CPU backend of core/tensor/ops_fp8.h (core/cpu/fp8.cpp), as ops_cpu.h for core/tensor/ops.h.
#pragma once
#include "core/tensor/ops_fp8.h"

namespace mt::cpu {

void fp8_quantize_transpose(const Tensor& x, const Tensor& scale, Tensor& out, Tensor& out_t, Tensor* amax_out);

}  // namespace mt::cpu
