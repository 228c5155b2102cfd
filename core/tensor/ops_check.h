// ops_check.h: the argument checks shared by the op entry points (core/tensor/ops.cpp, core/tensor/ops_layers.cpp,
// core/tensor/ops_loss_optimizer.cpp, core/tensor/ops_moe.cpp, core/tensor/ops_fp8.cpp,
// core/tensor/ops_attention_context.cpp): messages naming the op and the argument. Not an interface:
// core/tensor/ops.h is; the dispatch that follows the checks is core/tensor/backend.h's.
#pragma once
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>

#include <fmt/format.h>

#include "core/tensor/ops.h"

namespace mt::ops_check {

[[noreturn]] inline void fail(const char* op, const std::string& what) {
  throw std::invalid_argument(fmt::format("{}: {}", op, what));
}

inline void check_defined(const char* op, const char* name, const Tensor& t) {
  if (!t.defined()) fail(op, fmt::format("{}: tensor is undefined", name));
}

inline void check_floating(const char* op, const char* name, const Tensor& t) {
  check_defined(op, name, t);
  if (!is_floating(t.dtype()))
    fail(op, fmt::format("{}: expected a floating dtype (fp32, bf16, fp16), got {}", name, dtype_name(t.dtype())));
}

inline void check_dtype(const char* op, const char* name, const Tensor& t, DType want) {
  check_defined(op, name, t);
  if (t.dtype() != want)
    fail(op, fmt::format("{}: expected dtype {}, got {}", name, dtype_name(want), dtype_name(t.dtype())));
}

// t has the dtype and shape of ref (an activation and its output or gradient).
inline void check_like(const char* op, const char* name, const Tensor& t, const Tensor& ref, const char* ref_name) {
  check_defined(op, name, t);
  if (t.dtype() != ref.dtype())
    fail(op, fmt::format("{}: expected dtype {} (that of {}), got {}", name, dtype_name(ref.dtype()), ref_name,
                         dtype_name(t.dtype())));
  if (t.shape() != ref.shape()) check_shape(t, ref.shape(), fmt::format("{}: {}", op, name).c_str());
}

// t is a `ndim`-D tensor (`layout` names its dimensions) of dtype `want`, or of any floating dtype.
inline void check_ndim(const char* op, const char* name, const Tensor& t, int ndim, const char* layout,
                       std::optional<DType> want = std::nullopt) {
  if (want)
    check_dtype(op, name, t, *want);
  else
    check_floating(op, name, t);
  if (t.ndim() != ndim)
    fail(op, fmt::format("{}: expected a {}-D tensor {}, got {}", name, ndim, layout, shape_str(t.shape())));
}

// (The message is made only for a tensor that fails: these checks run on every op.)
inline void expect_shape(const char* op, const char* name, const Tensor& t, const Shape& shape) {
  if (!t.defined() || t.shape() != shape) check_shape(t, shape, fmt::format("{}: {}", op, name).c_str());
}

inline void check_floating_shape(const char* op, const char* name, const Tensor& t, const Shape& shape) {
  check_floating(op, name, t);
  expect_shape(op, name, t, shape);
}

inline void check_f32_shape(const char* op, const char* name, const Tensor& t, const Shape& shape) {
  check_dtype(op, name, t, DType::f32);
  expect_shape(op, name, t, shape);
}

inline void check_range(const char* op, const char* name, bool ok, const std::string& rule) {
  if (!ok) fail(op, fmt::format("{}: {}", name, rule));
}
// The same with the rule made only when it is broken (a message with values formatted in it).
template <class Rule>
requires std::is_invocable_r_v<std::string, Rule>
inline void check_range(const char* op, const char* name, bool ok, Rule&& rule) {
  if (!ok) fail(op, fmt::format("{}: {}", name, rule()));
}

// The device all of ts live on; throws when they differ.
inline Device device_of(const char* op, std::initializer_list<const Tensor*> ts) {
  const Device d = (*ts.begin())->device();
  for (const Tensor* t : ts)
    if (t->device() != d)
      fail(op, fmt::format("tensors on different devices ({} and {})", device_name(d), device_name(t->device())));
  return d;
}

inline void check_p(const char* op, float p) {
  if (!(p >= 0.f && p < 1.f)) fail(op, fmt::format("dropout probability must lie in [0, 1), got {}", p));
}

// An attention's sliding window (AttentionOptions::window, AttentionBlockOptions::window): >= 0, > 0 only causal.
inline void check_window(const char* op, int64_t window, bool causal) {
  check_range(op, "window", window >= 0 && (window == 0 || causal),
              [&] { return fmt::format("must be >= 0, and > 0 only with causal attention, got {}", window); });
}

// gemm's and gemm_fp8's checks of the shapes (a, b, out 2-D; op(a) (M, K) @ op(b) (K, N) = out (M, N)), the
// epilogue and its vectors (core/tensor/ops.cpp); the dtypes each op checks itself.
void check_gemm_shapes(const char* op, const Tensor& a, const Tensor& b, const Tensor& out, const GemmOptions& opt);

}  // namespace mt::ops_check
