// moe_mlp.cpp: the mixture-of-experts MLP on one rank (models/moe_mlp.h).
#include "models/moe_mlp.h"

#include <algorithm>
#include <numeric>
#include <cmath>
#include <stdexcept>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/tensor/ops.h"
#include "parallel/layers/sequence_parallel.h"
#include "parallel/pipeline/weight_grad.h"

namespace mt {

namespace {

RouterScore router_score(MoeScore s) { return s == MoeScore::sigmoid ? RouterScore::sigmoid : RouterScore::softmax; }

}  // namespace

MoeMlp::MoeMlp(const ModelConfig& cfg, const std::string& prefix, DType dtype, float output_init_std, uint64_t seed,
               Device device, TensorParallel tp, ExpertParallel ep, ContextParallel cp, const LoraConfig& lora)
    : cfg_(cfg), prefix_(prefix), dtype_(dtype), device_(device), tp_(tp), cp_(cp), ep_(ep) {
  const MoeConfig& m = cfg.moe;
  if (!m.enabled()) throw std::invalid_argument(prefix + ": MoeMlp needs model.moe.num_experts > 0");
  const int64_t C = cfg.hidden_size, F = m.ffn_hidden_size, E = m.num_experts, t = tp.size;
  if (E % ep.size != 0)
    throw std::invalid_argument(
        fmt::format("{}: the expert-parallel size {} does not divide the {} experts", prefix, ep.size, E));
  const int etp = ep.tensor == 0 ? tp.size : ep.tensor;
  if (etp < 1 || tp.size % etp != 0)
    throw std::invalid_argument(
        fmt::format("{}: the experts' tensor-parallel size {} does not divide the "
                    "tensor-parallel size {}",
                    prefix, etp, tp.size));
  fold_ = tp.rank / etp;
  folds_ = tp.size / etp;
  const TensorParallel expert_tp{.rank = tp.rank % etp, .size = etp};  // the experts' split (no communication)
  first_expert_ = ep.first(E);
  const bool llama = cfg.arch == Arch::llama;
  if (F % etp != 0 || m.shared_expert_ffn_hidden_size % t != 0)
    throw std::invalid_argument(
        fmt::format("{}: the tensor-parallel sizes {} (experts) and {} (shared expert) do not divide the experts' "
                    "width {} or the shared expert's {}",
                    prefix, etp, t, F, m.shared_expert_ffn_hidden_size));
  // fc1 (F1, C) split by rows (SwiGLU's gate and up interleaved, so a row block holds whole pairs), fc2 (C, F) by
  // columns: the dense MLP's column- and row-parallel split, every slice holding the whole tensor's values.
  auto mlp = [&](const std::string& name, int64_t width, const TensorParallel& split, Parameter& w1, Parameter& w2) {
    const int64_t W1 = llama ? 2 * width : width;
    w1 = make_parameter_slice(name + ".fc1.weight",
                              {.global = {W1, C}, .start = {split.begin(W1), 0}, .local = {split.count(W1), C}}, dtype,
                              Init::normal, cfg.init_std, seed);
    w2 =
        make_parameter_slice(name + ".fc2.weight",
                             {.global = {C, width}, .start = {0, split.begin(width)}, .local = {C, split.count(width)}},
                             dtype, Init::normal, output_init_std, seed);
  };
  router_ = make_parameter(prefix + ".router.weight", {E, C}, dtype, Init::normal, cfg.init_std, seed);
  // This rank's experts, named by their global index.
  const int64_t El = ep.count(E);
  fc1_.resize(static_cast<size_t>(El));
  fc2_.resize(static_cast<size_t>(El));
  for (int64_t l = 0; l < El; ++l)
    mlp(fmt::format("{}.experts.{}", prefix, first_expert_ + l), F, expert_tp, fc1_[static_cast<size_t>(l)],
        fc2_[static_cast<size_t>(l)]);
  for (size_t l = 0; l < fc1_.size(); ++l) fc1_[l].expert = fc2_[l].expert = true;
  if (m.shared_expert_ffn_hidden_size > 0)
    mlp(prefix + ".shared_expert", m.shared_expert_ffn_hidden_size, tp, shared_fc1_, shared_fc2_);
  if (lora.enabled() && (lora.targets_any("fc1") || lora.targets_any("fc2"))) {
    const int64_t Fs = m.shared_expert_ffn_hidden_size;
    lora_ = ExpertAdapters(lora,
                           {.prefix = prefix,
                            .first_expert = first_expert_,
                            .local_experts = El,
                            .hidden = C,
                            .fc1_rows = llama ? 2 * F : F,
                            .width = F,
                            .shared_width = Fs,
                            .shared_fc1_rows = llama ? 2 * Fs : Fs},
                           dtype, seed, expert_tp, tp);
  }
  for (Parameter* p : parameters()) move_to_device(*p, device);  // initial values are drawn on the host
  if (m.bias_update_rate > 0) expert_bias_ = Tensor::zeros({E}, DType::f32, device, MemKind::parameter);
  load_.tokens.assign(static_cast<size_t>(E), 0);
}

namespace {

// The architecture's expert activation: act = SwiGLU(h) for llama, GELU(h) for gpt (nothing for no rows). Forward
// and the selective recomputation (moe_act) both run it, so the recomputed values are the forward's.
void activation_forward(const Tensor& h, Tensor& act, bool llama) {
  if (h.dim(0) == 0) return;
  if (llama)
    swiglu_forward(h, act);
  else
    gelu_forward(h, act);
}

// The shared expert's adapters (either may be null) and their saved rows.
struct SharedLora {
  LoraAdapter *fc1, *fc2;
  LoraSaved *saved1, *saved2;
};

// The shared expert's MLP on rows x (n, C): h = x W1^T, act = GELU(h) or SwiGLU(h), y = act W2^T (each GEMM with
// its adapter's update).
void expert_forward(const Tensor& x, const Parameter& w1, const Parameter& w2, bool llama, Tensor& h, Tensor& act,
                    Tensor& y, const SharedLora& lora) {
  gemm(x, w1.value, h, GemmOptions{.trans_b = true});
  if (lora.fc1) lora.fc1->forward(x, 1, h, {.saved = lora.saved1});
  activation_forward(h, act, llama);
  gemm(act, w2.value, y, GemmOptions{.trans_b = true});
  if (lora.fc2) lora.fc2->forward(act, 1, y, {.saved = lora.saved2});
}

// Its backward: dx (n, C) written from dy; the weights' gradients accumulated. dact and dh are scratch like act, h.
void expert_backward(const Tensor& dy, const Tensor& x, const Tensor& h, const Tensor& act, Parameter& w1,
                     Parameter& w2, bool llama, Tensor& dact, Tensor& dh, Tensor& dx, const SharedLora& lora) {
  gemm(dy, w2.value, dact);  // (n, F)
  if (lora.fc2) lora.fc2->backward(dy, act, 1, dact, {.saved = lora.saved2});
  if (llama)
    swiglu_backward(h, dact, dh);
  else
    gelu_backward(h, dact, dh);
  gemm(dh, w1.value, dx);  // (n, C)
  if (lora.fc1) lora.fc1->backward(dh, x, 1, dx, {.saved = lora.saved1});
  if (w1.frozen) return;  // finetune.lora's base
  // The weights' gradients: the schedule's W under a zero-bubble pipeline (parallel/pipeline/weight_grad.h).
  weight_grad_work([dy, act, dh, x, &w1, &w2] {
    gemm(dy, act, w2.grad, GemmOptions{.trans_a = true, .beta = 1.f});  // (C, F) +=
    gemm(dh, x, w1.grad, GemmOptions{.trans_a = true, .beta = 1.f});    // (F1, C) +=
  });
}

// The local experts with rows (models/moe_expert_lora.h) and their weights.
struct ExpertGroups : ExpertRows {
  std::vector<Tensor> w1, w2;  // their weights: (F1, C), (C, F)

