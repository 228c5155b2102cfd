// hf_export.cpp: our checkpoints -> transformers' GPT2LMHeadModel, LlamaForCausalLM, MixtralForCausalLM or
// Qwen2MoeForCausalLM.
//
// The layout differences (transposes, QKV and fc1 row orders, vocabulary padding) are all in hf_mapping.cpp;
// here the checkpoint's config is read and checked against its tensors, and the files are written.
#include "core/hf/hf_export.h"

#include <algorithm>
#include <filesystem>
#include <optional>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "core/io/file_io.h"
#include "core/hf/safetensors.h"

namespace mt {
namespace {

// SECTION.KEY of the stored config (model.*, model.moe.*), or `fallback` when absent, auto or none (required when
// fallback is nullopt).
struct ModelKeys {
  YAML::Node model;
  std::string where;
  std::string section = "model";
  template <class T>
  T get(const char* key, std::optional<T> fallback) const {
    YAML::Node v = model[key];
    if (!v.IsDefined() || v.IsNull() || (v.IsScalar() && (v.Scalar() == "auto" || v.Scalar() == "none"))) {
      if (fallback) return *fallback;
      throw CheckpointError(fmt::format("{}: {}.{} missing", where, section, key));
    }
    try {
      return v.as<T>();
    } catch (const YAML::Exception&) {
      throw CheckpointError(fmt::format("{}: {}.{} has a bad value", where, section, key));
    }
  }
};

const Shape& stored_shape(const CheckpointReader& ckpt, const std::string& name, const char* why) {
  if (!ckpt.has(name)) throw CheckpointError(fmt::format("{}: has no tensor {} ({})", ckpt.dir(), name, why));
  return ckpt.info(name).global_shape;
}

Tensor read_f32(const CheckpointReader& ckpt, const std::string& name, const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::f32);
  ckpt.read(name, t);
  return t;
}

// model.sliding_window (and full_attention_layers) into the family chosen so far: a plain llama's is Mistral's
// (every layer in the window); Qwen2's and Qwen3's windows may spare the first layers (max_window_layers), Mixtral's
// and Qwen3-MoE's cover every layer. Whatever no family computes is refused, naming the key.
void read_window(const ModelKeys& keys, HfModelShape& g) {
  g.sliding_window = keys.get<int64_t>("sliding_window", int64_t{0});
  if (g.sliding_window == 0) return;
  g.full_attention_layers = keys.get<int64_t>("full_attention_layers", int64_t{0});
  auto refuse = [&](const std::string& why) {
    throw CheckpointError(fmt::format("{}: model.sliding_window {}: {}", keys.where, g.sliding_window, why));
  };
  if (g.arch == HfArch::gpt) refuse("GPT2LMHeadModel has no sliding window");
  if (g.arch == HfArch::qwen2_moe)
    refuse("Qwen2MoeForCausalLM's sliding layers alternate; megatrain's window is the last layers'");
  if (g.arch == HfArch::llama) g.arch = HfArch::mistral;
  const bool spares_layers = g.arch == HfArch::qwen2 || g.arch == HfArch::qwen3;
  if (g.full_attention_layers > 0 && !spares_layers)
    refuse(
        fmt::format("with model.full_attention_layers {}: {} slides every layer (only Qwen2 and Qwen3, with "
                    "model.qkv_bias or model.qk_norm, keep the first layers' attention full)",
                    g.full_attention_layers, hf_class_name(g.arch)));
}

// model.moe of a llama -> the Hugging Face family that computes it: MixtralForCausalLM without a shared expert,
// Qwen2MoeForCausalLM with one. Whatever neither computes is refused, naming the key.
void read_moe_shape(const CheckpointReader& ckpt, const ModelKeys& moe, HfModelShape& g) {
  auto refuse = [&](const std::string& what) {
    throw CheckpointError(
        fmt::format("{}: model.moe: {}: no Hugging Face model computes it (export supports "
                    "MixtralForCausalLM, Qwen2MoeForCausalLM and Qwen3MoeForCausalLM)",
                    moe.where, what));
  };
  if (g.arch != HfArch::llama) refuse("a mixture of experts in a model.arch: gpt model (GELU experts)");
  HfMoeShape& m = g.moe;
  m.experts = moe.get<int64_t>("num_experts", std::nullopt);
  m.top_k = moe.get<int64_t>("top_k", int64_t{2});
  m.shared_ffn = moe.get<int64_t>("shared_expert_ffn_hidden_size", int64_t{0});
  m.norm_topk_prob = moe.get<bool>("norm_topk_prob", true);
  m.aux_loss_coeff = moe.get<double>("aux_loss_coeff", 0.0);
  if (const auto score = moe.get<std::string>("score_function", std::string("softmax")); score != "softmax")
    refuse(fmt::format("score_function {} (Mixtral and Qwen2-MoE route with a softmax)", score));
  if (moe.get<double>("bias_update_rate", 0.0) != 0)
    refuse("bias_update_rate (DeepSeek-V3's expert bias in the choice of experts)");
  if (moe.get<double>("capacity_factor", 0.0) != 0) refuse("capacity_factor (dropped tokens)");
  const YAML::Node pattern = moe.model["layer_pattern"];
  if (pattern && pattern.IsSequence() && pattern.size() > 0) {
    for (const auto& v : pattern) m.layer_pattern.push_back(v.as<int64_t>(0));
  } else {
    const auto freq = moe.get<int64_t>("layer_freq", int64_t{1});
    for (int64_t i = 0; i < g.num_layers; ++i) m.layer_pattern.push_back(freq > 0 && i % freq == 0 ? 1 : 0);
  }
  if (static_cast<int64_t>(m.layer_pattern.size()) != g.num_layers)
    refuse(fmt::format("layer_pattern with {} entries for {} layers", m.layer_pattern.size(), g.num_layers));
  int64_t first = 0;
  while (first < g.num_layers && !m.is_moe_layer(first)) ++first;
  // The experts' widths: the stored tensors say (the config may leave them to a default).
  const Shape& fc2 = stored_shape(ckpt, fmt::format("model.layers.{}.mlp.experts.0.fc2.weight", first), "an expert");
  m.ffn = fc2.size() == 2 ? fc2[1] : 0;
  const bool all_moe = std::find(m.layer_pattern.begin(), m.layer_pattern.end(), 0) == m.layer_pattern.end();
  if (g.qk_norm) {  // Qwen3-MoE: QK-norm, no shared expert, norm_topk_prob either way, dense layers allowed
    if (m.shared_ffn != 0) refuse("shared_expert_ffn_hidden_size with model.qk_norm (Qwen3-MoE has no shared expert)");
    g.arch = HfArch::qwen3_moe;
  } else if (m.shared_ffn == 0) {
    g.arch = HfArch::mixtral;
    if (!m.norm_topk_prob) refuse("norm_topk_prob false without a shared expert (Mixtral always renormalises)");
    if (!all_moe) refuse("dense layers without a shared expert (every Mixtral layer is MoE)");
  } else {
    g.arch = HfArch::qwen2_moe;
  }
}

}  // namespace

