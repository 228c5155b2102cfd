// moe_mlp.cpp: the mixture-of-experts MLP on one rank (models/moe_mlp.h).
#include "models/moe_mlp.h"

#include <stdexcept>
#include <utility>

#include <fmt/format.h>

#include "core/tensor/ops.h"

namespace mt {

namespace {

RouterScore router_score(MoeScore s) { return s == MoeScore::sigmoid ? RouterScore::sigmoid : RouterScore::softmax; }

}  // namespace

MoeMlp::MoeMlp(const ModelConfig& cfg, const std::string& prefix, DType dtype, float output_init_std, uint64_t seed,
               Device device)
    : cfg_(cfg), dtype_(dtype), device_(device) {
  const MoeConfig& m = cfg.moe;
  if (!m.enabled()) throw std::invalid_argument(prefix + ": MoeMlp needs model.moe.num_experts > 0");
  if (m.aux_loss_coeff > 0 || m.z_loss_coeff > 0 || m.bias_update_rate > 0 || m.capacity_factor > 0)
    throw std::invalid_argument(prefix +
                                ": the auxiliary and z losses, the expert bias update and capacity factors are not "
                                "implemented in MoeMlp yet (issue 25)");
  const int64_t C = cfg.hidden_size, F = m.ffn_hidden_size, E = m.num_experts;
  const int64_t F1 = cfg.arch == Arch::llama ? 2 * F : F;
  router_ = make_parameter(prefix + ".router.weight", {E, C}, dtype, Init::normal, cfg.init_std, seed);
  for (int64_t e = 0; e < E; ++e) {
    const std::string expert = fmt::format("{}.experts.{}", prefix, e);
    fc1_.push_back(make_parameter(expert + ".fc1.weight", {F1, C}, dtype, Init::normal, cfg.init_std, seed));
    fc2_.push_back(make_parameter(expert + ".fc2.weight", {C, F}, dtype, Init::normal, output_init_std, seed));
  }
  if (const int64_t Fs = m.shared_expert_ffn_hidden_size; Fs > 0) {
    const int64_t Fs1 = cfg.arch == Arch::llama ? 2 * Fs : Fs;
    shared_fc1_ =
        make_parameter(prefix + ".shared_expert.fc1.weight", {Fs1, C}, dtype, Init::normal, cfg.init_std, seed);
    shared_fc2_ =
        make_parameter(prefix + ".shared_expert.fc2.weight", {C, Fs}, dtype, Init::normal, output_init_std, seed);
  }
  for (Parameter* p : parameters()) move_to_device(*p, device);  // initial values are drawn on the host
}

namespace {

// One expert's MLP on rows x (n, C): h = x W1^T, act = GELU(h) or SwiGLU(h), y = act W2^T.
void expert_forward(const Tensor& x, const Parameter& w1, const Parameter& w2, bool llama, Tensor& h, Tensor& act,
                    Tensor& y) {
  gemm(x, w1.value, h, GemmOptions{.trans_b = true});
  if (llama)
    swiglu_forward(h, act);
  else
    gelu_forward(h, act);
  gemm(act, w2.value, y, GemmOptions{.trans_b = true});
}

// Its backward: dx (n, C) written from dy; the weights' gradients accumulated. dact and dh are scratch like act, h.
void expert_backward(const Tensor& dy, const Tensor& x, const Tensor& h, const Tensor& act, Parameter& w1,
                     Parameter& w2, bool llama, Tensor& dact, Tensor& dh, Tensor& dx) {
  gemm(dy, w2.value, dact);                                           // (n, F)
  gemm(dy, act, w2.grad, GemmOptions{.trans_a = true, .beta = 1.f});  // (C, F) +=
  if (llama)
    swiglu_backward(h, dact, dh);
  else
    gelu_backward(h, dact, dh);
  gemm(dh, w1.value, dx);                                           // (n, C)
  gemm(dh, x, w1.grad, GemmOptions{.trans_a = true, .beta = 1.f});  // (F1, C) +=
}

}  // namespace

std::vector<Parameter*> MoeMlp::parameters() {
  std::vector<Parameter*> out{&router_};
  for (size_t e = 0; e < fc1_.size(); ++e) {
    out.push_back(&fc1_[e]);
    out.push_back(&fc2_[e]);
  }
  if (has_shared_expert()) {
    out.push_back(&shared_fc1_);
    out.push_back(&shared_fc2_);
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
  const Tensor host_counts = counts.to(Device::cpu);
  s.counts.assign(host_counts.data<int32_t>(), host_counts.data<int32_t>() + E);
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
    Tensor hs = s.h.slice(row, row + n), as = s.act.slice(row, row + n), ys = s.y.slice(row, row + n);
    expert_forward(s.xp.slice(row, row + n), fc1_[static_cast<size_t>(e)], fc2_[static_cast<size_t>(e)], llama, hs, as,
                   ys);
    row += n;
  }
  Tensor out = Tensor::empty({N, C}, dtype_, device_);
  moe_unpermute(s.y, s.row_of, &s.probs, out);
  if (has_shared_expert()) {  // out += the shared expert's output
    s.shared_h = Tensor::empty({N, shared_fc1_.value.dim(0)}, dtype_, device_);
    s.shared_act = Tensor::empty({N, shared_fc2_.value.dim(1)}, dtype_, device_);
    Tensor ys = Tensor::empty({N, C}, dtype_, device_);
    expert_forward(x, shared_fc1_, shared_fc2_, llama, s.shared_h, s.shared_act, ys);
    add(out, ys, out);
  }
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
    Tensor das = dact.slice(row, row + n), dhs = dh.slice(row, row + n), dxs = dxp.slice(row, row + n);
    expert_backward(dy.slice(row, row + n), s.xp.slice(row, row + n), s.h.slice(row, row + n),
                    s.act.slice(row, row + n), fc1_[static_cast<size_t>(e)], fc2_[static_cast<size_t>(e)], llama, das,
                    dhs, dxs);
    row += n;
  }
  Tensor dx = Tensor::empty({N, C}, dtype_, device_);
  moe_unpermute(dxp, s.row_of, nullptr, dx);
  if (has_shared_expert()) {  // dx += the shared expert's input gradient
    Tensor sdact = Tensor::empty(s.shared_act.shape(), dtype_, device_),
           sdh = Tensor::empty(s.shared_h.shape(), dtype_, device_), sdx = Tensor::empty({N, C}, dtype_, device_);
    expert_backward(dout, s.x, s.shared_h, s.shared_act, shared_fc1_, shared_fc2_, llama, sdact, sdh, sdx);
    add(dx, sdx, dx);
  }
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
