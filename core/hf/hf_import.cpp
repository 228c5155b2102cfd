// hf_import.cpp: a Hugging Face model directory -> our parameters: config.json (read by family in
// hf_import_families.cpp, strictly: every key that changes what the model computes is mapped to ours or checked to
// hold the value we compute with, so an import never silently means another model), the weights of
// model.safetensors or its shards, and the model YAML a fine-tuning config takes.
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
#include "core/hf/hf_import_detail.h"
#include "core/hf/safetensors.h"
#include "core/tensor/finite.h"

namespace mt {
namespace {

using hf_import::ConfigKeys;
using hf_import::hf_family_shape;
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
  HfModelShape s = hf_family_shape(k, arch);
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
  if (s.head_width > 0) add("head_dim", std::to_string(s.head_width));
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
  if (s.qk_norm) add("qk_norm", "true");
  if (s.sliding_window > 0) {
    add("sliding_window", std::to_string(s.sliding_window));
    if (s.full_attention_layers > 0) add("full_attention_layers", std::to_string(s.full_attention_layers));
  }
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
