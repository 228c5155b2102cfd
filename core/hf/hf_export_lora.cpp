// hf_export_lora.cpp: a LoRA checkpoint (finetune.lora: adapters only, the frozen base elsewhere) -> the merged
// Hugging Face model, or a PEFT adapter for the base's export (hf_export.h).
#include <algorithm>
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

// Layer i's experts' adapters as PEFT's ParamWrapper holds them for transformers 5's fused experts
// (<layer>.mlp.experts.gate_up_proj (E, 2F, C) with gate rows then up rows, down_proj (E, C, F)): one lora_A
// (r E, in) whose rows e r + j are expert e's A, one lora_B (out, r E) whose column j E + e is column j of expert e's
// B; targeting both, gate_up_proj's wrapper is the inner one (its keys under experts.base_layer). Our fc1 interleaves
// gate and up rows (2f, 2f + 1): B's rows are put in HF's order.
struct FusedExperts {
  Tensor a, b;  // f32, PEFT's shapes
};
FusedExperts fuse_experts(const CheckpointReader& lora, const std::string& layer, const char* linear, int64_t E,
                          bool swiglu_rows) {
  std::vector<Factors> f;
  for (int64_t e = 0; e < E; ++e) f.push_back(read_factors(lora, fmt::format("{}.experts.{}.{}", layer, e, linear)));
  const int64_t r = f[0].a.dim(0), in = f[0].a.dim(1), out = f[0].b.dim(0);
  std::vector<float> a(static_cast<size_t>(r * E * in)), b(static_cast<size_t>(out * r * E));
  for (int64_t e = 0; e < E; ++e) {
    const float* ae = f[static_cast<size_t>(e)].a.data<float>();
    const float* be = f[static_cast<size_t>(e)].b.data<float>();
    std::copy(ae, ae + r * in, a.begin() + e * r * in);
    for (int64_t o = 0; o < out; ++o) {
      const int64_t ours = swiglu_rows ? (o < out / 2 ? 2 * o : 2 * (o - out / 2) + 1) : o;
      for (int64_t j = 0; j < r; ++j) b[static_cast<size_t>(o * r * E + j * E + e)] = be[ours * r + j];
    }
  }
  return {Tensor::from_floats(a, {r * E, in}), Tensor::from_floats(b, {out, r * E})};
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
  std::set<std::string> modules;        // PEFT's target_modules: the last two parts of each adapted module's name
  std::vector<std::string> parameters;  // PEFT's target_parameters: the fused experts'
  bool any_fc1 = false, any_fc2 = false;
  for (const HfMapping& m : hf_mappings(g)) {
    const std::string linear = m.ours.empty() ? "" : adapted_linear(lora, m.ours);
    if (linear.empty() || linear.find(".experts.") != std::string::npos) continue;  // the experts' below
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
  for (int64_t i = 0; has_experts(g.arch) && i < g.num_layers; ++i) {
    const std::string layer = fmt::format("layers.{}.mlp", i);
    const bool fc1 = lora.has(fmt::format("model.{}.experts.0.fc1.lora_a", layer));
    const bool fc2 = lora.has(fmt::format("model.{}.experts.0.fc2.lora_a", layer));
    const std::string module = fmt::format("base_model.model.model.layers.{}.mlp.experts.", i);
    if (fc1) {
      const FusedExperts f = fuse_experts(lora, layer, "fc1", g.moe.experts, true);
      pieces.push_back({module + (fc2 ? "base_layer." : "") + "lora_A.weight", f.a});
      pieces.push_back({module + (fc2 ? "base_layer." : "") + "lora_B.weight", f.b});
    }
    if (fc2) {
      const FusedExperts f = fuse_experts(lora, layer, "fc2", g.moe.experts, false);
      pieces.push_back({module + "lora_A.weight", f.a});
      pieces.push_back({module + "lora_B.weight", f.b});
    }
    any_fc1 = any_fc1 || fc1;
    any_fc2 = any_fc2 || fc2;
  }
  if (any_fc1) parameters.push_back(json_string("mlp.experts.gate_up_proj"));
  if (any_fc2) parameters.push_back(json_string("mlp.experts.down_proj"));
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
      "  \"target_parameters\": {},\n"
      "  \"bias\": \"none\",\n  \"fan_in_fan_out\": {},\n  \"inference_mode\": true,\n  \"init_lora_weights\": true,\n"
      "  \"modules_to_save\": null,\n  \"use_rslora\": false,\n  \"use_dora\": false\n}}\n",
      l->base.empty() ? "null" : json_string(l->base), l->rank, l->alpha, l->dropout, fmt::join(quoted, ", "),
      parameters.empty() ? "null" : fmt::format("[{}]", fmt::join(parameters, ", ")),
      g.arch == HfArch::gpt ? "true" : "false");
  io::write_file_atomically(io::join_path(out_dir, "adapter_config.json"), config);
}

}  // namespace mt
