// ops.cpp: the device-independent entry points of core/tensor/ops.h. Each checks its arguments (shapes, dtypes,
// devices) with messages naming the op and the argument, then dispatches on the tensors' device.
//
// Dtype rules: values (activations, weights) are any floating dtype (f32, bf16, f16); an op's output and
// the gradient of an activation have the dtype of that activation; parameter gradients, row statistics
// (mean, rstd, lse, rowmax, ...) and optimizer buffers are f32; token ids and targets are i32.
#include "core/tensor/ops.h"

#include <atomic>
#include <cmath>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "core/cpu/ops_cpu.h"
#if defined(MEGATRAIN_WITH_CUDA)
#include "core/cuda/ops_cuda.h"
#endif

namespace mt {

namespace {

[[noreturn]] void fail(const char* op, const std::string& what) {
  throw std::invalid_argument(fmt::format("{}: {}", op, what));
}

void check_defined(const char* op, const char* name, const Tensor& t) {
  if (!t.defined()) fail(op, fmt::format("{}: tensor is undefined", name));
}

void check_floating(const char* op, const char* name, const Tensor& t) {
  check_defined(op, name, t);
  if (!is_floating(t.dtype()))
    fail(op, fmt::format("{}: expected a floating dtype (fp32, bf16, fp16), got {}", name, dtype_name(t.dtype())));
}

void check_dtype(const char* op, const char* name, const Tensor& t, DType want) {
  check_defined(op, name, t);
  if (t.dtype() != want)
    fail(op, fmt::format("{}: expected dtype {}, got {}", name, dtype_name(want), dtype_name(t.dtype())));
}

// t has the dtype and shape of ref (an activation and its output or gradient).
void check_like(const char* op, const char* name, const Tensor& t, const Tensor& ref, const char* ref_name) {
  check_defined(op, name, t);
  if (t.dtype() != ref.dtype())
    fail(op, fmt::format("{}: expected dtype {} (that of {}), got {}", name, dtype_name(ref.dtype()), ref_name,
                         dtype_name(t.dtype())));
  check_shape(t, ref.shape(), fmt::format("{}: {}", op, name).c_str());
}

// t is a `ndim`-D tensor (`layout` names its dimensions) of dtype `want`, or of any floating dtype.
void check_ndim(const char* op, const char* name, const Tensor& t, int ndim, const char* layout,
                std::optional<DType> want = std::nullopt) {
  if (want)
    check_dtype(op, name, t, *want);
  else
    check_floating(op, name, t);
  if (t.ndim() != ndim)
    fail(op, fmt::format("{}: expected a {}-D tensor {}, got {}", name, ndim, layout, shape_str(t.shape())));
}

void expect_shape(const char* op, const char* name, const Tensor& t, const Shape& shape) {
  check_shape(t, shape, fmt::format("{}: {}", op, name).c_str());
}

void check_floating_shape(const char* op, const char* name, const Tensor& t, const Shape& shape) {
  check_floating(op, name, t);
  expect_shape(op, name, t, shape);
}

void check_f32_shape(const char* op, const char* name, const Tensor& t, const Shape& shape) {
  check_dtype(op, name, t, DType::f32);
  expect_shape(op, name, t, shape);
}

void check_range(const char* op, const char* name, bool ok, const std::string& rule) {
  if (!ok) fail(op, fmt::format("{}: {}", name, rule));
}

// The device all of ts live on; throws when they differ.
Device device_of(const char* op, std::initializer_list<const Tensor*> ts) {
  const Device d = (*ts.begin())->device();
  for (const Tensor* t : ts)
    if (t->device() != d)
      fail(op, fmt::format("tensors on different devices ({} and {})", device_name(d), device_name(t->device())));
  return d;
}

[[noreturn, maybe_unused]] void no_cuda(const char* op) {
  throw std::runtime_error(
      fmt::format("{}: this megatrain was built without the CUDA backend (no CUDA toolkit at "
                  "build time); use training.device: cpu",
                  op));
}

// After the CPU branch of each op: the CUDA backend's version, or an error when it is not built.
#if defined(MEGATRAIN_WITH_CUDA)
#define MT_ON_CUDA(call) return cuda::call
#else
#define MT_ON_CUDA(call) no_cuda(op)
#endif

void check_p(const char* op, float p) {
  if (!(p >= 0.f && p < 1.f)) fail(op, fmt::format("dropout probability must lie in [0, 1), got {}", p));
}

}  // namespace

// ---- GEMM ----------------------------------------------------------------------------------------

// ---- GEMM epilogues: argument checks ----
namespace {

const char* epilogue_name(Epilogue e) {
  switch (e) {
    case Epilogue::none:
      return "none";
    case Epilogue::bias:
      return "bias";
    case Epilogue::gelu_bias:
      return "gelu_bias";
    case Epilogue::dgelu_bgrad:
      return "dgelu_bgrad";
    case Epilogue::bgrad_a:
      return "bgrad_a";
  }
  return "unknown";
}

// The epilogue's vectors are given exactly when it uses them, with the shapes and dtypes ops.h names.
void check_gemm_epilogue(const char* op, const Tensor& out, const GemmOptions& opt) {
  const Epilogue e = opt.epilogue;
  const bool wants_bias = e == Epilogue::bias || e == Epilogue::gelu_bias;
  const bool wants_aux = e == Epilogue::gelu_bias || e == Epilogue::dgelu_bgrad;
  const bool wants_dbias = e == Epilogue::dgelu_bgrad || e == Epilogue::bgrad_a;
  auto presence = [&](const char* name, const void* p, bool wanted) {
    if (wanted && !p) fail(op, fmt::format("epilogue {} needs opt.{}", epilogue_name(e), name));
    if (!wanted && p) fail(op, fmt::format("opt.{} is set but epilogue {} does not use it", name, epilogue_name(e)));
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
    fail(op, fmt::format("epilogue {} needs beta == 0, got {}", epilogue_name(e), opt.beta));
  if (e == Epilogue::bgrad_a) {
    if (!opt.trans_a) fail(op, "epilogue bgrad_a needs trans_a (a = dout stored (K, M))");
    if (opt.alpha != 1.f) fail(op, fmt::format("epilogue bgrad_a needs alpha == 1, got {}", opt.alpha));
  }
}

}  // namespace
// ---- end GEMM epilogues ----

void gemm(const Tensor& a, const Tensor& b, Tensor& out, GemmOptions opt) {
  const char* op = "gemm";
  check_ndim(op, "a", a, 2, "(M, K)");
  check_ndim(op, "b", b, 2, "(K, N)");
  check_ndim(op, "out", out, 2, "(M, N)");
  if (b.dtype() != a.dtype())
    fail(op, fmt::format("b: expected dtype {} (that of a), got {}", dtype_name(a.dtype()), dtype_name(b.dtype())));
  if (out.dtype() != a.dtype() && out.dtype() != DType::f32)
    fail(op, fmt::format("out: expected dtype {} or fp32, got {}", dtype_name(a.dtype()), dtype_name(out.dtype())));
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
  if (device_of(op, {&a, &b, &out}) == Device::cpu) return cpu::gemm(a, b, out, opt);
  MT_ON_CUDA(gemm(a, b, out, opt));
}

void add_bias(Tensor& x, const Tensor& bias) {
  const char* op = "add_bias";
  check_ndim(op, "x", x, 2, "(N, C)");
  check_floating_shape(op, "bias", bias, {x.dim(1)});
  if (device_of(op, {&x, &bias}) == Device::cpu) return cpu::add_bias(x, bias);
  MT_ON_CUDA(add_bias(x, bias));
}

void bias_backward(const Tensor& dout, Tensor& dbias) {
  const char* op = "bias_backward";
  check_ndim(op, "dout", dout, 2, "(N, C)");
  check_f32_shape(op, "dbias", dbias, {dout.dim(1)});
  if (device_of(op, {&dout, &dbias}) == Device::cpu) return cpu::bias_backward(dout, dbias);
  MT_ON_CUDA(bias_backward(dout, dbias));
}

// ---- block transpose -----------------------------------------------------------------------------

void transpose_blocks(const Tensor& x, Tensor& out) {
  const char* op = "transpose_blocks";
  check_defined(op, "x", x);
  check_defined(op, "out", out);
  if (x.ndim() != 3) fail(op, fmt::format("x: expected a 3-D tensor (P, Q, L), got {}", shape_str(x.shape())));
  if (out.dtype() != x.dtype())
    fail(op, fmt::format("out: expected dtype {} (that of x), got {}", dtype_name(x.dtype()), dtype_name(out.dtype())));
  expect_shape(op, "out", out, {x.dim(1), x.dim(0), x.dim(2)});
  if (device_of(op, {&x, &out}) == Device::cpu) return cpu::transpose_blocks(x, out);
  MT_ON_CUDA(transpose_blocks(x, out));
}

// ---- elementwise ---------------------------------------------------------------------------------

void add(const Tensor& a, const Tensor& b, Tensor& out) {
  const char* op = "add";
  check_floating(op, "a", a);
  check_like(op, "b", b, a, "a");
  check_like(op, "out", out, a, "a");
  if (device_of(op, {&a, &b, &out}) == Device::cpu) return cpu::add(a, b, out);
  MT_ON_CUDA(add(a, b, out));
}

void scale_(Tensor& x, float s) {
  const char* op = "scale_";
  check_floating(op, "x", x);
  if (x.device() == Device::cpu) return cpu::scale_(x, s);
  MT_ON_CUDA(scale_(x, s));
}

void gelu_forward(const Tensor& x, Tensor& out) {
  const char* op = "gelu_forward";
  check_floating(op, "x", x);
  check_like(op, "out", out, x, "x");
  if (device_of(op, {&x, &out}) == Device::cpu) return cpu::gelu_forward(x, out);
  MT_ON_CUDA(gelu_forward(x, out));
}

void gelu_backward(const Tensor& x, const Tensor& dout, Tensor& dx) {
  const char* op = "gelu_backward";
  check_floating(op, "x", x);
  check_like(op, "dout", dout, x, "x");
  check_like(op, "dx", dx, x, "x");
  if (device_of(op, {&x, &dout, &dx}) == Device::cpu) return cpu::gelu_backward(x, dout, dx);
  MT_ON_CUDA(gelu_backward(x, dout, dx));
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
  const int64_t F = check_swiglu_x(op, x);
  check_dtype(op, "out", out, x.dtype());
  expect_shape(op, "out", out, {x.dim(0), F});
  if (device_of(op, {&x, &out}) == Device::cpu) return cpu::swiglu_forward(x, out);
  MT_ON_CUDA(swiglu_forward(x, out));
}

void swiglu_backward(const Tensor& x, const Tensor& dout, Tensor& dx) {
  const char* op = "swiglu_backward";
  const int64_t F = check_swiglu_x(op, x);
  check_dtype(op, "dout", dout, x.dtype());
  expect_shape(op, "dout", dout, {x.dim(0), F});
  check_like(op, "dx", dx, x, "x");
  if (device_of(op, {&x, &dout, &dx}) == Device::cpu) return cpu::swiglu_backward(x, dout, dx);
  MT_ON_CUDA(swiglu_backward(x, dout, dx));
}

// ---- LayerNorm -----------------------------------------------------------------------------------

void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& out, Tensor& mean,
                       Tensor& rstd, LayerNormOptions opt) {
  const char* op = "layernorm_forward";
  check_ndim(op, "x", x, 2, "(N, C)");
  const int64_t N = x.dim(0), C = x.dim(1);
  check_floating_shape(op, "weight", weight, {C});
  check_floating_shape(op, "bias", bias, {C});
  check_like(op, "out", out, x, "x");
  check_f32_shape(op, "mean", mean, {N});
  check_f32_shape(op, "rstd", rstd, {N});
  check_range(op, "eps", opt.eps >= 0.f, fmt::format("must be >= 0, got {}", opt.eps));
  if (device_of(op, {&x, &weight, &bias, &out, &mean, &rstd}) == Device::cpu)
    return cpu::layernorm_forward(x, weight, bias, out, mean, rstd, opt);
  MT_ON_CUDA(layernorm_forward(x, weight, bias, out, mean, rstd, opt));
}

void layernorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, Tensor& dx, Tensor& dweight, Tensor& dbias) {
  const char* op = "layernorm_backward";
  check_ndim(op, "x", x, 2, "(N, C)");
  const int64_t N = x.dim(0), C = x.dim(1);
  check_like(op, "dout", dout, x, "x");
  check_floating_shape(op, "weight", weight, {C});
  check_f32_shape(op, "mean", mean, {N});
  check_f32_shape(op, "rstd", rstd, {N});
  check_like(op, "dx", dx, x, "x");
  check_f32_shape(op, "dweight", dweight, {C});
  check_f32_shape(op, "dbias", dbias, {C});
  if (device_of(op, {&dout, &x, &weight, &mean, &rstd, &dx, &dweight, &dbias}) == Device::cpu)
    return cpu::layernorm_backward(dout, x, weight, mean, rstd, dx, dweight, dbias);
  MT_ON_CUDA(layernorm_backward(dout, x, weight, mean, rstd, dx, dweight, dbias));
}

