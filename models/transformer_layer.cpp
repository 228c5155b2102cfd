#include "models/transformer_layer.h"

#include <cmath>
#include <fmt/format.h>

#include "core/ops.h"
#include "core/rng.h"

namespace mt {

TransformerLayer::TransformerLayer(int64_t index, const ModelConfig& cfg, DType dtype, uint64_t seed, bool recompute,
                                   TensorParallel tp, Device device)
    : index_(index), cfg_(cfg), dtype_(dtype), device_(device), recompute_(recompute), tp_(tp) {
  const int64_t C = cfg.hidden_size, F = cfg.ffn_hidden_size;
  heads_ = tp.count(cfg.num_heads);
  const float std = cfg.init_std;
  // Megatron's scaled init for the projections that feed the residual stream.
  const float out_std = static_cast<float>(cfg.init_std / std::sqrt(2.0 * cfg.num_layers));
  auto name = [&](const char* s) { return fmt::format("layers.{}.{}", index, s); };
  auto norm = [&](const char* s, Init init) { return make_parameter(name(s), {C}, dtype, init, 0, seed); };
  auto linear = [&](const char* s, int64_t in, int64_t out, float sd) {
    return LinearOptions{
        .name = name(s), .in_features = in, .out_features = out, .init_std = sd, .dtype = dtype, .seed = seed};
  };
  ln1_w_ = norm("ln1.weight", Init::ones);
  ln1_b_ = norm("ln1.bias", Init::zeros);
  // Column-parallel over heads: thanks to the per-head interleave, this rank's heads are one row block.
  qkv_ = ColumnParallelLinear(linear("attn.qkv", C, 3 * C, std), tp);
  proj_ = RowParallelLinear(linear("attn.proj", C, C, out_std), tp);
  ln2_w_ = norm("ln2.weight", Init::ones);
  ln2_b_ = norm("ln2.bias", Init::zeros);
  fc1_ = ColumnParallelLinear(linear("mlp.fc1", C, F, std), tp);
  fc2_ = RowParallelLinear(linear("mlp.fc2", F, C, out_std), tp);
  if (tp.sequence_parallel)
    for (Parameter* p : {&ln1_w_, &ln1_b_, &ln2_w_, &ln2_b_}) p->grad_sums.tensor = true;
  site_attn_probs_ = stream_id(name("attn.probs"));
  site_attn_out_ = stream_id(name("attn.out"));
  site_mlp_out_ = stream_id(name("mlp.out"));
}

std::vector<Parameter*> TransformerLayer::parameters() {
  std::vector<Parameter*> ps;
  auto append = [&ps](const std::vector<Parameter*>& more) { ps.insert(ps.end(), more.begin(), more.end()); };
  append({&ln1_w_, &ln1_b_});
  append(qkv_.parameters());
  append(proj_.parameters());
  append({&ln2_w_, &ln2_b_});
  append(fc1_.parameters());
  append(fc2_.parameters());
  return ps;
}

AttentionOptions TransformerLayer::attention_options(const StepContext& ctx) const {
  return {.causal = true,
          .dropout_p = ctx.training ? cfg_.attention_dropout : 0.f,
          .seed = ctx.seed,
          .site = site_attn_probs_,
          .sample_offset = ctx.sample_offset,
          .head_offset = tp_.begin(cfg_.num_heads)};
}

DropoutOptions TransformerLayer::residual_dropout(const StepContext& ctx, uint64_t site, int64_t T) const {
  return {.p = ctx.training ? cfg_.dropout : 0.f,
          .seed = ctx.seed,
          .site = site,
          .sample_offset = ctx.sample_offset,
          .row_offset = tp_.shard_offset(T)};
}

Tensor TransformerLayer::run(Activations& a, bool keep) {
  const Tensor& x = a.x;  // (B, T, C), or (B, T/tp, C) with sequence parallelism
  const int64_t B = x.dim(0), Ts = x.dim(1), T = tp_.sequence_sharded() ? Ts * tp_.size : Ts, C = cfg_.hidden_size,
                H = heads_, D = cfg_.head_dim, N = B * T, Ns = B * Ts;
  const LayerNormOptions ln_opt{.eps = cfg_.layernorm_eps};

  // Attention block: x2 = x + dropout(proj(attention(qkv(ln1(x)))))
  a.ln1 = Tensor::empty({Ns, C}, dtype_, device_);
  a.ln1_mean = Tensor::empty({Ns}, DType::f32, device_);
  a.ln1_rstd = Tensor::empty({Ns}, DType::f32, device_);
  layernorm_forward(x.view({Ns, C}), ln1_w_.value, ln1_b_.value, a.ln1, a.ln1_mean, a.ln1_rstd, ln_opt);
  a.qkv = qkv_.forward(a.ln1, B).view({B, T, H, 3, D});
  a.att = Tensor::empty({B, T, H * D}, dtype_, device_);
  a.att_lse = Tensor::empty({B, H, T}, DType::f32, device_);
  attention_forward(a.qkv, a.att, a.att_lse, attention_options(a.ctx));
  const Tensor proj = proj_.forward(a.att.view({N, H * D}), B);  // (Ns, C)
  a.x2 = Tensor::empty({B, Ts, C}, dtype_, device_);
  dropout_add(proj.view({B, Ts, C}), x, a.x2, residual_dropout(a.ctx, site_attn_out_, T));

  // MLP block: out = x2 + dropout(fc2(gelu(fc1(ln2(x2)))))
  a.ln2 = Tensor::empty({Ns, C}, dtype_, device_);
  a.ln2_mean = Tensor::empty({Ns}, DType::f32, device_);
  a.ln2_rstd = Tensor::empty({Ns}, DType::f32, device_);
  layernorm_forward(a.x2.view({Ns, C}), ln2_w_.value, ln2_b_.value, a.ln2, a.ln2_mean, a.ln2_rstd, ln_opt);
  a.gelu = fc1_.forward(a.ln2, B, &a.fc1);     // (N, F/tp), the pre-activation kept in a.fc1
  const Tensor mlp = fc2_.forward(a.gelu, B);  // (Ns, C)
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
  Tensor out = run(a, ctx.training && !recompute_);
  if (ctx.training) {
    a.ctx = ctx;
    saved_[mb] = std::move(a);
  }
  return out;
}

Tensor TransformerLayer::backward(const Tensor& dout, int mb) {
  auto it = saved_.find(mb);
  if (it == saved_.end())
    throw std::logic_error(fmt::format("layer {}: backward of microbatch {} without forward", index_, mb));
  Activations a = std::move(it->second);
  saved_.erase(it);
  if (recompute_) {
    StepContext ctx = a.ctx;
    run(a, true);  // the same inputs and dropout keys give the same activations
    a.ctx = ctx;
  }
  const int64_t B = a.x.dim(0), Ts = a.x.dim(1), T = tp_.sequence_sharded() ? Ts * tp_.size : Ts, C = cfg_.hidden_size,
                HD = heads_ * cfg_.head_dim, N = B * T, Ns = B * Ts;

  // MLP block: out = x2 + dropout(fc2(gelu(fc1(ln2(x2))))); with SP the residual side is a sequence shard.
  Tensor dmlp = Tensor::empty({Ns, C}, dtype_, device_);
  Tensor dmlp_btc = dmlp.view({B, Ts, C});
  dropout_backward(dout, dmlp_btc, residual_dropout(a.ctx, site_mlp_out_, T));
  // dfc1 (N, F/tp) = (dmlp @ W2) * gelu'(fc1), and fc1's bias gradient (its column sums), from one epilogue.
  Tensor dfc1 = fc2_.backward(dmlp, a.gelu, B,
                              {.dx_epilogue = Epilogue::dgelu_bgrad, .aux = &a.fc1, .dbias = &fc1_.bias()->grad});
  const Tensor dln2 = fc1_.backward(dfc1, a.ln2, B, {.bias_grad_done = true});  // (Ns, C)
  Tensor dx2 = Tensor::empty({Ns, C}, dtype_, device_);
  layernorm_backward(dln2, a.x2.view({Ns, C}), ln2_w_.value, a.ln2_mean, a.ln2_rstd, dx2, ln2_w_.grad, ln2_b_.grad);
  add(dx2, dout.view({Ns, C}), dx2);

  // Attention block: x2 = x + dropout(proj(attention(qkv(ln1(x)))))
  Tensor dproj = Tensor::empty({Ns, C}, dtype_, device_);
  Tensor dproj_btc = dproj.view({B, Ts, C});
  dropout_backward(dx2.view({B, Ts, C}), dproj_btc, residual_dropout(a.ctx, site_attn_out_, T));
  const Tensor datt = proj_.backward(dproj, a.att.view({N, HD}), B);  // (N, C/tp)
  Tensor dqkv = Tensor::empty(a.qkv.shape(), dtype_, device_);
  attention_backward(a.qkv, a.att, a.att_lse, datt.view(a.att.shape()), dqkv, attention_options(a.ctx));
  const Tensor dln1 = qkv_.backward(dqkv.view({N, 3 * HD}), a.ln1, B);  // (Ns, C)
  Tensor dx = Tensor::empty({Ns, C}, dtype_, device_);
  layernorm_backward(dln1, a.x.view({Ns, C}), ln1_w_.value, a.ln1_mean, a.ln1_rstd, dx, ln1_w_.grad, ln1_b_.grad);
  add(dx, dx2, dx);
  return dx.view({B, Ts, C});
}

}  // namespace mt
