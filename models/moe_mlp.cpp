// moe_mlp.cpp: the mixture-of-experts MLP on one rank (models/moe_mlp.h).
#include "models/moe_mlp.h"

#include <stdexcept>
#include <utility>

#include <fmt/format.h>

#include "core/tensor/ops.h"

namespace mt {

namespace {

RouterScore router_score(MoeScore s) { return s == MoeScore::sigmoid ? RouterScore::sigmoid : RouterScore::softmax; }

Parameter on_device(Parameter p, Device device) {
  if (device != Device::cpu) {
    p.value = p.value.to(device, MemKind::parameter);
    p.grad = p.grad.to(device, MemKind::gradient);
  }
  return p;
}

}  // namespace

MoeMlp::MoeMlp(const ModelConfig& cfg, const std::string& prefix, DType dtype, float output_init_std, uint64_t seed,
               Device device)
    : cfg_(cfg), dtype_(dtype), device_(device) {
  const MoeConfig& m = cfg.moe;
  if (!m.enabled()) throw std::invalid_argument(prefix + ": MoeMlp needs model.moe.num_experts > 0");
  if (m.shared_expert_ffn_hidden_size > 0 || m.aux_loss_coeff > 0 || m.z_loss_coeff > 0 || m.bias_update_rate > 0 ||
      m.capacity_factor > 0)
    throw std::invalid_argument(prefix +
                                ": the shared expert, auxiliary and z losses, the expert bias update and capacity "
                                "factors are not implemented in MoeMlp yet (issue 25)");
  const int64_t C = cfg.hidden_size, F = m.ffn_hidden_size, E = m.num_experts;
  const int64_t F1 = cfg.arch == Arch::llama ? 2 * F : F;
  router_ =
      on_device(make_parameter(prefix + ".router.weight", {E, C}, dtype, Init::normal, cfg.init_std, seed), device);
  for (int64_t e = 0; e < E; ++e) {
    const std::string expert = fmt::format("{}.experts.{}", prefix, e);
    fc1_.push_back(
        on_device(make_parameter(expert + ".fc1.weight", {F1, C}, dtype, Init::normal, cfg.init_std, seed), device));
    fc2_.push_back(
        on_device(make_parameter(expert + ".fc2.weight", {C, F}, dtype, Init::normal, output_init_std, seed), device));
  }
}

std::vector<Parameter*> MoeMlp::parameters() {
  std::vector<Parameter*> out{&router_};
  for (size_t e = 0; e < fc1_.size(); ++e) {
    out.push_back(&fc1_[e]);
    out.push_back(&fc2_[e]);
  }
  return out;
}

Tensor MoeMlp::forward(const Tensor& x, Saved& s) const {
  const MoeConfig& m = cfg_.moe;
  const int64_t N = x.dim(0), C = x.dim(1), E = m.num_experts, k = m.top_k, R = N * k;
  const bool llama = cfg_.arch == Arch::llama;
  s.x = x;
  // Router: fp32 logits, scores and top-k.
  Tensor logits = Tensor::empty({N, E}, DType::f32, device_);
  gemm(x, router_.value, logits, GemmOptions{.trans_b = true});
  s.scores = Tensor::empty({N, E}, DType::f32, device_);
  s.experts = Tensor::empty({N, k}, DType::i32, device_);
  s.probs = Tensor::empty({N, k}, DType::f32, device_);
  moe_router_forward(
      logits, Tensor(), s.scores, s.experts, s.probs,
      MoeRouterOptions{
          .top_k = static_cast<int>(k), .score = router_score(m.score_function), .norm_topk_prob = m.norm_topk_prob});
  // Dispatch: each expert's choices a contiguous row slice; the counts on the host size the GEMMs.
  s.row_of = Tensor::empty({N, k}, DType::i32, device_);
  Tensor counts = Tensor::empty({E}, DType::i32, device_);
  moe_dispatch_index(s.experts, s.row_of, counts);
  const std::vector<float> host_counts = counts.to_floats();
  s.counts.assign(host_counts.begin(), host_counts.end());
  s.xp = Tensor::empty({R, C}, dtype_, device_);
  moe_permute(x, s.row_of, nullptr, s.xp);
  const int64_t F1 = fc1_.front().value.dim(0), F = fc2_.front().value.dim(1);
  s.h = Tensor::empty({R, F1}, dtype_, device_);
  s.act = Tensor::empty({R, F}, dtype_, device_);
  s.y = Tensor::empty({R, C}, dtype_, device_);
  int64_t row = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = s.counts[static_cast<size_t>(e)];
    if (n == 0) continue;
    const Tensor xs = s.xp.slice(row, row + n);
    Tensor hs = s.h.slice(row, row + n), as = s.act.slice(row, row + n), ys = s.y.slice(row, row + n);
    gemm(xs, fc1_[static_cast<size_t>(e)].value, hs, GemmOptions{.trans_b = true});
    if (llama)
      swiglu_forward(hs, as);
    else
      gelu_forward(hs, as);
    gemm(as, fc2_[static_cast<size_t>(e)].value, ys, GemmOptions{.trans_b = true});
    row += n;
  }
  Tensor out = Tensor::empty({N, C}, dtype_, device_);
  moe_unpermute(s.y, s.row_of, &s.probs, out);
  return out;
}

