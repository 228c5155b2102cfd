// hf_export_lora.cpp: a LoRA checkpoint (finetune.lora: adapters only, the frozen base elsewhere) -> the merged
// Hugging Face model, or a PEFT adapter for the base's export (hf_export.h).
#include <filesystem>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <yaml-cpp/yaml.h>

#include "core/hf/hf_export.h"
#include "core/hf/safetensors.h"
#include "core/io/file_io.h"
#include "core/tensor/ops.h"

namespace mt {

namespace {

Tensor read_f32(const CheckpointReader& ckpt, const std::string& name, const Shape& shape) {
  if (!ckpt.has(name)) throw CheckpointError(fmt::format("{}: has no tensor {}", ckpt.dir(), name));
  Tensor t = Tensor::empty(shape, DType::f32);
  ckpt.read(name, t);
  return t;
}

// "layers.3.attn.qkv.weight" -> "layers.3.attn.qkv" when `lora` holds that linear's adapter, else "".
std::string adapted_linear(const CheckpointReader& lora, const std::string& ours) {
  const std::string suffix = ".weight";
  if (ours.size() <= suffix.size() || ours.compare(ours.size() - suffix.size(), suffix.size(), suffix) != 0) return "";
  const std::string linear = ours.substr(0, ours.size() - suffix.size());
  return lora.has("model." + linear + ".lora_a") ? linear : "";
}

struct Factors {
  Tensor a, b;  // (r, in), (out, r) f32, global
};

Factors read_factors(const CheckpointReader& lora, const std::string& linear) {
  const std::string a = "model." + linear + ".lora_a", b = "model." + linear + ".lora_b";
  if (!lora.has(b)) throw CheckpointError(fmt::format("{}: has {} but no {}", lora.dir(), a, b));
  return {read_f32(lora, a, lora.info(a).global_shape), read_f32(lora, b, lora.info(b).global_shape)};
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

std::optional<HfLoraShape> hf_lora_shape(const CheckpointReader& ckpt) {
  YAML::Node root;
  try {
    root = YAML::Load(ckpt.state().config_yaml);
  } catch (const YAML::Exception& e) {
    throw CheckpointError(fmt::format("{}: the stored config is not valid YAML: {}", ckpt.dir(), e.what()));
  }
  const YAML::Node l = root["finetune"]["lora"];
  if (!l.IsMap() || !l["rank"] || l["rank"].as<int64_t>() <= 0) return std::nullopt;
  HfLoraShape s;
  s.rank = l["rank"].as<int64_t>();
  s.alpha = l["alpha"].as<double>();
  s.dropout = l["dropout"] ? l["dropout"].as<double>() : 0.0;
  s.targets = l["targets"].as<std::vector<std::string>>();
  if (const YAML::Node from = root["training"]["init_from"]; from && from.IsScalar()) s.base = from.Scalar();
  return s;
}

void export_hf_lora_merged(const CheckpointReader& lora, const CheckpointReader& base, const std::string& out_dir,
                           DType dtype, std::optional<HfSpecialIds> ids, const ProgressHook& progress) {
  const std::optional<HfLoraShape> l = hf_lora_shape(lora);
  if (!l) throw CheckpointError(fmt::format("{}: not a LoRA checkpoint (no finetune.lora in its config)", lora.dir()));
  const auto scale = static_cast<float>(l->alpha / static_cast<double>(l->rank));
  export_hf(base, out_dir, dtype, ids, progress, [&](const std::string& ours, const Shape& shape) {
    Tensor w = read_f32(base, "model." + ours, shape);
    if (const std::string linear = adapted_linear(lora, ours); !linear.empty()) {
      const Factors f = read_factors(lora, linear);
      gemm(f.b, f.a, w, {.alpha = scale, .beta = 1.f});  // W + scale B A
    }
    return w;
  });
}

void export_peft_adapter(const CheckpointReader& lora, const CheckpointReader& base, const std::string& out_dir,
                         DType dtype) {
  const std::optional<HfLoraShape> l = hf_lora_shape(lora);
  if (!l) throw CheckpointError(fmt::format("{}: not a LoRA checkpoint (no finetune.lora in its config)", lora.dir()));
  const HfModelShape g = hf_export_shape(base);
  struct Piece {
    std::string name;
    Tensor t;  // f32, as PEFT stores it
  };
  std::vector<Piece> pieces;
  std::set<std::string> modules;  // PEFT's target_modules: the last two parts of each adapted module's name
  for (const HfMapping& m : hf_mappings(g)) {
    const std::string linear = m.ours.empty() ? "" : adapted_linear(lora, m.ours);
    if (linear.empty()) continue;
    const std::string module = m.hf_name.substr(0, m.hf_name.size() - std::string(".weight").size());
    const Factors f = read_factors(lora, linear);
    const int64_t r = f.a.dim(0), hf_out = m.transpose ? m.hf_shape.at(1) : m.hf_shape.at(0);
    if (m.scale != 1.f)
      throw CheckpointError(fmt::format("{}: {} is stored scaled; no PEFT adapter for it", lora.dir(), m.hf_name));
    // B's rows as the weight's (HF row i is our row rows[i]); A's input columns are the weight's as they are.
    HfMapping rows_of_b{.hf_name = module + ".lora_B.weight",
                        .hf_shape = {hf_out, r},
                        .ours = linear + ".lora_b",
                        .our_shape = f.b.shape(),
                        .rows = m.rows};
    pieces.push_back({"base_model.model." + module + ".lora_A.weight", f.a});
    pieces.push_back({"base_model.model." + module + ".lora_B.weight", to_hf(f.b, rows_of_b)});
    const size_t dot = module.rfind('.', module.rfind('.') - 1);
    modules.insert(module.substr(dot + 1));
  }
  if (pieces.empty()) throw CheckpointError(fmt::format("{}: holds no adapters", lora.dir()));
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) throw CheckpointError(fmt::format("{}: cannot create export directory: {}", out_dir, ec.message()));
  std::vector<SafetensorsSpec> specs;
  for (const Piece& p : pieces) specs.push_back({p.name, dtype, p.t.shape()});
  SafetensorsWriter w(io::join_path(out_dir, "adapter_model.safetensors"), std::move(specs),
                      {{"format", "pt"}, {"megatrain.iteration", std::to_string(lora.state().iteration)}});
  for (const Piece& p : pieces) w.write(p.t);
  w.finish();
  std::vector<std::string> quoted;
  for (const std::string& mod : modules) quoted.push_back(json_string(mod));
  // GPT-2's Conv1D stores (in, out): PEFT's fan_in_fan_out says so.
  const std::string config = fmt::format(
      "{{\n  \"peft_type\": \"LORA\",\n  \"task_type\": \"CAUSAL_LM\",\n  \"base_model_name_or_path\": {},\n"
      "  \"r\": {},\n  \"lora_alpha\": {},\n  \"lora_dropout\": {},\n  \"target_modules\": [{}],\n"
      "  \"bias\": \"none\",\n  \"fan_in_fan_out\": {},\n  \"inference_mode\": true,\n  \"init_lora_weights\": true,\n"
      "  \"modules_to_save\": null,\n  \"use_rslora\": false,\n  \"use_dora\": false\n}}\n",
      l->base.empty() ? "null" : json_string(l->base), l->rank, l->alpha, l->dropout, fmt::join(quoted, ", "),
      g.arch == HfArch::gpt ? "true" : "false");
  io::write_file_atomically(io::join_path(out_dir, "adapter_config.json"), config);
}

}  // namespace mt
