#include "models/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/base/rng.h"
#include "core/tensor/ops.h"

namespace mt {

struct SelfAttention::Saved : PartSaved {
  Tensor qkv;           // (B, T, G/tp, R+2, D): this rank's query groups (after the QK-norm and rotary embeddings)
  QkNorm::Saved qk;     // with QK-norm
  Tensor att, att_lse;  // (B, T, H/tp * D), (B, H/tp, T)
  LinearPair::Saved lora;
};

struct SelfAttention::Cache : PartSaved {
  std::vector<float> k, v;  // (capacity, G, D) each, f32 on the host
};

SelfAttention::SelfAttention(const LayerSpec& spec, const ModelConfig& cfg, const PartOptions& opt)
    : cfg_(cfg), opt_(opt), rotary_(spec.position == PositionKind::rotary), qk_norm_(spec.qk_norm),
      window_(spec.window) {
  const int64_t C = cfg.hidden_size, H = cfg.num_heads, G = cfg.kv_heads(), D = cfg.head_dim;
  heads_ = opt.tp.count(H);
  groups_ = opt.tp.count(G);
  if (rotary_) rope_freqs_ = rope_frequencies(static_cast<float>(cfg.rotary_base), D, cfg.rope_scaling);
  // Column-parallel over query groups: thanks to the per-group interleave, this rank's groups are one row block.
  linears_ = LinearPair(opt, {"attn.qkv", "qkv", C, (H + 2 * G) * D, cfg.init_std, spec.qkv_bias},
                        {"attn.proj", "proj", H * D, C, output_init_std(cfg), spec.bias});
  site_probs_ = stream_id(opt.name("attn.probs"));
  if (qk_norm_) qk_ = QkNorm(opt, D, cfg.layernorm_eps);
}

std::vector<Parameter*> SelfAttention::parameters() {
  std::vector<Parameter*> p = linears_.parameters();
  if (qk_norm_)
    for (Parameter* q : qk_.parameters()) p.push_back(q);
  return p;
}

AttentionOptions SelfAttention::attention_options(const StepContext& ctx) const {
  return {.causal = true,
          .dropout_p = ctx.training ? cfg_.attention_dropout : 0.f,
          .seed = ctx.seed,
          .site = site_probs_,
          .sample_offset = ctx.sample_offset,
          .head_offset = opt_.tp.begin(cfg_.num_heads),
          .positions = ctx.positions,
          .window = window_};
}

RopeOptions SelfAttention::rope_options(bool inverse, int64_t T, const StepContext& ctx) const {
  // Attention sees whole local sequences (sequence parallelism gathers them first): positions start at 0, or with
  // context parallelism at this rank's chunks; packed documents' are each token's own (ctx.positions, this rank's
  // chunks of them), up to the whole sequence's T * C - 1.
  const SequencePositions p = opt_.cp.positions(T, 0, T);
  RopeOptions o = rope_frequency_options();
  o.inverse = inverse;
  if (ctx.positions.defined()) {
    o.positions = ctx.positions;
    o.position_rows = T * opt_.cp.size;
    return o;
  }
  o.position_offset = p.position_offset;
  o.split_at = p.split_at;
  o.split_position = p.split_position;
  return o;
}

RopeOptions SelfAttention::rope_frequency_options() const {
  return {.theta = static_cast<float>(cfg_.rotary_base),
          .inv_freq = rope_freqs_.inv_freq,
          .attention_factor = rope_freqs_.attention_factor};
}

void SelfAttention::attend(Saved& s, const StepContext& ctx) const {
  if (opt_.cp.enabled())
    context_attention_forward(opt_.cp, s.qkv, s.att, s.att_lse, attention_options(ctx));
  else
    attention_forward(s.qkv, s.att, s.att_lse, attention_options(ctx));
}

Tensor SelfAttention::forward(const Tensor& x, PartState& state, const PartStep& step) const {
  Saved& s = state.as<Saved>();
  const int64_t B = step.samples, T = step.tokens, N = B * T, H = heads_, G = groups_, D = cfg_.head_dim;
  const LinearPair::Calls lora = linears_.lora_calls(s.lora, step);
  s.qkv = linears_.column.forward(x, B, nullptr, &lora.column).view({B, T, G, H / G + 2, D});
  if (qk_norm_) s.qkv = qk_.forward(s.qkv, s.qk);
  if (rotary_) rope_(s.qkv, rope_options(false, T, *step.ctx));
  s.att = Tensor::empty({B, T, H * D}, opt_.dtype, opt_.device);
  s.att_lse = Tensor::empty({B, H, T}, DType::f32, opt_.device);
  attend(s, *step.ctx);
  return linears_.row.forward(s.att.view({N, H * D}), B, &lora.row);  // (Ns, C)
}

void SelfAttention::drop_selected(PartState& state) const {
  if (!opt_.selective.core_attn) return;
  Saved& s = state.as<Saved>();
  s.att = s.att_lse = Tensor();
}

void SelfAttention::recompute_selected(PartState& state, const PartStep& step) const {
  if (!opt_.selective.core_attn) return;
  Saved& s = state.as<Saved>();
  const int64_t B = step.samples, T = step.tokens;
  s.att = Tensor::empty({B, T, heads_ * cfg_.head_dim}, opt_.dtype, opt_.device);
  s.att_lse = Tensor::empty({B, heads_, T}, DType::f32, opt_.device);
  attend(s, *step.ctx);  // the same dropout keys
}

Tensor SelfAttention::backward(const Tensor& dout, const Tensor& x, PartState& state, const PartStep& step) {
  Saved& s = state.as<Saved>();
  const StepContext& ctx = *step.ctx;
  const int64_t B = step.samples, N = B * step.tokens, HD = heads_ * cfg_.head_dim;
  const LinearPair::Calls lora = linears_.lora_calls(s.lora, step);
  const Tensor datt = linears_.row.backward(dout, s.att.view({N, HD}), B, {.lora = &lora.row});  // (N, H/tp * D)
  Tensor dqkv = Tensor::empty(s.qkv.shape(), opt_.dtype, opt_.device);
  if (opt_.cp.enabled())
    context_attention_backward(opt_.cp, s.qkv, s.att, s.att_lse, datt.view(s.att.shape()), dqkv,
                               attention_options(ctx));
  else
    attention_backward(s.qkv, s.att, s.att_lse, datt.view(s.att.shape()), dqkv, attention_options(ctx));
  if (rotary_) rope_(dqkv, rope_options(true, step.tokens, ctx));  // a rotation's gradient is the inverse rotation
  if (qk_norm_) dqkv = qk_.backward(dqkv, s.qk);
  return linears_.column.backward(dqkv.view({N, dqkv.numel() / N}), x, B, {.lora = &lora.column});  // (Ns, C)
}

Tensor SelfAttention::decode(const Tensor& x, PartState& cache, const DecodeStep& step) const {
  const int64_t n = x.dim(0), H = cfg_.num_heads, G = cfg_.kv_heads(), D = cfg_.head_dim;
  Cache& c = cache.as<Cache>();
  if (c.k.empty()) {
    c.k.assign(static_cast<size_t>(step.capacity * G * D), 0.f);
    c.v.assign(static_cast<size_t>(step.capacity * G * D), 0.f);
  }
  Tensor qkv = linears_.column.forward(x, 1).view({n, G, H / G + 2, D});  // (n, G, R + 2, D)
  if (qk_norm_) {
    QkNorm::Saved unused;
    qkv = qk_.forward(qkv, unused);
  }
  if (rotary_) {  // the fed tokens' queries and keys at their absolute positions
    Tensor q5 = qkv.view({1, n, G, H / G + 2, D});
    RopeOptions o = rope_frequency_options();
    o.position_offset = step.position;
    rope_(q5, o);
  }
  const Tensor att = cached_attention(qkv, c, step);  // (n, H D)
  return linears_.row.forward(att, 1);
}

Tensor SelfAttention::cached_attention(const Tensor& qkv, Cache& cache, const DecodeStep& step) const {
  const int64_t n = qkv.dim(0), H = cfg_.num_heads, G = cfg_.kv_heads(), R = H / G, D = cfg_.head_dim, HD = H * D,
                L = step.position;
  const DType dtype = qkv.dtype();
  const Device device = qkv.device();
  // Cache the fed tokens' keys and values: qkv row t is (G, R + 2, D), per group [q_0 .. q_{R-1} | k | v].
  const std::vector<float> q3 = qkv.to_floats();  // (n, G, R + 2, D)
  auto slot = [&](int64_t t, int64_t g, int64_t s) { return q3.data() + ((t * G + g) * (R + 2) + s) * D; };
  for (int64_t t = 0; t < n; ++t)
    for (int64_t g = 0; g < G; ++g) {
      std::copy_n(slot(t, g, R), D, cache.k.begin() + ((L + t) * G + g) * D);
      std::copy_n(slot(t, g, R + 1), D, cache.v.begin() + ((L + t) * G + g) * D);
    }

  if (L == 0) {  // a prefill: the training forward's causal attention op, on the device
    Tensor att = Tensor::empty({1, n, HD}, dtype, device);
    Tensor lse = Tensor::empty({1, H, n}, DType::f32, device);
    attention_forward(qkv.view({1, n, G, R + 2, D}), att, lse, {.causal = true, .window = window_});
    return att.view({n, HD});
  }

  // Decode: query t (position L + t) attends to keys [first, L + t] (first 0, or the window's start), softmax in
  // fp32 as attention_forward's.
  // Query head h = g*R + r reads group g's keys and values.
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  std::vector<float> out(static_cast<size_t>(n * HD), 0.f), p(static_cast<size_t>(L + n));  // (n, H, D), (L + n)
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / R;
      const float* q = slot(t, g, h % R);
      const int64_t len = L + t + 1, first = attention_first_key(L + t, L + t, window_);
      float m = -INFINITY;
      for (int64_t j = first; j < len; ++j) {
        const float* k = cache.k.data() + (j * G + g) * D;
        float s = 0.f;
        for (int64_t d = 0; d < D; ++d) s += q[d] * k[d];
        p[j] = s * scale;
        m = std::max(m, p[j]);
      }
      double sum = 0;
      for (int64_t j = first; j < len; ++j) sum += std::exp(static_cast<double>(p[j] - m));
      const float inv = static_cast<float>(1.0 / sum);
      float* o = out.data() + (t * H + h) * D;
      for (int64_t j = first; j < len; ++j) {
        const float pj = std::exp(p[j] - m) * inv;
        const float* v = cache.v.data() + (j * G + g) * D;
        for (int64_t d = 0; d < D; ++d) o[d] += pj * v[d];
      }
    }
  Tensor att = Tensor::from_floats(out, {n, HD}, dtype);  // rounded once to the compute dtype
  return device == Device::cpu ? att : att.to(device);
}

}  // namespace mt
