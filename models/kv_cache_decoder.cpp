#include "models/kv_cache_decoder.h"

#include <algorithm>
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
    : cfg_(model.config()), opt_(opt), capacity_(opt.capacity) {
  const int64_t P = cfg_.max_position_embeddings;
  if (capacity_ == 0) capacity_ = P;
  if (capacity_ < 1 || capacity_ > P)
    throw std::invalid_argument(
        fmt::format("generation: cache capacity {} must lie in [1, max_position_embeddings={}]", capacity_, P));
  const GptModel::Roles roles = model.roles();
  wte_ = whole(roles.word_embeddings, "word embeddings");
  if (cfg_.arch == Arch::gpt)  // llama rotates q and k instead
    wpe_ = whole(roles.position_embeddings, "position embeddings");
  if (!roles.final_norm) whole(nullptr, "final norm");
  lnf_ = roles.final_norm;
  head_w_ = whole(roles.lm_head, "LM head");
  dtype_ = wte_->dtype();
  device_ = wte_->device();
  if (static_cast<int64_t>(roles.layers.size()) != cfg_.num_layers)
    throw std::invalid_argument(
        fmt::format("generation: the model holds {} of its {} layers (it needs the whole model on one rank)",
                    roles.layers.size(), cfg_.num_layers));
  for (const Parameter* p : model.parameters()) whole(p, "parameter");  // tensor-parallel size 1
  layers_ = roles.layers;
  caches_.resize(layers_.size());
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
  const DecodeStep step{.position = length_, .capacity = capacity_};
  for (size_t i = 0; i < layers_.size(); ++i) h = layers_[i]->decode(h, caches_[i], step);
  length_ += n;

  // Final norm and the LM head over the positions asked for; f32 logits, padding columns dropped below.
  const int64_t rows = opt_.all_positions ? n : 1;
  Norm::Saved lnf;
  lnf_->forward(h.slice(n - rows, n), lnf);  // (rows, C)
  const int64_t Vpad = head_w_->dim(0);
  Tensor logits = Tensor::empty({rows, Vpad}, DType::f32, device_);  // (rows, Vpad)
  gemm(lnf.out, *head_w_, logits, {.trans_b = true});
  const std::vector<float> padded = logits.to_floats();
  std::vector<float> out(static_cast<size_t>(rows * V));
  for (int64_t r = 0; r < rows; ++r) std::copy_n(padded.begin() + r * Vpad, V, out.begin() + r * V);
  return out;
}

}  // namespace mt
