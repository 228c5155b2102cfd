// hf_export_llama.cpp: config.json of transformers' LlamaForCausalLM for a model.arch: llama checkpoint.
// The keys are the LlamaConfig ones of transformers 4.x (rope_theta, rope_scaling), which 5.x also reads
// (into rope_parameters).
#include <fmt/format.h>

#include "core/hf/hf_config_json.h"
#include "core/hf/hf_export.h"

namespace mt {

std::string hf_llama_config_json(const HfModelShape& s, DType dtype, std::optional<HfSpecialIds> ids) {
  using namespace hf_json;
  Object j = begin_config("LlamaForCausalLM", "llama", s.vocab);
  j.add("hidden_size", std::to_string(s.hidden));
  j.add("intermediate_size", std::to_string(s.ffn));
  j.add("num_hidden_layers", std::to_string(s.num_layers));
  j.add("num_attention_heads", std::to_string(s.heads));
  j.add("num_key_value_heads", std::to_string(s.groups));
  j.add("head_dim", std::to_string(s.head_dim()));
  j.add("hidden_act", "\"silu\"");
  j.add("max_position_embeddings", std::to_string(s.positions));
  j.add("rms_norm_eps", num(s.layernorm_eps));
  j.add("rope_theta", num(s.rotary_base));
  j.add("rope_scaling", "null");
  j.add("attention_bias", "false");
  j.add("attention_dropout", num(s.attention_dropout));
  j.add("mlp_bias", "false");
  j.add("initializer_range", num(s.init_std));
  j.add("pretraining_tp", "1");
  j.add("use_cache", "true");
  return end_config(j, s.tied, s.vocab, ids, dtype);
}

}  // namespace mt