// ---- RMSNorm -------------------------------------------------------------------------------------

void rmsnorm_forward(const Tensor& x, const Tensor& weight, Tensor& out, Tensor& rstd, RmsNormOptions opt) {
  const char* op = "rmsnorm_forward";
  check_ndim(op, "x", x, 2, "(N, C)");
  const int64_t N = x.dim(0), C = x.dim(1);
  check_floating_shape(op, "weight", weight, {C});
  check_like(op, "out", out, x, "x");
  check_f32_shape(op, "rstd", rstd, {N});
  check_range(op, "eps", opt.eps >= 0.f, fmt::format("must be >= 0, got {}", opt.eps));
  if (device_of(op, {&x, &weight, &out, &rstd}) == Device::cpu) return cpu::rmsnorm_forward(x, weight, out, rstd, opt);
  MT_ON_CUDA(rmsnorm_forward(x, weight, out, rstd, opt));
}

void rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& rstd, Tensor& dx,
                      Tensor& dweight) {
  const char* op = "rmsnorm_backward";
  check_ndim(op, "x", x, 2, "(N, C)");
  const int64_t N = x.dim(0), C = x.dim(1);
  check_like(op, "dout", dout, x, "x");
  check_floating_shape(op, "weight", weight, {C});
  check_f32_shape(op, "rstd", rstd, {N});
  check_like(op, "dx", dx, x, "x");
  check_f32_shape(op, "dweight", dweight, {C});
  if (device_of(op, {&dout, &x, &weight, &rstd, &dx, &dweight}) == Device::cpu)
    return cpu::rmsnorm_backward(dout, x, weight, rstd, dx, dweight);
  MT_ON_CUDA(rmsnorm_backward(dout, x, weight, rstd, dx, dweight));
}