Tensor MoeMlp::backward(const Tensor& dout, const Saved& s) {
  const MoeConfig& m = cfg_.moe;
  const int64_t N = dout.dim(0), C = dout.dim(1), E = m.num_experts, k = m.top_k, R = N * k;
  const bool llama = cfg_.arch == Arch::llama;
  // Through the weighted sum: the rows' gradient and the weights'.
  Tensor dy = Tensor::empty({R, C}, dtype_, device_);
  moe_permute(dout, s.row_of, &s.probs, dy);
  Tensor dprobs = Tensor::empty({N, k}, DType::f32, device_);
  moe_unpermute_backward_probs(dout, s.y, s.row_of, dprobs);
  // Each expert's MLP on its slice.
  Tensor dxp = Tensor::empty({R, C}, dtype_, device_);
  Tensor dact = Tensor::empty(s.act.shape(), dtype_, device_), dh = Tensor::empty(s.h.shape(), dtype_, device_);
  int64_t row = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = s.counts[static_cast<size_t>(e)];
    if (n == 0) continue;
    Parameter& w1 = fc1_[static_cast<size_t>(e)];
    Parameter& w2 = fc2_[static_cast<size_t>(e)];
    const Tensor dys = dy.slice(row, row + n), as = s.act.slice(row, row + n), hs = s.h.slice(row, row + n),
                 xs = s.xp.slice(row, row + n);
    Tensor das = dact.slice(row, row + n), dhs = dh.slice(row, row + n), dxs = dxp.slice(row, row + n);
    gemm(dys, w2.value, das);                                           // (n, F)
    gemm(dys, as, w2.grad, GemmOptions{.trans_a = true, .beta = 1.f});  // (C, F) +=
    if (llama)
      swiglu_backward(hs, das, dhs);
    else
      gelu_backward(hs, das, dhs);
    gemm(dhs, w1.value, dxs);                                           // (n, C)
    gemm(dhs, xs, w1.grad, GemmOptions{.trans_a = true, .beta = 1.f});  // (F1, C) +=
    row += n;
  }
  Tensor dx = Tensor::empty({N, C}, dtype_, device_);
  moe_unpermute(dxp, s.row_of, nullptr, dx);
  // Through the router: dlogits in fp32, then the linear's gradients in the compute dtype.
  Tensor dlogits = Tensor::empty({N, E}, DType::f32, device_);
  moe_router_backward(
      s.scores, s.experts, dprobs, dlogits,
      MoeRouterOptions{
          .top_k = static_cast<int>(k), .score = router_score(m.score_function), .norm_topk_prob = m.norm_topk_prob});
  Tensor dl = dlogits;
  if (dtype_ != DType::f32) {
    dl = Tensor::empty({N, E}, dtype_, device_);
    dl.copy_from(dlogits);
  }
  gemm(dl, router_.value, dx, GemmOptions{.beta = 1.f});                   // dx += dlogits Wr
  gemm(dl, s.x, router_.grad, GemmOptions{.trans_a = true, .beta = 1.f});  // dWr += dlogits^T x
  return dx;
}

}  // namespace mt
