#include "models/kv_cache_decoder.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/tensor/ops.h"

namespace mt {

namespace {

// The whole tensor of a parameter (`role` says which, when the stage has none); throws when this rank does not
// hold all of it.
const Tensor* whole(const Parameter* p, const char* role) {
  if (!p)
    throw std::invalid_argument(
        fmt::format("generation: the model has no {} (it needs the whole model on one rank)", role));
  if (p->value.shape() != p->global_shape)
    throw std::invalid_argument(
        fmt::format("generation: parameter {} is a slice {} of {} (it needs tensor-parallel size 1)", p->name,
                    p->value.describe(), fmt::join(p->global_shape, "x")));
  return &p->value;
}

}  // namespace

KvCacheDecoder::KvCacheDecoder(const GptModel& model, DecoderOptions opt)
    : cfg_(model.config()), opt_(opt), llama_(cfg_.arch == Arch::llama), capacity_(opt.capacity) {
  const int64_t P = cfg_.max_position_embeddings;
  if (capacity_ == 0) capacity_ = P;
  if (capacity_ < 1 || capacity_ > P)
    throw std::invalid_argument(
        fmt::format("generation: cache capacity {} must lie in [1, max_position_embeddings={}]", capacity_, P));
  const GptModel::Roles roles = model.roles();
  // Biases and LayerNorm's shift exist for gpt only (null for llama).
  auto bias = [&](const Parameter* p) { return p ? whole(p, "bias") : nullptr; };
  auto norm = [&](const Norm* n, const char* role) {
    if (!n) whole(nullptr, role);
    return NormWeights{whole(&n->weight(), role), bias(n->bias())};
  };
  wte_ = whole(roles.word_embeddings, "word embeddings");
  if (!llama_) wpe_ = whole(roles.position_embeddings, "position embeddings");  // llama rotates q and k instead
  lnf_ = norm(roles.final_norm, "final norm");
  head_w_ = whole(roles.lm_head, "LM head");
  dtype_ = wte_->dtype();
  device_ = wte_->device();
  const int64_t GD = cfg_.kv_heads() * cfg_.head_dim;
  if (static_cast<int64_t>(roles.layers.size()) != cfg_.num_layers)
    throw std::invalid_argument(
        fmt::format("generation: the model holds {} of its {} layers (it needs the whole model on one rank)",
                    roles.layers.size(), cfg_.num_layers));
  for (const TransformerLayer* layer : roles.layers) {
    const TransformerLayer::Roles r = layer->roles();
    LayerWeights l{.ln1 = norm(r.ln1, "attention norm"),
                   .ln2 = norm(r.ln2, "MLP norm"),
                   .qkv_w = whole(r.qkv_w, "QKV weight"),
                   .qkv_b = bias(r.qkv_b),
                   .proj_w = whole(r.proj_w, "attention projection"),
                   .proj_b = bias(r.proj_b),
                   .fc1_w = r.moe ? nullptr : whole(r.fc1_w, "fc1 weight"),
                   .fc1_b = bias(r.fc1_b),
                   .fc2_w = r.moe ? nullptr : whole(r.fc2_w, "fc2 weight"),
                   .fc2_b = bias(r.fc2_b),
                   .moe = r.moe};
    l.k.assign(static_cast<size_t>(capacity_ * GD), 0.f);
    l.v.assign(static_cast<size_t>(capacity_ * GD), 0.f);
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

  // Embedding, as GptModel's first stage: word rows, plus position rows for gpt (no dropout outside training).
  Tensor ids = Tensor::from_ints(tokens, {1, n});  // (1, n) i32
  if (device_ != Device::cpu) ids = ids.to(device_);
  Tensor x = Tensor::empty({1, n, C}, dtype_, device_);  // (1, n, C)
  embedding_forward(ids, *wte_, x);
  if (wpe_) position_embedding_add(x, *wpe_, {.position_offset = length_});
  Tensor h = x.view({n, C});
  for (LayerWeights& l : layers_) h = layer_forward(l, h);
  length_ += n;

  // Final norm and the LM head over the positions asked for; f32 logits, padding columns dropped below.
  const int64_t rows = opt_.all_positions ? n : 1;
  const Tensor lnf = normalize(lnf_, h.slice(n - rows, n));  // (rows, C)
  const int64_t Vpad = head_w_->dim(0);
  Tensor logits = Tensor::empty({rows, Vpad}, DType::f32, device_);  // (rows, Vpad)
  gemm(lnf, *head_w_, logits, {.trans_b = true});
  const std::vector<float> padded = logits.to_floats();
  std::vector<float> out(static_cast<size_t>(rows * V));
  for (int64_t r = 0; r < rows; ++r) std::copy_n(padded.begin() + r * Vpad, V, out.begin() + r * V);
  return out;
}

Tensor KvCacheDecoder::normalize(const NormWeights& nw, const Tensor& x) const {
  const int64_t n = x.dim(0), C = x.dim(1);
  Tensor out = Tensor::empty({n, C}, dtype_, device_);
  Tensor rstd = Tensor::empty({n}, DType::f32, device_);
  if (llama_) {
    rmsnorm_forward(x, *nw.w, out, rstd, {.eps = cfg_.layernorm_eps});
  } else {
    Tensor mean = Tensor::empty({n}, DType::f32, device_);
    layernorm_forward(x, *nw.w, *nw.b, out, mean, rstd, {.eps = cfg_.layernorm_eps});
  }
  return out;
}

Tensor KvCacheDecoder::layer_forward(LayerWeights& w, const Tensor& x) {
  const int64_t n = x.dim(0), C = cfg_.hidden_size, H = cfg_.num_heads, G = cfg_.kv_heads(), D = cfg_.head_dim;

  // Attention block: x2 = x + proj(attention(rope(qkv(norm1(x))))), the ops of TransformerLayer::run.
  const Tensor ln1 = normalize(w.ln1, x);
  Tensor qkv = Tensor::empty({n, (H + 2 * G) * D}, dtype_, device_);  // (n, G, R + 2, D)
  GemmOptions qkv_opt{.trans_b = true};
  if (w.qkv_b) {
    qkv_opt.epilogue = Epilogue::bias;
    qkv_opt.bias = w.qkv_b;
  }
  gemm(ln1, *w.qkv_w, qkv, qkv_opt);
  if (llama_) {  // the fed tokens' queries and keys at their absolute positions
    Tensor q5 = qkv.view({1, n, G, H / G + 2, D});
    rope_(q5, {.theta = static_cast<float>(cfg_.rotary_base), .position_offset = length_});
  }
  const Tensor att = attention(w, qkv);  // (n, H D)
  Tensor proj = Tensor::empty({n, C}, dtype_, device_);
  gemm(att, *w.proj_w, proj, {.trans_b = true});
  if (w.proj_b) add_bias(proj, *w.proj_b);  // after the GEMM, as RowParallelLinear adds it
  Tensor x2 = Tensor::empty({n, C}, dtype_, device_);
  add(x, proj, x2);

  // MLP block: out = x2 + fc2(act(fc1(norm2(x2)))), act GELU on fc1's epilogue (gpt) or SwiGLU (llama).
  const Tensor ln2 = normalize(w.ln2, x2);
  if (w.moe) {  // the router and the experts as training runs them (one rank: every expert here)
    MoeMlp::Saved s;
    const Tensor mlp = w.moe->forward(ln2, s);
    Tensor out = Tensor::empty({n, C}, dtype_, device_);
    add(x2, mlp, out);
    return out;
  }
  const int64_t fc1_rows = w.fc1_w->dim(0);
  Tensor act;  // (n, F)
  if (llama_) {
    Tensor fc1 = Tensor::empty({n, fc1_rows}, dtype_, device_);  // (n, 2F): (gate, up) pairs
    gemm(ln2, *w.fc1_w, fc1, {.trans_b = true});
    act = Tensor::empty({n, fc1_rows / 2}, dtype_, device_);
    swiglu_forward(fc1, act);
  } else {
    Tensor preact = Tensor::empty({n, fc1_rows}, dtype_, device_);
    act = Tensor::empty({n, fc1_rows}, dtype_, device_);
    gemm(ln2, *w.fc1_w, act, {.trans_b = true, .epilogue = Epilogue::gelu_bias, .bias = w.fc1_b, .aux = &preact});
  }
  Tensor mlp = Tensor::empty({n, C}, dtype_, device_);
  gemm(act, *w.fc2_w, mlp, {.trans_b = true});
  if (w.fc2_b) add_bias(mlp, *w.fc2_b);
  Tensor out = Tensor::empty({n, C}, dtype_, device_);
  add(x2, mlp, out);
  return out;
}

Tensor KvCacheDecoder::attention(LayerWeights& w, const Tensor& qkv) {
  const int64_t n = qkv.dim(0), H = cfg_.num_heads, G = cfg_.kv_heads(), R = H / G, D = cfg_.head_dim, HD = H * D,
                L = length_;
  // Cache the fed tokens' keys and values: qkv row t is (G, R + 2, D), per group [q_0 .. q_{R-1} | k | v].
  const std::vector<float> q3 = qkv.to_floats();  // (n, G, R + 2, D)
  auto slot = [&](int64_t t, int64_t g, int64_t s) { return q3.data() + ((t * G + g) * (R + 2) + s) * D; };
  for (int64_t t = 0; t < n; ++t)
    for (int64_t g = 0; g < G; ++g) {
      std::copy_n(slot(t, g, R), D, w.k.begin() + ((L + t) * G + g) * D);
      std::copy_n(slot(t, g, R + 1), D, w.v.begin() + ((L + t) * G + g) * D);
    }

  if (L == 0) {  // a prefill: the training forward's causal attention op, on the device
    Tensor att = Tensor::empty({1, n, HD}, dtype_, device_);
    Tensor lse = Tensor::empty({1, H, n}, DType::f32, device_);
    attention_forward(qkv.view({1, n, G, R + 2, D}), att, lse, {.causal = true});
    return att.view({n, HD});
  }

  // Decode: query t (position L + t) attends to keys [0, L + t], softmax in fp32 as attention_forward's.
  // Query head h = g*R + r reads group g's keys and values.
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  std::vector<float> out(static_cast<size_t>(n * HD), 0.f), p(static_cast<size_t>(L + n));  // (n, H, D), (L + n)
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / R;
      const float* q = slot(t, g, h % R);
      const int64_t len = L + t + 1;
      float m = -INFINITY;
      for (int64_t j = 0; j < len; ++j) {
        const float* k = w.k.data() + (j * G + g) * D;
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
        const float* v = w.v.data() + (j * G + g) * D;
        for (int64_t d = 0; d < D; ++d) o[d] += pj * v[d];
      }
    }
  Tensor att = Tensor::from_floats(out, {n, HD}, dtype_);  // rounded once to the compute dtype
  return device_ == Device::cpu ? att : att.to(device_);
}

}  // namespace mt