// ---- embeddings ----------------------------------------------------------------------------------

void embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out, EmbeddingOptions opt) {
  const char* op = "embedding_forward";
  check_ndim(op, "ids", ids, 2, "(B, T)", DType::i32);
  check_ndim(op, "table", table, 2, "(V, C)");
  check_floating_shape(op, "out", out, {ids.dim(0), ids.dim(1), table.dim(1)});
  check_range(op, "vocab_start", opt.vocab_start >= 0, fmt::format("must be >= 0, got {}", opt.vocab_start));
  if (device_of(op, {&ids, &table, &out}) == Device::cpu) return cpu::embedding_forward(ids, table, out, opt);
  MT_ON_CUDA(embedding_forward(ids, table, out, opt));
}

void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable, EmbeddingOptions opt) {
  const char* op = "embedding_backward";
  check_ndim(op, "ids", ids, 2, "(B, T)", DType::i32);
  check_ndim(op, "dtable", dtable, 2, "(V, C)", DType::f32);
  check_floating_shape(op, "dout", dout, {ids.dim(0), ids.dim(1), dtable.dim(1)});
  check_range(op, "vocab_start", opt.vocab_start >= 0, fmt::format("must be >= 0, got {}", opt.vocab_start));
  if (device_of(op, {&ids, &dout, &dtable}) == Device::cpu) return cpu::embedding_backward(ids, dout, dtable, opt);
  MT_ON_CUDA(embedding_backward(ids, dout, dtable, opt));
}

