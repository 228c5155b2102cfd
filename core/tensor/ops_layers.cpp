// ops_layers.cpp: the op entry points for LayerNorm, RMSNorm, embeddings, dropout, attention and RoPE.
#include "core/tensor/ops.h"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>

#include <fmt/format.h>

#include "core/base/rope_scaling.h"
#include "core/tensor/backend.h"
#include "core/tensor/op_profile.h"
#include "core/tensor/ops_check.h"

namespace mt {

using namespace ops_check;  // NOLINT(google-build-using-namespace): the checks every entry point makes

// ---- LayerNorm -----------------------------------------------------------------------------------

void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& out, Tensor& mean,
                       Tensor& rstd, LayerNormOptions opt) {
  const char* op = "layernorm_forward";
  const op_profile::Scope profile(op);
  check_ndim(op, "x", x, 2, "(N, C)");
  const int64_t N = x.dim(0), C = x.dim(1);
  check_floating_shape(op, "weight", weight, {C});
  check_floating_shape(op, "bias", bias, {C});
  check_like(op, "out", out, x, "x");
  check_f32_shape(op, "mean", mean, {N});
  check_f32_shape(op, "rstd", rstd, {N});
  check_range(op, "eps", opt.eps >= 0.f, [&] { return fmt::format("must be >= 0, got {}", opt.eps); });
  backend(device_of(op, {&x, &weight, &bias, &out, &mean, &rstd}), op)
      .layernorm_forward(x, weight, bias, out, mean, rstd, opt);
}

void layernorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, Tensor& dx, Tensor& dweight, Tensor& dbias) {
  const char* op = "layernorm_backward";
  const op_profile::Scope profile(op);
  check_ndim(op, "x", x, 2, "(N, C)");
  const int64_t N = x.dim(0), C = x.dim(1);
  check_like(op, "dout", dout, x, "x");
  check_floating_shape(op, "weight", weight, {C});
  check_f32_shape(op, "mean", mean, {N});
  check_f32_shape(op, "rstd", rstd, {N});
  check_like(op, "dx", dx, x, "x");
  check_f32_shape(op, "dweight", dweight, {C});
  check_f32_shape(op, "dbias", dbias, {C});
  backend(device_of(op, {&dout, &x, &weight, &mean, &rstd, &dx, &dweight, &dbias}), op)
      .layernorm_backward(dout, x, weight, mean, rstd, dx, dweight, dbias);
}

// ---- RMSNorm -------------------------------------------------------------------------------------

void rmsnorm_forward(const Tensor& x, const Tensor& weight, Tensor& out, Tensor& rstd, RmsNormOptions opt) {
  const char* op = "rmsnorm_forward";
  const op_profile::Scope profile(op);
  check_ndim(op, "x", x, 2, "(N, C)");
  const int64_t N = x.dim(0), C = x.dim(1);
  check_floating_shape(op, "weight", weight, {C});
  check_like(op, "out", out, x, "x");
  check_f32_shape(op, "rstd", rstd, {N});
  check_range(op, "eps", opt.eps >= 0.f, [&] { return fmt::format("must be >= 0, got {}", opt.eps); });
  backend(device_of(op, {&x, &weight, &out, &rstd}), op).rmsnorm_forward(x, weight, out, rstd, opt);
}

void rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& rstd, Tensor& dx,
                      Tensor& dweight) {
  const char* op = "rmsnorm_backward";
  const op_profile::Scope profile(op);
  check_ndim(op, "x", x, 2, "(N, C)");
  const int64_t N = x.dim(0), C = x.dim(1);
  check_like(op, "dout", dout, x, "x");
  check_floating_shape(op, "weight", weight, {C});
  check_f32_shape(op, "rstd", rstd, {N});
  check_like(op, "dx", dx, x, "x");
  check_f32_shape(op, "dweight", dweight, {C});
  backend(device_of(op, {&dout, &x, &weight, &rstd, &dx, &dweight}), op)
      .rmsnorm_backward(dout, x, weight, rstd, dx, dweight);
}

// ---- embeddings ----------------------------------------------------------------------------------

void embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out, EmbeddingOptions opt) {
  const char* op = "embedding_forward";
  const op_profile::Scope profile(op);
  check_ndim(op, "ids", ids, 2, "(B, T)", DType::i32);
  check_ndim(op, "table", table, 2, "(V, C)");
  check_floating_shape(op, "out", out, {ids.dim(0), ids.dim(1), table.dim(1)});
  check_range(op, "vocab_start", opt.vocab_start >= 0,
              [&] { return fmt::format("must be >= 0, got {}", opt.vocab_start); });
  backend(device_of(op, {&ids, &table, &out}), op).embedding_forward(ids, table, out, opt);
}

