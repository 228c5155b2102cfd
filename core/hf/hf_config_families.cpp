// hf_config_families.cpp: config.json of each Hugging Face family megatrain exports, one table each
// (hf_json::ConfigLayout: the family, its model_type and its keys in the order written) fed to the one writer,
// hf_json::config_json. A new family is a table here, beside its tensors' table in hf_mapping.cpp.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>
#include <vector>

#include "core/hf/hf_config_json.h"
#include "core/hf/hf_export.h"

namespace mt {
namespace {

using hf_json::ConfigKey;
using hf_json::ConfigLayout;
using hf_json::integer;
using hf_json::literal;
using hf_json::moe_integer;
using hf_json::real;
using S = HfModelShape;

std::vector<ConfigKey> concat(std::vector<ConfigKey> a, const std::vector<ConfigKey>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

ConfigLayout gpt2() {
  return {HfArch::gpt,
          "gpt2",
          {{"n_positions", integer(&S::positions)},
           {"n_ctx", integer(&S::positions)},
           {"n_embd", integer(&S::hidden)},
           {"n_layer", integer(&S::num_layers)},
           {"n_head", integer(&S::heads)},
           {"n_inner", integer(&S::ffn)},
           {"activation_function", literal("\"gelu_new\"")},
           {"layer_norm_epsilon", real(&S::layernorm_eps)},
           {"resid_pdrop", real(&S::dropout)},
           {"embd_pdrop", real(&S::dropout)},
           {"attn_pdrop", real(&S::attention_dropout)},
           {"initializer_range", real(&S::init_std)},
           {"scale_attn_weights", literal("true")},
           {"use_cache", literal("true")}}};
}

// model.rope_scaling as transformers 4.x's rope_scaling (5.x reads it into rope_parameters): null when plain, else
// rope_type and the keys its type reads.
std::string rope_scaling(const S& m) {
  const RopeScaling& r = m.rope_scaling;
  if (!r.enabled()) return "null";
  using hf_json::num;
  std::vector<std::string> keys{fmt::format("\"rope_type\": \"{}\"", name_of(r.type)),
                                fmt::format("\"factor\": {}", num(r.factor))};
  if (r.type == RopeScalingType::llama3) {
    keys.push_back(fmt::format("\"low_freq_factor\": {}", num(r.low_freq_factor)));
    keys.push_back(fmt::format("\"high_freq_factor\": {}", num(r.high_freq_factor)));
  }
  if (r.type != RopeScalingType::linear)
    keys.push_back(fmt::format("\"original_max_position_embeddings\": {}", r.original_max_position_embeddings));
  if (r.type == RopeScalingType::yarn) {
    if (r.attention_factor != 0) keys.push_back(fmt::format("\"attention_factor\": {}", num(r.attention_factor)));
    keys.push_back(fmt::format("\"beta_fast\": {}", num(r.beta_fast)));
    keys.push_back(fmt::format("\"beta_slow\": {}", num(r.beta_slow)));
    if (r.mscale != 0) keys.push_back(fmt::format("\"mscale\": {}", num(r.mscale)));
    if (r.mscale_all_dim != 0) keys.push_back(fmt::format("\"mscale_all_dim\": {}", num(r.mscale_all_dim)));
    keys.push_back(fmt::format("\"truncate\": {}", r.truncate ? "true" : "false"));
  }
  return fmt::format("{{{}}}", fmt::join(keys, ", "));
}

// The window keys: sliding_window (null without one), use_sliding_window (Qwen's switch) and max_window_layers (the
// Qwen layers before the window: model.full_attention_layers, or all of them without a window).
std::string window(const S& m) { return m.sliding_window > 0 ? std::to_string(m.sliding_window) : "null"; }
std::string window_on(const S& m) { return hf_json::boolean(m.sliding_window > 0); }
std::string window_layers(const S& m) {
  return std::to_string(m.sliding_window > 0 ? m.full_attention_layers : m.num_layers);
}

// LlamaConfig's attention and norm keys, which the mixtures share: hidden_size, `after_hidden`, the heads, positions
// and rotary keys, `after_rope`, attention_dropout. The keys of transformers 4.x (rope_theta, rope_scaling), which 5.x
// also reads (into rope_parameters).
std::vector<ConfigKey> llama_attention(const std::vector<ConfigKey>& after_hidden,
                                       const std::vector<ConfigKey>& after_rope) {
  const std::vector<ConfigKey> heads{{"num_hidden_layers", integer(&S::num_layers)},
                                     {"num_attention_heads", integer(&S::heads)},
                                     {"num_key_value_heads", integer(&S::groups)},
                                     {"head_dim", [](const S& m) { return std::to_string(m.head_dim()); }},
                                     {"hidden_act", literal("\"silu\"")},
                                     {"max_position_embeddings", integer(&S::positions)},
                                     {"rms_norm_eps", real(&S::layernorm_eps)},
                                     {"rope_theta", real(&S::rotary_base)},
                                     {"rope_scaling", rope_scaling}};
  return concat(concat(concat(concat({{"hidden_size", integer(&S::hidden)}}, after_hidden), heads), after_rope),
                {{"attention_dropout", real(&S::attention_dropout)}});
}

ConfigLayout llama() {
  return {HfArch::llama, "llama",
          concat(llama_attention({{"intermediate_size", integer(&S::ffn)}}, {{"attention_bias", literal("false")}}),
                 {{"mlp_bias", literal("false")},
                  {"initializer_range", real(&S::init_std)},
                  {"pretraining_tp", literal("1")},
                  {"use_cache", literal("true")}})};
}

// Qwen2: Llama's layers with q/k/v biases (Qwen2Config has no attention_bias key: they are always there).
ConfigLayout qwen2() {
  return {HfArch::qwen2, "qwen2",
          concat(llama_attention({{"intermediate_size", integer(&S::ffn)}}, {{"use_sliding_window", window_on},
                                                                             {"sliding_window", window},
                                                                             {"max_window_layers", window_layers}}),
                 {{"initializer_range", real(&S::init_std)}, {"use_cache", literal("true")}})};
}

// Mistral: Llama's layers (no biases), every one in the sliding window.
ConfigLayout mistral() {
  return {HfArch::mistral, "mistral",
          concat(llama_attention({{"intermediate_size", integer(&S::ffn)}}, {{"sliding_window", window}}),
                 {{"initializer_range", real(&S::init_std)}, {"use_cache", literal("true")}})};
}

// Qwen3: Llama's layers with QK-norm; head_dim always written (Qwen3Config's default, 128, is no quotient).
ConfigLayout qwen3() {
  return {HfArch::qwen3, "qwen3",
          concat(llama_attention({{"intermediate_size", integer(&S::ffn)}}, {{"attention_bias", literal("false")},
                                                                             {"use_sliding_window", window_on},
                                                                             {"sliding_window", window},
                                                                             {"max_window_layers", window_layers}}),
                 {{"initializer_range", real(&S::init_std)}, {"use_cache", literal("true")}})};
}

// The mixtures of experts (a model.arch: llama checkpoint with model.moe; hf_export.cpp picks the family):
// LlamaConfig's attention keys, their own, then the router's. The router's auxiliary loss is off in the forward
// (output_router_logits false: the loss is the language model's, as `megatrain eval` reports it) and its coefficient
// carries our aux_loss_coeff.
ConfigLayout moe_family(HfArch family, const char* model_type, const std::vector<ConfigKey>& own) {
  const std::vector<ConfigKey> router{
      {"num_experts_per_tok", moe_integer(&HfMoeShape::top_k)},
      {"output_router_logits", literal("false")},
      {"router_aux_loss_coef", [](const S& m) { return hf_json::num(m.moe.aux_loss_coeff); }},
      {"initializer_range", real(&S::init_std)},
      {"use_cache", literal("true")}};
  return {family, model_type, concat(concat(llama_attention({}, {{"sliding_window", window}}), own), router)};
}

// Mixtral's intermediate_size is each expert's width; every layer is MoE and the top-k weights renormalised.
ConfigLayout mixtral() {
  return moe_family(HfArch::mixtral, "mixtral",
                    {{"intermediate_size", moe_integer(&HfMoeShape::ffn)},
                     {"num_local_experts", moe_integer(&HfMoeShape::experts)},
                     {"router_jitter_noise", literal("0.0")}});
}

// The Qwen MoE families' mlp_only_layers: the dense layers' indices (decoder_sparse_step 1, so the list alone decides).
std::string dense_layers(const S& m) {
  std::vector<int64_t> dense;
  for (int64_t i = 0; i < m.num_layers; ++i)
    if (!m.moe.is_moe_layer(i)) dense.push_back(i);
  return fmt::format("[{}]", fmt::join(dense, ", "));
}

// Dense layers (mlp_only_layers, decoder_sparse_step 1 so the list alone decides) have intermediate_size; the
// shared expert's gate is exported as zeros (hf_mapping.h), the q/k/v biases too.
ConfigLayout qwen2_moe() {
  return moe_family(HfArch::qwen2_moe, "qwen2_moe",
                    {{"intermediate_size", integer(&S::ffn)},
                     {"use_sliding_window", literal("false")},
                     {"max_window_layers", integer(&S::num_layers)},
                     {"num_experts", moe_integer(&HfMoeShape::experts)},
                     {"moe_intermediate_size", moe_integer(&HfMoeShape::ffn)},
                     {"shared_expert_intermediate_size", moe_integer(&HfMoeShape::shared_ffn)},
                     {"norm_topk_prob", [](const S& m) { return hf_json::boolean(m.moe.norm_topk_prob); }},
                     {"decoder_sparse_step", literal("1")},
                     {"mlp_only_layers", dense_layers}});
}

// Qwen3-MoE: Qwen3's attention (no biases, QK-norm), no shared expert; dense layers as Qwen2-MoE lists them.
ConfigLayout qwen3_moe() {
  return moe_family(HfArch::qwen3_moe, "qwen3_moe",
                    {{"intermediate_size", integer(&S::ffn)},
                     {"attention_bias", literal("false")},
                     {"use_sliding_window", window_on},
                     {"num_experts", moe_integer(&HfMoeShape::experts)},
                     {"moe_intermediate_size", moe_integer(&HfMoeShape::ffn)},
                     {"norm_topk_prob", [](const S& m) { return hf_json::boolean(m.moe.norm_topk_prob); }},
                     {"decoder_sparse_step", literal("1")},
                     {"mlp_only_layers", dense_layers}});
}

}  // namespace

std::string hf_config_json(HfArch family, const HfModelShape& s, DType dtype, std::optional<HfSpecialIds> ids) {
  static const std::vector<ConfigLayout> families{gpt2(),  llama(), mixtral(),   qwen2_moe(),
                                                  qwen2(), qwen3(), qwen3_moe(), mistral()};
  for (const ConfigLayout& f : families)
    if (f.family == family) return hf_json::config_json(f, s, dtype, ids);
  throw std::logic_error(fmt::format("hf export: no config.json table for {}", name_of(family)));
}

}  // namespace mt
