// kv_cache_decoder.h: autoregressive inference of a whole GptModel (one rank, tensor-parallel size 1, every
// layer) with a key/value cache: the prompt is fed at once (prefill), then one token at a time (decode), and
// each new token attends to the keys and values cached for the tokens before it instead of recomputing them.
//
// It reads the model's parameters by their global names (the names checkpoints use) and runs the same ops in
// the same order as GptModel::forward (core/ops.h: embedding, LayerNorm, GEMMs with their bias / GELU
// epilogues, the residual adds), so a prefill from position 0 computes what the training forward computes.
// Attention:
//  * a feed that starts at position 0 runs attention_forward (causal) on the device, as training does;
//  * a feed after cached tokens (decode) runs a small attention on the host over the cached keys and values,
//    which live on the host in f32 (holding the compute dtype's values exactly). On a GPU this copies one
//    token's q, k, v (3C values per layer) to the host and its attention output back; the GEMMs stay on the
//    device. attention_forward cannot take a query shorter than its keys, hence this path.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"
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
  struct LayerWeights {
    const Tensor *ln1_w, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b;  // (C), (C), (3C, C), (3C), (C, C), (C)
    const Tensor *ln2_w, *ln2_b, *fc1_w, *fc1_b, *fc2_w, *fc2_b;    // (C), (C), (F, C), (F), (C, F), (C)
    std::vector<float> k, v;  // (capacity, H, D) each: the cached keys and values, f32 on the host
  };
  // x (n, C) -> (n, C): one transformer layer over the fed tokens at positions [length_, length_ + n).
  Tensor layer_forward(LayerWeights& w, const Tensor& x);
  // The attention output (n, C) of the fed tokens from their qkv (n, H, 3, D), caching their keys and values.
  Tensor attention(LayerWeights& w, const Tensor& qkv);

  const ModelConfig& cfg_;
  DecoderOptions opt_;
  DType dtype_;
  Device device_;
  int64_t capacity_ = 0, length_ = 0;
  const Tensor *wte_, *wpe_, *lnf_w_, *lnf_b_, *head_w_;  // (Vpad, C), (P, C), (C), (C), (Vpad, C)
  std::vector<LayerWeights> layers_;
};

}  // namespace mt
