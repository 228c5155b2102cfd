// ops_cpu.h: the CPU reference backend of core/tensor/ops.h. Arguments arrive checked (shapes, dtypes, devices)
// by core/tensor/ops.cpp; values are read as fp32, computed in fp32 (statistics in double where cheap) and rounded
// once to the output dtype, so a bf16/f16 op equals the fp32 op on the same values, rounded.
#pragma once
#include "core/tensor/ops.h"

namespace mt::cpu {

#include "core/tensor/backend_ops.inc"

}  // namespace mt::cpu
