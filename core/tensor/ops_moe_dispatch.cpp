// ops_moe_dispatch.cpp: the entry points of the mixture-of-experts token dispatch (core/tensor/ops.h): argument
// checks naming the op and the argument, then the device's implementation.
#include <string>

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

// row_of (N, k) i32, one row per token; probs, when given, (N, k) f32.
void check_choices(const char* op, const Tensor& row_of, int64_t tokens, const Tensor* probs) {
  check_ndim(op, "row_of", row_of, 2, "(N, k)", DType::i32);
  if (row_of.dim(0) != tokens)
    fail(op, fmt::format("row_of: expected {} rows (one per token), got {}", tokens, shape_str(row_of.shape())));
  if (probs) check_f32_shape(op, "probs", *probs, row_of.shape());
}

}  // namespace

void moe_dispatch_index(const Tensor& experts, Tensor& row_of, Tensor& counts) {
  const char* op = "moe_dispatch_index";
  const op_profile::Scope profile(op);
  check_ndim(op, "experts", experts, 2, "(N, k)", DType::i32);
  check_dtype(op, "row_of", row_of, DType::i32);
  expect_shape(op, "row_of", row_of, experts.shape());
  check_ndim(op, "counts", counts, 1, "(E)", DType::i32);
  if (counts.dim(0) < 1) fail(op, "counts: expected at least one expert, got (0)");
  if (experts.numel() > (int64_t{1} << 31) - 1)
    fail(op, fmt::format("experts: {} choices, more than int32 row indices hold", experts.numel()));
  if (device_of(op, {&experts, &row_of, &counts}) == Device::cpu)
    return cpu::moe_dispatch_index(experts, row_of, counts);
  MT_ON_CUDA(moe_dispatch_index(experts, row_of, counts));
}

void moe_permute(const Tensor& x, const Tensor& row_of, const Tensor* probs, Tensor& out) {
  const char* op = "moe_permute";
  const op_profile::Scope profile(op);
  check_ndim(op, "x", x, 2, "(N, C)");
  check_choices(op, row_of, x.dim(0), probs);
  check_ndim(op, "out", out, 2, "(R, C)");
  if (out.dtype() != x.dtype() || out.dim(1) != x.dim(1))
    fail(op, fmt::format("out: expected {} rows of {} columns like x, got {} {}", dtype_name(x.dtype()), x.dim(1),
                         dtype_name(out.dtype()), shape_str(out.shape())));
  if (probs) (void)device_of(op, {&x, probs});  // throws when they differ
  if (device_of(op, {&x, &row_of, &out}) == Device::cpu) return cpu::moe_permute(x, row_of, probs, out);
  MT_ON_CUDA(moe_permute(x, row_of, probs, out));
}

void moe_unpermute(const Tensor& y, const Tensor& row_of, const Tensor* probs, Tensor& out) {
  const char* op = "moe_unpermute";
  const op_profile::Scope profile(op);
  check_ndim(op, "y", y, 2, "(R, C)");
  check_ndim(op, "out", out, 2, "(N, C)");
  check_choices(op, row_of, out.dim(0), probs);
  if (out.dtype() != y.dtype() || out.dim(1) != y.dim(1))
    fail(op, fmt::format("out: expected {} rows of {} columns like y, got {} {}", dtype_name(y.dtype()), y.dim(1),
                         dtype_name(out.dtype()), shape_str(out.shape())));
  if (probs) (void)device_of(op, {&y, probs});  // throws when they differ
  if (device_of(op, {&y, &row_of, &out}) == Device::cpu) return cpu::moe_unpermute(y, row_of, probs, out);
  MT_ON_CUDA(moe_unpermute(y, row_of, probs, out));
}

void moe_unpermute_backward_probs(const Tensor& dout, const Tensor& y, const Tensor& row_of, Tensor& dprobs) {
  const char* op = "moe_unpermute_backward_probs";
  const op_profile::Scope profile(op);
  check_ndim(op, "dout", dout, 2, "(N, C)");
  check_ndim(op, "y", y, 2, "(R, C)");
  if (y.dtype() != dout.dtype() || y.dim(1) != dout.dim(1))
    fail(op, fmt::format("y: expected {} rows of {} columns like dout, got {} {}", dtype_name(dout.dtype()),
                         dout.dim(1), dtype_name(y.dtype()), shape_str(y.shape())));
  check_choices(op, row_of, dout.dim(0), &dprobs);
  if (device_of(op, {&dout, &y, &row_of, &dprobs}) == Device::cpu)
    return cpu::moe_unpermute_backward_probs(dout, y, row_of, dprobs);
  MT_ON_CUDA(moe_unpermute_backward_probs(dout, y, row_of, dprobs));
}

}  // namespace mt
