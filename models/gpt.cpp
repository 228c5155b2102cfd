#include "models/gpt.h"

#include <fmt/format.h>

#include "core/tensor/ops.h"
#include "core/base/rng.h"
#include "parallel/pipeline/weight_grad.h"

namespace mt {

GptModel::GptModel(const ModelConfig& cfg, GptOptions opt) : cfg_(cfg), opt_(opt) {
  const int64_t C = cfg.hidden_size, V = cfg.padded_vocab_size, P = cfg.max_position_embeddings;
  StageLayout& st = opt_.stage;
  if (st.layer_end < 0) st.layer_end = cfg.num_layers;
  vocab_start_ = opt.tp.begin(V);
  vocab_local_ = opt.tp.count(V);
  // Vocabulary-parallel: each TP rank holds a block of rows of the (padded) vocabulary. A last stage
  // without the embedding holds a tied copy for its head (same name and initial values).
  if (st.has_embedding || (st.has_head && cfg.tie_embeddings)) {
    wte_ = VocabParallelEmbedding({.name = "embedding.word_embeddings",
                                   .num_embeddings = V,
                                   .embedding_dim = C,
                                   .init_std = cfg.init_std,
                                   .dtype = opt.dtype,
                                   .seed = opt.seed},
                                  opt.tp);
    wte_.weight().tied_copy = !st.has_embedding;
    wte_.weight().grad_sums.embedding = cfg.tie_embeddings;
    params_.push_back(&wte_.weight());
  }
  if (st.has_embedding && has_position_table()) {
    wpe_ =
        make_parameter("embedding.position_embeddings.weight", {P, C}, opt.dtype, Init::normal, cfg.init_std, opt.seed);
    params_.push_back(&wpe_);
  }
  if (opt.recompute && opt.recompute_uniform) {
    if (opt.recompute_layers < 1)
      throw std::invalid_argument(
          fmt::format("model: uniform recomputation needs recompute_layers >= 1 (the layers per group), got {}",
                      opt.recompute_layers));
    group_layers_ = opt.recompute_layers;
  }
  for (int64_t i = st.layer_begin; i < st.layer_end; ++i) {
    // training.recompute_num_layers (Megatron's "block" method): the chunk's first layers only.
    // Uniform's layers keep what they are told to: their group (here) decides.
    const bool recompute = opt.recompute && !opt.recompute_uniform &&
                           (opt.recompute_layers == 0 || i - st.layer_begin < opt.recompute_layers);
    const PartOptions part{.layer = i,
                           .dtype = opt.dtype,
                           .seed = opt.seed,
                           .device = opt.device,
                           .tp = opt.tp,
                           .ep = opt.ep,
                           .cp = opt.cp,
                           .lora = opt.lora,
                           .selective = opt.selective};
    layers_.push_back(std::make_unique<TransformerLayer>(cfg, part, recompute));
    for (Parameter* p : layers_.back()->parameters()) params_.push_back(p);
  }
  if (st.has_head) {
    lnf_ = Norm("final_ln", C, norm_kind(cfg.arch), cfg.layernorm_eps, opt.dtype, opt.seed);
    for (Parameter* p : lnf_.parameters()) params_.push_back(p);
    // The LM head is vocabulary-parallel: column-parallel over the vocabulary, its input gathered with SP.
    if (cfg.tie_embeddings) {
      head_ = ColumnParallelLinear(wte_.weight(), opt.tp);
    } else {
      head_ = ColumnParallelLinear({.name = "lm_head",
                                    .in_features = C,
                                    .out_features = V,
                                    .bias = false,
                                    .init_std = cfg.init_std,
                                    .dtype = opt.dtype,
                                    .seed = opt.seed},
                                   opt.tp);
      head_.weight().vocabulary_rows = true;
      params_.push_back(&head_.weight());
    }
  }
  if (opt.tp.sequence_parallel) {
    if (st.has_embedding && has_position_table()) wpe_.grad_sums.tensor = true;
    if (st.has_head) lnf_.mark_sequence_parallel();
  }
  site_embedding_ = stream_id("embedding.dropout");
  if (opt.lora.enabled())  // only the adapters train: the base has no gradient storage and gets no gradient
    for (Parameter* p : params_)
      if (!is_lora_parameter(*p)) {
        p->frozen = true;
        p->grad = Tensor();
      }
  for (Parameter* p : params_) move_to_device(*p, opt.device);  // initial values are drawn on the host
}

GptModel::Roles GptModel::roles() const {
  Roles r;
  const StageLayout& st = opt_.stage;
  if (st.has_embedding) r.word_embeddings = &wte_.weight();
  if (st.has_embedding && has_position_table()) r.position_embeddings = &wpe_;
  if (st.has_head) {
    r.final_norm = &lnf_;
    r.lm_head = &head_.weight();
  }
  for (const auto& layer : layers_) r.layers.push_back(layer.get());
  return r;
}

void GptModel::merge_lora() {
  std::erase_if(params_, [](const Parameter* p) { return is_lora_parameter(*p); });  // before they are dropped
  for (auto& l : layers_) l->merge_lora();
}

std::vector<MoeMlp*> GptModel::moe_layers() {
  std::vector<MoeMlp*> out;
  for (auto& layer : layers_)
    if (MoeMlp* m = layer->moe()) out.push_back(m);
  return out;
}

std::vector<TransformerLayer*> GptModel::layers() {
  std::vector<TransformerLayer*> out;
  for (auto& layer : layers_) out.push_back(layer.get());
  return out;
}

std::vector<std::vector<Parameter*>> GptModel::units() {
  std::vector<std::vector<Parameter*>> units;
  if (opt_.stage.has_embedding) {
    units.push_back({&wte_.weight()});
    if (has_position_table()) units.back().push_back(&wpe_);
  }
  for (auto& layer : layers_) units.push_back(layer->parameters());
  if (opt_.stage.has_head) {
    units.push_back(lnf_.parameters());
    units.back().push_back(&head_.weight());
  }
  return units;
}

int64_t GptModel::num_parameters() const {
  int64_t n = 0;
  for (const Parameter* p : params_) n += p->value.numel();
  return n;
}

float GptModel::forward(const Tensor& tokens, const Tensor& targets, int mb, const StepContext& ctx) {
  float loss = 0;
  forward_stage(Tensor(), tokens, targets, mb, ctx, &loss);
  return loss;
}

void GptModel::backward(int mb, float dloss) { backward_stage(mb, Tensor(), dloss); }

Tensor GptModel::forward_stage(const Tensor& input, const Tensor& tokens, const Tensor& targets, int mb,
                               const StepContext& ctx, float* loss) {
  return forward_impl(input, tokens, targets, mb, ctx, loss, nullptr);
}

Tensor GptModel::forward_stage(const Tensor& input, const Tensor& tokens, const Tensor& targets, int mb,
                               const StepContext& ctx, Tensor& loss_sum) {
  return forward_impl(input, tokens, targets, mb, ctx, nullptr, &loss_sum);
}

Tensor GptModel::forward_impl(const Tensor& input, const Tensor& tokens, const Tensor& targets, int mb,
                              const StepContext& ctx, float* loss, Tensor* loss_sum) {
  const int64_t B = tokens.dim(0), T = tokens.dim(1), C = cfg_.hidden_size, N = B * T;
  if (T > cfg_.max_position_embeddings)
    throw std::invalid_argument(
        fmt::format("sequence of {} tokens exceeds max_position_embeddings={}", T, cfg_.max_position_embeddings));
  const int64_t Ts = opt_.tp.shard_length(T), seq_offset = opt_.tp.shard_offset(T), Ns = B * Ts;
  Tensor x = input;
  const int last_unit = opt_.stage.has_head ? head_unit() : head_unit() - 1;
  auto following = [&](int unit) { return unit < last_unit ? unit + 1 : -1; };
  if (opt_.stage.has_embedding) {
    unit_event(UnitEvent::forward_begin, 0, following(0));
    x = wte_.forward(tokens);  // (B, Ts, C)
    if (has_position_table()) position_embedding_add(x, wpe_.value, position_options(T, seq_offset, Ts, ctx));
    dropout_forward(x, x, embedding_dropout(ctx.training ? cfg_.dropout : 0.f, T, seq_offset, Ts, ctx));
    unit_event(UnitEvent::forward_end, 0, -1);
    if (ctx.training) embedded_[mb] = {ctx, tokens};
  }
  for (size_t i = 0; i < layers_.size(); ++i) {
    const int unit = layer_unit(i);
    unit_event(UnitEvent::forward_begin, unit, following(unit));
    if (group_layers_ > 0 && ctx.training) {  // uniform recomputation: only each group's input is kept
      if (group_first(i) == i) group_inputs_[{i, mb}] = {ctx, x};
      x = layers_[i]->forward_unkept(x, ctx);
    } else {
      x = layers_[i]->forward(x, mb, ctx);
    }
    unit_event(UnitEvent::forward_end, unit, -1);
  }
  if (!opt_.stage.has_head) return x;

  HeadActivations h;
  h.ctx = ctx;
  h.tokens = tokens;
  h.targets = targets;
  h.final_in = x;
  unit_event(UnitEvent::forward_begin, head_unit(), -1);
  lnf_.forward(x.view({Ns, C}), h.lnf);
  h.logits = head_.forward(h.lnf.out, B);  // (N, V): this rank's vocabulary columns of every position
  unit_event(UnitEvent::forward_end, head_unit(), -1);
  h.rowmax = Tensor::empty({N}, DType::f32, opt_.device);
  h.sumexp = Tensor::empty({N}, DType::f32, opt_.device);
  Tensor target_logit = Tensor::empty({N}, DType::f32, opt_.device);
  Tensor losses = Tensor::empty({N}, DType::f32, opt_.device);
  Tensor flat_targets = targets.view({N});
  // Vocabulary-parallel cross-entropy: only per-token max, sum-exp and target logit cross the wire. Padding
  // columns are not tokens.
  const CrossEntropyOptions ce{.vocab_start = vocab_start_, .vocab_size = cfg_.vocab_size};
  cross_entropy_rowmax(h.logits, h.rowmax, ce);
  opt_.tp.max_over_group(h.rowmax);
  cross_entropy_partials(h.logits, flat_targets, h.rowmax, h.sumexp, target_logit, ce);
  if (opt_.tp.size > 1) {
    Tensor both = Tensor::empty({2, N}, DType::f32, opt_.device);
    both.slice(0, 1).copy_from(h.sumexp);
    both.slice(1, 2).copy_from(target_logit);
    opt_.tp.reduce_from_group(both);
    h.sumexp.copy_from(both.slice(0, 1));
    target_logit.copy_from(both.slice(1, 2));
  }
  cross_entropy_loss(h.rowmax, h.sumexp, target_logit, losses);
  if (ctx.training) saved_[mb] = std::move(h);
  if (ctx.loss_weights.defined()) {
    // Masked (supervised fine-tuning): the weights already divide by the batch's count of targets that count.
    Tensor one = loss_sum ? *loss_sum : f64_zeros(1, opt_.device);
    accumulate_weighted_sum(losses, ctx.loss_weights, one);
    if (loss) *loss = static_cast<float>(read_f64(one)[0]);
  } else if (loss_sum) {
    accumulate_mean(losses, *loss_sum);  // stays on the device
  } else {
    double sum = 0;
    for (float l : losses.to_floats()) sum += l;
    *loss = static_cast<float>(sum / static_cast<double>(N));
  }
  return Tensor();
}

Tensor GptModel::backward_stage(int mb, const Tensor& dout, float dloss) {
  const int64_t C = cfg_.hidden_size;
  Tensor dx = dout;
  if (opt_.stage.has_head) {
    auto it = saved_.find(mb);
    if (it == saved_.end()) throw std::logic_error(fmt::format("model: backward of microbatch {} without forward", mb));
    HeadActivations h = std::move(it->second);
    saved_.erase(it);
    const int64_t B = h.tokens.dim(0), T = h.tokens.dim(1), V = vocab_local_, N = B * T;
    const int64_t Ts = opt_.tp.shard_length(T), Ns = B * Ts;

    // Each token's loss enters the mean with weight 1/N: a fill on the device, nothing copied from the host.
    Tensor dlosses = Tensor::empty({N}, DType::f32, opt_.device);
    if (h.ctx.loss_weights.defined()) {  // masked: each target's own weight (0 where masked)
      dlosses.copy_from(h.ctx.loss_weights);
      scale_(dlosses, dloss);
    } else {
      fill_(dlosses, dloss / static_cast<float>(N));
    }
    unit_event(UnitEvent::backward_begin, head_unit(), unit_after_backward(layers_.size()));
    if (grads_needed_) {  // the head, the final norm, and the tied embedding the head writes into
      std::vector<Parameter*> needed = lnf_.parameters();
      needed.push_back(&head_.weight());
      grads_needed_(mb, needed);
    }
    Tensor dlogits = Tensor::empty({N, V}, opt_.dtype, opt_.device);
    cross_entropy_backward(h.logits, h.targets.view({N}), h.rowmax, h.sumexp, dlosses, dlogits,
                           {.vocab_start = vocab_start_, .vocab_size = cfg_.vocab_size});
    h.logits = Tensor();
    // The head's weight gradient now, not at a zero-bubble schedule's W: deferred it would keep the (N, V / t)
    // dlogits per waiting microbatch (a gigabyte each for Llama 3 at sequence 8192), for one GEMM's worth of bubble.
    const Tensor dlnf = [&] {
      WeightGradsNow now;
      return head_.backward(dlogits, h.lnf.out, B);  // (Ns, C), summed over the group
    }();
    dx = lnf_.backward(dlnf, h.final_in.view({Ns, C}), h.lnf).view({B, Ts, C});
    if (grads_ready_) {
      std::vector<Parameter*> head_params = lnf_.parameters();
      if (!cfg_.tie_embeddings) head_params.push_back(&head_.weight());
      if (cfg_.tie_embeddings && !opt_.stage.has_embedding) head_params.push_back(&wte_.weight());  // the tied copy
      // After their weight gradients: deferred with them under a zero-bubble pipeline (parallel/pipeline/weight_grad.h).
      weight_grad_work([this, mb, head_params] { grads_ready_(mb, head_params); });
    }
    unit_event(UnitEvent::backward_end, head_unit(), -1);
  }

  for (size_t i = layers_.size(); i-- > 0;) {
    TransformerLayer& layer = *layers_[i];
    std::pair<StepContext, Tensor> rerun;  // uniform: the context and layer i's input, its group's others rerun
    if (group_last(i)) rerun = rerun_group(i, mb);
    unit_event(UnitEvent::backward_begin, layer_unit(i), unit_after_backward(i));
    if (grads_needed_) grads_needed_(mb, layer.parameters());
    if (group_last(i)) layer.forward_again(rerun.second, mb, rerun.first);  // within its backward's gathered weights
    rerun = {};
    dx = layer.backward(dx, mb, dloss);
    if (grads_ready_) weight_grad_work([this, mb, ps = layer.parameters()] { grads_ready_(mb, ps); });
    unit_event(UnitEvent::backward_end, layer_unit(i), -1);
  }
  if (!opt_.stage.has_embedding) return dx;

  auto it = embedded_.find(mb);
  if (it == embedded_.end())
    throw std::logic_error(fmt::format("model: backward of microbatch {} without forward", mb));
  auto [ctx, tokens] = std::move(it->second);
  embedded_.erase(it);
  if (grads_needed_) {  // the tied table was made ready by the head's call (one call per mark)
    std::vector<Parameter*> needed;
    if (!(cfg_.tie_embeddings && opt_.stage.has_head)) needed.push_back(&wte_.weight());
    if (has_position_table()) needed.push_back(&wpe_);
    grads_needed_(mb, needed);
  }
  const int64_t seq_offset = opt_.tp.shard_offset(tokens.dim(1));
  dropout_backward(dx, dx, embedding_dropout(cfg_.dropout, tokens.dim(1), seq_offset, dx.dim(1), ctx));
  if (has_position_table() && !wpe_.frozen)  // frozen (LoRA): no gradient wanted
    position_embedding_backward(dx, wpe_.grad, position_options(tokens.dim(1), seq_offset, dx.dim(1), ctx));
  if (!wte_.weight().frozen) wte_.backward(tokens, dx);
  if (grads_ready_) {
    std::vector<Parameter*> embedding_params{&wte_.weight()};
    if (has_position_table()) embedding_params.push_back(&wpe_);
    weight_grad_work([this, mb, embedding_params] { grads_ready_(mb, embedding_params); });
  }
  return Tensor();
}

std::pair<StepContext, Tensor> GptModel::rerun_group(size_t last, int mb) {
  const size_t first = group_first(last);
  auto it = group_inputs_.find({first, mb});
  if (it == group_inputs_.end())
    throw std::logic_error(fmt::format("model: backward of microbatch {} without forward (recompute group of layer {})",
                                       mb, layers_[first]->index()));
  auto [ctx, x] = std::move(it->second);
  group_inputs_.erase(it);
  for (size_t j = first; j < last; ++j) {
    unit_event(UnitEvent::forward_begin, layer_unit(j), layer_unit(j + 1));
    x = layers_[j]->forward_again(x, mb, ctx);
    unit_event(UnitEvent::forward_end, layer_unit(j), -1);
  }
  return {ctx, x};
}

double model_flops_per_iteration(const ModelConfig& cfg, int64_t tokens) {
  const double C = static_cast<double>(cfg.hidden_size), F = static_cast<double>(cfg.ffn_hidden_size),
               S = static_cast<double>(cfg.seq_length), V = static_cast<double>(cfg.padded_vocab_size),
               L = static_cast<double>(cfg.num_layers),
               Q = static_cast<double>(cfg.num_heads * cfg.head_dim),  // the queries' width (C but for Qwen3's)
      KV = static_cast<double>(cfg.kv_heads() * cfg.head_dim);         // K (= V) width
  // Forward GEMM flops per token and layer, 2 per multiply-add: Q and the output projection 2CQ each (2C^2 when
  // the heads split C), K and V 2C*KV each (C each without grouped-query attention), the MLP 4CF (GELU: two GEMMs)
  // or 6CF (SwiGLU: gate, up and down).
  auto mlp = [&](double width) { return (cfg.arch == Arch::llama ? 6.0 : 4.0) * C * width; };
  const double attention_linear = 4.0 * C * Q + 4.0 * C * KV;
  // A MoE layer's MLP counts what a token passes through (the active parameters): its top_k experts, the shared
  // expert and the router's logits (2CE); the experts a token skips cost it nothing.
  const MoeConfig& moe = cfg.moe;
  double linear = 0;
  for (int64_t l = 0; l < cfg.num_layers; ++l)
    linear += attention_linear + (moe.is_moe_layer(l)
                                      ? static_cast<double>(moe.top_k) * mlp(static_cast<double>(moe.ffn_hidden_size)) +
                                            mlp(static_cast<double>(moe.shared_expert_ffn_hidden_size)) +
                                            2.0 * C * static_cast<double>(moe.num_experts)
                                      : mlp(F));
  // Causal attention 2SQ: the scores and the weighted values, 2SQ each over all S keys, halved by the mask (a
  // sliding window's layers fewer: ModelConfig::attention_work_fraction). Plus 2CV for the logits. Backward costs
  // twice the forward.
  const double per_token = linear + L * 2.0 * S * Q * cfg.attention_work_fraction() + 2.0 * C * V;
  return 3.0 * per_token * static_cast<double>(tokens);
}
}  // namespace mt
