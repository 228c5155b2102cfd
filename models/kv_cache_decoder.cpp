#include "models/kv_cache_decoder.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/ops.h"

namespace mt {

namespace {

// The whole tensor of parameter `name`; throws when the model does not hold all of it on this rank.
const Tensor* whole(const std::map<std::string, const Parameter*>& params, const std::string& name) {
  auto it = params.find(name);
  if (it == params.end())
    throw std::invalid_argument(
        fmt::format("generation: the model has no parameter {} (it needs the whole model on one rank)", name));
  const Parameter& p = *it->second;
  if (p.value.shape() != p.global_shape)
    throw std::invalid_argument(
        fmt::format("generation: parameter {} is a slice {} of {} (it needs tensor-parallel size 1)", name,
                    p.value.describe(), fmt::join(p.global_shape, "x")));
  return &p.value;
}

}  // namespace

KvCacheDecoder::KvCacheDecoder(const GptModel& model, DecoderOptions opt)
    : cfg_(model.config()), opt_(opt), capacity_(opt.capacity) {
  if (cfg_.arch != Arch::gpt)
    throw std::invalid_argument(
        fmt::format("generation: model.arch {} is not supported by the decoder yet (gpt is)", name_of(cfg_.arch)));
  const int64_t P = cfg_.max_position_embeddings;
  if (capacity_ == 0) capacity_ = P;
  if (capacity_ < 1 || capacity_ > P)
    throw std::invalid_argument(
        fmt::format("generation: cache capacity {} must lie in [1, max_position_embeddings={}]", capacity_, P));
  std::map<std::string, const Parameter*> params;
  for (const Parameter* p : model.parameters()) params[p->name] = p;
  wte_ = whole(params, "embedding.word_embeddings.weight");
  wpe_ = whole(params, "embedding.position_embeddings.weight");
  lnf_w_ = whole(params, "final_ln.weight");
  lnf_b_ = whole(params, "final_ln.bias");
  head_w_ = cfg_.tie_embeddings ? wte_ : whole(params, "lm_head.weight");
  dtype_ = wte_->dtype();
  device_ = wte_->device();
  const int64_t HD = cfg_.num_heads * cfg_.head_dim;
  for (int64_t i = 0; i < cfg_.num_layers; ++i) {
    auto w = [&](const char* s) { return whole(params, fmt::format("layers.{}.{}", i, s)); };
    LayerWeights l{.ln1_w = w("ln1.weight"),
                   .ln1_b = w("ln1.bias"),
                   .qkv_w = w("attn.qkv.weight"),
                   .qkv_b = w("attn.qkv.bias"),
                   .proj_w = w("attn.proj.weight"),
                   .proj_b = w("attn.proj.bias"),
                   .ln2_w = w("ln2.weight"),
                   .ln2_b = w("ln2.bias"),
                   .fc1_w = w("mlp.fc1.weight"),
                   .fc1_b = w("mlp.fc1.bias"),
                   .fc2_w = w("mlp.fc2.weight"),
                   .fc2_b = w("mlp.fc2.bias")};
    l.k.assign(static_cast<size_t>(capacity_ * HD), 0.f);
    l.v.assign(static_cast<size_t>(capacity_ * HD), 0.f);
    layers_.push_back(std::move(l));
  }
}

std::vector<float> KvCacheDecoder::feed(std::span<const int32_t> tokens) {
  const int64_t n = static_cast<int64_t>(tokens.size()), C = cfg_.hidden_size, V = cfg_.vocab_size;
  if (n == 0) throw std::invalid_argument("generation: feed() of no tokens");
  if (length_ + n > capacity_)
    throw std::invalid_argument(
        fmt::format("generation: {} cached + {} new tokens exceed the cache of {} tokens", length_, n, capacity_));
  for (int32_t id : tokens)
    if (id < 0 || id >= V)
      throw std::invalid_argument(fmt::format("generation: token id {} outside the vocabulary [0, {})", id, V));

  // Embedding, as GptModel's first stage: word + position rows (no dropout outside training).
  Tensor ids = Tensor::from_ints(tokens, {1, n});  // (1, n) i32
  if (device_ != Device::cpu) ids = ids.to(device_);
  Tensor x = Tensor::empty({1, n, C}, dtype_, device_);  // (1, n, C)
  embedding_forward(ids, *wte_, x);
  position_embedding_add(x, *wpe_, {.position_offset = length_});
  Tensor h = x.view({n, C});
  for (LayerWeights& l : layers_) h = layer_forward(l, h);
  length_ += n;

  // Final norm and the LM head over the positions asked for; f32 logits, padding columns dropped below.
  const int64_t rows = opt_.all_positions ? n : 1;
  const Tensor last = h.slice(n - rows, n);  // (rows, C)
  Tensor lnf = Tensor::empty({rows, C}, dtype_, device_);
  Tensor mean = Tensor::empty({rows}, DType::f32, device_), rstd = Tensor::empty({rows}, DType::f32, device_);
  layernorm_forward(last, *lnf_w_, *lnf_b_, lnf, mean, rstd, {.eps = cfg_.layernorm_eps});
  const int64_t Vpad = head_w_->dim(0);
  Tensor logits = Tensor::empty({rows, Vpad}, DType::f32, device_);  // (rows, Vpad)
  gemm(lnf, *head_w_, logits, {.trans_b = true});
  const std::vector<float> padded = logits.to_floats();
  std::vector<float> out(static_cast<size_t>(rows * V));
  for (int64_t r = 0; r < rows; ++r) std::copy_n(padded.begin() + r * Vpad, V, out.begin() + r * V);
  return out;
}

Tensor KvCacheDecoder::layer_forward(LayerWeights& w, const Tensor& x) {
  const int64_t n = x.dim(0), C = cfg_.hidden_size, F = w.fc1_w->dim(0);
  const LayerNormOptions ln_opt{.eps = cfg_.layernorm_eps};
  Tensor mean = Tensor::empty({n}, DType::f32, device_), rstd = Tensor::empty({n}, DType::f32, device_);

  // Attention block: x2 = x + proj(attention(qkv(ln1(x)))), the ops of TransformerLayer::run.
  Tensor ln1 = Tensor::empty({n, C}, dtype_, device_);
  layernorm_forward(x, *w.ln1_w, *w.ln1_b, ln1, mean, rstd, ln_opt);
  Tensor qkv = Tensor::empty({n, 3 * C}, dtype_, device_);  // (n, 3C) = (n, H, 3, D)
  gemm(ln1, *w.qkv_w, qkv, {.trans_b = true, .epilogue = Epilogue::bias, .bias = w.qkv_b});
  const Tensor att = attention(w, qkv);  // (n, C)
  Tensor proj = Tensor::empty({n, C}, dtype_, device_);
  gemm(att, *w.proj_w, proj, {.trans_b = true});
  add_bias(proj, *w.proj_b);  // after the GEMM, as RowParallelLinear adds it
  Tensor x2 = Tensor::empty({n, C}, dtype_, device_);
  add(x, proj, x2);

  // MLP block: out = x2 + fc2(gelu(fc1(ln2(x2)))).
  Tensor ln2 = Tensor::empty({n, C}, dtype_, device_);
  layernorm_forward(x2, *w.ln2_w, *w.ln2_b, ln2, mean, rstd, ln_opt);
  Tensor preact = Tensor::empty({n, F}, dtype_, device_), gelu = Tensor::empty({n, F}, dtype_, device_);
  gemm(ln2, *w.fc1_w, gelu, {.trans_b = true, .epilogue = Epilogue::gelu_bias, .bias = w.fc1_b, .aux = &preact});
  Tensor mlp = Tensor::empty({n, C}, dtype_, device_);
  gemm(gelu, *w.fc2_w, mlp, {.trans_b = true});
  add_bias(mlp, *w.fc2_b);
  Tensor out = Tensor::empty({n, C}, dtype_, device_);
  add(x2, mlp, out);
  return out;
}

Tensor KvCacheDecoder::attention(LayerWeights& w, const Tensor& qkv) {
  const int64_t n = qkv.dim(0), H = cfg_.num_heads, D = cfg_.head_dim, HD = H * D, L = length_;
  // Cache the fed tokens' keys and values: qkv row t is (H, 3, D), per head [q | k | v].
  const std::vector<float> q3 = qkv.to_floats();  // (n, H, 3, D)
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const float* src = q3.data() + ((t * H + h) * 3) * D;
      std::copy_n(src + D, D, w.k.begin() + ((L + t) * H + h) * D);
      std::copy_n(src + 2 * D, D, w.v.begin() + ((L + t) * H + h) * D);
    }

