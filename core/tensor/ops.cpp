// ops.cpp: the device-independent entry points of core/tensor/ops.h. Each checks its arguments (shapes, dtypes,
// devices) with messages naming the op and the argument, then dispatches on the tensors' device.
//
// Dtype rules: values (activations, weights) are any floating dtype (f32, bf16, f16); an op's output and
// the gradient of an activation have the dtype of that activation; parameter gradients, row statistics
// (mean, rstd, lse, rowmax, ...) and optimizer buffers are f32; token ids and targets are i32.
//
// The entry points are split by concern: this file holds GEMM, block transpose, elementwise and SwiGLU;
// core/tensor/ops_layers.cpp the norms, embeddings, dropout, attention and RoPE; core/tensor/ops_loss_optimizer.cpp the
// cross-entropy, the optimizer and the reductions; core/tensor/ops_moe.cpp the mixture-of-experts router and token dispatch.
// core/tensor/ops_check.h holds the argument checks they share.
#include "core/tensor/ops.h"

#include <optional>
#include <string>

#include <fmt/format.h>

#include "core/tensor/backend.h"
#include "core/tensor/op_profile.h"
#include "core/tensor/ops_check.h"

namespace mt {

using namespace ops_check;  // NOLINT(google-build-using-namespace): the checks every entry point makes

// ---- GEMM ----------------------------------------------------------------------------------------

// ---- GEMM epilogues: argument checks ----
namespace {

// The epilogue's vectors are given exactly when it uses them, with the shapes and dtypes ops.h names.
void check_gemm_epilogue(const char* op, const Tensor& out, const GemmOptions& opt) {
  const Epilogue e = opt.epilogue;
  const bool wants_bias = e == Epilogue::bias || e == Epilogue::gelu_bias;
  const bool wants_aux = e == Epilogue::gelu_bias || e == Epilogue::dgelu_bgrad;
  const bool wants_dbias = e == Epilogue::dgelu_bgrad || e == Epilogue::bgrad_a;
  auto presence = [&](const char* name, const void* p, bool wanted) {
    if (wanted && !p) fail(op, fmt::format("epilogue {} needs opt.{}", name_of(e), name));
    if (!wanted && p) fail(op, fmt::format("opt.{} is set but epilogue {} does not use it", name, name_of(e)));
  };
  presence("bias", opt.bias, wants_bias);
  presence("aux", opt.aux, wants_aux);
  presence("dbias", opt.dbias, wants_dbias);
  const int64_t M = out.dim(0), N = out.dim(1);
  if (opt.bias) check_floating_shape(op, "bias", *opt.bias, {N});
  if (opt.aux) {
    check_like(op, "aux", *opt.aux, out, "out");
    if (e == Epilogue::gelu_bias && opt.aux->raw() == out.raw() && out.numel() > 0)
      fail(op, "aux: must not alias out (gelu_bias writes both)");
  }
  if (opt.dbias) check_f32_shape(op, "dbias", *opt.dbias, {e == Epilogue::bgrad_a ? M : N});
  if ((e == Epilogue::gelu_bias || e == Epilogue::dgelu_bgrad) && opt.beta != 0.f)
    fail(op, fmt::format("epilogue {} needs beta == 0, got {}", name_of(e), opt.beta));
  if (e == Epilogue::bgrad_a) {
    if (!opt.trans_a) fail(op, "epilogue bgrad_a needs trans_a (a = dout stored (K, M))");
    if (opt.alpha != 1.f) fail(op, fmt::format("epilogue bgrad_a needs alpha == 1, got {}", opt.alpha));
  }
}

}  // namespace
// ---- end GEMM epilogues ----

void ops_check::check_gemm_shapes(const char* op, const Tensor& a, const Tensor& b, const Tensor& out,
                                  const GemmOptions& opt) {
  check_ndim(op, "a", a, 2, "(M, K)", a.dtype());  // the dtypes: the caller's checks
  check_ndim(op, "b", b, 2, "(K, N)", b.dtype());
  check_ndim(op, "out", out, 2, "(M, N)", out.dtype());
  const int64_t M = opt.trans_a ? a.dim(1) : a.dim(0), K = opt.trans_a ? a.dim(0) : a.dim(1);
  const int64_t Kb = opt.trans_b ? b.dim(1) : b.dim(0), N = opt.trans_b ? b.dim(0) : b.dim(1);
  if (K != Kb)
    fail(op, fmt::format("inner dimensions differ: op(a) is [{}, {}], op(b) is [{}, {}] (a {}, b {}, trans_a={}, "
                         "trans_b={})",
                         M, K, Kb, N, shape_str(a.shape()), shape_str(b.shape()), opt.trans_a, opt.trans_b));
  expect_shape(op, "out", out, {M, N});
  check_gemm_epilogue(op, out, opt);
  const Tensor* vectors[] = {opt.bias, opt.aux, opt.dbias};
  for (const Tensor* v : vectors)
    if (v && v->device() != out.device())
      fail(op, fmt::format("tensors on different devices ({} and {})", device_name(out.device()),
                           device_name(v->device())));
}

void gemm(const Tensor& a, const Tensor& b, Tensor& out, GemmOptions opt) {
  const char* op = "gemm";
  const op_profile::Scope profile(op, [&] {  // M x N x K and the transposes, as the step's GEMMs differ by shape
    if (a.ndim() != 2 || b.ndim() != 2) return std::string();
    return fmt::format("{}x{}x{} {}{}", opt.trans_a ? a.dim(1) : a.dim(0), opt.trans_b ? b.dim(0) : b.dim(1),
                       opt.trans_a ? a.dim(0) : a.dim(1), opt.trans_a ? 't' : 'n', opt.trans_b ? 't' : 'n');
  });
  check_floating(op, "a", a);
  check_floating(op, "out", out);
  if (b.dtype() != a.dtype())
    fail(op, fmt::format("b: expected dtype {} (that of a), got {}", dtype_name(a.dtype()), dtype_name(b.dtype())));
  if (out.dtype() != a.dtype() && out.dtype() != DType::f32)
    fail(op, fmt::format("out: expected dtype {} or fp32, got {}", dtype_name(a.dtype()), dtype_name(out.dtype())));
  check_gemm_shapes(op, a, b, out, opt);
  backend(device_of(op, {&a, &b, &out}), op).gemm(a, b, out, opt);
}

void gemm_grouped(const std::vector<Tensor>& a, const std::vector<Tensor>& b, std::vector<Tensor>& c,
                  const GemmOptions& opt) {
  const char* op = "gemm_grouped";
  const op_profile::Scope profile(op, [&] { return fmt::format("{} groups", c.size()); });
  if (b.size() != a.size() || c.size() != a.size())
    fail(op, fmt::format("a, b and c must hold one tensor per group, got {}, {} and {}", a.size(), b.size(), c.size()));
  if (opt.epilogue != Epilogue::none)
    fail(op, fmt::format("epilogue {} is not supported (groups take none)", name_of(opt.epilogue)));
  if (opt.bias || opt.aux || opt.dbias) fail(op, "opt.bias, opt.aux and opt.dbias must be null (no epilogue)");
  if (a.empty()) return;
  std::vector<Tensor> ga, gb, gc;  // the groups with work to do
  for (size_t g = 0; g < a.size(); ++g) {
    const std::string na = fmt::format("a[{}]", g), nb = fmt::format("b[{}]", g), nc = fmt::format("c[{}]", g);
    check_ndim(op, na.c_str(), a[g], 2, "(M, K)");
    check_ndim(op, nb.c_str(), b[g], 2, "(K, N)");
    check_ndim(op, nc.c_str(), c[g], 2, "(M, N)");
    if (a[g].dtype() != a[0].dtype())
      fail(op, fmt::format("{}: expected dtype {} (that of a[0]), got {}", na, dtype_name(a[0].dtype()),
                           dtype_name(a[g].dtype())));
    if (b[g].dtype() != a[g].dtype())
      fail(op, fmt::format("{}: expected dtype {} (that of {}), got {}", nb, dtype_name(a[g].dtype()), na,
                           dtype_name(b[g].dtype())));
    if (c[g].dtype() != c[0].dtype() || (c[g].dtype() != a[g].dtype() && c[g].dtype() != DType::f32))
      fail(op, fmt::format("{}: expected dtype {} or fp32, the same for every group (c[0] is {}), got {}", nc,
                           dtype_name(a[g].dtype()), dtype_name(c[0].dtype()), dtype_name(c[g].dtype())));
    const int64_t M = opt.trans_a ? a[g].dim(1) : a[g].dim(0), K = opt.trans_a ? a[g].dim(0) : a[g].dim(1);
    const int64_t Kb = opt.trans_b ? b[g].dim(1) : b[g].dim(0), N = opt.trans_b ? b[g].dim(0) : b[g].dim(1);
    if (K != Kb)
      fail(op, fmt::format("group {}: inner dimensions differ: op(a) is [{}, {}], op(b) is [{}, {}] (a {}, b {}, "
                           "trans_a={}, trans_b={})",
                           g, M, K, Kb, N, shape_str(a[g].shape()), shape_str(b[g].shape()), opt.trans_a, opt.trans_b));
    expect_shape(op, nc.c_str(), c[g], {M, N});
    if (device_of(op, {&a[g], &b[g], &c[g]}) != a[0].device())
      fail(op, fmt::format("group {}: tensors on different devices ({} and {})", g, device_name(a[0].device()),
                           device_name(a[g].device())));
    if (M == 0 || N == 0) continue;
    ga.push_back(a[g]);
    gb.push_back(b[g]);
    gc.push_back(c[g]);
  }
  if (gc.empty()) return;
  backend(a[0].device(), op).gemm_grouped(ga, gb, gc, opt);
}

void add_bias(Tensor& x, const Tensor& bias) {
  const char* op = "add_bias";
  const op_profile::Scope profile(op);
  check_ndim(op, "x", x, 2, "(N, C)");
  check_floating_shape(op, "bias", bias, {x.dim(1)});
  backend(device_of(op, {&x, &bias}), op).add_bias(x, bias);
}

void bias_backward(const Tensor& dout, Tensor& dbias) {
  const char* op = "bias_backward";
  const op_profile::Scope profile(op);
  check_ndim(op, "dout", dout, 2, "(N, C)");
  check_f32_shape(op, "dbias", dbias, {dout.dim(1)});
  backend(device_of(op, {&dout, &dbias}), op).bias_backward(dout, dbias);
}

// ---- block transpose -----------------------------------------------------------------------------

void transpose_blocks(const Tensor& x, Tensor& out) {
  const char* op = "transpose_blocks";
  const op_profile::Scope profile(op);
  check_defined(op, "x", x);
  check_defined(op, "out", out);
  if (x.ndim() != 3) fail(op, fmt::format("x: expected a 3-D tensor (P, Q, L), got {}", shape_str(x.shape())));
  if (out.dtype() != x.dtype())
    fail(op, fmt::format("out: expected dtype {} (that of x), got {}", dtype_name(x.dtype()), dtype_name(out.dtype())));
  expect_shape(op, "out", out, {x.dim(1), x.dim(0), x.dim(2)});
  backend(device_of(op, {&x, &out}), op).transpose_blocks(x, out);
}

// ---- elementwise ---------------------------------------------------------------------------------

void add(const Tensor& a, const Tensor& b, Tensor& out) {
  const char* op = "add";
  const op_profile::Scope profile(op);
  check_floating(op, "a", a);
  check_like(op, "b", b, a, "a");
  check_like(op, "out", out, a, "a");
  backend(device_of(op, {&a, &b, &out}), op).add(a, b, out);
}

void scale_(Tensor& x, float s) {
  const char* op = "scale_";
  const op_profile::Scope profile(op);
  check_floating(op, "x", x);
  backend(x.device(), op).scale_(x, s);
}

void gelu_forward(const Tensor& x, Tensor& out) {
  const char* op = "gelu_forward";
  const op_profile::Scope profile(op);
  check_floating(op, "x", x);
  check_like(op, "out", out, x, "x");
  backend(device_of(op, {&x, &out}), op).gelu_forward(x, out);
}

void gelu_backward(const Tensor& x, const Tensor& dout, Tensor& dx) {
  const char* op = "gelu_backward";
  const op_profile::Scope profile(op);
  check_floating(op, "x", x);
  check_like(op, "dout", dout, x, "x");
  check_like(op, "dx", dx, x, "x");
  backend(device_of(op, {&x, &dout, &dx}), op).gelu_backward(x, dout, dx);
}

// ---- SwiGLU --------------------------------------------------------------------------------------

namespace {

// x (N, 2F) of (gate, up) pairs; returns F.
int64_t check_swiglu_x(const char* op, const Tensor& x) {
  check_ndim(op, "x", x, 2, "(N, 2F)");
  if (x.dim(1) % 2 != 0)
    fail(op, fmt::format("x: expected (N, 2F) with an even number of columns ((gate, up) pairs), got {}",
                         shape_str(x.shape())));
  return x.dim(1) / 2;
}

}  // namespace

void swiglu_forward(const Tensor& x, Tensor& out) {
  const char* op = "swiglu_forward";
  const op_profile::Scope profile(op);
  const int64_t F = check_swiglu_x(op, x);
  check_dtype(op, "out", out, x.dtype());
  expect_shape(op, "out", out, {x.dim(0), F});
  backend(device_of(op, {&x, &out}), op).swiglu_forward(x, out);
}

void swiglu_backward(const Tensor& x, const Tensor& dout, Tensor& dx) {
  const char* op = "swiglu_backward";
  const op_profile::Scope profile(op);
  const int64_t F = check_swiglu_x(op, x);
  check_dtype(op, "dout", dout, x.dtype());
  expect_shape(op, "dout", dout, {x.dim(0), F});
  check_like(op, "dx", dx, x, "x");
  backend(device_of(op, {&x, &dout, &dx}), op).swiglu_backward(x, dout, dx);
}

}  // namespace mt