namespace {

// The rows [position_offset, position_offset + T) must lie inside a (P, C) position table.
void check_positions(const char* op, const Tensor& x, const char* table_name, const Tensor& table,
                     const EmbeddingOptions& opt) {
  check_ndim(op, table_name, table, 2, "(P, C)");
  expect_shape(op, table_name, table, {table.dim(0), x.dim(2)});
  check_range(op, "position_offset", opt.position_offset >= 0 && opt.position_offset + x.dim(1) <= table.dim(0),
              fmt::format("positions [{}, {}) exceed the {} rows of {}", opt.position_offset,
                          opt.position_offset + x.dim(1), table.dim(0), table_name));
}

}  // namespace

void position_embedding_add(Tensor& x, const Tensor& wpe, EmbeddingOptions opt) {
  const char* op = "position_embedding_add";
  check_ndim(op, "x", x, 3, "(B, T, C)");
  check_positions(op, x, "wpe", wpe, opt);
  if (device_of(op, {&x, &wpe}) == Device::cpu) return cpu::position_embedding_add(x, wpe, opt);
  MT_ON_CUDA(position_embedding_add(x, wpe, opt));
}

void position_embedding_backward(const Tensor& dout, Tensor& dwpe, EmbeddingOptions opt) {
  const char* op = "position_embedding_backward";
  check_ndim(op, "dout", dout, 3, "(B, T, C)");
  check_dtype(op, "dwpe", dwpe, DType::f32);
  check_positions(op, dout, "dwpe", dwpe, opt);
  if (device_of(op, {&dout, &dwpe}) == Device::cpu) return cpu::position_embedding_backward(dout, dwpe, opt);
  MT_ON_CUDA(position_embedding_backward(dout, dwpe, opt));
}