HfModelShape hf_export_shape(const CheckpointReader& ckpt) {
  const std::string where = io::join_path(ckpt.dir(), "metadata.yaml") + ": config";
  YAML::Node model;
  try {
    model = YAML::Load(ckpt.state().config_yaml)["model"];
  } catch (const YAML::Exception& e) {
    throw CheckpointError(fmt::format("{}: invalid YAML: {}", where, e.what()));
  }
  if (!model.IsMap()) throw CheckpointError(fmt::format("{}: has no model section", where));
  ModelKeys keys{model, where};
  const auto arch = keys.get<std::string>("arch", std::string("gpt"));
  if (arch != "gpt" && arch != "llama")
    throw CheckpointError(fmt::format("{}: model.arch {} has no Hugging Face export", where, arch));
  HfModelShape g;
  g.arch = arch == "llama" ? HfArch::llama : HfArch::gpt;
  const bool llama = g.arch == HfArch::llama;  // before the MoE families are told apart
  g.num_layers = keys.get<int64_t>("num_layers", std::nullopt);
  g.hidden = keys.get<int64_t>("hidden_size", std::nullopt);
  g.heads = keys.get<int64_t>("num_heads", std::nullopt);
  g.groups = llama ? keys.get<int64_t>("num_query_groups", int64_t{0}) : 0;
  if (g.groups == 0) g.groups = g.heads;
  g.ffn = keys.get<int64_t>("ffn_hidden_size", int64_t{0});
  g.vocab = keys.get<int64_t>("vocab_size", std::nullopt);
  g.positions = keys.get<int64_t>("max_position_embeddings", int64_t{0});
  g.seq_length = keys.get<int64_t>("seq_length", int64_t{0});
  if (g.positions == 0) g.positions = g.seq_length;
  g.tied = keys.get<bool>("tie_embeddings", !llama);  // llama unties by default
  g.layernorm_eps = keys.get<double>("layernorm_eps", 1e-5);
  g.dropout = keys.get<double>("dropout", 0.1);
  g.attention_dropout = keys.get<double>("attention_dropout", 0.1);
  g.init_std = keys.get<double>("init_std", 0.02);
  g.rotary_base = llama ? keys.get<double>("rotary_base", 10000.0) : 10000.0;
  g.qkv_bias = llama && keys.get<bool>("qkv_bias", false);
  g.qk_norm = llama && keys.get<bool>("qk_norm", false);
  if (const auto d = keys.get<int64_t>("head_dim", int64_t{0});
      llama && d > 0 && g.heads > 0 && d * g.heads != g.hidden)
    g.head_width = d;
  if (const YAML::Node rope = model["rope_scaling"]; llama && rope && rope.IsMap()) {
    const ModelKeys r{rope, where, "model.rope_scaling"};
    const auto type = r.get<std::string>("type", std::string("none"));
    const std::optional<RopeScalingType> t = parse_choice<RopeScalingType>(type);
    if (!t)
      throw CheckpointError(
          fmt::format("{}: model.rope_scaling.type {} is none of none, linear, llama3, yarn", where, type));
    const RopeScaling d;  // a key left out holds model.rope_scaling's default
    RopeScaling& rs = g.rope_scaling;
    rs.type = *t;
    rs.factor = r.get<double>("factor", d.factor);
    rs.low_freq_factor = r.get<double>("low_freq_factor", d.low_freq_factor);
    rs.high_freq_factor = r.get<double>("high_freq_factor", d.high_freq_factor);
    rs.original_max_position_embeddings =
        r.get<int64_t>("original_max_position_embeddings", d.original_max_position_embeddings);
    rs.attention_factor = r.get<double>("attention_factor", d.attention_factor);
    rs.beta_fast = r.get<double>("beta_fast", d.beta_fast);
    rs.beta_slow = r.get<double>("beta_slow", d.beta_slow);
    rs.mscale = r.get<double>("mscale", d.mscale);
    rs.mscale_all_dim = r.get<double>("mscale_all_dim", d.mscale_all_dim);
    rs.truncate = r.get<bool>("truncate", d.truncate);
  }
  if (const YAML::Node moe = model["moe"];
      moe && moe.IsMap() && ModelKeys{moe, where, "model.moe"}.get<int64_t>("num_experts", 0) > 0)
    read_moe_shape(ckpt, ModelKeys{moe, where, "model.moe"}, g);
  if (g.qkv_bias && g.arch == HfArch::mixtral)
    throw CheckpointError(
        fmt::format("{}: model.qkv_bias true with experts and no shared expert: no Hugging Face "
                    "model computes it (Mixtral's attention has no biases; Qwen2-MoE's has)",
                    where));
  if (g.qk_norm && g.qkv_bias)
    throw CheckpointError(fmt::format(
        "{}: model.qk_norm true with model.qkv_bias: no Hugging Face model computes it (Qwen3's attention, the one "
        "with QK-norm, has biases on every projection or none)",
        where));
  if (g.qk_norm && g.arch == HfArch::llama) g.arch = HfArch::qwen3;   // Llama's layers with QK-norm
  if (g.qkv_bias && g.arch == HfArch::llama) g.arch = HfArch::qwen2;  // Llama's layers with q/k/v biases
  read_window(keys, g);
  if (g.num_layers <= 0 || g.hidden <= 0 || g.heads <= 0 || g.vocab <= 0 ||
      (g.head_width == 0 && g.hidden % g.heads != 0) || g.groups <= 0 || g.heads % g.groups != 0)
    throw CheckpointError(
        fmt::format("{}: model.num_layers={}, hidden_size={}, num_heads={}, num_query_groups={}, vocab_size={} do "
                    "not describe a {} model",
                    where, g.num_layers, g.hidden, g.heads, g.groups, g.vocab, arch));

  // The stored tensors fix what the config may leave implicit: padded vocabulary, positions, a llama's ffn.
  const std::string wte = "model.embedding.word_embeddings.weight";
  const Shape& ws = stored_shape(ckpt, wte, "not a GPT or Llama checkpoint?");
  if (ws.size() != 2 || ws[0] < g.vocab)
    throw CheckpointError(fmt::format("{}: tensor {} has shape {}, fewer rows than vocab_size={}", ckpt.dir(), wte,
                                      shape_str(ws), g.vocab));
  g.padded_vocab = ws[0];
  if (llama) {
    int64_t dense = 0;  // the first dense layer
    while (dense < g.num_layers && has_experts(g.arch) && g.moe.is_moe_layer(dense)) ++dense;
    if (g.ffn == 0 && dense == g.num_layers) g.ffn = g.moe.ffn;  // unused; HF's config names a width
    if (g.ffn == 0) {                                            // whatever the default, the tensors say
      const Shape& fc2 = stored_shape(ckpt, fmt::format("model.layers.{}.mlp.fc2.weight", dense), "the MLP's width");
      g.ffn = fc2.size() == 2 ? fc2[1] : 0;
    }
  } else {
    if (g.ffn == 0) g.ffn = 4 * g.hidden;
    const std::string wpe = "model.embedding.position_embeddings.weight";
    const Shape& ps = stored_shape(ckpt, wpe, "not a GPT checkpoint?");
    if (ps.size() != 2 || (g.positions != 0 && ps[0] != g.positions))
      throw CheckpointError(fmt::format("{}: tensor {} has shape {} but the config says {} positions", ckpt.dir(), wpe,
                                        shape_str(ps), g.positions));
    g.positions = ps[0];
  }
  return g;
}