  if (L == 0) {  // a prefill: the training forward's causal attention op, on the device
    Tensor att = Tensor::empty({1, n, HD}, dtype_, device_);
    Tensor lse = Tensor::empty({1, H, n}, DType::f32, device_);
    attention_forward(qkv.view({1, n, H, 3, D}), att, lse, {.causal = true});
    return att.view({n, HD});
  }

  // Decode: query t (position L + t) attends to keys [0, L + t], softmax in fp32 as attention_forward's.
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  std::vector<float> out(static_cast<size_t>(n * HD), 0.f), p(static_cast<size_t>(L + n));  // (n, H, D), (L + n)
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const float* q = q3.data() + ((t * H + h) * 3) * D;
      const int64_t len = L + t + 1;
      float m = -INFINITY;
      for (int64_t j = 0; j < len; ++j) {
        const float* k = w.k.data() + (j * H + h) * D;
        float s = 0.f;
        for (int64_t d = 0; d < D; ++d) s += q[d] * k[d];
        p[j] = s * scale;
        m = std::max(m, p[j]);
      }
      double sum = 0;
      for (int64_t j = 0; j < len; ++j) sum += std::exp(static_cast<double>(p[j] - m));
      const float inv = static_cast<float>(1.0 / sum);
      float* o = out.data() + (t * H + h) * D;
      for (int64_t j = 0; j < len; ++j) {
        const float pj = std::exp(p[j] - m) * inv;
        const float* v = w.v.data() + (j * H + h) * D;
        for (int64_t d = 0; d < D; ++d) o[d] += pj * v[d];
      }
    }
  Tensor att = Tensor::from_floats(out, {n, HD}, dtype_);  // rounded once to the compute dtype
  return device_ == Device::cpu ? att : att.to(device_);
}

}  // namespace mt
