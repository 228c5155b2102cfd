// ops_attention_context.cpp: the op entry points of context-parallel attention's blocks (core/tensor/ops.h):
// packing keys and values, a block's partial attention with its log-sum-exp, the merge, the block backward and
// the assembly of the qkv gradient.
#include <cstdint>
#include <string>

#include <fmt/format.h>

#include "core/tensor/backend.h"
#include "core/tensor/op_profile.h"
#include "core/tensor/ops.h"
#include "core/tensor/ops_check.h"

namespace mt {

using namespace ops_check;  // NOLINT(google-build-using-namespace): the checks every entry point makes

namespace {

// qkv (B, T, G, R + 2, D) with R >= 1.
void check_block_qkv(const char* op, const Tensor& qkv) {
  check_ndim(op, "qkv", qkv, 5, "(B, T, G, R + 2, D)");
  if (qkv.dim(3) < 3 || qkv.dim(4) == 0)
    fail(op,
         fmt::format("qkv: expected shape (B, T, G, R + 2, D) with R >= 1 and D > 0, got {}", shape_str(qkv.shape())));
}

// kv (B, Tk, G, 2, D) of qkv's dtype, its B, G and D.
void check_kv(const char* op, const char* name, const Tensor& kv, const Tensor& qkv, std::optional<DType> dtype) {
  check_ndim(op, name, kv, 5, "(B, Tk, G, 2, D)", dtype);
  if (!dtype && kv.dtype() != qkv.dtype())
    fail(op, fmt::format("{}: expected dtype {} (that of qkv), got {}", name, dtype_name(qkv.dtype()),
                         dtype_name(kv.dtype())));
  expect_shape(op, name, kv, {qkv.dim(0), kv.dim(1), qkv.dim(2), 2, qkv.dim(4)});
}

int64_t heads_of(const Tensor& qkv) { return qkv.dim(2) * (qkv.dim(3) - 2); }

void check_positions(const char* op, const Tensor& qkv, const AttentionBlockOptions& opt) {
  for (const SequencePositions* p : {&opt.q, &opt.k})
    check_range(op, "positions", p->position_offset >= 0 && p->split_at >= 0 && p->split_position >= 0, [&] {
      return fmt::format("must be >= 0, got offset {}, split_at {}, split_position {}", p->position_offset, p->split_at,
                         p->split_position);
    });
  check_window(op, opt.window, opt.causal);
  if (opt.positions.defined()) {  // packed documents: each query row's position within its document
    check_range(op, "causal", opt.causal, "packed documents' positions need causal attention");
    check_ndim(op, "positions", opt.positions, 2, "(B, Tq)", DType::i32);
    expect_shape(op, "positions", opt.positions, {qkv.dim(0), qkv.dim(1)});
    if (opt.positions.device() != qkv.device()) fail(op, "positions: on another device than qkv");
  }
  if (opt.dropout_p == 0.f) return;
  check_p(op, opt.dropout_p);
  check_range(op, "dropout keys", opt.seq_length > 0 && opt.sample_offset >= 0 && opt.head_offset >= 0, [&] {
    return fmt::format("need seq_length > 0 and offsets >= 0, got seq_length {}, sample {}, head {}", opt.seq_length,
                       opt.sample_offset, opt.head_offset);
  });
}

}  // namespace

void attention_kv_pack(const Tensor& qkv, Tensor& kv) {
  const char* op = "attention_kv_pack";
  const op_profile::Scope profile(op);
  check_block_qkv(op, qkv);
  check_kv(op, "kv", kv, qkv, std::nullopt);
  expect_shape(op, "kv", kv, {qkv.dim(0), qkv.dim(1), qkv.dim(2), 2, qkv.dim(4)});
  backend(device_of(op, {&qkv, &kv}), op).attention_kv_pack(qkv, kv);
}

void attention_block_forward(const Tensor& qkv, const Tensor& kv, Tensor& out, Tensor& lse,
                             const AttentionBlockOptions& opt) {
  const char* op = "attention_block_forward";
  const op_profile::Scope profile(op);
  check_block_qkv(op, qkv);
  check_kv(op, "kv", kv, qkv, std::nullopt);
  const int64_t B = qkv.dim(0), T = qkv.dim(1), H = heads_of(qkv), D = qkv.dim(4);
  check_f32_shape(op, "out", out, {B, T, H, D});
  check_f32_shape(op, "lse", lse, {B, H, T});
  check_positions(op, qkv, opt);
  backend(device_of(op, {&qkv, &kv, &out, &lse}), op).attention_block_forward(qkv, kv, out, lse, opt);
}

void attention_merge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b) {
  const char* op = "attention_merge";
  const op_profile::Scope profile(op);
  check_ndim(op, "out", out, 4, "(B, T, H, D)", DType::f32);
  const int64_t B = out.dim(0), T = out.dim(1), H = out.dim(2);
  check_f32_shape(op, "lse", lse, {B, H, T});
  check_f32_shape(op, "out_b", out_b, out.shape());
  check_f32_shape(op, "lse_b", lse_b, lse.shape());
  backend(device_of(op, {&out, &lse, &out_b, &lse_b}), op).attention_merge(out, lse, out_b, lse_b);
}

void attention_block_backward(const Tensor& qkv, const Tensor& kv, const Tensor& out, const Tensor& lse,
                              const Tensor& dout, Tensor& dq, Tensor& dkv, const AttentionBlockOptions& opt) {
  const char* op = "attention_block_backward";
  const op_profile::Scope profile(op);
  check_block_qkv(op, qkv);
  check_kv(op, "kv", kv, qkv, std::nullopt);
  const int64_t B = qkv.dim(0), T = qkv.dim(1), H = heads_of(qkv), D = qkv.dim(4);
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"out", &out}, {"dout", &dout}}) {
    check_dtype(op, name, *t, qkv.dtype());
    if (t->numel() != B * T * H * D)
      fail(op, fmt::format("{}: expected shape [{}, {}, {}, {}] (B, T, H, D) or a view of it, got {}", name, B, T, H, D,
                           shape_str(t->shape())));
  }
  check_f32_shape(op, "lse", lse, {B, H, T});
  check_f32_shape(op, "dq", dq, {B, T, H, D});
  check_kv(op, "dkv", dkv, qkv, DType::f32);
  expect_shape(op, "dkv", dkv, kv.shape());
  check_positions(op, qkv, opt);
  backend(device_of(op, {&qkv, &kv, &out, &lse, &dout, &dq, &dkv}), op)
      .attention_block_backward(qkv, kv, out, lse, dout, dq, dkv, opt);
}

void attention_qkv_grad(const Tensor& dq, const Tensor& dkv, Tensor& dqkv) {
  const char* op = "attention_qkv_grad";
  const op_profile::Scope profile(op);
  check_block_qkv(op, dqkv);
  const int64_t B = dqkv.dim(0), T = dqkv.dim(1), H = heads_of(dqkv), D = dqkv.dim(4);
  check_f32_shape(op, "dq", dq, {B, T, H, D});
  check_f32_shape(op, "dkv", dkv, {B, T, dqkv.dim(2), 2, D});
  backend(device_of(op, {&dq, &dkv, &dqkv}), op).attention_qkv_grad(dq, dkv, dqkv);
}

}  // namespace mt