  ExpertGroups(const std::vector<int64_t>& expert_rows, const std::vector<Parameter>& fc1,
               const std::vector<Parameter>& fc2)
      : ExpertRows(expert_rows) {
    for (size_t l : experts) {
      w1.push_back(fc1[l].value);
      w2.push_back(fc2[l].value);
    }
  }
  // Each group's gradient of the parameters ps (handles to the accumulated buffers).
  std::vector<Tensor> grads(const std::vector<Parameter>& ps) const {
    std::vector<Tensor> out;
    for (size_t l : experts) out.push_back(ps[l].grad);
    return out;
  }
};

}  // namespace

std::vector<Parameter*> MoeMlp::parameters() {
  std::vector<Parameter*> out{&router_};
  for (size_t e = 0; e < fc1_.size(); ++e) {
    out.push_back(&fc1_[e]);
    out.push_back(&fc2_[e]);
    for (Parameter* p : lora_.expert_parameters(e)) out.push_back(p);
  }
  if (has_shared_expert()) {
    out.push_back(&shared_fc1_);
    out.push_back(&shared_fc2_);
    for (Parameter* p : lora_.shared_parameters()) out.push_back(p);
  }
  return out;
}

void MoeMlp::merge_lora() {
  for (size_t e = 0; e < fc1_.size(); ++e) lora_.merge_into(e, fc1_[e].value, fc2_[e].value);
  if (has_shared_expert()) lora_.merge_shared_into(shared_fc1_.value, shared_fc2_.value);
  lora_.clear();
}

MoeRouterOptions MoeMlp::router_options() const {
  return {.top_k = static_cast<int>(cfg_.moe.top_k),
          .score = router_score(cfg_.moe.score_function),
          .norm_topk_prob = cfg_.moe.norm_topk_prob};
}

Tensor MoeMlp::forward(const Tensor& x_rows, Saved& s, const MoeStep& step) const {
  const MoeConfig& m = cfg_.moe;
  const bool llama = cfg_.arch == Arch::llama;
  s.x = sequence_to_full(x_rows, step.samples, tp_);  // every token, on every TP rank
  const Tensor& x = s.x;
  const int64_t N = x.dim(0), C = x.dim(1), E = m.num_experts, k = m.top_k;
  // Router: fp32 logits, scores and top-k (the same on every TP rank).
  Tensor logits = Tensor::empty({N, E}, DType::f32, device_);
  gemm(x, router_.value, logits, GemmOptions{.trans_b = true});
  s.scores = Tensor::empty({N, E}, DType::f32, device_);
  s.experts = Tensor::empty({N, k}, DType::i32, device_);
  s.probs = Tensor::empty({N, k}, DType::f32, device_);
  moe_router_forward(logits, expert_bias_, s.scores, s.experts, s.probs, router_options());
  if (m.aux_loss_coeff > 0 || m.z_loss_coeff > 0) s.logits = logits;
  // Dispatch: each expert's choices a contiguous row slice; the counts on the host size the GEMMs. With a capacity
  // factor each expert keeps its ceil(factor * N * k / E) heaviest choices of the microbatch (Megatron-Core's "probs"
  // policy; capacity_dispatch) and the others are dropped (they add nothing to their token's output); the aux loss
  // and the load count every choice.
  s.row_of = Tensor::empty({N, k}, DType::i32, device_);
  auto host = [E](const Tensor& t) {
    const Tensor h = t.to(Device::cpu);
    return std::vector<int64_t>(h.data<int32_t>(), h.data<int32_t>() + E);
  };
  Tensor counts = Tensor::empty({E}, DType::i32, device_);
  moe_dispatch_index(s.experts, s.row_of, counts);
  s.routed = host(counts);
  s.routed_all = s.routed;
  s.tokens_all = N;
  if (cp_.enabled() && (m.aux_loss_coeff > 0 || m.z_loss_coeff > 0)) {  // the whole microbatch's counts
    std::vector<float> v(s.routed.begin(), s.routed.end());             // exact in f32 (far below 2^24)
    v.push_back(static_cast<float>(N));
    Tensor all = Tensor::from_floats(v, {E + 1}).to(device_);
    cp_.comm->all_reduce(all, ReduceOp::sum)->wait();
    const std::vector<float> sums = all.to_floats();
    for (int64_t e = 0; e < E; ++e) s.routed_all[static_cast<size_t>(e)] = std::llround(sums[static_cast<size_t>(e)]);
    s.tokens_all = std::llround(sums[static_cast<size_t>(E)]);
  }
  if (m.capacity_factor > 0) {
    capacity_dispatch(s, step.samples, counts);
    s.counts = host(counts);
  } else {
    s.counts = s.routed;
  }
  if (step.record) record_load(logits, s);
  int64_t kept = 0;
  for (int64_t c : s.counts) kept += c;
  Tensor xp = Tensor::empty({kept, C}, dtype_, device_);  // this rank's kept choices, by expert
  moe_permute(x, s.row_of, nullptr, xp);
  plan_share(s);
  const Tensor xd = take_share(xp, s);  // the rows this rank dispatches
  if (ep_.size > 1)
    plan_exchange(s);
  else
    s.expert_rows = s.sent;
  s.xp = ep_.size > 1 ? to_experts(xd, s) : xd;  // this rank's experts' rows, by expert
  const int64_t Re = s.xp.dim(0);
  const int64_t F1 = fc1_.front().value.dim(0), F = fc2_.front().value.dim(1);
  s.h = Tensor::empty({Re, F1}, dtype_, device_);
  s.act = Tensor::empty({Re, F}, dtype_, device_);
  Tensor ye = Tensor::empty({Re, C}, dtype_, device_);
  // The local experts' MLPs as grouped GEMMs (one group per expert with rows), the activation once over all rows.
  const ExpertGroups g(s.expert_rows, fc1_, fc2_);
  std::vector<Tensor> xs = g.slices(s.xp), hs = g.slices(s.h), as = g.slices(s.act), ys = g.slices(ye);
  gemm_grouped(xs, g.w1, hs, GemmOptions{.trans_b = true});  // h = x W1^T
  lora_.forward_fc1(g, s.xp, s.h, s.lora);
  activation_forward(s.h, s.act, llama);
  gemm_grouped(as, g.w2, ys, GemmOptions{.trans_b = true});  // y = act W2^T
  lora_.forward_fc2(g, s.act, ye, s.lora);
  s.y = put_share(ep_.size > 1 ? from_experts(ye, s) : ye, s, kept);
  Tensor out = Tensor::empty({N, C}, dtype_, device_);  // this rank's partial sum with tensor parallelism
  moe_unpermute(s.y, s.row_of, &s.probs, out);
  if (has_shared_expert()) {  // out += the shared expert's output
    s.shared_h = Tensor::empty({N, shared_fc1_.value.dim(0)}, dtype_, device_);
    s.shared_act = Tensor::empty({N, shared_fc2_.value.dim(1)}, dtype_, device_);
    Tensor ys = Tensor::empty({N, C}, dtype_, device_);
    expert_forward(x, shared_fc1_, shared_fc2_, llama, s.shared_h, s.shared_act, ys,
                   {lora_.shared_fc1(), lora_.shared_fc2(), &s.shared_lora1, &s.shared_lora2});
    add(out, ys, out);
  }
  return sequence_shard_sum(out, step.samples, tp_);
}

void MoeMlp::capacity_dispatch(Saved& s, int64_t samples, Tensor& counts) const {
  const MoeConfig& m = cfg_.moe;
  const int64_t N = s.experts.dim(0), k = s.experts.dim(1), all = N * cp_.size;
  const auto capacity = std::max<int64_t>(
      1, static_cast<int64_t>(
             std::ceil(m.capacity_factor * static_cast<double>(all * k) / static_cast<double>(m.num_experts) - 1e-9)));
  if (!cp_.enabled()) {
    moe_dispatch_index(s.experts, s.row_of, counts, {.capacity = capacity, .probs = &s.probs});
    return;
  }
  // The context ranks hold the other chunks of the microbatch's sequences: their choices, with the tokens' one-rank
  // order for the ties, decide which of this rank's choices stay.
  Tensor experts = Tensor::empty({all, k}, DType::i32, device_), probs = Tensor::empty({all, k}, DType::f32, device_);
  cp_.comm->all_gather(s.experts, experts)->wait();
  cp_.comm->all_gather(s.probs, probs)->wait();
  const Tensor order = context_token_order(cp_, samples, N / samples).to(device_);
  moe_dispatch_index(experts, s.row_of, counts,
                     {.capacity = capacity, .probs = &probs, .order = &order, .part_begin = cp_.rank * N});
}

void MoeMlp::plan_share(Saved& s) const {
  if (folds_ == 1) {
    s.sent = s.counts;
    return;
  }
  // Expert e's kept rows [offset, offset + c): this fold takes [offset + c f / F, offset + c (f + 1) / F).
  std::vector<int32_t> share;
  s.sent.assign(s.counts.size(), 0);
  int64_t offset = 0;
  for (size_t e = 0; e < s.counts.size(); ++e) {
    const int64_t c = s.counts[e], begin = c * fold_ / folds_, end = c * (fold_ + 1) / folds_;
    for (int64_t r = begin; r < end; ++r) share.push_back(static_cast<int32_t>(offset + r));
    s.sent[e] = end - begin;
    offset += c;
  }
  s.share = Tensor::from_ints(share, {static_cast<int64_t>(share.size()), 1}).to(device_);
}

Tensor MoeMlp::take_share(const Tensor& rows, const Saved& s) const {
  if (folds_ == 1) return rows;
  Tensor out = Tensor::empty({s.share.dim(0), rows.dim(1)}, rows.dtype(), device_);
  moe_unpermute(rows, s.share, nullptr, out);  // out[i] = rows[share[i]]
  return out;
}

Tensor MoeMlp::put_share(const Tensor& rows, const Saved& s, int64_t kept) const {
  if (folds_ == 1) return rows;
  Tensor out = Tensor::zeros({kept, rows.dim(1)}, rows.dtype(), device_);
  moe_permute(rows, s.share, nullptr, out);  // out[share[i]] = rows[i]
  return out;
}

void MoeMlp::record_load(const Tensor& logits, const Saved& s) const {
  const MoeConfig& m = cfg_.moe;
  const int64_t N = s.x.dim(0), E = m.num_experts;
  for (int64_t e = 0; e < E; ++e) {
    load_.tokens[static_cast<size_t>(e)] += s.routed[static_cast<size_t>(e)];
    load_.dropped += s.routed[static_cast<size_t>(e)] - s.counts[static_cast<size_t>(e)];
  }
  ++load_.microbatches;
  if (N == 0 || (m.aux_loss_coeff <= 0 && m.z_loss_coeff <= 0)) return;
  // The score sums and the sum of squared log-sum-exps over the whole microbatch (its context ranks' too).
  Tensor stats = Tensor::empty({E + 1}, DType::f32, device_);
  Tensor score_sums = stats.slice(0, E), lse_sq = stats.slice(E, E + 1);
  moe_router_loss_stats(logits, s.scores, router_options().score, score_sums, lse_sq);
  if (cp_.enabled()) cp_.comm->all_reduce(stats, ReduceOp::sum)->wait();
  const std::vector<float> sums = stats.to_floats();
  const auto n = static_cast<double>(s.tokens_all);
  double aux = 0;
  for (int64_t e = 0; e < E; ++e)
    aux +=
        static_cast<double>(sums[static_cast<size_t>(e)]) * static_cast<double>(s.routed_all[static_cast<size_t>(e)]);
  load_.aux += aux * static_cast<double>(E) / (static_cast<double>(m.top_k) * n * n);
  load_.z += static_cast<double>(sums[static_cast<size_t>(E)]) / n;
}

void MoeMlp::drop_activations(Saved& s) const { s.act = s.shared_act = Tensor(); }

void MoeMlp::recompute_activations(Saved& s) const {
  const bool llama = cfg_.arch == Arch::llama;
  auto act = [&](const Tensor& h, int64_t width) {
    Tensor out = Tensor::empty({h.dim(0), width}, dtype_, device_);
    activation_forward(h, out, llama);
    return out;
  };
  s.act = act(s.h, fc2_.front().value.dim(1));
  if (has_shared_expert()) s.shared_act = act(s.shared_h, shared_fc2_.value.dim(1));
}

MoeLoad MoeMlp::take_load() {
  MoeLoad out = std::move(load_);
  load_ = MoeLoad{};
  load_.tokens.assign(static_cast<size_t>(cfg_.moe.num_experts), 0);
  return out;
}

void MoeMlp::update_expert_bias(const std::vector<int64_t>& tokens) {
  if (!has_expert_bias()) return;
  const int64_t E = cfg_.moe.num_experts;
  if (static_cast<int64_t>(tokens.size()) != E)
    throw std::invalid_argument(
        fmt::format("{}: expert bias update with {} token counts for {} experts", prefix_, tokens.size(), E));
  double mean = 0;
  for (int64_t t : tokens) mean += static_cast<double>(t);
  mean /= static_cast<double>(E);
  std::vector<float> bias = expert_bias();
  const auto rate = static_cast<float>(cfg_.moe.bias_update_rate);
  for (size_t e = 0; e < bias.size(); ++e) {
    const double d = mean - static_cast<double>(tokens[e]);
    bias[e] += d > 0 ? rate : (d < 0 ? -rate : 0.f);  // an underloaded expert's bias rises
  }
  set_expert_bias(bias);
}

std::vector<float> MoeMlp::expert_bias() const {
  return has_expert_bias() ? expert_bias_.to_floats() : std::vector<float>();
}

void MoeMlp::set_expert_bias(const std::vector<float>& bias) {
  if (!has_expert_bias() || static_cast<int64_t>(bias.size()) != cfg_.moe.num_experts)
    throw std::invalid_argument(fmt::format("{}: an expert bias of {} values for a layer with {}", prefix_, bias.size(),
                                            has_expert_bias() ? cfg_.moe.num_experts : 0));
  expert_bias_.copy_from(Tensor::from_floats(bias, {cfg_.moe.num_experts}));
}

Tensor MoeMlp::backward(const Tensor& dout_rows, const Saved& s, const MoeStep& step) {
  const MoeConfig& m = cfg_.moe;
  const bool llama = cfg_.arch == Arch::llama;
  const Tensor dout = sequence_to_full(dout_rows, step.samples, tp_);  // (N, C)
  const int64_t N = dout.dim(0), C = dout.dim(1), E = m.num_experts, k = m.top_k;
  // Through the weighted sum: the rows' gradient and the weights' (summed over the experts' TP slices).
  int64_t kept = 0;
  for (int64_t c : s.counts) kept += c;
  Tensor dy = Tensor::empty({kept, C}, dtype_, device_);
  moe_permute(dout, s.row_of, &s.probs, dy);
  Tensor dprobs = Tensor::empty({N, k}, DType::f32, device_);
  moe_unpermute_backward_probs(dout, s.y, s.row_of, dprobs);
  tp_.reduce_from_group(dprobs);
  // Each expert's MLP on its slice (with expert parallelism, on the rows every EP rank sent this rank's experts).
  const Tensor dyd = take_share(dy, s);
  const Tensor dye = ep_.size > 1 ? to_experts(dyd, s) : dyd;
  const int64_t Re = s.xp.dim(0);
  Tensor dxe = Tensor::empty({Re, C}, dtype_, device_);
  Tensor dact = Tensor::empty(s.act.shape(), dtype_, device_), dh = Tensor::empty(s.h.shape(), dtype_, device_);
  const ExpertGroups g(s.expert_rows, fc1_, fc2_);
  const std::vector<Tensor> dys = g.slices(dye), xs = g.slices(s.xp), as = g.slices(s.act);
  std::vector<Tensor> dacts = g.slices(dact), dhs = g.slices(dh), dxs = g.slices(dxe);
  gemm_grouped(dys, g.w2, dacts);  // dact (n, F) = dy W2
  lora_.backward_fc2(g, dye, s.act, s.lora, dact);
  if (Re > 0) {
    if (llama)
      swiglu_backward(s.h, dact, dh);
    else
      gelu_backward(s.h, dact, dh);
  }
  gemm_grouped(dhs, g.w1, dxs);  // dx (n, C) = dh W1
  lora_.backward_fc1(g, dh, s.xp, s.lora, dxe);
  // The experts' weight gradients: the schedule's W under a zero-bubble pipeline (parallel/pipeline/weight_grad.h);
  // none for finetune.lora's frozen base.
  if (!fc1_.front().frozen)
    weight_grad_work([dys, as, dhs, xs, w1_grads = g.grads(fc1_), w2_grads = g.grads(fc2_)]() mutable {
      gemm_grouped(dys, as, w2_grads, GemmOptions{.trans_a = true, .beta = 1.f});  // dW2 (C, F) += dy^T act
      gemm_grouped(dhs, xs, w1_grads, GemmOptions{.trans_a = true, .beta = 1.f});  // dW1 (F1, C) += dh^T x
    });
  const Tensor dxp = put_share(ep_.size > 1 ? from_experts(dxe, s) : dxe, s, kept);
  Tensor dx = Tensor::empty({N, C}, dtype_, device_);
  moe_unpermute(dxp, s.row_of, nullptr, dx);
  if (has_shared_expert()) {  // dx += the shared expert's input gradient
    Tensor sdact = Tensor::empty(s.shared_act.shape(), dtype_, device_),
           sdh = Tensor::empty(s.shared_h.shape(), dtype_, device_), sdx = Tensor::empty({N, C}, dtype_, device_);
    expert_backward(dout, s.x, s.shared_h, s.shared_act, shared_fc1_, shared_fc2_, llama, sdact, sdh, sdx,
                    {lora_.shared_fc1(), lora_.shared_fc2(), const_cast<LoraSaved*>(&s.shared_lora1),
                     const_cast<LoraSaved*>(&s.shared_lora2)});  // backward only reads them
    add(dx, sdx, dx);
  }
  // Through the router: dlogits in fp32 (with the aux and z losses' gradients), then the linear's gradients in the
  // compute dtype. Every TP rank has the whole dlogits: the router's gradient is a replica's, its input gradient
  // joins the group's sum from rank 0 only.
  Tensor dlogits = Tensor::empty({N, E}, DType::f32, device_);
  moe_router_backward(s.scores, s.experts, dprobs, dlogits, router_options());
  if (N > 0 && (m.aux_loss_coeff > 0 || m.z_loss_coeff > 0)) {
    // d(objective)/d(score sum P_e) = dloss * coeff * E * T_e / (k N^2); d/d(sum of lse^2) = dloss * z_coeff / N,
    // with N and T_e the whole microbatch's. A context rank's dloss is the microbatch's over CP (its share of the
    // mean of the language-model loss): these losses are the microbatch's whole, so CP times that.
    Tensor score_grad;
    const double n = static_cast<double>(s.tokens_all), dloss = step.dloss * static_cast<double>(cp_.size);
    if (m.aux_loss_coeff > 0) {
      std::vector<float> g(static_cast<size_t>(E));
      const double c = dloss * m.aux_loss_coeff * static_cast<double>(E) / (static_cast<double>(k) * n * n);
      for (int64_t e = 0; e < E; ++e)
        g[static_cast<size_t>(e)] = static_cast<float>(c * static_cast<double>(s.routed_all[static_cast<size_t>(e)]));
      score_grad = Tensor::from_floats(g, {E}).to(device_);
    }
    const float z_grad = m.z_loss_coeff > 0 ? static_cast<float>(dloss * m.z_loss_coeff / n) : 0.f;
    moe_router_loss_backward(s.logits, s.scores, score_grad, z_grad, router_options().score, dlogits);
  }
  Tensor dl = dlogits;
  if (dtype_ != DType::f32) {
    dl = Tensor::empty({N, E}, dtype_, device_);
    dl.copy_from(dlogits);
  }
  if (tp_.rank == 0) gemm(dl, router_.value, dx, GemmOptions{.beta = 1.f});  // dx += dlogits Wr
  if (!router_.frozen)                                                       // finetune.lora's base
    weight_grad_work([this, dl, x = s.x] {
      gemm(dl, x, router_.grad, GemmOptions{.trans_a = true, .beta = 1.f});  // dWr += dlogits^T x
    });
  return sequence_shard_sum(dx, step.samples, tp_);
}

}  // namespace mt
