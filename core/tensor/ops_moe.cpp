// ops_moe.cpp: the op entry points for mixture of experts, the router and the token dispatch (core/tensor/ops.h):
// argument checks naming the op and the argument, then the device's implementation.
#include "core/tensor/ops.h"

#include <string>

#include <fmt/format.h>

#include "core/tensor/backend.h"
#include "core/tensor/op_profile.h"
#include "core/tensor/ops_check.h"

namespace mt {

using namespace ops_check;  // NOLINT(google-build-using-namespace): the checks every entry point makes

namespace {

// E, the number of experts, from a (N, E) f32 tensor `name` (logits or scores), within [1, kMaxRouterExperts].
int64_t check_router_experts(const char* op, const char* name, const Tensor& t) {
  check_ndim(op, name, t, 2, "(N, E)", DType::f32);
  const int64_t E = t.dim(1);
  check_range(op, name, E >= 1 && E <= kMaxRouterExperts,
              [&] { return fmt::format("the number of experts E must lie in [1, {}], got {}", kMaxRouterExperts, E); });
  return E;
}

void check_router_score(const char* op, RouterScore score) {
  check_range(op, "score", score == RouterScore::softmax || score == RouterScore::sigmoid,
              [&] { return fmt::format("unknown RouterScore {}", static_cast<int>(score)); });
}

// E from a (N, E) f32 tensor `name` (logits or scores), top_k within [1, E] and a known score function.
int64_t check_router_rows(const char* op, const char* name, const Tensor& t, const MoeRouterOptions& opt) {
  const int64_t E = check_router_experts(op, name, t);
  check_range(op, "top_k", opt.top_k >= 1 && opt.top_k <= E,
              [&] { return fmt::format("must lie in [1, E] = [1, {}], got {}", E, opt.top_k); });
  check_router_score(op, opt.score);
  return E;
}

}  // namespace

void moe_router_forward(const Tensor& logits, const Tensor& bias, Tensor& scores, Tensor& experts, Tensor& probs,
                        const MoeRouterOptions& opt) {
  const char* op = "moe_router_forward";
  const op_profile::Scope profile(op);
  const int64_t E = check_router_rows(op, "logits", logits, opt), N = logits.dim(0), K = opt.top_k;
  if (bias.defined()) check_f32_shape(op, "bias", bias, {E});
  check_f32_shape(op, "scores", scores, {N, E});
  check_dtype(op, "experts", experts, DType::i32);
  expect_shape(op, "experts", experts, {N, K});
  check_f32_shape(op, "probs", probs, {N, K});
  const Device device = bias.defined() ? device_of(op, {&logits, &bias, &scores, &experts, &probs})
                                       : device_of(op, {&logits, &scores, &experts, &probs});
  backend(device, op).moe_router_forward(logits, bias, scores, experts, probs, opt);
}

void moe_router_backward(const Tensor& scores, const Tensor& experts, const Tensor& dprobs, Tensor& dlogits,
                         const MoeRouterOptions& opt) {
  const char* op = "moe_router_backward";
  const op_profile::Scope profile(op);
  const int64_t E = check_router_rows(op, "scores", scores, opt), N = scores.dim(0), K = opt.top_k;
  check_dtype(op, "experts", experts, DType::i32);
  expect_shape(op, "experts", experts, {N, K});
  check_f32_shape(op, "dprobs", dprobs, {N, K});
  check_f32_shape(op, "dlogits", dlogits, {N, E});
  backend(device_of(op, {&scores, &experts, &dprobs, &dlogits}), op)
      .moe_router_backward(scores, experts, dprobs, dlogits, opt);
}

void moe_router_loss_stats(const Tensor& logits, const Tensor& scores, RouterScore score, Tensor& score_sums,
                           Tensor& lse_sq_sum) {
  const char* op = "moe_router_loss_stats";
  const op_profile::Scope profile(op);
  const int64_t E = check_router_experts(op, "logits", logits), N = logits.dim(0);
  check_router_score(op, score);
  check_f32_shape(op, "scores", scores, {N, E});
  check_f32_shape(op, "score_sums", score_sums, {E});
  check_f32_shape(op, "lse_sq_sum", lse_sq_sum, {1});
  backend(device_of(op, {&logits, &scores, &score_sums, &lse_sq_sum}), op)
      .moe_router_loss_stats(logits, scores, score, score_sums, lse_sq_sum);
}

void moe_router_loss_backward(const Tensor& logits, const Tensor& scores, const Tensor& score_grad, float z_grad,
                              RouterScore score, Tensor& dlogits) {
  const char* op = "moe_router_loss_backward";
  const op_profile::Scope profile(op);
  const int64_t E = check_router_experts(op, "logits", logits), N = logits.dim(0);
  check_router_score(op, score);
  check_f32_shape(op, "scores", scores, {N, E});
  if (score_grad.defined()) check_f32_shape(op, "score_grad", score_grad, {E});
  check_f32_shape(op, "dlogits", dlogits, {N, E});
  const Device device = score_grad.defined() ? device_of(op, {&logits, &scores, &score_grad, &dlogits})
                                             : device_of(op, {&logits, &scores, &dlogits});
  backend(device, op).moe_router_loss_backward(logits, scores, score_grad, z_grad, score, dlogits);
}

// ---- token dispatch ----

namespace {

// row_of (N, k) i32, one row per token; probs, when given, (N, k) f32.
void check_choices(const char* op, const Tensor& row_of, int64_t tokens, const Tensor* probs) {
  check_ndim(op, "row_of", row_of, 2, "(N, k)", DType::i32);
  if (row_of.dim(0) != tokens)
    fail(op, fmt::format("row_of: expected {} rows (one per token), got {}", tokens, shape_str(row_of.shape())));
  if (probs) check_f32_shape(op, "probs", *probs, row_of.shape());
}

// t's dtype and column count are ref's (the permuted rows and the tokens' rows of one activation).
void check_columns_like(const char* op, const char* name, const Tensor& t, const Tensor& ref, const char* ref_name) {
  if (t.dtype() != ref.dtype() || t.dim(1) != ref.dim(1))
    fail(op, fmt::format("{}: expected {} rows of {} columns like {}, got {} {}", name, dtype_name(ref.dtype()),
                         ref.dim(1), ref_name, dtype_name(t.dtype()), shape_str(t.shape())));
}

}  // namespace

void moe_dispatch_index(const Tensor& experts, Tensor& row_of, Tensor& counts) {
  moe_dispatch_index(experts, row_of, counts, MoeCapacityOptions{});
}

void moe_dispatch_index(const Tensor& experts, Tensor& row_of, Tensor& counts, const MoeCapacityOptions& cap) {
  const char* op = "moe_dispatch_index";
  const op_profile::Scope profile(op);
  check_ndim(op, "experts", experts, 2, "(N, k)", DType::i32);
  check_ndim(op, "row_of", row_of, 2, "(P, k)", DType::i32);
  const int64_t N = experts.dim(0), P = row_of.dim(0);
  if (row_of.dim(1) != experts.dim(1) || cap.part_begin < 0 || cap.part_begin + P > N)
    fail(op, fmt::format("row_of: expected the choices of tokens [{}, {} + P) of experts {}, got {}", cap.part_begin,
                         cap.part_begin, shape_str(experts.shape()), shape_str(row_of.shape())));
  check_ndim(op, "counts", counts, 1, "(E)", DType::i32);
  if (counts.dim(0) < 1) fail(op, "counts: expected at least one expert, got (0)");
  if (experts.numel() > (int64_t{1} << 31) - 1)
    fail(op, fmt::format("experts: {} choices, more than int32 row indices hold", experts.numel()));
  check_range(op, "capacity", cap.capacity >= 0, [&] {
    return fmt::format("the most choices an expert keeps must be >= 0 (0: no limit), got {}", cap.capacity);
  });
  if (cap.probs) {
    check_f32_shape(op, "probs", *cap.probs, experts.shape());
    (void)device_of(op, {&experts, cap.probs});  // throws when they differ
  }
  if (cap.order) {
    check_ndim(op, "order", *cap.order, 1, "(N)", DType::i32);
    expect_shape(op, "order", *cap.order, {N});
    (void)device_of(op, {&experts, cap.order});
  }
  backend(device_of(op, {&experts, &row_of, &counts}), op).moe_dispatch_index(experts, row_of, counts, cap);
}

void moe_permute(const Tensor& x, const Tensor& row_of, const Tensor* probs, Tensor& out) {
  const char* op = "moe_permute";
  const op_profile::Scope profile(op);
  check_ndim(op, "x", x, 2, "(N, C)");
  check_choices(op, row_of, x.dim(0), probs);
  check_ndim(op, "out", out, 2, "(R, C)");
  check_columns_like(op, "out", out, x, "x");
  if (probs) (void)device_of(op, {&x, probs});  // throws when they differ
  backend(device_of(op, {&x, &row_of, &out}), op).moe_permute(x, row_of, probs, out);
}

void moe_unpermute(const Tensor& y, const Tensor& row_of, const Tensor* probs, Tensor& out) {
  const char* op = "moe_unpermute";
  const op_profile::Scope profile(op);
  check_ndim(op, "y", y, 2, "(R, C)");
  check_ndim(op, "out", out, 2, "(N, C)");
  check_choices(op, row_of, out.dim(0), probs);
  check_columns_like(op, "out", out, y, "y");
  if (probs) (void)device_of(op, {&y, probs});  // throws when they differ
  backend(device_of(op, {&y, &row_of, &out}), op).moe_unpermute(y, row_of, probs, out);
}

void moe_unpermute_backward_probs(const Tensor& dout, const Tensor& y, const Tensor& row_of, Tensor& dprobs) {
  const char* op = "moe_unpermute_backward_probs";
  const op_profile::Scope profile(op);
  check_ndim(op, "dout", dout, 2, "(N, C)");
  check_ndim(op, "y", y, 2, "(R, C)");
  check_columns_like(op, "y", y, dout, "dout");
  check_choices(op, row_of, dout.dim(0), &dprobs);
  backend(device_of(op, {&dout, &y, &row_of, &dprobs}), op).moe_unpermute_backward_probs(dout, y, row_of, dprobs);
}

}  // namespace mt
