// hf_mapping.h: the one table between our parameter names and layouts and Hugging Face transformers' for
// GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM (Llama's layers with q/k/v biases) and the mixtures of
// experts MixtralForCausalLM and Qwen2MoeForCausalLM, used both ways (export: ckpt -> HF, import: HF -> ckpt).
//
// Every HF tensor is a row selection of one of our tensors, maybe transposed: HF row i (before the transpose)
// is our row rows[i]. That one rule covers the vocabulary padding (HF holds the first vocab rows), GPT-2's
// [q | k | v] columns against our per-head interleaving, Llama's separate q/k/v projections against our
// per-group (R query heads, k, v) rows and gate/up against our row-interleaved fc1 (LLAMA.md), for the dense MLP
// and each expert alike.
//
// Two more rules cover what Qwen2-MoE holds and we do not compute: a tensor with no counterpart of ours (the q/k/v
// biases of a model without model.qkv_bias, the shared expert's sigmoid gate) is all zeros, written so on export
// and required so on import; and a tensor may be ours times a power of two (`scale`): with its gate's weight zero,
// Qwen2-MoE's shared expert output is sigmoid(0) = 0.5 times down_proj's, so its down_proj is 2x our (ungated) shared
// expert's fc2, exactly.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/base/enum_names.h"
#include "core/base/rope_scaling.h"
#include "core/tensor/tensor.h"

namespace mt {

enum class HfArch { gpt, llama, mixtral, qwen2_moe, qwen2, qwen3, qwen3_moe, mistral };
template <>
struct EnumNames<HfArch> {  // the model class, as config.json's "architectures" spells it
  static constexpr std::array names{"GPT2LMHeadModel",     "LlamaForCausalLM",  "MixtralForCausalLM",
                                    "Qwen2MoeForCausalLM", "Qwen2ForCausalLM",  "Qwen3ForCausalLM",
                                    "Qwen3MoeForCausalLM", "MistralForCausalLM"};
};

// The mixture of experts of a Mixtral or Qwen2-MoE (model.moe; our config keys in comments). The router is always
// softmax then top-k; Mixtral renormalises the top-k weights, Qwen2-MoE as norm_topk_prob says.
struct HfMoeShape {
  int64_t experts = 0, top_k = 0;      // num_experts, top_k
  int64_t ffn = 0, shared_ffn = 0;     // ffn_hidden_size (resolved), shared_expert_ffn_hidden_size (0: none)
  bool norm_topk_prob = true;          // norm_topk_prob
  double aux_loss_coeff = 0;           // aux_loss_coeff (HF's router_aux_loss_coef)
  std::vector<int64_t> layer_pattern;  // (num_layers) 1: MoE MLP, 0: dense (layer_pattern, resolved)

  bool is_moe_layer(int64_t layer) const { return layer_pattern.at(static_cast<size_t>(layer)) != 0; }
};

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
  bool qkv_bias = false;       // llama: qkv_bias (Qwen2's q/k/v biases; HF's are zeros without it)
  RopeScaling rope_scaling;    // llama: rope_scaling (HF rope_scaling / rope_parameters)
  HfMoeShape moe;              // mixtral and qwen2_moe only

  int64_t head_width = 0;             // llama: head_dim when it is not hidden / heads (Qwen3's; 0: the quotient)
  bool qk_norm = false;               // llama: qk_norm (Qwen3's q_norm / k_norm)
  int64_t sliding_window = 0;         // sliding_window (0: none; Mistral's sliding_window, Qwen's with
                                      // use_sliding_window)
  int64_t full_attention_layers = 0;  // full_attention_layers (Qwen's max_window_layers, as layer_types list them)

  int64_t head_dim() const { return head_width > 0 ? head_width : hidden / heads; }
};

const char* arch_name(HfArch a);      // "gpt" | "llama", as model.arch spells it (the MoE ones are llama)
const char* hf_class_name(HfArch a);  // as config.json's "architectures" spells it: EnumNames<HfArch>
// Whether the architecture computes Llama's attention and SwiGLU MLPs (all but gpt).
inline bool llama_like(HfArch a) { return a != HfArch::gpt; }
// Whether the family's MLPs are mixtures of experts (HfModelShape::moe describes them).
inline bool has_experts(HfArch a) { return a == HfArch::mixtral || a == HfArch::qwen2_moe || a == HfArch::qwen3_moe; }

struct HfMapping {
  std::string hf_name;
  Shape hf_shape;             // as HF stores it
  std::string ours;           // our parameter name (the checkpoint holds "model." + ours); empty: all zeros
  Shape our_shape;            // its global shape
  std::vector<int64_t> rows;  // HF row i is our row rows[i]; empty: our first hf rows, in order
  bool transpose = false;     // HF stores the (in, out) transpose (GPT-2's Conv1D)
  float scale = 1;            // HF's values are ours times this (a power of two, so exact both ways)
  const char* zero_why = "";  // without `ours`: what megatrain lacks, for the import's refusal of nonzero values
};

// Every tensor of the model, in HF's order. Tied embeddings have no lm_head entry.
std::vector<HfMapping> hf_mappings(const HfModelShape& s);
// The HF tensors' sizes in bytes at `element_bytes` each, in the order of `maps` (a progress line's pieces).
std::vector<int64_t> hf_tensor_bytes(const std::vector<HfMapping>& maps, size_t element_bytes);

// Our tensor (fp32, our_shape) -> the HF tensor (fp32, hf_shape). A mapping without `ours` takes an undefined
// tensor and gives zeros.
Tensor to_hf(const Tensor& ours, const HfMapping& m);
// The HF tensor (any float dtype, hf_shape) into our tensor (fp32, our_shape): the rows it names are written,
// the others (vocabulary padding) left as they are. A mapping without `ours` checks that `hf` is all zeros
// (throws CheckpointError naming the tensor and zero_why otherwise) and leaves `ours` alone.
void from_hf(const Tensor& hf, const HfMapping& m, Tensor& ours);

}  // namespace mt
