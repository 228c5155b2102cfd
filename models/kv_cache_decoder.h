// kv_cache_decoder.h: autoregressive inference of a whole GptModel (one rank, tensor-parallel size 1, every
// layer) with a key/value cache: the prompt is fed at once (prefill), then one token at a time (decode), and
// each new token attends to the keys and values cached for the tokens before it instead of recomputing them.
//
// It reads the embeddings and the head by their roles and runs each layer's own decode (TransformerLayer::decode:
// the layer's norms and parts, models/block_part.h), so a prefill from position 0 computes what the training
// forward computes: the embedding (plus the learned position rows for gpt), every layer, the final norm and the LM
// head. The attention part keeps each layer's cache (models/attention.h); a MoE layer runs its MoeMlp's forward on
// the fed tokens.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor/tensor.h"
#include "models/gpt.h"

namespace mt {

struct DecoderOptions {
  int64_t capacity = 0;        // tokens the cache holds; 0: max_position_embeddings (may not exceed it)
  bool all_positions = false;  // feed() returns the logits of every fed position, not only the last one
};

class KvCacheDecoder {
 public:
  // `model` must hold the whole model (every layer, embedding and head) with tensor-parallel size 1, and
  // outlive the decoder. Throws std::invalid_argument otherwise.
  KvCacheDecoder(const GptModel& model, DecoderOptions opt = {});

  // Appends `tokens` (ids < vocab_size) at positions [length(), length() + n) and returns f32 logits over the
  // vocabulary (padding columns left out): (vocab_size) of the last fed position, or (n, vocab_size) with
  // all_positions. Throws std::invalid_argument when the tokens do not fit in the cache or an id is out of range.
  std::vector<float> feed(std::span<const int32_t> tokens);

  int64_t length() const { return length_; }      // tokens cached
  int64_t capacity() const { return capacity_; }  // tokens the cache can hold
  void reset() { length_ = 0; }

 private:
  const ModelConfig& cfg_;
  DecoderOptions opt_;
  DType dtype_;
  Device device_;
  int64_t capacity_ = 0, length_ = 0;
  const Tensor *wte_, *wpe_ = nullptr, *head_w_;  // (Vpad, C), (P, C) gpt only, (Vpad, C)
  const Norm* lnf_;
  std::vector<const TransformerLayer*> layers_;
  std::vector<TransformerLayer::DecodeCache> caches_;  // per layer
};

}  // namespace mt