// ---- dropout -------------------------------------------------------------------------------------

namespace {

// A (B, T, C) input (the mask is keyed by sample, row and column, so a flattened (N, C) view would draw a
// different mask per layout) and an output of the same dtype and shape.
void check_dropout(const char* op, const Tensor& in, const char* in_name, const Tensor& out, const char* out_name,
                   const DropoutOptions& opt) {
  check_ndim(op, in_name, in, 3, "(B, T, C)");
  check_like(op, out_name, out, in, in_name);
  check_p(op, opt.p);
  check_range(
      op, "offsets", opt.sample_offset >= 0 && opt.row_offset >= 0 && opt.col_offset >= 0,
      fmt::format("must be >= 0, got sample {}, row {}, col {}", opt.sample_offset, opt.row_offset, opt.col_offset));
}

}  // namespace

void dropout_forward(const Tensor& x, Tensor& out, const DropoutOptions& opt) {
  const char* op = "dropout_forward";
  check_dropout(op, x, "x", out, "out", opt);
  if (device_of(op, {&x, &out}) == Device::cpu) return cpu::dropout_forward(x, out, opt);
  MT_ON_CUDA(dropout_forward(x, out, opt));
}

void dropout_backward(const Tensor& dout, Tensor& dx, const DropoutOptions& opt) {
  const char* op = "dropout_backward";
  check_dropout(op, dout, "dout", dx, "dx", opt);
  if (device_of(op, {&dout, &dx}) == Device::cpu) return cpu::dropout_backward(dout, dx, opt);
  MT_ON_CUDA(dropout_backward(dout, dx, opt));
}

// ---- fused residual + dropout ----

void dropout_add(const Tensor& x, const Tensor& residual, Tensor& out, const DropoutOptions& opt) {
  const char* op = "dropout_add";
  check_dropout(op, x, "x", out, "out", opt);
  check_like(op, "residual", residual, x, "x");
  if (device_of(op, {&x, &residual, &out}) == Device::cpu) return cpu::dropout_add(x, residual, out, opt);
  MT_ON_CUDA(dropout_add(x, residual, out, opt));
}

// ---- end fused residual + dropout ----

// ---- attention -----------------------------------------------------------------------------------

namespace {

// qkv (B, T, G, R + 2, D): G groups of R >= 1 query heads, a key and a value (GPT: R = 1, (B, T, H, 3, D)).
void check_qkv(const char* op, const Tensor& qkv, const AttentionOptions& opt) {
  check_ndim(op, "qkv", qkv, 5, "(B, T, G, R + 2, D)");
  if (qkv.dim(3) < 3 || qkv.dim(4) == 0)
    fail(op, fmt::format("qkv: expected shape (B, T, G, R + 2, D) with R >= 1 query heads per group and D > 0, "
                         "got {}",
                         shape_str(qkv.shape())));
  check_p(op, opt.dropout_p);
  check_range(op, "offsets", opt.sample_offset >= 0 && opt.head_offset >= 0,
              fmt::format("must be >= 0, got sample {}, head {}", opt.sample_offset, opt.head_offset));
}

// The query heads H = G * R of qkv (B, T, G, R + 2, D).
int64_t query_heads(const Tensor& qkv) { return qkv.dim(2) * (qkv.dim(3) - 2); }

// An attention output or its gradient: qkv's dtype, shape (B, T, H, D) or its (B, T, H * D) view, H = G * R.
void check_heads_out(const char* op, const char* name, const Tensor& t, const Tensor& qkv) {
  check_defined(op, name, t);
  const int64_t B = qkv.dim(0), T = qkv.dim(1), H = query_heads(qkv), D = qkv.dim(4);
  if (t.dtype() != qkv.dtype())
    fail(op, fmt::format("{}: expected dtype {} (that of qkv), got {}", name, dtype_name(qkv.dtype()),
                         dtype_name(t.dtype())));
  if (t.shape() != Shape{B, T, H * D} && t.shape() != Shape{B, T, H, D})
    fail(op, fmt::format("{}: expected shape [{}, {}, {}, {}] (B, T, H = G * R, D) or its view [{}, {}, {}] for "
                         "qkv {}, got {}",
                         name, B, T, H, D, B, T, H * D, shape_str(qkv.shape()), shape_str(t.shape())));
}

// lse (B, H, T) f32, H = G * R.
void check_lse(const char* op, const Tensor& lse, const Tensor& qkv) {
  check_dtype(op, "lse", lse, DType::f32);
  const Shape want{qkv.dim(0), query_heads(qkv), qkv.dim(1)};
  if (lse.shape() != want)
    fail(op, fmt::format("lse: expected shape {} (B, H = G * R, T) for qkv {}, got {}", shape_str(want),
                         shape_str(qkv.shape()), shape_str(lse.shape())));
}

}  // namespace

