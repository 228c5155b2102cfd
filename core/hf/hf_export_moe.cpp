// hf_export_moe.cpp: config.json of transformers' MixtralForCausalLM and Qwen2MoeForCausalLM for a model.arch: llama
// checkpoint with model.moe (hf_export.cpp picks the family). The attention keys are LlamaConfig's; the router's
// auxiliary loss is off in the forward (output_router_logits false: the loss is the language model's, as
// `megatrain eval` reports it) and its coefficient carries our aux_loss_coeff.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/hf/hf_config_json.h"
#include "core/hf/hf_export.h"

namespace mt {
namespace {

using hf_json::ConfigKey;
using hf_json::integer;
using hf_json::literal;
using hf_json::real;
using S = HfModelShape;

// The attention and norm keys both families share with LlamaConfig.
std::vector<ConfigKey> attention_keys() {
  return {{"hidden_size", integer(&S::hidden)},
          {"num_hidden_layers", integer(&S::num_layers)},
          {"num_attention_heads", integer(&S::heads)},
          {"num_key_value_heads", integer(&S::groups)},
          {"head_dim", [](const S& m) { return std::to_string(m.head_dim()); }},
          {"hidden_act", literal("\"silu\"")},
          {"max_position_embeddings", integer(&S::positions)},
          {"rms_norm_eps", real(&S::layernorm_eps)},
          {"rope_theta", real(&S::rotary_base)},
          {"rope_scaling", literal("null")},
          {"sliding_window", literal("null")},
          {"attention_dropout", real(&S::attention_dropout)}};
}

std::vector<ConfigKey> router_keys() {
  return {{"num_experts_per_tok", [](const S& m) { return std::to_string(m.moe.top_k); }},
          {"output_router_logits", literal("false")},
          {"router_aux_loss_coef", [](const S& m) { return hf_json::num(m.moe.aux_loss_coeff); }},
          {"initializer_range", real(&S::init_std)},
          {"use_cache", literal("true")}};
}

std::vector<ConfigKey> concat(std::vector<ConfigKey> a, const std::vector<ConfigKey>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

std::string hf_mixtral_config_json(const HfModelShape& s, DType dtype, std::optional<HfSpecialIds> ids) {
  // Mixtral's intermediate_size is each expert's width; every layer is MoE and the top-k weights renormalised.
  static const hf_json::ConfigLayout mixtral{
      "MixtralForCausalLM", "mixtral",
      concat(concat(attention_keys(), {{"intermediate_size", [](const S& m) { return std::to_string(m.moe.ffn); }},
                                       {"num_local_experts", [](const S& m) { return std::to_string(m.moe.experts); }},
                                       {"router_jitter_noise", literal("0.0")}}),
             router_keys())};
  return hf_json::config_json(mixtral, s, dtype, ids);
}

std::string hf_qwen2_moe_config_json(const HfModelShape& s, DType dtype, std::optional<HfSpecialIds> ids) {
  // Dense layers (mlp_only_layers, decoder_sparse_step 1 so the list alone decides) have intermediate_size; the
  // shared expert's gate is exported as zeros (hf_mapping.h), the q/k/v biases too.
  static const hf_json::ConfigLayout qwen2_moe{
      "Qwen2MoeForCausalLM", "qwen2_moe",
      concat(concat(attention_keys(),
                    {{"intermediate_size", integer(&S::ffn)},
                     {"use_sliding_window", literal("false")},
                     {"max_window_layers", integer(&S::num_layers)},
                     {"num_experts", [](const S& m) { return std::to_string(m.moe.experts); }},
                     {"moe_intermediate_size", [](const S& m) { return std::to_string(m.moe.ffn); }},
                     {"shared_expert_intermediate_size", [](const S& m) { return std::to_string(m.moe.shared_ffn); }},
                     {"norm_topk_prob", [](const S& m) { return hf_json::boolean(m.moe.norm_topk_prob); }},
                     {"decoder_sparse_step", literal("1")},
                     {"mlp_only_layers",
                      [](const S& m) {
                        std::vector<int64_t> dense;
                        for (int64_t i = 0; i < m.num_layers; ++i)
                          if (!m.moe.is_moe_layer(i)) dense.push_back(i);
                        return fmt::format("[{}]", fmt::join(dense, ", "));
                      }}}),
             router_keys())};
  return hf_json::config_json(qwen2_moe, s, dtype, ids);
}

}  // namespace mt
