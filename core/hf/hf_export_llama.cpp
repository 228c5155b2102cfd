// hf_export_llama.cpp: config.json of transformers' LlamaForCausalLM for a model.arch: llama checkpoint.
// The keys are the LlamaConfig ones of transformers 4.x (rope_theta, rope_scaling), which 5.x also reads
// (into rope_parameters).
#include <fmt/format.h>

#include "core/hf/hf_config_json.h"
#include "core/hf/hf_export.h"

namespace mt {

std::string hf_llama_config_json(const HfModelShape& s, DType dtype, std::optional<HfSpecialIds> ids) {
  using namespace hf_json;
  using S = HfModelShape;
  static const ConfigLayout llama{"LlamaForCausalLM",
                                  "llama",
                                  {{"hidden_size", integer(&S::hidden)},
                                   {"intermediate_size", integer(&S::ffn)},
                                   {"num_hidden_layers", integer(&S::num_layers)},
                                   {"num_attention_heads", integer(&S::heads)},
                                   {"num_key_value_heads", integer(&S::groups)},
                                   {"head_dim", [](const S& m) { return std::to_string(m.head_dim()); }},
                                   {"hidden_act", literal("\"silu\"")},
                                   {"max_position_embeddings", integer(&S::positions)},
                                   {"rms_norm_eps", real(&S::layernorm_eps)},
                                   {"rope_theta", real(&S::rotary_base)},
                                   {"rope_scaling", literal("null")},
                                   {"attention_bias", literal("false")},
                                   {"attention_dropout", real(&S::attention_dropout)},
                                   {"mlp_bias", literal("false")},
                                   {"initializer_range", real(&S::init_std)},
                                   {"pretraining_tp", literal("1")},
                                   {"use_cache", literal("true")}}};
  return config_json(llama, s, dtype, ids);
}

}  // namespace mt