namespace {
std::atomic<int64_t> g_attention_calls[3];  // by AttentionImpl
}  // namespace

void count_attention_call(AttentionImpl impl) {
  g_attention_calls[static_cast<int>(impl)].fetch_add(1, std::memory_order_relaxed);
}

AttentionCalls attention_calls() {
  const auto get = [](AttentionImpl i) { return g_attention_calls[static_cast<int>(i)].load(); };
  return {.cpu = get(AttentionImpl::cpu), .cudnn = get(AttentionImpl::cudnn), .kernel = get(AttentionImpl::kernel)};
}

void attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse, const AttentionOptions& opt) {
  const char* op = "attention_forward";
  check_qkv(op, qkv, opt);
  check_heads_out(op, "out", out, qkv);
  check_lse(op, lse, qkv);
  if (device_of(op, {&qkv, &out, &lse}) == Device::cpu) {
    cpu::attention_forward(qkv, out, lse, opt);
    return count_attention_call(AttentionImpl::cpu);
  }
  MT_ON_CUDA(attention_forward(qkv, out, lse, opt));
}

void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout, Tensor& dqkv,
                        const AttentionOptions& opt) {
  const char* op = "attention_backward";
  check_qkv(op, qkv, opt);
  check_heads_out(op, "out", out, qkv);
  check_lse(op, lse, qkv);
  check_heads_out(op, "dout", dout, qkv);
  check_like(op, "dqkv", dqkv, qkv, "qkv");
  if (device_of(op, {&qkv, &out, &lse, &dout, &dqkv}) == Device::cpu) {
    cpu::attention_backward(qkv, out, lse, dout, dqkv, opt);
    return count_attention_call(AttentionImpl::cpu);
  }
  MT_ON_CUDA(attention_backward(qkv, out, lse, dout, dqkv, opt));
}

// ---- rotary position embedding -------------------------------------------------------------------

void rope_(Tensor& qkv, const RopeOptions& opt) {
  const char* op = "rope_";
  check_ndim(op, "qkv", qkv, 5, "(B, T, G, R + 2, D)");
  if (qkv.dim(3) < 3 || qkv.dim(4) == 0 || qkv.dim(4) % 2 != 0)
    fail(op, fmt::format("qkv: expected shape (B, T, G, R + 2, D) with R >= 1 and an even D > 0, got {}",
                         shape_str(qkv.shape())));
  check_range(op, "theta", opt.theta > 0.f && std::isfinite(opt.theta),
              fmt::format("must be a finite number > 0, got {}", opt.theta));
  check_range(op, "position_offset", opt.position_offset >= 0,
              fmt::format("must be >= 0, got {}", opt.position_offset));
  if (qkv.device() == Device::cpu) return cpu::rope_(qkv, opt);
  MT_ON_CUDA(rope_(qkv, opt));
}

// ---- cross-entropy -------------------------------------------------------------------------------

namespace {

void check_logits(const char* op, const Tensor& logits, const Tensor* targets, int64_t vocab_start) {
  check_ndim(op, "logits", logits, 2, "(N, V)");
  if (targets) {
    check_dtype(op, "targets", *targets, DType::i32);
    expect_shape(op, "targets", *targets, {logits.dim(0)});
  }
  check_range(op, "vocab_start", vocab_start >= 0, fmt::format("must be >= 0, got {}", vocab_start));
}

}  // namespace

void cross_entropy_rowmax(const Tensor& logits, Tensor& rowmax, CrossEntropyOptions opt) {
  const char* op = "cross_entropy_rowmax";
  check_logits(op, logits, nullptr, 0);
  check_f32_shape(op, "rowmax", rowmax, {logits.dim(0)});
  if (device_of(op, {&logits, &rowmax}) == Device::cpu) return cpu::cross_entropy_rowmax(logits, rowmax, opt);
  MT_ON_CUDA(cross_entropy_rowmax(logits, rowmax, opt));
}

void cross_entropy_partials(const Tensor& logits, const Tensor& targets, const Tensor& rowmax, Tensor& sumexp,
                            Tensor& target_logit, CrossEntropyOptions opt) {
  const char* op = "cross_entropy_partials";
  check_logits(op, logits, &targets, opt.vocab_start);
  const int64_t N = logits.dim(0);
  check_f32_shape(op, "rowmax", rowmax, {N});
  check_f32_shape(op, "sumexp", sumexp, {N});
  check_f32_shape(op, "target_logit", target_logit, {N});
  if (device_of(op, {&logits, &targets, &rowmax, &sumexp, &target_logit}) == Device::cpu)
    return cpu::cross_entropy_partials(logits, targets, rowmax, sumexp, target_logit, opt);
  MT_ON_CUDA(cross_entropy_partials(logits, targets, rowmax, sumexp, target_logit, opt));
}

