// kv_cache_decoder.h: autoregressive inference of a whole GptModel (one rank, tensor-parallel size 1, every
// layer) with a key/value cache: the prompt is fed at once (prefill), then one token at a time (decode), and
// each new token attends to the keys and values cached for the tokens before it instead of recomputing them.
//
// It reads the model's parameters by their global names (the names checkpoints use) and runs the same ops in
// the same order as GptModel::forward (core/tensor/ops.h), so a prefill from position 0 computes what the training
// forward computes. Both architectures share the loop; they differ in three steps:
//  * norm: LayerNorm with bias (gpt) or RMSNorm (llama, no biases anywhere);
//  * position: the learned position table added to the embedding (gpt), or the rotary embedding of the fed
//    tokens' queries and keys at their absolute positions (llama, rope_ with position_offset = length());
//  * MLP: fc1 with the GELU epilogue (gpt), or fc1's interleaved gate/up pairs through SwiGLU (llama); a MoE layer
//    runs its MoeMlp's forward (models/moe_mlp.h) on the fed tokens.
// QKV is per query group, (n, G, R + 2, D) (LLAMA.md; gpt: G = H, R = 1), and the cache holds only the G
// key/value heads: capacity x G x D per layer for keys and as much for values.
// Attention:
//  * a feed that starts at position 0 runs attention_forward (causal) on the device, as training does;
//  * a feed after cached tokens (decode) runs a small attention on the host over the cached keys and values,
//    which live on the host in f32 (holding the compute dtype's values exactly); query head h = g*R + r reads
//    group g's keys and values. On a GPU this copies one token's qkv ((H + 2G) D values per layer) to the host
//    and its attention output back; the GEMMs stay on the device. attention_forward cannot take a query
//    shorter than its keys, hence this path.
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
  // A norm's parameters: bias null for RMSNorm.
  struct NormWeights {
    const Tensor *w = nullptr, *b = nullptr;  // (C), (C)
  };
  struct LayerWeights {
    NormWeights ln1, ln2;
    // Biases are null for llama. F: ffn_hidden_size; fc1 has 2F rows (gate/up interleaved) for llama.
    const Tensor *qkv_w, *qkv_b, *proj_w, *proj_b;  // ((H + 2G) D, C), ((H + 2G) D), (C, H D), (C)
    const Tensor *fc1_w, *fc1_b, *fc2_w, *fc2_b;    // (F or 2F, C), (F), (C, F), (C); null in a MoE layer
    const MoeMlp* moe = nullptr;                    // a MoE layer's MLP
    std::vector<float> k, v;  // (capacity, G, D) each: the cached keys and values, f32 on the host
  };
  // x (n, C) -> (n, C): the architecture's norm.
  Tensor normalize(const NormWeights& nw, const Tensor& x) const;
  // x (n, C) -> (n, C): one transformer layer over the fed tokens at positions [length_, length_ + n).
  Tensor layer_forward(LayerWeights& w, const Tensor& x);
  // The attention output (n, H D) of the fed tokens from their (rotated) qkv (n, G, R + 2, D), caching their
  // keys and values.
  Tensor attention(LayerWeights& w, const Tensor& qkv);

  const ModelConfig& cfg_;
  DecoderOptions opt_;
  bool llama_ = false;
  DType dtype_;
  Device device_;
  int64_t capacity_ = 0, length_ = 0;
  const Tensor *wte_, *wpe_ = nullptr, *head_w_;  // (Vpad, C), (P, C) gpt only, (Vpad, C)
  NormWeights lnf_;
  std::vector<LayerWeights> layers_;
};

}  // namespace mt
