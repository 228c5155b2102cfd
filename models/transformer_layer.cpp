#include "models/transformer_layer.h"

#include <cmath>
#include <fmt/format.h>

#include "core/tensor/ops.h"
#include "core/base/rng.h"

namespace mt {

SelectiveRecompute SelectiveRecompute::of(const std::vector<std::string>& modules) {
  SelectiveRecompute s;
  for (const std::string& m : modules) {
    if (m == "core_attn") s.core_attn = true;
    if (m == "layernorm") s.layernorm = true;
    if (m == "mlp_act") s.mlp_act = true;
    if (m == "moe_act") s.moe_act = true;
  }
  return s;
}

TransformerLayer::TransformerLayer(int64_t index, const ModelConfig& cfg, DType dtype, uint64_t seed, bool recompute,
                                   TensorParallel tp, Device device, ExpertParallel ep, SelectiveRecompute selective,
                                   ContextParallel cp, const LoraConfig& lora)
    : index_(index), cfg_(cfg), dtype_(dtype), device_(device), recompute_(recompute), selective_(selective), tp_(tp),
      cp_(cp), lora_(lora) {
  const int64_t C = cfg.hidden_size, F = cfg.ffn_hidden_size, H = cfg.num_heads, G = cfg.kv_heads(), D = cfg.head_dim;
  const bool llama = cfg.arch == Arch::llama;
  heads_ = tp.count(H);
  groups_ = tp.count(G);
  const float std = cfg.init_std;
  // Megatron's scaled init for the projections that feed the residual stream.
  const float out_std = static_cast<float>(cfg.init_std / std::sqrt(2.0 * cfg.num_layers));
  auto name = [&](const char* s) { return fmt::format("layers.{}.{}", index, s); };
  auto linear = [&](const char* s, int64_t in, int64_t out, float sd) {
    return LinearOptions{.name = name(s),
                         .in_features = in,
                         .out_features = out,
                         .bias = !llama,
                         .init_std = sd,
                         .dtype = dtype,
                         .seed = seed};
  };
  const NormKind norm = norm_kind(cfg.arch);
  ln1_ = Norm(name("ln1"), C, norm, cfg.layernorm_eps, dtype, seed);
  // Column-parallel over query groups: thanks to the per-group interleave, this rank's groups are one row block.
  qkv_ = ColumnParallelLinear(linear("attn.qkv", C, (H + 2 * G) * D, std), tp);
  proj_ = RowParallelLinear(linear("attn.proj", H * D, C, out_std), tp);
  ln2_ = Norm(name("ln2"), C, norm, cfg.layernorm_eps, dtype, seed);
  // SwiGLU's gate and up projections are one GEMM, their rows interleaved so every row block holds whole pairs.
  if (cfg.moe.is_moe_layer(index)) {
    moe_ = std::make_unique<MoeMlp>(cfg, name("mlp"), dtype, out_std, seed, device, tp, ep, cp);
  } else {
    fc1_ = ColumnParallelLinear(linear("mlp.fc1", C, llama ? 2 * F : F, std), tp);
    fc2_ = RowParallelLinear(linear("mlp.fc2", F, C, out_std), tp);
  }
  if (lora.enabled()) {  // adapters beside the linears finetune.lora.targets names
    auto adapter = [&](const char* s, int64_t in, int64_t out) {
      return LoraOptions{.name = name(s),
                         .in_features = in,
                         .out_features = out,
                         .rank = lora.rank,
                         .alpha = static_cast<float>(lora.alpha),
                         .dropout = static_cast<float>(lora.dropout),
                         .dtype = dtype,
                         .seed = seed};
    };
    if (lora.targets_any("qkv")) qkv_.add_lora(adapter("attn.qkv", C, (H + 2 * G) * D));
    if (lora.targets_any("proj")) proj_.add_lora(adapter("attn.proj", H * D, C));
    if (!moe_ && lora.targets_any("fc1")) fc1_.add_lora(adapter("mlp.fc1", C, llama ? 2 * F : F));
    if (!moe_ && lora.targets_any("fc2")) fc2_.add_lora(adapter("mlp.fc2", F, C));
    site_lora_qkv_ = stream_id(name("attn.qkv.lora_dropout"));
    site_lora_proj_ = stream_id(name("attn.proj.lora_dropout"));
    site_lora_fc1_ = stream_id(name("mlp.fc1.lora_dropout"));
    site_lora_fc2_ = stream_id(name("mlp.fc2.lora_dropout"));
  }
  if (tp.sequence_parallel) {
    ln1_.mark_sequence_parallel();
    ln2_.mark_sequence_parallel();
  }
  site_attn_probs_ = stream_id(name("attn.probs"));
  site_attn_out_ = stream_id(name("attn.out"));
  site_mlp_out_ = stream_id(name("mlp.out"));
}

std::vector<Parameter*> TransformerLayer::parameters() {
  std::vector<Parameter*> ps;
  auto append = [&ps](const std::vector<Parameter*>& more) { ps.insert(ps.end(), more.begin(), more.end()); };
  append(ln1_.parameters());
  append(qkv_.parameters());
  append(proj_.parameters());
  append(ln2_.parameters());
  if (moe_) {
    append(moe_->parameters());
  } else {
    append(fc1_.parameters());
    append(fc2_.parameters());
  }
  return ps;
}

AttentionOptions TransformerLayer::attention_options(const StepContext& ctx) const {
  return {.causal = true,
          .dropout_p = ctx.training ? cfg_.attention_dropout : 0.f,
          .seed = ctx.seed,
          .site = site_attn_probs_,
          .sample_offset = ctx.sample_offset,
          .head_offset = tp_.begin(cfg_.num_heads),
          .positions = ctx.positions};
}

RopeOptions TransformerLayer::rope_options(bool inverse, int64_t T, const StepContext& ctx) const {
  // Attention sees whole local sequences (sequence parallelism gathers them first): positions start at 0, or with
  // context parallelism at this rank's chunks.
  const SequencePositions p = cp_.positions(T, 0, T);
  return {.theta = static_cast<float>(cfg_.rotary_base),
          .position_offset = p.position_offset,
          .inverse = inverse,
          .split_at = p.split_at,
          .split_position = p.split_position,
          .positions = ctx.positions};
}

void TransformerLayer::attend(Activations& a) const {
  if (cp_.enabled())
    context_attention_forward(cp_, a.qkv, a.att, a.att_lse, attention_options(a.ctx));
  else
    attention_forward(a.qkv, a.att, a.att_lse, attention_options(a.ctx));
}

DropoutOptions TransformerLayer::residual_dropout(const StepContext& ctx, uint64_t site, int64_t T) const {
  // This rank's rows: its sequence shard of the local sequence, at the context chunks' global positions.
  return cp_.with_rows(
      {.p = ctx.training ? cfg_.dropout : 0.f, .seed = ctx.seed, .site = site, .sample_offset = ctx.sample_offset}, T,
      tp_.shard_offset(T), tp_.shard_length(T));
}

LoraCall TransformerLayer::lora_call(LoraSaved& saved, uint64_t site, const StepContext& ctx, int64_t T) const {
  // The linears' GEMM inputs hold whole local sequences of T tokens: rows at the context chunks' global positions.
  return {.saved = &saved,
          .dropout = cp_.with_rows({.p = ctx.training ? static_cast<float>(lora_.dropout) : 0.f,
                                    .seed = ctx.seed,
                                    .site = site,
                                    .sample_offset = ctx.sample_offset},
                                   T, 0, T)};
}

Tensor TransformerLayer::run(Activations& a, bool keep, bool record) {
  const Tensor& x = a.x;  // (B, T, C), or (B, T/tp, C) with sequence parallelism
  const int64_t B = x.dim(0), Ts = x.dim(1), T = tp_.sequence_sharded() ? Ts * tp_.size : Ts, C = cfg_.hidden_size,
                H = heads_, G = groups_, D = cfg_.head_dim, N = B * T, Ns = B * Ts;
  const bool llama = cfg_.arch == Arch::llama;

  // Attention block: x2 = x + dropout(proj(attention(rope(qkv(norm1(x))))))
  const LoraCall lqkv = lora_call(a.lora_qkv, site_lora_qkv_, a.ctx, T),
                 lproj = lora_call(a.lora_proj, site_lora_proj_, a.ctx, T),
                 lfc1 = lora_call(a.lora_fc1, site_lora_fc1_, a.ctx, T),
                 lfc2 = lora_call(a.lora_fc2, site_lora_fc2_, a.ctx, T);
  ln1_.forward(x.view({Ns, C}), a.n1);
  a.qkv = qkv_.forward(a.n1.out, B, nullptr, &lqkv).view({B, T, G, H / G + 2, D});
  if (llama) rope_(a.qkv, rope_options(false, T, a.ctx));
  a.att = Tensor::empty({B, T, H * D}, dtype_, device_);
  a.att_lse = Tensor::empty({B, H, T}, DType::f32, device_);
  attend(a);
  const Tensor proj = proj_.forward(a.att.view({N, H * D}), B, &lproj);  // (Ns, C)
  a.x2 = Tensor::empty({B, Ts, C}, dtype_, device_);
  dropout_add(proj.view({B, Ts, C}), x, a.x2, residual_dropout(a.ctx, site_attn_out_, T));

  // MLP block: out = x2 + dropout(fc2(act(fc1(norm2(x2))))), act GELU (on fc1's epilogue) or SwiGLU
  ln2_.forward(a.x2.view({Ns, C}), a.n2);
  Tensor mlp;  // (Ns, C)
  if (moe_) {
    mlp = moe_->forward(a.n2.out, a.moe, {.samples = B, .record = record});
  } else if (llama) {
    a.fc1 = fc1_.forward(a.n2.out, B, nullptr, &lfc1);  // (N, 2F/tp)
    a.act = Tensor::empty({N, a.fc1.dim(1) / 2}, dtype_, device_);
    swiglu_forward(a.fc1, a.act);
  } else {
    a.act = fc1_.forward(a.n2.out, B, &a.fc1, &lfc1);  // (N, F/tp), the pre-activation kept in a.fc1
  }
  if (!moe_) mlp = fc2_.forward(a.act, B, &lfc2);
  Tensor out = Tensor::empty({B, Ts, C}, dtype_, device_);
  dropout_add(mlp.view({B, Ts, C}), a.x2, out, residual_dropout(a.ctx, site_mlp_out_, T));
  if (!keep) {
    Tensor kept_x = a.x;
    a = Activations{};
    a.x = kept_x;
  }
  return out;
}

Tensor TransformerLayer::forward(const Tensor& x, int mb, const StepContext& ctx) {
  Activations a;
  a.ctx = ctx;
  a.x = x;
  Tensor out = run(a, ctx.training && !recompute_, ctx.training);
  if (ctx.training) {
    a.ctx = ctx;
    if (!recompute_) drop_selected(a);
    saved_[mb] = std::move(a);
  }
  return out;
}

void TransformerLayer::drop_selected(Activations& a) const {
  if (selective_.layernorm) a.n1.out = a.n2.out = Tensor();
  if (selective_.core_attn) a.att = a.att_lse = Tensor();
  if (selective_.mlp_act && !moe_) a.act = Tensor();
  if (selective_.moe_act && moe_) moe_->drop_activations(a.moe);
}

void TransformerLayer::recompute_selected(Activations& a) {
  const int64_t B = a.x.dim(0), Ts = a.x.dim(1), T = tp_.sequence_sharded() ? Ts * tp_.size : Ts, C = cfg_.hidden_size,
                N = B * T, Ns = B * Ts;
  if (selective_.layernorm) {
    ln1_.forward(a.x.view({Ns, C}), a.n1);
    ln2_.forward(a.x2.view({Ns, C}), a.n2);
  }
  if (selective_.core_attn) {
    a.att = Tensor::empty({B, T, heads_ * cfg_.head_dim}, dtype_, device_);
    a.att_lse = Tensor::empty({B, heads_, T}, DType::f32, device_);
    attend(a);  // the same dropout keys
  }
  if (selective_.mlp_act && !moe_) {
    if (cfg_.arch == Arch::llama) {
      a.act = Tensor::empty({N, a.fc1.dim(1) / 2}, dtype_, device_);
      swiglu_forward(a.fc1, a.act);
    } else {
      a.act = Tensor::empty(a.fc1.shape(), dtype_, device_);
      gelu_forward(a.fc1, a.act);  // what fc1's GELU epilogue computed (the same function on the CPU)
    }
  }
  if (selective_.moe_act && moe_) moe_->recompute_activations(a.moe);
}

Tensor TransformerLayer::backward(const Tensor& dout, int mb, float dloss) {
  auto it = saved_.find(mb);
  if (it == saved_.end())
    throw std::logic_error(fmt::format("layer {}: backward of microbatch {} without forward", index_, mb));
  Activations a = std::move(it->second);
  saved_.erase(it);
  if (recompute_) {
    StepContext ctx = a.ctx;
    run(a, true, false);  // the same inputs and dropout keys give the same activations
    a.ctx = ctx;
  } else if (selective_.any()) {
    recompute_selected(a);
  }
  const int64_t B = a.x.dim(0), Ts = a.x.dim(1), T = tp_.sequence_sharded() ? Ts * tp_.size : Ts, C = cfg_.hidden_size,
                HD = heads_ * cfg_.head_dim, N = B * T, Ns = B * Ts;
  const bool llama = cfg_.arch == Arch::llama;

  // MLP block: out = x2 + dropout(fc2(act(fc1(norm2(x2))))); with SP the residual side is a sequence shard.
  Tensor dmlp = Tensor::empty({Ns, C}, dtype_, device_);
  Tensor dmlp_btc = dmlp.view({B, Ts, C});
  dropout_backward(dout, dmlp_btc, residual_dropout(a.ctx, site_mlp_out_, T));
  Tensor dln2;  // (Ns, C)
  if (moe_) {
    dln2 = moe_->backward(dmlp, a.moe, {.samples = B, .dloss = dloss});
  } else if (llama || lora_.enabled()) {
    // With adapters (GPT) the GELU's backward is its own op: fc2's adapter adds to dact first, and fc1's bias is
    // frozen.
    const LoraCall lfc1 = lora_call(a.lora_fc1, site_lora_fc1_, a.ctx, T),
                   lfc2 = lora_call(a.lora_fc2, site_lora_fc2_, a.ctx, T);
    const Tensor dact = fc2_.backward(dmlp, a.act, B, {.lora = &lfc2});  // (N, F/tp)
    Tensor dfc1 = Tensor::empty(a.fc1.shape(), dtype_, device_);
    if (llama)
      swiglu_backward(a.fc1, dact, dfc1);
    else
      gelu_backward(a.fc1, dact, dfc1);
    dln2 = fc1_.backward(dfc1, a.n2.out, B, {.lora = &lfc1});
  } else {
    // dfc1 (N, F/tp) = (dmlp @ W2) * gelu'(fc1), and fc1's bias gradient (its column sums), from one epilogue.
    Tensor dfc1 = fc2_.backward(dmlp, a.act, B,
                                {.dx_epilogue = Epilogue::dgelu_bgrad, .aux = &a.fc1, .dbias = &fc1_.bias()->grad});
    dln2 = fc1_.backward(dfc1, a.n2.out, B, {.bias_grad_done = true});
  }
  Tensor dx2 = ln2_.backward(dln2, a.x2.view({Ns, C}), a.n2);
  add(dx2, dout.view({Ns, C}), dx2);

  // Attention block: x2 = x + dropout(proj(attention(rope(qkv(norm1(x))))))
  Tensor dproj = Tensor::empty({Ns, C}, dtype_, device_);
  Tensor dproj_btc = dproj.view({B, Ts, C});
  dropout_backward(dx2.view({B, Ts, C}), dproj_btc, residual_dropout(a.ctx, site_attn_out_, T));
  const LoraCall lqkv = lora_call(a.lora_qkv, site_lora_qkv_, a.ctx, T),
                 lproj = lora_call(a.lora_proj, site_lora_proj_, a.ctx, T);
  const Tensor datt = proj_.backward(dproj, a.att.view({N, HD}), B, {.lora = &lproj});  // (N, H/tp * D)
  Tensor dqkv = Tensor::empty(a.qkv.shape(), dtype_, device_);
  if (cp_.enabled())
    context_attention_backward(cp_, a.qkv, a.att, a.att_lse, datt.view(a.att.shape()), dqkv, attention_options(a.ctx));
  else
    attention_backward(a.qkv, a.att, a.att_lse, datt.view(a.att.shape()), dqkv, attention_options(a.ctx));
  if (llama) rope_(dqkv, rope_options(true, T, a.ctx));  // a rotation's gradient is the inverse rotation
  const Tensor dln1 = qkv_.backward(dqkv.view({N, dqkv.numel() / N}), a.n1.out, B, {.lora = &lqkv});  // (Ns, C)
  Tensor dx = ln1_.backward(dln1, a.x.view({Ns, C}), a.n1);
  add(dx, dx2, dx);
  return dx.view({B, Ts, C});
}

void TransformerLayer::enable_fp8(const std::shared_ptr<Fp8Context>& ctx) {
  auto link = [&](const Parameter& w) {
    const std::string suffix = ".weight";
    return Fp8Link{.ctx = ctx, .id = ctx->add(w.name.substr(0, w.name.size() - suffix.size()))};
  };
  qkv_.enable_fp8(link(qkv_.weight()));
  proj_.enable_fp8(link(proj_.weight()));
  if (moe_) return;
  fc1_.enable_fp8(link(fc1_.weight()));
  fc2_.enable_fp8(link(fc2_.weight()));
}

}  // namespace mt