void cross_entropy_loss(const Tensor& rowmax, const Tensor& sumexp, const Tensor& target_logit, Tensor& losses) {
  const char* op = "cross_entropy_loss";
  check_ndim(op, "rowmax", rowmax, 1, "(N)");
  const int64_t N = rowmax.dim(0);
  check_f32_shape(op, "rowmax", rowmax, {N});
  check_f32_shape(op, "sumexp", sumexp, {N});
  check_f32_shape(op, "target_logit", target_logit, {N});
  check_f32_shape(op, "losses", losses, {N});
  if (device_of(op, {&rowmax, &sumexp, &target_logit, &losses}) == Device::cpu)
    return cpu::cross_entropy_loss(rowmax, sumexp, target_logit, losses);
  MT_ON_CUDA(cross_entropy_loss(rowmax, sumexp, target_logit, losses));
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& rowmax, const Tensor& sumexp,
                            const Tensor& dloss, Tensor& dlogits, CrossEntropyOptions opt) {
  const char* op = "cross_entropy_backward";
  check_logits(op, logits, &targets, opt.vocab_start);
  const int64_t N = logits.dim(0);
  check_f32_shape(op, "rowmax", rowmax, {N});
  check_f32_shape(op, "sumexp", sumexp, {N});
  check_f32_shape(op, "dloss", dloss, {N});
  check_like(op, "dlogits", dlogits, logits, "logits");
  if (device_of(op, {&logits, &targets, &rowmax, &sumexp, &dloss, &dlogits}) == Device::cpu)
    return cpu::cross_entropy_backward(logits, targets, rowmax, sumexp, dloss, dlogits, opt);
  MT_ON_CUDA(cross_entropy_backward(logits, targets, rowmax, sumexp, dloss, dlogits, opt));
}

// ---- optimizer and reductions --------------------------------------------------------------------

double sum_squares(const Tensor& x) {
  check_dtype("sum_squares", "x", x, DType::f32);
  return sum_squares(std::vector<Tensor>{x});
}

double sum_squares(const std::vector<Tensor>& xs) {
  const char* op = "sum_squares";
  if (xs.empty()) return 0.0;
  for (size_t i = 0; i < xs.size(); ++i) {
    check_dtype(op, fmt::format("xs[{}]", i).c_str(), xs[i], DType::f32);
    if (xs[i].device() != xs[0].device())
      fail(op, fmt::format("tensors on different devices ({} and {})", device_name(xs[0].device()),
                           device_name(xs[i].device())));
  }
  return grad_stats(xs).sum_squares;  // one pass, one read (the inf/NaN flag comes along)
}

bool has_inf_or_nan(const Tensor& x) {
  check_dtype("has_inf_or_nan", "x", x, DType::f32);
  return grad_stats(std::vector<Tensor>{x}).found_inf;
}

void adamw_step(Tensor& master, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, const AdamWOptions& opt) {
  const char* op = "adamw_step";
  check_dtype(op, "master", master, DType::f32);
  check_like(op, "grad", grad, master, "master");
  check_like(op, "exp_avg", exp_avg, master, "master");
  check_like(op, "exp_avg_sq", exp_avg_sq, master, "master");
  check_range(op, "step", opt.step >= 1, fmt::format("must be >= 1 (1-based), got {}", opt.step));
  check_range(op, "betas", opt.beta1 >= 0.f && opt.beta1 < 1.f && opt.beta2 >= 0.f && opt.beta2 < 1.f,
              fmt::format("must lie in [0, 1), got {} and {}", opt.beta1, opt.beta2));
  if (device_of(op, {&master, &grad, &exp_avg, &exp_avg_sq}) == Device::cpu)
    return cpu::adamw_step(master, grad, exp_avg, exp_avg_sq, opt);
  MT_ON_CUDA(adamw_step(master, grad, exp_avg, exp_avg_sq, opt));
}

// ==== fused step ops ==================================================================================

namespace {

void check_f64(const char* op, const char* name, const Tensor& t, int64_t n) {
  check_dtype(op, name, t, DType::i64);  // f64 bits in i64 storage
  check_range(op, name, t.numel() == n, fmt::format("expected {} f64 value(s), got {}", n, t.numel()));
}

void check_same_device(const char* op, const char* name, size_t i, const Tensor& t, Device d) {
  if (t.device() != d)
    fail(op, fmt::format("{}[{}]: on {}, the others on {}", name, i, device_name(t.device()), device_name(d)));
}

}  // namespace