void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable, EmbeddingOptions opt) {
  const char* op = "embedding_backward";
  const op_profile::Scope profile(op);
  check_ndim(op, "ids", ids, 2, "(B, T)", DType::i32);
  check_ndim(op, "dtable", dtable, 2, "(V, C)", DType::f32);
  check_floating_shape(op, "dout", dout, {ids.dim(0), ids.dim(1), dtable.dim(1)});
  check_range(op, "vocab_start", opt.vocab_start >= 0,
              [&] { return fmt::format("must be >= 0, got {}", opt.vocab_start); });
  backend(device_of(op, {&ids, &dout, &dtable}), op).embedding_backward(ids, dout, dtable, opt);
}

namespace {

// Packed documents' positions (AttentionOptions / RopeOptions / EmbeddingOptions::positions), when defined:
// (B, T) i32 on `device` with T >= `min_columns` (== it when `exact`).
void check_document_positions(const char* op, const Tensor& positions, int64_t B, int64_t min_columns, bool exact,
                              Device device) {
  if (!positions.defined()) return;
  check_ndim(op, "positions", positions, 2, "(B, T)", DType::i32);
  if (positions.dim(0) != B || (exact ? positions.dim(1) != min_columns : positions.dim(1) < min_columns))
    fail(op, fmt::format("positions: expected shape [{}, {}{}] (B, T), got {}", B, exact ? "" : ">= ", min_columns,
                         shape_str(positions.shape())));
  if (positions.device() != device) fail(op, "positions: on another device than the tensors it positions");
}

// The rows [position_offset, position_offset + T) must lie inside a (P, C) position table.
void check_positions(const char* op, const Tensor& x, const char* table_name, const Tensor& table,
                     const EmbeddingOptions& opt) {
  check_ndim(op, table_name, table, 2, "(P, C)");
  expect_shape(op, table_name, table, {table.dim(0), x.dim(2)});
  check_range(op, "position_offset", opt.position_offset >= 0 && opt.position_offset + x.dim(1) <= table.dim(0),
              fmt::format("positions [{}, {}) exceed the {} rows of {}", opt.position_offset,
                          opt.position_offset + x.dim(1), table.dim(0), table_name));
  if (opt.positions.defined()) {
    check_range(op, "split_at", opt.split_at == 0, "must be 0 with packed documents' positions");
    check_document_positions(op, opt.positions, x.dim(0), opt.position_offset + x.dim(1), false, x.device());
  }
  if (opt.split_at > 0)
    check_range(op, "split_position",
                opt.split_position >= 0 && opt.split_position + x.dim(1) - opt.split_at <= table.dim(0),
                fmt::format("positions [{}, {}) exceed the {} rows of {}", opt.split_position,
                            opt.split_position + x.dim(1) - opt.split_at, table.dim(0), table_name));
}

}  // namespace

void position_embedding_add(Tensor& x, const Tensor& wpe, EmbeddingOptions opt) {
  const char* op = "position_embedding_add";
  const op_profile::Scope profile(op);
  check_ndim(op, "x", x, 3, "(B, T, C)");
  check_positions(op, x, "wpe", wpe, opt);
  backend(device_of(op, {&x, &wpe}), op).position_embedding_add(x, wpe, opt);
}

void position_embedding_backward(const Tensor& dout, Tensor& dwpe, EmbeddingOptions opt) {
  const char* op = "position_embedding_backward";
  const op_profile::Scope profile(op);
  check_ndim(op, "dout", dout, 3, "(B, T, C)");
  check_dtype(op, "dwpe", dwpe, DType::f32);
  check_positions(op, dout, "dwpe", dwpe, opt);
  backend(device_of(op, {&dout, &dwpe}), op).position_embedding_backward(dout, dwpe, opt);
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
  check_range(op, "offsets", opt.sample_offset >= 0 && opt.row_offset >= 0 && opt.col_offset >= 0, [&] {
    return fmt::format("must be >= 0, got sample {}, row {}, col {}", opt.sample_offset, opt.row_offset,
                       opt.col_offset);
  });
  check_range(op, "split", opt.split_at >= 0 && opt.split_position >= 0, [&] {
    return fmt::format("must be >= 0, got split_at {}, split_position {}", opt.split_at, opt.split_position);
  });
}

}  // namespace

void dropout_forward(const Tensor& x, Tensor& out, const DropoutOptions& opt) {
  const char* op = "dropout_forward";
  const op_profile::Scope profile(op);
  check_dropout(op, x, "x", out, "out", opt);
  backend(device_of(op, {&x, &out}), op).dropout_forward(x, out, opt);
}

