// ops_cpu.h: the CPU reference backend of core/tensor/ops.h and core/tensor/ops_fp8.h, registered as the CPU's op
// table by core/cpu/backend_cpu.cpp. Arguments arrive checked (shapes, dtypes, devices) by core/tensor/ops*.cpp;
// values are read as fp32, computed in fp32 (statistics in double where cheap) and rounded once to the output
// dtype, so a bf16/f16 op equals the fp32 op on the same values, rounded.
#pragma once
#include "core/tensor/ops.h"

namespace mt::cpu {

#define MT_BACKEND_OP(name, params) void name params;
#include "core/tensor/backend_ops.inc"
#undef MT_BACKEND_OP

}  // namespace mt::cpu