Tensor f64_zeros(int64_t n, Device device, MemKind kind) { return Tensor::zeros({n}, DType::i64, device, kind); }

std::vector<double> read_f64(const Tensor& t) {
  check_dtype("read_f64", "t", t, DType::i64);
  const Tensor host = t.device() == Device::cpu ? t : t.to(Device::cpu);
  const double* v = host.data<double>();
  return std::vector<double>(v, v + host.numel());
}

void grad_stats(const std::vector<Tensor>& xs, Tensor& stats) {
  const char* op = "grad_stats";
  check_f64(op, "stats", stats, 2);
  for (size_t i = 0; i < xs.size(); ++i) {
    check_dtype(op, fmt::format("xs[{}]", i).c_str(), xs[i], DType::f32);
    check_same_device(op, "xs", i, xs[i], stats.device());
  }
  if (stats.device() == Device::cpu) return cpu::grad_stats(xs, stats);
  MT_ON_CUDA(grad_stats(xs, stats));
}

GradStats grad_stats(const std::vector<Tensor>& xs) {
  Tensor stats = f64_zeros(2, xs.empty() ? Device::cpu : xs[0].device());
  grad_stats(xs, stats);
  const std::vector<double> v = read_f64(stats);
  return GradStats{.sum_squares = v[0], .found_inf = v[1] != 0.0};
}

void adamw_multi_step(const std::vector<AdamWTensors>& ts, const AdamWOptions& opt) {
  const char* op = "adamw_multi_step";
  if (ts.empty()) return;
  check_range(op, "step", opt.step >= 1, fmt::format("must be >= 1 (1-based), got {}", opt.step));
  check_range(op, "betas", opt.beta1 >= 0.f && opt.beta1 < 1.f && opt.beta2 >= 0.f && opt.beta2 < 1.f,
              fmt::format("must lie in [0, 1), got {} and {}", opt.beta1, opt.beta2));
  const Device d = ts[0].master.defined() ? ts[0].master.device() : Device::cpu;
  std::optional<DType> value_dtype;
  for (size_t i = 0; i < ts.size(); ++i) {
    const AdamWTensors& t = ts[i];
    const std::string at = fmt::format("ts[{}]", i);
    const int64_t n = t.master.defined() ? t.master.numel() : 0;
    const std::pair<const char*, const Tensor*> f32s[] = {
        {"master", &t.master}, {"grad", &t.grad}, {"exp_avg", &t.exp_avg}, {"exp_avg_sq", &t.exp_avg_sq}};
    for (auto [name, x] : f32s) {
      const std::string what = fmt::format("{}.{}", at, name);
      check_dtype(op, what.c_str(), *x, DType::f32);
      check_range(op, what.c_str(), x->numel() == n, fmt::format("{} elements, master has {}", x->numel(), n));
      check_same_device(op, "ts", i, *x, d);
    }
    if (!t.value.defined()) continue;
    const std::string what = at + ".value";
    check_floating(op, what.c_str(), t.value);
    check_range(op, what.c_str(), t.value.numel() == n, fmt::format("{} elements, master has {}", t.value.numel(), n));
    check_same_device(op, "ts", i, t.value, d);
    if (value_dtype && *value_dtype != t.value.dtype())
      fail(op, fmt::format("{}: dtype {}, an earlier value has {} (one dtype per call)", what,
                           dtype_name(t.value.dtype()), dtype_name(*value_dtype)));
    value_dtype = t.value.dtype();
  }
  if (d == Device::cpu) return cpu::adamw_multi_step(ts, opt);
  MT_ON_CUDA(adamw_multi_step(ts, opt));
}

void accumulate_mean(const Tensor& x, Tensor& sum) {
  const char* op = "accumulate_mean";
  check_dtype(op, "x", x, DType::f32);
  check_f64(op, "sum", sum, 1);
  check_range(op, "x", x.numel() > 0, "the mean of no values");
  if (device_of(op, {&x, &sum}) == Device::cpu) return cpu::accumulate_mean(x, sum);
  MT_ON_CUDA(accumulate_mean(x, sum));
}

void fill_(Tensor& x, float v) {
  const char* op = "fill_";
  check_floating(op, "x", x);
  if (x.device() == Device::cpu) return cpu::fill_(x, v);
  MT_ON_CUDA(fill_(x, v));
}

}  // namespace mt