void dropout_backward(const Tensor& dout, Tensor& dx, const DropoutOptions& opt) {
  const char* op = "dropout_backward";
  const op_profile::Scope profile(op);
  check_dropout(op, dout, "dout", dx, "dx", opt);
  backend(device_of(op, {&dout, &dx}), op).dropout_backward(dout, dx, opt);
}

// ---- fused residual + dropout ----

void dropout_add(const Tensor& x, const Tensor& residual, Tensor& out, const DropoutOptions& opt) {
  const char* op = "dropout_add";
  const op_profile::Scope profile(op);
  check_dropout(op, x, "x", out, "out", opt);
  check_like(op, "residual", residual, x, "x");
  backend(device_of(op, {&x, &residual, &out}), op).dropout_add(x, residual, out, opt);
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
              [&] { return fmt::format("must be >= 0, got sample {}, head {}", opt.sample_offset, opt.head_offset); });
  check_window(op, opt.window, opt.causal);
  if (opt.positions.defined()) {
    check_range(op, "causal", opt.causal, "packed documents' positions need causal attention");
    check_document_positions(op, opt.positions, qkv.dim(0), qkv.dim(1), true, qkv.device());
  }
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
  const op_profile::Scope profile(op);
  check_qkv(op, qkv, opt);
  check_heads_out(op, "out", out, qkv);
  check_lse(op, lse, qkv);
  backend(device_of(op, {&qkv, &out, &lse}), op).attention_forward(qkv, out, lse, opt);
}

void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout, Tensor& dqkv,
                        const AttentionOptions& opt) {
  const char* op = "attention_backward";
  const op_profile::Scope profile(op);
  check_qkv(op, qkv, opt);
  check_heads_out(op, "out", out, qkv);
  check_lse(op, lse, qkv);
  check_heads_out(op, "dout", dout, qkv);
  check_like(op, "dqkv", dqkv, qkv, "qkv");
  backend(device_of(op, {&qkv, &out, &lse, &dout, &dqkv}), op).attention_backward(qkv, out, lse, dout, dqkv, opt);
}

// ---- rotary position embedding -------------------------------------------------------------------

void rope_(Tensor& qkv, const RopeOptions& opt) {
  const char* op = "rope_";
  const op_profile::Scope profile(op);
  check_ndim(op, "qkv", qkv, 5, "(B, T, G, R + 2, D)");
  if (qkv.dim(3) < 3 || qkv.dim(4) == 0 || qkv.dim(4) % 2 != 0)
    fail(op, fmt::format("qkv: expected shape (B, T, G, R + 2, D) with R >= 1 and an even D > 0, got {}",
                         shape_str(qkv.shape())));
  check_range(op, "theta", opt.theta > 0.f && std::isfinite(opt.theta),
              [&] { return fmt::format("must be a finite number > 0, got {}", opt.theta); });
  check_range(op, "position_offset", opt.position_offset >= 0,
              [&] { return fmt::format("must be >= 0, got {}", opt.position_offset); });
  check_range(op, "split_position", opt.split_at >= 0 && opt.split_position >= 0, [&] {
    return fmt::format("split_at and split_position must be >= 0, got {} and {}", opt.split_at, opt.split_position);
  });
  if (opt.positions.defined()) {
    check_range(op, "position_offset", opt.position_offset == 0 && opt.split_at == 0,
                "position_offset and split_at must be 0 with packed documents' positions");
    check_document_positions(op, opt.positions, qkv.dim(0), qkv.dim(1), true, qkv.device());
    check_range(op, "position_rows", opt.position_rows >= 0,
                [&] { return fmt::format("must be >= 0, got {}", opt.position_rows); });
  }
  check_range(op, "inv_freq", opt.inv_freq.empty() || static_cast<int64_t>(opt.inv_freq.size()) * 2 == qkv.dim(4), [&] {
    return fmt::format("holds {} frequencies for a head dim of {} (D/2 = {} expected)", opt.inv_freq.size(), qkv.dim(4),
                       qkv.dim(4) / 2);
  });
  check_range(op, "attention_factor", opt.attention_factor > 0.f && std::isfinite(opt.attention_factor),
              [&] { return fmt::format("must be a finite number > 0, got {}", opt.attention_factor); });
  backend(qkv.device(), op).rope_(qkv, opt);
}

std::vector<float> rope_inv_freq(const RopeOptions& opt, int64_t D) {
  if (!opt.inv_freq.empty()) return {opt.inv_freq.begin(), opt.inv_freq.end()};
  return rope_frequencies(opt.theta, D).inv_freq;
}

}  // namespace mt
