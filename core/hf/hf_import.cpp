// hf_import.cpp: transformers' GPT2LMHeadModel / LlamaForCausalLM / MixtralForCausalLM / Qwen2MoeForCausalLM ->
// our parameters.
//
// config.json is read strictly: every key that changes what the model computes is either mapped to ours or
// checked to hold the value we compute with, so an import never silently means another model.
#include "core/hf/hf_import.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/checkpoint/checkpoint.h"
#include "core/io/file_io.h"
#include "core/hf/hf_config_json.h"
#include "core/hf/safetensors.h"
#include "core/tensor/finite.h"

namespace mt {
namespace {

using nlohmann::json;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw CheckpointError(fmt::format("{}: cannot read it (is this a Hugging Face model directory?)", path));
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

json parse_json(const std::string& path) {
  try {
    return json::parse(slurp(path));
  } catch (const json::exception& e) {
    throw CheckpointError(fmt::format("{}: not valid JSON: {}", path, e.what()));
  }
}

// config.json's keys, each read with the file and key in every error; null counts as absent.
class ConfigKeys {
 public:
  ConfigKeys(json j, std::string file) : j_(std::move(j)), file_(std::move(file)) {
    if (!j_.is_object()) throw CheckpointError(fmt::format("{}: is not a JSON object", file_));
  }
  const std::string& file() const { return file_; }
  bool present(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  const json& raw(const char* key) const { return j_[key]; }
  const json& raw_object() const { return j_; }
  [[noreturn]] void fail(const char* key, const std::string& why) const {
    throw CheckpointError(fmt::format("{}: {} {}", file_, key, why));
  }
  int64_t integer(const char* key, std::optional<int64_t> fallback = std::nullopt) const {
    if (!present(key)) return fallback ? *fallback : (fail(key, "is missing"), 0);
    const json& v = j_[key];
    if (!v.is_number_integer()) fail(key, fmt::format("= {} is not an integer", v.dump()));
    const int64_t x = v.get<int64_t>();
    if (x <= 0) fail(key, fmt::format("= {} is not positive", x));
    return x;
  }
  double real(const char* key, std::optional<double> fallback = std::nullopt) const {
    if (!present(key)) return fallback ? *fallback : (fail(key, "is missing"), 0.0);
    const json& v = j_[key];
    if (!v.is_number() || !std::isfinite(v.get<double>())) fail(key, fmt::format("= {} is not a number", v.dump()));
    return v.get<double>();
  }
  bool flag(const char* key, bool fallback) const {
    if (!present(key)) return fallback;
    if (!j_[key].is_boolean()) fail(key, fmt::format("= {} is not true or false", j_[key].dump()));
    return j_[key].get<bool>();
  }
  std::string text(const char* key, const std::string& fallback) const {
    if (!present(key)) return fallback;
    if (!j_[key].is_string()) fail(key, fmt::format("= {} is not a string", j_[key].dump()));
    return j_[key].get<std::string>();
  }
  // A key whose value must be `want` for us to compute the same model.
  void require_flag(const char* key, bool fallback, bool want, const std::string& why) const {
    if (flag(key, fallback) != want) fail(key, fmt::format("= {}: {}", hf_json::boolean(!want), why));
  }

 private:
  json j_;
  std::string file_;
};

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
  if (s.hidden % s.heads != 0)
    k.fail("num_attention_heads", fmt::format("= {} does not divide hidden_size={}", s.heads, s.hidden));
  if (s.heads % s.groups != 0)
    k.fail("num_key_value_heads", fmt::format("= {} does not divide num_attention_heads={}", s.groups, s.heads));
  if (k.present("head_dim") && k.integer("head_dim") != s.hidden / s.heads)
    k.fail("head_dim", fmt::format("= {} is not hidden_size / num_attention_heads = {}: megatrain's head_dim is "
                                   "always that quotient",
                                   k.integer("head_dim"), s.hidden / s.heads));
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

// transformers 5.x: layer_types, one per layer, must all be full attention.
void require_full_attention(const ConfigKeys& k) {
  if (!k.present("layer_types")) return;
  const json& t = k.raw("layer_types");
  if (!t.is_array()) k.fail("layer_types", fmt::format("= {} is not a list", t.dump()));
  for (const json& x : t)
    if (x != "full_attention")
      k.fail("layer_types", fmt::format("holds {}: megatrain's attention is full causal attention", x.dump()));
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
  if (k.present("sliding_window")) {
    const json& w = k.raw("sliding_window");  // 0 or at least max_position_embeddings: no window
    if (!w.is_number_integer() || (w.get<int64_t>() != 0 && w.get<int64_t>() < s.positions))
      k.fail("sliding_window",
             fmt::format("= {}: megatrain's attention is full causal attention (sliding_window null)", w.dump()));
  }
  require_full_attention(k);
  if (m.top_k > m.experts)
    k.fail("num_experts_per_tok", fmt::format("= {} is more than num_local_experts={}", m.top_k, m.experts));
  return s;
}

// Qwen2: Llama's layers with q/k/v biases, full causal attention (use_sliding_window false).
HfModelShape qwen2_shape(const ConfigKeys& k) {
  HfModelShape s = llama_shape(k);
  s.arch = HfArch::qwen2;
  s.qkv_bias = true;
  k.require_flag("use_sliding_window", false, false,
                 "megatrain's attention is full causal attention (use_sliding_window false)");
  require_full_attention(k);
  return s;
}

// Qwen2-MoE: Llama's attention with q/k/v biases, MoE layers of num_experts
// experts of moe_intermediate_size plus a shared expert of shared_expert_intermediate_size behind a sigmoid gate
// (which must be zero), dense layers of intermediate_size where mlp_only_layers or decoder_sparse_step say.
HfModelShape qwen2_moe_shape(const ConfigKeys& k) {
  HfModelShape s = llama_shape(k);
  s.arch = HfArch::qwen2_moe;
  s.qkv_bias = true;
  HfMoeShape& m = s.moe;
  m.experts = k.integer("num_experts", 60);
  m.top_k = k.integer("num_experts_per_tok", 4);
  m.ffn = k.integer("moe_intermediate_size", 1408);
  if (k.present("shared_expert_intermediate_size") && k.raw("shared_expert_intermediate_size") == 0)
    k.fail("shared_expert_intermediate_size", "= 0: megatrain's Qwen2-MoE export and import need a shared expert");
  m.shared_ffn = k.integer("shared_expert_intermediate_size", 5632);
  m.norm_topk_prob = k.flag("norm_topk_prob", false);
  m.aux_loss_coeff = k.real("router_aux_loss_coef", 0.001);
  if (m.top_k > m.experts)
    k.fail("num_experts_per_tok", fmt::format("= {} is more than num_experts={}", m.top_k, m.experts));
  k.require_flag("use_sliding_window", false, false,
                 "megatrain's attention is full causal attention (use_sliding_window false)");
  require_full_attention(k);
  if (k.present("qkv_bias")) k.require_flag("qkv_bias", true, true, "megatrain reads Qwen2-MoE's q/k/v biases");
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
  for (int64_t i = 0; i < s.num_layers; ++i) m.layer_pattern.push_back(!dense.count(i) && (i + 1) % step == 0);
  if (std::find(m.layer_pattern.begin(), m.layer_pattern.end(), 1) == m.layer_pattern.end())
    k.fail("mlp_only_layers", "and decoder_sparse_step leave no MoE layer: import it as a dense model");
  return s;
}

// Where each tensor lives: model.safetensors, or the shards model.safetensors.index.json names.
class WeightFiles {
 public:
  explicit WeightFiles(const std::string& dir) {
    const std::string single = io::join_path(dir, "model.safetensors");
    const std::string index = single + ".index.json";
    std::error_code ec;
    if (std::filesystem::exists(single, ec)) {
      auto r = std::make_shared<SafetensorsReader>(single);
      for (const auto& [name, e] : r->tensors()) where_[name] = r;
      return;
    }
    if (!std::filesystem::exists(index, ec))
      throw CheckpointError(
          fmt::format("{}: has neither model.safetensors nor model.safetensors.index.json (only "
                      "safetensors weights are read; save with safe_serialization=True)",
                      dir));
    const json j = parse_json(index);
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      throw CheckpointError(fmt::format("{}: has no weight_map object", index));
    std::map<std::string, std::shared_ptr<SafetensorsReader>> shards;
    for (const auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos)
        throw CheckpointError(fmt::format("{}: weight_map[{}] is not a file name in the directory", index, name));
      auto& r = shards[file.get<std::string>()];
      if (!r) r = std::make_shared<SafetensorsReader>(io::join_path(dir, file.get<std::string>()));
      if (!r->has(name))
        throw CheckpointError(
            fmt::format("{}: names {} for tensor {}, which does not hold it", index, r->path(), name));
      where_[name] = r;
    }
  }
  const std::map<std::string, std::shared_ptr<SafetensorsReader>>& tensors() const { return where_; }

