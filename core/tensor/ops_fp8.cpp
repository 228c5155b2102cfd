// ops_fp8.cpp: the op entry points for fp8 scaling (amax, quantize, dequantize; core/tensor/ops.h).
#include <fmt/format.h>

#include "core/cpu/ops_cpu.h"
#include "core/tensor/op_profile.h"
#include "core/tensor/ops.h"
#include "core/tensor/ops_check.h"
#if defined(MEGATRAIN_WITH_CUDA)
#include "core/cuda/ops_cuda.h"
#endif

namespace mt {

using namespace ops_check;  // NOLINT(google-build-using-namespace): the checks every entry point makes

namespace {

void check_fp8(const char* op, const char* name, const Tensor& t) {
  check_defined(op, name, t);
  if (!is_fp8(t.dtype()))
    fail(op, fmt::format("{}: expected an fp8 dtype (e4m3, e5m2), got {}", name, dtype_name(t.dtype())));
}

void check_same_shape(const char* op, const char* name, const Tensor& t, const Tensor& ref, const char* ref_name) {
  if (t.shape() != ref.shape())
    fail(op, fmt::format("{}: shape {} differs from {}'s {}", name, shape_str(t.shape()), ref_name,
                         shape_str(ref.shape())));
}

}  // namespace

void fp8_amax(const Tensor& x, Tensor& amax) {
  const char* op = "fp8_amax";
  const op_profile::Scope profile(op);
  check_floating(op, "x", x);
  check_f32_shape(op, "amax", amax, {1});
  if (device_of(op, {&x, &amax}) == Device::cpu) return cpu::fp8_amax(x, amax);
  MT_ON_CUDA(fp8_amax(x, amax));
}

void fp8_quantize(const Tensor& x, const Tensor& scale, Tensor& out, Tensor* amax_out) {
  const char* op = "fp8_quantize";
  const op_profile::Scope profile(op);
  check_floating(op, "x", x);
  check_f32_shape(op, "scale", scale, {1});
  check_fp8(op, "out", out);
  check_same_shape(op, "out", out, x, "x");
  if (amax_out) check_f32_shape(op, "amax_out", *amax_out, {1});
  const Device d = amax_out ? device_of(op, {&x, &scale, &out, amax_out}) : device_of(op, {&x, &scale, &out});
  if (d == Device::cpu) return cpu::fp8_quantize(x, scale, out, amax_out);
  MT_ON_CUDA(fp8_quantize(x, scale, out, amax_out));
}

void fp8_dequantize(const Tensor& q, const Tensor& scale_inv, Tensor& out) {
  const char* op = "fp8_dequantize";
  const op_profile::Scope profile(op);
  check_fp8(op, "q", q);
  check_f32_shape(op, "scale_inv", scale_inv, {1});
  check_floating(op, "out", out);
  check_same_shape(op, "out", out, q, "q");
  if (device_of(op, {&q, &scale_inv, &out}) == Device::cpu) return cpu::fp8_dequantize(q, scale_inv, out);
  MT_ON_CUDA(fp8_dequantize(q, scale_inv, out));
}

}  // namespace mt
