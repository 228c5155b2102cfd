// hf_mapping.h: the one table between our parameter names and layouts and Hugging Face transformers' for
// GPT2LMHeadModel and LlamaForCausalLM, used both ways (export: ckpt -> HF, import: HF -> ckpt).
//
// Every HF tensor is a row selection of one of our tensors, maybe transposed: HF row i (before the transpose)
// is our row rows[i]. That one rule covers the vocabulary padding (HF holds the first vocab rows), GPT-2's
// [q | k | v] columns against our per-head interleaving, Llama's separate q/k/v projections against our
// per-group (R query heads, k, v) rows and gate/up against our row-interleaved fc1 (LLAMA.md).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor/tensor.h"

namespace mt {

enum class HfArch { gpt, llama };

// The hyperparameters both sides agree on (our config keys in comments).
struct HfModelShape {
  HfArch arch = HfArch::gpt;
  int64_t num_layers = 0, hidden = 0, heads = 0;  // num_layers, hidden_size, num_heads
  int64_t groups = 0;                             // num_query_groups (G; heads for GPT)
  int64_t ffn = 0;                                // ffn_hidden_size, resolved (never 0)
  int64_t vocab = 0, padded_vocab = 0;            // vocab_size; our tables' row count
  int64_t positions = 0;                          // max_position_embeddings, resolved
  int64_t seq_length = 0;                         // model.seq_length (0 when unknown)
  bool tied = true;                               // tie_embeddings
  double layernorm_eps = 1e-5, dropout = 0.1, attention_dropout = 0.1, init_std = 0.02;
  double rotary_base = 10000;  // llama: rotary_base (HF rope_theta)

  int64_t head_dim() const { return hidden / heads; }
};

const char* arch_name(HfArch a);  // "gpt" | "llama", as model.arch spells it

struct HfMapping {
  std::string hf_name;
  Shape hf_shape;             // as HF stores it
  std::string ours;           // our parameter name (the checkpoint holds "model." + ours)
  Shape our_shape;            // its global shape
  std::vector<int64_t> rows;  // HF row i is our row rows[i]; empty: our first hf rows, in order
  bool transpose = false;     // HF stores the (in, out) transpose (GPT-2's Conv1D)
};

// Every tensor of the model, in HF's order. Tied embeddings have no lm_head entry.
std::vector<HfMapping> hf_mappings(const HfModelShape& s);
// The HF tensors' sizes in bytes at `element_bytes` each, in the order of `maps` (a progress line's pieces).
std::vector<int64_t> hf_tensor_bytes(const std::vector<HfMapping>& maps, size_t element_bytes);

// Our tensor (fp32, our_shape) -> the HF tensor (fp32, hf_shape).
Tensor to_hf(const Tensor& ours, const HfMapping& m);
// The HF tensor (any float dtype, hf_shape) into our tensor (fp32, our_shape): the rows it names are written,
// the others (vocabulary padding) left as they are.
void from_hf(const Tensor& hf, const HfMapping& m, Tensor& ours);

}  // namespace mt