 private:
  std::map<std::string, std::shared_ptr<SafetensorsReader>> where_;
};

// Buffers older transformers versions saved beside the weights; not parameters.
bool is_saved_buffer(const std::string& name) {
  auto ends = [&](const std::string& suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return ends(".attn.bias") || ends(".attn.masked_bias") || ends(".rotary_emb.inv_freq");
}

// A weight with inf or NaN makes every loss NaN: refused, naming the tensor and where its first bad value is.
void check_finite(const Tensor& t, const std::string& file, const std::string& name) {
  if (const NonFinite n = find_nonfinite(t))
    throw CheckpointError(
        fmt::format("{}: tensor {}: {}: megatrain imports only finite weights", file, name, describe(n, t.numel())));
}

}  // namespace

HfModelShape read_hf_config(const std::string& hf_dir, const HfImportOptions& opt) {
  const std::string file = io::join_path(hf_dir, "config.json");
  const ConfigKeys k(parse_json(file), file);
  if (!k.present("architectures") || !k.raw("architectures").is_array() || k.raw("architectures").size() != 1)
    k.fail("architectures",
           "must name one model class: GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM, MixtralForCausalLM or "
           "Qwen2MoeForCausalLM");
  const json& a = k.raw("architectures")[0];
  const std::string arch = a.is_string() ? a.get<std::string>() : a.dump();
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
  } else if (arch == "MixtralForCausalLM") {
    if (k.text("model_type", "mixtral") != "mixtral") k.fail("model_type", "is not mixtral for MixtralForCausalLM");
    s = mixtral_shape(k);
  } else if (arch == "Qwen2MoeForCausalLM") {
    if (k.text("model_type", "qwen2_moe") != "qwen2_moe")
      k.fail("model_type", "is not qwen2_moe for Qwen2MoeForCausalLM");
    s = qwen2_moe_shape(k);
  } else {
    k.fail("architectures", fmt::format("= [{}]: megatrain imports GPT2LMHeadModel, LlamaForCausalLM, "
                                        "Qwen2ForCausalLM, MixtralForCausalLM and Qwen2MoeForCausalLM only",
                                        arch));
  }
  s.seq_length = opt.seq_length.value_or(s.positions);
  if (s.seq_length <= 0 || s.seq_length > s.positions)
    throw CheckpointError(fmt::format("--seq-length {} must be in [1, {}] (max_position_embeddings of {})",
                                      s.seq_length, s.positions, file));
  s.dropout = s.attention_dropout = opt.dropout;
  return s;
}

std::string hf_model_yaml(const HfModelShape& s) {
  using hf_json::num;
  const bool llama = llama_like(s.arch);
  std::string y = "model:\n";
  auto add = [&](const char* key, const std::string& value) { y += fmt::format("  {}: {}\n", key, value); };
  add("arch", arch_name(s.arch));
  add("num_layers", std::to_string(s.num_layers));
  add("hidden_size", std::to_string(s.hidden));
  add("num_heads", std::to_string(s.heads));
  if (llama) add("num_query_groups", std::to_string(s.groups));
  add("ffn_hidden_size", std::to_string(s.ffn));
  add("seq_length", std::to_string(s.seq_length));
  add("max_position_embeddings", std::to_string(s.positions));
  add("vocab_size", std::to_string(s.vocab));
  add("tie_embeddings", hf_json::boolean(s.tied));
  add("dropout", num(s.dropout));
  add("attention_dropout", num(s.attention_dropout));
  add("layernorm_eps", num(s.layernorm_eps));
  if (llama) add("rotary_base", num(s.rotary_base));
  if (s.qkv_bias) add("qkv_bias", "true");
  if (s.rope_scaling.enabled()) {
    const RopeScaling& r = s.rope_scaling;
    y += "  rope_scaling:\n";
    auto sub = [&](const char* key, const std::string& value) { y += fmt::format("    {}: {}\n", key, value); };
    sub("type", std::string(name_of(r.type)));
    sub("factor", num(r.factor));
    if (r.type == RopeScalingType::llama3) {
      sub("low_freq_factor", num(r.low_freq_factor));
      sub("high_freq_factor", num(r.high_freq_factor));
    }
    if (r.type != RopeScalingType::linear)
      sub("original_max_position_embeddings", std::to_string(r.original_max_position_embeddings));
    if (r.type == RopeScalingType::yarn) {
      sub("attention_factor", num(r.attention_factor));
      sub("beta_fast", num(r.beta_fast));
      sub("beta_slow", num(r.beta_slow));
      sub("mscale", num(r.mscale));
      sub("mscale_all_dim", num(r.mscale_all_dim));
      sub("truncate", hf_json::boolean(r.truncate));
    }
  }
  add("init_std", num(s.init_std));
  if (has_experts(s.arch)) {
    const HfMoeShape& m = s.moe;
    y += "  moe:\n";
    auto sub = [&](const char* key, const std::string& value) { y += fmt::format("    {}: {}\n", key, value); };
    sub("num_experts", std::to_string(m.experts));
    sub("top_k", std::to_string(m.top_k));
    sub("layer_pattern", fmt::format("[{}]", fmt::join(m.layer_pattern, ", ")));
    sub("ffn_hidden_size", std::to_string(m.ffn));
    sub("shared_expert_ffn_hidden_size", std::to_string(m.shared_ffn));
    sub("score_function", "softmax");
    sub("norm_topk_prob", hf_json::boolean(m.norm_topk_prob));
    sub("aux_loss_coeff", num(m.aux_loss_coeff));
  }
  return y;
}

std::vector<std::pair<std::string, Tensor>> read_hf_weights(const std::string& hf_dir, const HfModelShape& s,
                                                            const ProgressHook& progress) {
  if (s.padded_vocab < s.vocab)
    throw CheckpointError(
        fmt::format("{}: padded vocabulary {} is smaller than vocab_size {}", hf_dir, s.padded_vocab, s.vocab));
  const WeightFiles files(hf_dir);
  const auto& where = files.tensors();
  const std::vector<HfMapping> maps = hf_mappings(s);
  std::vector<std::pair<std::string, Tensor>> out;
  std::map<std::string, size_t> index;  // our name -> its place in out
  std::set<std::string> used;
  // transformers 5.x holds a Mixtral's or Qwen2-MoE's experts fused in (E, 2F, C) / (E, C, F) tensors and saves
  // them per expert (the names hf_mapping.h reads) unless told save_original_format=False.
  for (const auto& [name, r] : where)
    if (const std::string fused = ".mlp.experts.gate_up_proj";
        name.size() > fused.size() && name.compare(name.size() - fused.size(), fused.size(), fused) == 0)
      throw CheckpointError(
          fmt::format("{}: holds {}, experts fused as transformers 5.x holds them in memory; "
                      "megatrain reads the per-expert layout: save with "
                      "save_pretrained(..., save_original_format=True), the default",
                      r->path(), name));
  PieceCounter counter(progress, hf_tensor_bytes(maps, sizeof(float)));
  for (const auto& m : maps) {
    auto it = where.find(m.hf_name);
    if (it == where.end())
      throw CheckpointError(
          fmt::format("{}: has no tensor {} (needed for {} of this config)", hf_dir, m.hf_name, m.ours));
    const SafetensorsReader& r = *it->second;
    if (r.entry(m.hf_name).shape != m.hf_shape)
      throw CheckpointError(fmt::format("{}: tensor {} has shape {}, but config.json implies {}", r.path(), m.hf_name,
                                        shape_str(r.entry(m.hf_name).shape), shape_str(m.hf_shape)));
    const Tensor hf = r.read(m.hf_name);
    check_finite(hf, r.path(), m.hf_name);
    if (m.ours.empty()) {  // must be zeros
      Tensor none;
      try {
        from_hf(hf, m, none);
      } catch (const CheckpointError& e) {
        throw CheckpointError(fmt::format("{}: {}", r.path(), e.what()));
      }
    } else {
      auto [pos, fresh] = index.emplace(m.ours, out.size());
      if (fresh) out.emplace_back(m.ours, Tensor::zeros(m.our_shape, DType::f32));  // padding rows stay zero
      from_hf(hf, m, out[pos->second].second);
    }
    used.insert(m.hf_name);
    counter.piece_done();
  }
  // Tied embeddings: a saved lm_head.weight must be the embedding itself.
  const std::string emb = llama_like(s.arch) ? "model.embed_tokens.weight" : "transformer.wte.weight";
  if (s.tied && where.count("lm_head.weight")) {
    const SafetensorsReader& r = *where.at("lm_head.weight");
    const std::vector<float> head = r.read("lm_head.weight").to_floats(), e = where.at(emb)->read(emb).to_floats();
    if (head != e)
      throw CheckpointError(
          fmt::format("{}: lm_head.weight differs from {} but config.json says "
                      "tie_word_embeddings: true",
                      r.path(), emb));
    used.insert("lm_head.weight");
  }
  std::vector<std::string> unexpected;
  for (const auto& [name, r] : where)
    if (!used.count(name) && !is_saved_buffer(name)) unexpected.push_back(name);
  if (!unexpected.empty()) {
    if (unexpected.size() > 5) unexpected.resize(5), unexpected.push_back("...");
    throw CheckpointError(fmt::format("{}: holds tensors this config has no place for: {} (another model variant?)",
                                      hf_dir, fmt::join(unexpected, ", ")));
  }
  return out;
}

}  // namespace mt
