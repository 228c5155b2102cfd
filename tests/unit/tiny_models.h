// tiny_models.h: the tiny model configs the model tests build in code (no config file, nothing resolved):
// a GPT of 2 layers, hidden 16, and its Llama twin. Tests adjust fields on top. And a batch to feed them.
#pragma once
#include <cstdint>

#include "core/config/config.h"
#include "core/tensor/tensor.h"

namespace mt::testing_util {

// 2 layers, hidden 16, 2 heads of 8, ffn 32, sequence 8, vocabulary 40 padded to 128, no dropout.
inline ModelConfig tiny_gpt(bool tie) {
  ModelConfig m;
  m.num_layers = 2;
  m.hidden_size = 16;
  m.num_heads = 2;
  m.ffn_hidden_size = 32;
  m.seq_length = 8;
  m.max_position_embeddings = 8;
  m.vocab_size = 40;
  m.padded_vocab_size = 128;
  m.head_dim = 8;
  m.tie_embeddings = tie;
  m.dropout = 0.f;
  m.attention_dropout = 0.f;
  return m;
}

// tiny_gpt's context as a Llama: 4 query heads of 4 sharing `groups` key/value heads (1: multi-query), SwiGLU
// 24 wide, rotary embeddings with `rotary_base` (not the default, so a wrong theta shows), no biases.
inline ModelConfig tiny_llama(int64_t groups, bool tie, double rotary_base) {
  ModelConfig m = tiny_gpt(tie);
  m.arch = Arch::llama;
  m.num_heads = 4;
  m.num_query_groups = groups;
  m.head_dim = 4;
  m.ffn_hidden_size = 24;
  m.rotary_base = rotary_base;
  return m;
}

// tokens and targets (B, T) i32 on the host: a fixed pattern below `vocab`.
inline void fill_batch(Tensor& tokens, Tensor& targets, int64_t vocab) {
  for (int64_t i = 0; i < tokens.numel(); ++i) {
    tokens.data<int32_t>()[i] = static_cast<int32_t>((i * 7 + 3) % vocab);
    targets.data<int32_t>()[i] = static_cast<int32_t>((i * 11 + 5) % vocab);
  }
}

}  // namespace mt::testing_util