void export_hf(const CheckpointReader& ckpt, const std::string& out_dir, DType dtype, std::optional<HfSpecialIds> ids,
               const ProgressHook& progress, const HfWeightReader& read) {
  if (!is_floating(dtype))
    throw CheckpointError(fmt::format("export: dtype {} is not a float type", dtype_name(dtype)));
  const HfModelShape g = hf_export_shape(ckpt);
  const std::vector<HfMapping> maps = hf_mappings(g);
  std::vector<SafetensorsSpec> specs;
  for (const auto& m : maps) {
    specs.push_back({m.hf_name, dtype, m.hf_shape});
    if (m.ours.empty()) continue;  // zeros (hf_mapping.h)
    const std::string src = "model." + m.ours;
    if (!ckpt.has(src))
      throw CheckpointError(fmt::format("{}: has no tensor {} (needed for {})", ckpt.dir(), src, m.hf_name));
    const Shape& have = ckpt.info(src).global_shape;
    if (have != m.our_shape)
      throw CheckpointError(fmt::format("{}: tensor {} has shape {}, expected {} for this config", ckpt.dir(), src,
                                        shape_str(have), shape_str(m.our_shape)));
  }

  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) throw CheckpointError(fmt::format("{}: cannot create export directory: {}", out_dir, ec.message()));
  SafetensorsWriter w(io::join_path(out_dir, "model.safetensors"), std::move(specs),
                      {{"format", "pt"}, {"megatrain.iteration", std::to_string(ckpt.state().iteration)}});
  PieceCounter counter(progress, hf_tensor_bytes(maps, dtype_size(dtype)));
  for (const auto& m : maps) {
    w.write(to_hf(m.ours.empty() ? Tensor()
                  : read         ? read(m.ours, m.our_shape)
                                 : read_f32(ckpt, "model." + m.ours, m.our_shape),
                  m));
    counter.piece_done();
  }
  w.finish();

  io::write_file_atomically(io::join_path(out_dir, "config.json"), hf_config_json(g.arch, g, dtype, ids));
}

void export_hf_gpt2(const CheckpointReader& ckpt, const std::string& out_dir, DType dtype,
                    std::optional<HfSpecialIds> ids) {
  if (hf_export_shape(ckpt).arch != HfArch::gpt)
    throw CheckpointError(fmt::format("{}: model.arch is not gpt: no GPT-2 export", ckpt.dir()));
  export_hf(ckpt, out_dir, dtype, ids);
}

}  // namespace mt
