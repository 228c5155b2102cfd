// hf_import_families.cpp: each Hugging Face family's config.json read into the HfModelShape megatrain builds
// (GPT2LMHeadModel, LlamaForCausalLM with its rotary scaling, Qwen2ForCausalLM, MixtralForCausalLM,
// Qwen2MoeForCausalLM). Strict: every key that changes what the model computes is mapped to ours or checked to hold
// the value we compute with.
#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/base/rope_scaling.h"
#include "core/hf/hf_import_detail.h"

namespace mt::hf_import {
namespace {

HfModelShape gpt2_shape(const ConfigKeys& k) {
  HfModelShape s;
  s.arch = HfArch::gpt;
  s.hidden = k.integer("n_embd");
  s.num_layers = k.integer("n_layer");
  s.heads = k.integer("n_head");
  s.groups = s.heads;
  s.ffn = k.integer("n_inner", 4 * s.hidden);  // null: 4 * n_embd
  s.positions = k.integer("n_positions");
  s.vocab = k.integer("vocab_size");
  s.layernorm_eps = k.real("layer_norm_epsilon", 1e-5);
  s.init_std = k.real("initializer_range", 0.02);
  s.tied = k.flag("tie_word_embeddings", true);
  const std::string act = k.text("activation_function", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh")
    k.fail("activation_function", fmt::format("= {}: megatrain's GPT computes the tanh GELU (gelu_new) only", act));
  k.require_flag("scale_attn_weights", true, true, "megatrain scales attention scores by 1/sqrt(head_dim)");
  k.require_flag("scale_attn_by_inverse_layer_idx", false, false, "megatrain does not scale scores per layer");
  k.require_flag("add_cross_attention", false, false, "megatrain's GPT is decoder-only");
  return s;
}

// A rope_scaling (4.x) or rope_parameters (5.x) object: the rotary scaling megatrain models (default, linear, llama3,
// yarn), each key read as transformers' rope_init_fn reads it. Any other type or key is refused by name, as is a
// partial rotary factor.
RopeScaling read_rope_scaling(const ConfigKeys& r, int64_t max_positions) {
  const json& j = r.raw_object();
  static const std::vector<std::string> known{"rope_type",
                                              "type",
                                              "rope_theta",
                                              "factor",
                                              "low_freq_factor",
                                              "high_freq_factor",
                                              "original_max_position_embeddings",
                                              "attention_factor",
                                              "beta_fast",
                                              "beta_slow",
                                              "mscale",
                                              "mscale_all_dim",
                                              "truncate",
                                              "partial_rotary_factor"};
  for (const auto& [key, value] : j.items())
    if (std::find(known.begin(), known.end(), key) == known.end())
      r.fail(key.c_str(), fmt::format("= {}: megatrain does not model this rotary key", value.dump()));
  if (r.present("partial_rotary_factor") && r.real("partial_rotary_factor") != 1.0)
    r.fail("partial_rotary_factor", fmt::format("= {}: megatrain rotates the whole head (partial_rotary_factor 1)",
                                                r.raw("partial_rotary_factor").dump()));
  const std::string type = r.text(r.present("rope_type") ? "rope_type" : "type", "default");
  RopeScaling rs;
  if (type == "default") return rs;
  const std::optional<RopeScalingType> t = parse_choice<RopeScalingType>(type);
  if (!t || *t == RopeScalingType::none)
    r.fail("rope_type",
           fmt::format("= \"{}\": megatrain models the rotary types default, linear, llama3 and yarn", type));
  rs.type = *t;
  const int64_t original =
      r.present("original_max_position_embeddings") ? r.integer("original_max_position_embeddings") : 0;
  switch (rs.type) {
    case RopeScalingType::linear:
      rs.factor = r.real("factor");
      break;
    case RopeScalingType::llama3:
      rs.factor = r.real("factor");
      rs.low_freq_factor = r.real("low_freq_factor");
      rs.high_freq_factor = r.real("high_freq_factor");
      rs.original_max_position_embeddings = r.integer("original_max_position_embeddings");
      break;
    case RopeScalingType::yarn:
      // transformers: original_max_position_embeddings required (4.x: max_position_embeddings when absent); a null
      // factor is the ratio of the two.
      rs.original_max_position_embeddings = original > 0 ? original : max_positions;
      rs.factor = r.present("factor")
                      ? r.real("factor")
                      : static_cast<double>(max_positions) / static_cast<double>(rs.original_max_position_embeddings);
      rs.attention_factor = r.present("attention_factor") ? r.real("attention_factor") : 0.0;
      rs.beta_fast = r.present("beta_fast") ? r.real("beta_fast") : 32.0;  // transformers: `or 32`
      rs.beta_slow = r.present("beta_slow") ? r.real("beta_slow") : 1.0;
      if (rs.beta_fast == 0) rs.beta_fast = 32;
      if (rs.beta_slow == 0) rs.beta_slow = 1;
      rs.mscale = r.present("mscale") ? r.real("mscale") : 0.0;
      rs.mscale_all_dim = r.present("mscale_all_dim") ? r.real("mscale_all_dim") : 0.0;
      rs.truncate = r.flag("truncate", true);
      break;
    case RopeScalingType::none:
      break;
  }
  return rs;
}

HfModelShape llama_shape(const ConfigKeys& k, double default_rope_theta = 10000.0) {
  HfModelShape s;
  s.arch = HfArch::llama;
  s.hidden = k.integer("hidden_size");
  s.ffn = k.integer("intermediate_size");
  s.num_layers = k.integer("num_hidden_layers");
  s.heads = k.integer("num_attention_heads");
  s.groups = k.integer("num_key_value_heads", s.heads);
  s.positions = k.integer("max_position_embeddings");
  s.vocab = k.integer("vocab_size");
  s.layernorm_eps = k.real("rms_norm_eps", 1e-6);
  s.init_std = k.real("initializer_range", 0.02);
  s.tied = k.flag("tie_word_embeddings", false);
  if (s.heads % s.groups != 0)
    k.fail("num_key_value_heads", fmt::format("= {} does not divide num_attention_heads={}", s.groups, s.heads));
  // head_dim: the heads' width, hidden_size / num_attention_heads unless given (Qwen3's may differ).
  if (k.present("head_dim")) {
    const int64_t d = k.integer("head_dim");
    if (d % 2 != 0) k.fail("head_dim", fmt::format("= {}: rotary embeddings rotate pairs, so it must be even", d));
    if (s.hidden % s.heads != 0 || d != s.hidden / s.heads) s.head_width = d;
  } else if (s.hidden % s.heads != 0) {
    k.fail("num_attention_heads",
           fmt::format("= {} does not divide hidden_size={} (and no head_dim is given)", s.heads, s.hidden));
  }
  const std::string act = k.text("hidden_act", "silu");
  if (act != "silu") k.fail("hidden_act", fmt::format("= {}: megatrain's Llama computes SwiGLU (silu) only", act));
  k.require_flag("attention_bias", false, false, "megatrain's Llama has no biases");
  k.require_flag("mlp_bias", false, false, "megatrain's Llama has no biases");
  // transformers 4.x: rope_theta and rope_scaling; 5.x: rope_parameters {rope_type, rope_theta, ...} (read first).
  s.rotary_base = k.real("rope_theta", default_rope_theta);
  const char* rope_key = k.present("rope_parameters") ? "rope_parameters" : "rope_scaling";
  if (k.present(rope_key)) {
    const json& rp = k.raw(rope_key);
    if (!rp.is_object()) k.fail(rope_key, fmt::format("= {} is not an object", rp.dump()));
    if (rp.contains("rope_theta")) {
      if (!rp["rope_theta"].is_number()) k.fail(rope_key, "has a rope_theta that is not a number");
      s.rotary_base = rp["rope_theta"].get<double>();
    }
    s.rope_scaling = read_rope_scaling(ConfigKeys(rp, fmt::format("{}: {}", k.file(), rope_key)), s.positions);
  }
  if (!(s.rotary_base > 0)) k.fail("rope_theta", fmt::format("= {} is not positive", s.rotary_base));
  return s;
}

// sliding_window, present and not null: a positive window, or 0 (none). `fallback` when absent.
int64_t window_key(const ConfigKeys& k, int64_t fallback) {
  if (!k.present("sliding_window")) return fallback;
  const json& w = k.raw("sliding_window");
  if (!w.is_number_integer() || w.get<int64_t>() < 0)
    k.fail("sliding_window", fmt::format("= {} is not a window size (a token count >= 0, or null)", w.dump()));
  return w.get<int64_t>();
}

// The window of a Qwen config with use_sliding_window true: sliding_window (default 4096), which must be positive.
int64_t switched_on_window(const ConfigKeys& k) {
  const int64_t w = window_key(k, 4096);
  if (w == 0) k.fail("sliding_window", "= 0 with use_sliding_window true: a window of no tokens sees nothing");
  return w;
}

// The Qwen window (Qwen2, Qwen3): with use_sliding_window, sliding_window (default 4096) over the layers layer_types
// names sliding_attention (transformers 5 writes the list), or without the list those from max_window_layers
// (default 28) on. megatrain's full-attention layers are the first ones (model.full_attention_layers), so a
// sliding layer before a full one is refused. Without use_sliding_window no layer slides (transformers drops the
// window), whatever layer_types says.
void read_qwen_window(const ConfigKeys& k, HfModelShape& s) {
  int64_t full = s.num_layers;
  if (k.present("layer_types")) {
    const json& t = k.raw("layer_types");
    if (!t.is_array() || static_cast<int64_t>(t.size()) != s.num_layers)
      k.fail("layer_types",
             fmt::format("= {} is not a list of num_hidden_layers={} layer kinds", t.dump(), s.num_layers));
    full = 0;
    while (full < s.num_layers && t[static_cast<size_t>(full)] == "full_attention") ++full;
    for (int64_t i = full; i < s.num_layers; ++i)
      if (t[static_cast<size_t>(i)] != "sliding_attention")
        k.fail("layer_types",
               fmt::format("holds {} at layer {}, after a sliding_attention layer: megatrain's full-attention layers "
                           "are the first ones (model.full_attention_layers), the sliding ones the rest",
                           t[static_cast<size_t>(i)].dump(), i));
  } else if (k.present("max_window_layers")) {
    const json& m = k.raw("max_window_layers");
    if (!m.is_number_integer() || m.get<int64_t>() < 0)
      k.fail("max_window_layers", fmt::format("= {} is not a layer count >= 0", m.dump()));
    full = std::min(m.get<int64_t>(), s.num_layers);
  } else {
    full = std::min<int64_t>(28, s.num_layers);  // the config classes' default
  }
  if (!k.flag("use_sliding_window", false) || full == s.num_layers) return;
  s.sliding_window = switched_on_window(k);
  s.full_attention_layers = full;
}

// Mixtral: Llama's attention, every layer a softmax-routed MoE of num_local_experts SwiGLU experts of
// intermediate_size, top-k weights renormalised.
HfModelShape mixtral_shape(const ConfigKeys& k) {
  HfModelShape s = llama_shape(k, 1e6);  // MixtralConfig's default rope_theta
  s.arch = HfArch::mixtral;
  HfMoeShape& m = s.moe;
  m.experts = k.integer("num_local_experts", 8);
  m.top_k = k.integer("num_experts_per_tok", 2);
  m.ffn = s.ffn;
  m.norm_topk_prob = true;
  m.aux_loss_coeff = k.real("router_aux_loss_coef", 0.001);
  m.layer_pattern.assign(static_cast<size_t>(s.num_layers), 1);
  // sliding_window over every layer (MixtralConfig's default: none); transformers reads no layer_types for Mixtral.
  s.sliding_window = window_key(k, 0);
  if (m.top_k > m.experts)
    k.fail("num_experts_per_tok", fmt::format("= {} is more than num_local_experts={}", m.top_k, m.experts));
  return s;
}

// Qwen2: Llama's layers with q/k/v biases, the later ones in a sliding window with use_sliding_window.
HfModelShape qwen2_shape(const ConfigKeys& k) {
  HfModelShape s = llama_shape(k);
  s.arch = HfArch::qwen2;
  s.qkv_bias = true;
  read_qwen_window(k, s);
  return s;
}

// Mistral: Llama's layers, every one in a sliding window of sliding_window tokens (null: none; absent: 4096).
HfModelShape mistral_shape(const ConfigKeys& k) {
  HfModelShape s = llama_shape(k);
  s.arch = HfArch::mistral;
  // sliding_window over every layer (MistralConfig's default: 4096); transformers reads no layer_types for Mistral
  // (it warns of one), so neither does megatrain.
  s.sliding_window = window_key(k, 4096);
  return s;
}

// Qwen3: Llama's layers with QK-norm (q_norm, k_norm over each head), head_dim given (it may differ from
// hidden_size / num_attention_heads), no biases (attention_bias would put them on o_proj too), a window as Qwen2's.
HfModelShape qwen3_shape(const ConfigKeys& k) {
  HfModelShape s = llama_shape(k);
  s.arch = HfArch::qwen3;
  s.qk_norm = true;
  if (!k.present("head_dim") && s.hidden / s.heads != 128)  // Qwen3Config's default is 128, not the quotient
    s.head_width = 128;
  read_qwen_window(k, s);
  return s;
}

// transformers' Qwen-MoE rule for which layers are sparse: layer i unless mlp_only_layers lists it, when
// (i + 1) % decoder_sparse_step == 0. Refused when it leaves none.
std::vector<int64_t> sparse_layers(const ConfigKeys& k, int64_t num_layers) {
  std::vector<int64_t> pattern;
  const int64_t step = k.integer("decoder_sparse_step", 1);
  std::set<int64_t> dense;
  if (k.present("mlp_only_layers")) {
    const json& v = k.raw("mlp_only_layers");
    if (!v.is_array()) k.fail("mlp_only_layers", fmt::format("= {} is not a list of layer indices", v.dump()));
    for (const json& i : v) {
      if (!i.is_number_integer()) k.fail("mlp_only_layers", fmt::format("holds {}, not a layer index", i.dump()));
      dense.insert(i.get<int64_t>());
    }
  }
  // transformers' rule: layer i is sparse unless listed, when (i + 1) % decoder_sparse_step == 0.
  for (int64_t i = 0; i < num_layers; ++i) pattern.push_back(!dense.count(i) && (i + 1) % step == 0);
  if (std::find(pattern.begin(), pattern.end(), 1) == pattern.end())
    k.fail("mlp_only_layers", "and decoder_sparse_step leave no MoE layer: import it as a dense model");
  return pattern;
}

// What the Qwen mixtures share: num_experts experts (transformers 5 saves the count as num_local_experts, its
// attribute map's name; 4.x as num_experts) of moe_intermediate_size, top num_experts_per_tok, renormalised as
// norm_topk_prob says, the sparse layers as sparse_layers reads them. The defaults are the family's config class's.
struct QwenMoeDefaults {
  int64_t experts, top_k, ffn;
};
void read_qwen_moe(const ConfigKeys& k, HfModelShape& s, QwenMoeDefaults d) {
  HfMoeShape& m = s.moe;
  m.experts = k.present("num_local_experts") ? k.integer("num_local_experts") : k.integer("num_experts", d.experts);
  m.top_k = k.integer("num_experts_per_tok", d.top_k);
  m.ffn = k.integer("moe_intermediate_size", d.ffn);
  m.norm_topk_prob = k.flag("norm_topk_prob", false);
  m.aux_loss_coeff = k.real("router_aux_loss_coef", 0.001);
  if (m.top_k > m.experts)
    k.fail("num_experts_per_tok", fmt::format("= {} is more than num_experts={}", m.top_k, m.experts));
  m.layer_pattern = sparse_layers(k, s.num_layers);
}

// Qwen2-MoE: Llama's attention with q/k/v biases, the Qwen mixture plus a shared expert of
// shared_expert_intermediate_size behind a sigmoid gate (which must be zero).
HfModelShape qwen2_moe_shape(const ConfigKeys& k) {
  HfModelShape s = llama_shape(k);
  s.arch = HfArch::qwen2_moe;
  s.qkv_bias = true;
  read_qwen_moe(k, s, {.experts = 60, .top_k = 4, .ffn = 1408});
  // Qwen2-MoE's sliding layers alternate (odd layers below max_window_layers): megatrain's windows are the last
  // layers', so it is refused.
  k.require_flag("use_sliding_window", false, false,
                 "Qwen2-MoE's sliding layers alternate, and megatrain's full-attention layers are the first ones");
  if (k.present("shared_expert_intermediate_size") && k.raw("shared_expert_intermediate_size") == 0)
    k.fail("shared_expert_intermediate_size", "= 0: megatrain's Qwen2-MoE export and import need a shared expert");
  s.moe.shared_ffn = k.integer("shared_expert_intermediate_size", 5632);
  if (k.present("qkv_bias")) k.require_flag("qkv_bias", true, true, "megatrain reads Qwen2-MoE's q/k/v biases");
  return s;
}

// Qwen3-MoE: Qwen3's attention (QK-norm, head_dim as given or the quotient, no biases) with the Qwen mixture, no
// shared expert; with use_sliding_window every layer in the window (Qwen3MoeConfig reads no max_window_layers).
HfModelShape qwen3_moe_shape(const ConfigKeys& k) {
  HfModelShape s = llama_shape(k);
  s.arch = HfArch::qwen3_moe;
  s.qk_norm = true;
  read_qwen_moe(k, s, {.experts = 128, .top_k = 8, .ffn = 768});
  if (k.flag("use_sliding_window", false)) s.sliding_window = switched_on_window(k);
  return s;
}

}  // namespace

HfModelShape hf_family_shape(const ConfigKeys& k, const std::string& arch) {
  HfModelShape s;
  if (arch == "GPT2LMHeadModel") {
    if (k.text("model_type", "gpt2") != "gpt2") k.fail("model_type", "is not gpt2 for GPT2LMHeadModel");
    s = gpt2_shape(k);
    if (s.hidden % s.heads != 0) k.fail("n_head", fmt::format("= {} does not divide n_embd={}", s.heads, s.hidden));
  } else if (arch == "LlamaForCausalLM") {
    if (k.text("model_type", "llama") != "llama") k.fail("model_type", "is not llama for LlamaForCausalLM");
    s = llama_shape(k);
  } else if (arch == "Qwen2ForCausalLM") {
    if (k.text("model_type", "qwen2") != "qwen2") k.fail("model_type", "is not qwen2 for Qwen2ForCausalLM");
    s = qwen2_shape(k);
  } else if (arch == "Qwen3ForCausalLM") {
    if (k.text("model_type", "qwen3") != "qwen3") k.fail("model_type", "is not qwen3 for Qwen3ForCausalLM");
    s = qwen3_shape(k);
  } else if (arch == "Qwen3MoeForCausalLM") {
    if (k.text("model_type", "qwen3_moe") != "qwen3_moe")
      k.fail("model_type", "is not qwen3_moe for Qwen3MoeForCausalLM");
    s = qwen3_moe_shape(k);
  } else if (arch == "MistralForCausalLM") {
    if (k.text("model_type", "mistral") != "mistral") k.fail("model_type", "is not mistral for MistralForCausalLM");
    s = mistral_shape(k);
  } else if (arch == "MixtralForCausalLM") {
    if (k.text("model_type", "mixtral") != "mixtral") k.fail("model_type", "is not mixtral for MixtralForCausalLM");
    s = mixtral_shape(k);
  } else if (arch == "Qwen2MoeForCausalLM") {
    if (k.text("model_type", "qwen2_moe") != "qwen2_moe")
      k.fail("model_type", "is not qwen2_moe for Qwen2MoeForCausalLM");
    s = qwen2_moe_shape(k);
  } else {
    k.fail("architectures", fmt::format("= [{}]: megatrain imports GPT2LMHeadModel, LlamaForCausalLM, "
                                        "Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM, "
                                        "MixtralForCausalLM, Qwen2MoeForCausalLM and Qwen3MoeForCausalLM only",
                                        arch));
  }
  return s;
}

}  // namespace mt::hf_import
