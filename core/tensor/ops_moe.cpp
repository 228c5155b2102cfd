// ops_moe.cpp: the op entry points for mixture of experts (the router): argument checks, then the dispatch.
#include "core/tensor/ops.h"

#include <fmt/format.h>

#include "core/cpu/ops_cpu.h"
#include "core/tensor/op_profile.h"
#include "core/tensor/ops_check.h"
#if defined(MEGATRAIN_WITH_CUDA)
#include "core/cuda/ops_cuda.h"
#endif

namespace mt {

using namespace ops_check;  // NOLINT(google-build-using-namespace): the checks every entry point makes

namespace {

// The most experts a router row may hold (the CUDA kernel keeps a row in shared memory).
constexpr int64_t kMaxExperts = 1024;

// E, the number of experts, from a (N, E) f32 tensor `name` (logits or scores), and top_k within [1, E].
int64_t check_router_rows(const char* op, const char* name, const Tensor& t, const MoeRouterOptions& opt) {
  check_ndim(op, name, t, 2, "(N, E)", DType::f32);
  const int64_t E = t.dim(1);
  check_range(op, name, E >= 1 && E <= kMaxExperts,
              fmt::format("the number of experts E must lie in [1, {}], got {}", kMaxExperts, E));
  check_range(op, "top_k", opt.top_k >= 1 && opt.top_k <= E,
              fmt::format("must lie in [1, E] = [1, {}], got {}", E, opt.top_k));
  check_range(op, "score", opt.score == RouterScore::softmax || opt.score == RouterScore::sigmoid,
              fmt::format("unknown RouterScore {}", static_cast<int>(opt.score)));
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
  if (device == Device::cpu) return cpu::moe_router_forward(logits, bias, scores, experts, probs, opt);
  MT_ON_CUDA(moe_router_forward(logits, bias, scores, experts, probs, opt));
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
  if (device_of(op, {&scores, &experts, &dprobs, &dlogits}) == Device::cpu)
    return cpu::moe_router_backward(scores, experts, dprobs, dlogits, opt);
  MT_ON_CUDA(moe_router_backward(scores, experts, dprobs, dlogits, opt));
}

}  // namespace mt
