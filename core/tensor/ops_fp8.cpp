// ops_fp8.cpp: the op entry points for fp8 scaling (amax, quantize, dequantize; core/tensor/ops.h) and the fused
// cast-and-transpose (core/tensor/ops_fp8.h).
#include <fmt/format.h>

#include "core/tensor/backend.h"
#include "core/tensor/op_profile.h"
#include "core/tensor/ops.h"
#include "core/tensor/ops_fp8.h"
#include "core/tensor/ops_check.h"

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
  backend(device_of(op, {&x, &amax}), op).fp8_amax(x, amax);
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
  backend(d, op).fp8_quantize(x, scale, out, amax_out);
}

void fp8_quantize_transpose(const Tensor& x, const Tensor& scale, Tensor& out, Tensor& out_t, Tensor* amax_out) {
  const char* op = "fp8_quantize_transpose";
  const op_profile::Scope profile(op);
  check_floating(op, "x", x);
  if (x.shape().size() != 2) fail(op, fmt::format("x: expected a matrix (R, C), got {}", shape_str(x.shape())));
  check_f32_shape(op, "scale", scale, {1});
  if (!out.defined() && !out_t.defined()) fail(op, "out and out_t: neither is defined, nothing to write");
  if (out.defined()) {
    check_fp8(op, "out", out);
    check_same_shape(op, "out", out, x, "x");
  }
  if (out_t.defined()) {
    check_fp8(op, "out_t", out_t);
    if (out_t.shape() != Shape{x.dim(1), x.dim(0)})
      fail(op, fmt::format("out_t: expected ({}, {}), x's transpose, got {}", x.dim(1), x.dim(0),
                           shape_str(out_t.shape())));
    if (out.defined() && out.dtype() != out_t.dtype())
      fail(op,
           fmt::format("out_t: dtype {} differs from out's {}", dtype_name(out_t.dtype()), dtype_name(out.dtype())));
  }
  if (amax_out) check_f32_shape(op, "amax_out", *amax_out, {1});
  const Tensor& any_out = out.defined() ? out : out_t;  // the devices of the defined ones
  const Device d =
      device_of(op, {&x, &scale, &any_out, out_t.defined() ? &out_t : &any_out, amax_out ? amax_out : &any_out});
  backend(d, op).fp8_quantize_transpose(x, scale, out, out_t, amax_out);
}

void fp8_dequantize(const Tensor& q, const Tensor& scale_inv, Tensor& out) {
  const char* op = "fp8_dequantize";
  const op_profile::Scope profile(op);
  check_fp8(op, "q", q);
  check_f32_shape(op, "scale_inv", scale_inv, {1});
  check_floating(op, "out", out);
  check_same_shape(op, "out", out, q, "q");
  backend(device_of(op, {&q, &scale_inv, &out}), op).fp8_dequantize(q, scale_inv, out);
}

void fp8_update_scale(const Tensor& amax, Tensor& history, Tensor& scale, Tensor& scale_inv, const Tensor& fp8_max,
                      Fp8ScaleOptions opt) {
  const char* op = "fp8_update_scale";
  const op_profile::Scope profile(op);
  check_defined(op, "amax", amax);
  const int64_t n = amax.numel();
  check_f32_shape(op, "amax", amax, {n});
  check_defined(op, "history", history);
  if (history.dtype() != DType::f32 || history.shape().size() != 2 || history.dim(0) != n || history.dim(1) < 1)
    fail(op, fmt::format("history: expected ({}, H >= 1) f32, got {} {}", n, shape_str(history.shape()),
                         dtype_name(history.dtype())));
  check_f32_shape(op, "scale", scale, {n});
  check_f32_shape(op, "scale_inv", scale_inv, {n});
  check_f32_shape(op, "fp8_max", fp8_max, {n});
  if (opt.margin < 0 || opt.margin > 64) fail(op, fmt::format("margin must lie in [0, 64], got {}", opt.margin));
  backend(device_of(op, {&amax, &history, &scale, &scale_inv, &fp8_max}), op)
      .fp8_update_scale(amax, history, scale, scale_inv, fp8_max, opt);
}

void gemm_fp8(const Tensor& a, const Tensor& scale_inv_a, const Tensor& b, const Tensor& scale_inv_b, Tensor& out,
              GemmOptions opt) {
  const char* op = "gemm_fp8";
  check_fp8(op, "a", a);
  check_fp8(op, "b", b);
  check_f32_shape(op, "scale_inv_a", scale_inv_a, {1});
  check_f32_shape(op, "scale_inv_b", scale_inv_b, {1});
  check_floating(op, "out", out);
  if (out.dtype() == DType::f64) fail(op, "out: expected bf16, f16 or f32, got f64");
  check_gemm_shapes(op, a, b, out, opt);
  if (opt.epilogue == Epilogue::bgrad_a)
    fail(op, "epilogue bgrad_a would sum the fp8 values of a; take the bias gradient from the unquantized tensor");
  const op_profile::Scope profile(op);
  backend(device_of(op, {&a, &scale_inv_a, &b, &scale_inv_b, &out}), op)
      .gemm_fp8(a, scale_inv_a, b, scale_inv_b, out, opt);
}

}  // namespace mt
