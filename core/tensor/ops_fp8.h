// ops_fp8.h: the fused fp8 cast-and-transpose op (beside core/tensor/ops.h's fp8 scaling ops, in a header of its own
// so that adding it rebuilt no more than its users).
#pragma once
#include "core/tensor/ops.h"

namespace mt {

// The fused cast-and-transpose of Transformer Engine: x (R, C) read once, out (R, C) = fp8_quantize(x) and out_t
// (C, R) = its transpose, both of out's and out_t's fp8 dtype (the same one), amax_out as fp8_quantize's (the max
// recorded in the same pass: the delayed recipe; current scaling takes fp8_amax first, then casts). The fp8 GEMMs
// of a linear want both layouts (cuBLASLt's fp8 kernels take only the TN form): y = x W^T reads x and W as stored,
// dx = dY W reads W^T, dW = dY^T x reads dY^T and x^T. Either output may be left undefined (Tensor()) when only
// the other layout is wanted, not both. The same bits as fp8_quantize then a transpose of the bytes, on every
// backend.
void fp8_quantize_transpose(const Tensor& x, const Tensor& scale, Tensor& out, Tensor& out_t,
                            Tensor* amax_out = nullptr);

}  // namespace mt
