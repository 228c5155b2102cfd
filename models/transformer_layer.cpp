#include "models/transformer_layer.h"

#include <cmath>
#include <fmt/format.h>

#include "core/ops.h"
#include "core/rng.h"
#include "parallel/sequence_parallel.h"

namespace mt {

void linear_forward(const Tensor& x, const Parameter& w, const Parameter* b, Tensor& out) {
  // The bias rides on the GEMM's epilogue (cuBLASLt's BIAS on the GPU; gemm then add_bias on the CPU).
  gemm(x, w.value, out,
       {.trans_b = true, .epilogue = b ? Epilogue::bias : Epilogue::none, .bias = b ? &b->value : nullptr});
}

void linear_backward(const Tensor& dout, const Tensor& x, Parameter& w, Parameter* b, Tensor* dx) {
  // dW (out, in) += dout^T x; the bias gradient (the column sums of dout) comes from the same GEMM's epilogue.
  gemm(dout, x, w.grad,
       {.trans_a = true,
        .beta = 1.f,
        .epilogue = b ? Epilogue::bgrad_a : Epilogue::none,
        .dbias = b ? &b->grad : nullptr});
  if (dx) gemm(dout, w.value, *dx);  // dx (N, in) = dout @ W
}

TransformerLayer::TransformerLayer(int64_t index, const ModelConfig& cfg, DType dtype, uint64_t seed, bool recompute,
                                   TensorParallel tp, Device device)
    : index_(index), cfg_(cfg), dtype_(dtype), device_(device), recompute_(recompute), tp_(tp) {
  const int64_t C = cfg.hidden_size, F = cfg.ffn_hidden_size, D = cfg.head_dim;
  heads_ = tp.count(cfg.num_heads);
  ffn_ = tp.count(F);
  const int64_t h0 = tp.begin(cfg.num_heads), f0 = tp.begin(F);
  const float std = cfg.init_std;
  // Megatron's scaled init for the projections that feed the residual stream.
  const float out_std = static_cast<float>(cfg.init_std / std::sqrt(2.0 * cfg.num_layers));
  auto name = [&](const char* s) { return fmt::format("layers.{}.{}", index, s); };
  auto whole = [&](const char* s, Shape shape, Init init, float sd) {
    return make_parameter(name(s), shape, dtype, init, sd, seed);
  };
  auto block = [&](const char* s, Shape global, std::vector<int64_t> start, Shape local, Init init, float sd) {
    return make_parameter_slice(name(s), global, start, local, dtype, init, sd, seed);
  };
  ln1_w_ = whole("ln1.weight", {C}, Init::ones, 0);
  ln1_b_ = whole("ln1.bias", {C}, Init::zeros, 0);
  // Column-parallel: this rank's heads are rows [3*D*h0, 3*D*(h0 + heads)) thanks to the per-head interleave.
  qkv_w_ = block("attn.qkv.weight", {3 * C, C}, {3 * D * h0, 0}, {3 * D * heads_, C}, Init::normal, std);
  qkv_b_ = block("attn.qkv.bias", {3 * C}, {3 * D * h0}, {3 * D * heads_}, Init::zeros, 0);
  // Row-parallel: the input columns of this rank's heads.
  proj_w_ = block("attn.proj.weight", {C, C}, {0, D * h0}, {C, D * heads_}, Init::normal, out_std);
  proj_b_ = whole("attn.proj.bias", {C}, Init::zeros, 0);
  ln2_w_ = whole("ln2.weight", {C}, Init::ones, 0);
  ln2_b_ = whole("ln2.bias", {C}, Init::zeros, 0);
  fc1_w_ = block("mlp.fc1.weight", {F, C}, {f0, 0}, {ffn_, C}, Init::normal, std);
  fc1_b_ = block("mlp.fc1.bias", {F}, {f0}, {ffn_}, Init::zeros, 0);
  fc2_w_ = block("mlp.fc2.weight", {C, F}, {0, f0}, {C, ffn_}, Init::normal, out_std);
  fc2_b_ = whole("mlp.fc2.bias", {C}, Init::zeros, 0);
  if (tp.sequence_parallel)
    for (Parameter* p : {&ln1_w_, &ln1_b_, &ln2_w_, &ln2_b_}) p->grad_sums.tensor = true;
  site_attn_probs_ = stream_id(name("attn.probs"));
  site_attn_out_ = stream_id(name("attn.out"));
  site_mlp_out_ = stream_id(name("mlp.out"));
}

std::vector<Parameter*> TransformerLayer::parameters() {
  return {&ln1_w_, &ln1_b_, &qkv_w_, &qkv_b_, &proj_w_, &proj_b_, &ln2_w_, &ln2_b_, &fc1_w_, &fc1_b_, &fc2_w_, &fc2_b_};
}

Tensor TransformerLayer::run(Activations& a, bool keep) {
  const Tensor& x = a.x;  // (B, T, C), or (B, T/tp, C) with sequence parallelism
  const int64_t B = x.dim(0), Ts = x.dim(1), T = tp_.sequence_sharded() ? Ts * tp_.size : Ts, C = cfg_.hidden_size,
                H = heads_, D = cfg_.head_dim, F = ffn_, N = B * T, Ns = B * Ts;
  const bool train = a.ctx.training;
  const float p_hidden = train ? cfg_.dropout : 0.f;
  const LayerNormOptions ln_opt{.eps = cfg_.layernorm_eps};

  a.ln1 = Tensor::empty({Ns, C}, dtype_, device_);
  a.ln1_mean = Tensor::empty({Ns}, DType::f32, device_);
  a.ln1_rstd = Tensor::empty({Ns}, DType::f32, device_);
  layernorm_forward(x.view({Ns, C}), ln1_w_.value, ln1_b_.value, a.ln1, a.ln1_mean, a.ln1_rstd, ln_opt);

  Tensor qkv = Tensor::empty({N, 3 * H * D}, dtype_, device_);
  linear_forward(sequence_to_full(a.ln1, B, tp_), qkv_w_, &qkv_b_, qkv);
  a.qkv = qkv.view({B, T, H, 3, D});
  a.att = Tensor::empty({B, T, H * D}, dtype_, device_);
  a.att_lse = Tensor::empty({B, H, T}, DType::f32, device_);
  const AttentionOptions att_opt{.causal = true,
                                 .dropout_p = train ? cfg_.attention_dropout : 0.f,
                                 .seed = a.ctx.seed,
                                 .site = site_attn_probs_,
                                 .sample_offset = a.ctx.sample_offset,
                                 .head_offset = tp_.begin(cfg_.num_heads)};
  attention_forward(a.qkv, a.att, a.att_lse, att_opt);

  Tensor proj_partial = Tensor::empty({N, C}, dtype_, device_);
  linear_forward(a.att.view({N, H * D}), proj_w_, nullptr, proj_partial);
  Tensor proj = sequence_shard_sum(proj_partial, B, tp_);  // g: sum the row-parallel partial outputs
  add_bias(proj, proj_b_.value);  // after the reduction (so no GEMM epilogue): added once, not once per rank
  a.x2 = Tensor::empty({B, Ts, C}, dtype_, device_);
  dropout_add(proj.view({B, Ts, C}), x, a.x2,
              {.p = p_hidden,
               .seed = a.ctx.seed,
               .site = site_attn_out_,
               .sample_offset = a.ctx.sample_offset,
               .row_offset = tp_.shard_offset(T)});  // x2 = x + dropout(proj)

  a.ln2 = Tensor::empty({Ns, C}, dtype_, device_);
  a.ln2_mean = Tensor::empty({Ns}, DType::f32, device_);
  a.ln2_rstd = Tensor::empty({Ns}, DType::f32, device_);
  layernorm_forward(a.x2.view({Ns, C}), ln2_w_.value, ln2_b_.value, a.ln2, a.ln2_mean, a.ln2_rstd, ln_opt);
  a.fc1 = Tensor::empty({N, F}, dtype_, device_);
  a.gelu = Tensor::empty({N, F}, dtype_, device_);
  // gelu = GELU(fc1), fc1 = ln2 @ W1^T + b1 kept as the pre-activation for backward: one GEMM epilogue.
  gemm(sequence_to_full(a.ln2, B, tp_), fc1_w_.value, a.gelu,
       {.trans_b = true, .epilogue = Epilogue::gelu_bias, .bias = &fc1_b_.value, .aux = &a.fc1});
  Tensor mlp_partial = Tensor::empty({N, C}, dtype_, device_);
  linear_forward(a.gelu, fc2_w_, nullptr, mlp_partial);
  Tensor mlp = sequence_shard_sum(mlp_partial, B, tp_);  // g
  add_bias(mlp, fc2_b_.value);                           // after the reduction, as proj's
  Tensor out = Tensor::empty({B, Ts, C}, dtype_, device_);
  dropout_add(mlp.view({B, Ts, C}), a.x2, out,
              {.p = p_hidden,
               .seed = a.ctx.seed,
               .site = site_mlp_out_,
               .sample_offset = a.ctx.sample_offset,
               .row_offset = tp_.shard_offset(T)});  // out = x2 + dropout(mlp)
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
                F = ffn_, HD = heads_ * cfg_.head_dim, N = B * T, Ns = B * Ts;
  const float p_hidden = cfg_.dropout;

  // MLP block: out = x2 + dropout(fc2(gelu(fc1(ln2(x2))))); with SP the residual side is a sequence shard.
  Tensor dmlp = Tensor::empty({B, Ts, C}, dtype_, device_);
  dropout_backward(dout, dmlp,
                   {.p = p_hidden,
                    .seed = a.ctx.seed,
                    .site = site_mlp_out_,
                    .sample_offset = a.ctx.sample_offset,
                    .row_offset = tp_.shard_offset(T)});
  Tensor dmlp_full =
      sequence_to_full(dmlp.view({Ns, C}), B, tp_);  // backward of the reduce-scatter (identity without SP)
  linear_backward(dmlp_full, a.gelu, fc2_w_, &fc2_b_, nullptr);
  // dfc1 = (dmlp @ W2) * gelu'(fc1), and fc1's bias gradient (its column sums), from one GEMM epilogue.
  Tensor dfc1 = Tensor::empty({N, F}, dtype_, device_);
  gemm(dmlp_full, fc2_w_.value, dfc1, {.epilogue = Epilogue::dgelu_bgrad, .aux = &a.fc1, .dbias = &fc1_b_.grad});
  Tensor dln2_partial = Tensor::empty({N, C}, dtype_, device_);
  linear_backward(dfc1, sequence_to_full(a.ln2, B, tp_), fc1_w_, nullptr, &dln2_partial);
  Tensor dln2 = sequence_shard_sum(dln2_partial, B, tp_);  // f backward: sum the column-parallel input gradients
  Tensor dx2 = Tensor::empty({Ns, C}, dtype_, device_);
  layernorm_backward(dln2, a.x2.view({Ns, C}), ln2_w_.value, a.ln2_mean, a.ln2_rstd, dx2, ln2_w_.grad, ln2_b_.grad);
  add(dx2, dout.view({Ns, C}), dx2);
  dx2 = dx2.view({B, Ts, C});

  // Attention block: x2 = x + dropout(proj(attention(qkv(ln1(x)))))
  Tensor dproj = Tensor::empty({B, Ts, C}, dtype_, device_);
  dropout_backward(dx2, dproj,
                   {.p = p_hidden,
                    .seed = a.ctx.seed,
                    .site = site_attn_out_,
                    .sample_offset = a.ctx.sample_offset,
                    .row_offset = tp_.shard_offset(T)});
  Tensor dproj_full = sequence_to_full(dproj.view({Ns, C}), B, tp_);
  Tensor datt = Tensor::empty({N, HD}, dtype_, device_);
  linear_backward(dproj_full, a.att.view({N, HD}), proj_w_, &proj_b_, &datt);
  Tensor dqkv = Tensor::empty(a.qkv.shape(), dtype_, device_);
  const AttentionOptions att_opt{.causal = true,
                                 .dropout_p = cfg_.attention_dropout,
                                 .seed = a.ctx.seed,
                                 .site = site_attn_probs_,
                                 .sample_offset = a.ctx.sample_offset,
                                 .head_offset = tp_.begin(cfg_.num_heads)};
  attention_backward(a.qkv, a.att, a.att_lse, datt.view(a.att.shape()), dqkv, att_opt);
  Tensor dln1_partial = Tensor::empty({N, C}, dtype_, device_);
  linear_backward(dqkv.view({N, 3 * HD}), sequence_to_full(a.ln1, B, tp_), qkv_w_, &qkv_b_, &dln1_partial);
  Tensor dln1 = sequence_shard_sum(dln1_partial, B, tp_);  // f backward
  Tensor dx = Tensor::empty({Ns, C}, dtype_, device_);
  layernorm_backward(dln1, a.x.view({Ns, C}), ln1_w_.value, a.ln1_mean, a.ln1_rstd, dx, ln1_w_.grad, ln1_b_.grad);
  add(dx, dx2.view({Ns, C}), dx);
  return dx.view({B, Ts, C});
}

}  // namespace mt
