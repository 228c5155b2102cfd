// hf_export.cpp: our GPT parameters -> transformers' GPT2LMHeadModel.
//
// Differences handled here: Conv1D weights are stored (in, out), ours (out, in) as nn.Linear, so every
// linear is transposed; our fused QKV rows are interleaved per head (row (h*3 + j)*D + d, Megatron's
// order) where c_attn's columns are [all q | all k | all v]; the vocabulary padding rows are dropped.
#include "core/checkpoint/hf_export.h"

#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <filesystem>
#include <optional>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "core/checkpoint/file_io.h"
#include "core/checkpoint/safetensors.h"

namespace mt {
namespace {

std::string num(double v) {  // shortest text that reads back as v: 0.1, not 0.10000000000000001
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

// One output tensor: its HF name and shape, and how to make it from the checkpoint.
struct Mapping {
  std::string hf_name;
  Shape hf_shape;
  std::string src;  // checkpoint tensor name
  enum Kind { copy, rows, transpose, qkv_weight, qkv_bias } kind = copy;
};

Tensor read_f32(const CheckpointReader& ckpt, const std::string& name, Shape region) {
  Tensor t = Tensor::empty(std::move(region), DType::f32);
  ckpt.read(name, t);
  return t;
}

Tensor produce(const CheckpointReader& ckpt, const Mapping& m, const GptExportShape& g) {
  const Shape& src_shape = ckpt.info(m.src).global_shape;
  switch (m.kind) {
    case Mapping::copy:
    case Mapping::rows:
      return read_f32(ckpt, m.src, m.hf_shape);  // rows: the first hf_shape[0] rows
    case Mapping::transpose: {
      Tensor s = read_f32(ckpt, m.src, src_shape);  // (out, in)
      const int64_t R = src_shape[0], K = src_shape[1];
      Tensor d = Tensor::empty({K, R}, DType::f32);  // (in, out)
      const float* a = s.data<float>();
      float* b = d.data<float>();
      for (int64_t r = 0; r < R; ++r)
        for (int64_t k = 0; k < K; ++k) b[k * R + r] = a[r * K + k];
      return d;
    }
    case Mapping::qkv_weight:
    case Mapping::qkv_bias: {
      const int64_t C = g.hidden, H = g.heads, D = C / H;
      const bool weight = m.kind == Mapping::qkv_weight;
      const int64_t K = weight ? C : 1;                  // values per row
      Tensor s = read_f32(ckpt, m.src, src_shape);       // (3C, C) or (3C)
      Tensor d = Tensor::empty(m.hf_shape, DType::f32);  // (C, 3C) or (3C)
      const float* a = s.data<float>();
      float* b = d.data<float>();
      for (int64_t h = 0; h < H; ++h)
        for (int64_t j = 0; j < 3; ++j)
          for (int64_t dd = 0; dd < D; ++dd) {
            const int64_t row = (h * 3 + j) * D + dd;  // ours
            const int64_t col = j * C + h * D + dd;    // HF
            for (int64_t k = 0; k < K; ++k) b[k * 3 * C + col] = a[row * K + k];
          }
      return d;
    }
  }
  return {};
}

std::vector<Mapping> mappings(const GptExportShape& g) {
  const int64_t C = g.hidden, F = g.ffn;
  std::vector<Mapping> m;
  m.push_back({"transformer.wte.weight", {g.vocab, C}, "model.embedding.word_embeddings.weight", Mapping::rows});
  m.push_back({"transformer.wpe.weight", {g.positions, C}, "model.embedding.position_embeddings.weight"});
  for (int64_t i = 0; i < g.num_layers; ++i) {
    std::string ours = fmt::format("model.layers.{}.", i), hf = fmt::format("transformer.h.{}.", i);
    m.push_back({hf + "ln_1.weight", {C}, ours + "ln1.weight"});
    m.push_back({hf + "ln_1.bias", {C}, ours + "ln1.bias"});
    m.push_back({hf + "attn.c_attn.weight", {C, 3 * C}, ours + "attn.qkv.weight", Mapping::qkv_weight});
    m.push_back({hf + "attn.c_attn.bias", {3 * C}, ours + "attn.qkv.bias", Mapping::qkv_bias});
    m.push_back({hf + "attn.c_proj.weight", {C, C}, ours + "attn.proj.weight", Mapping::transpose});
    m.push_back({hf + "attn.c_proj.bias", {C}, ours + "attn.proj.bias"});
    m.push_back({hf + "ln_2.weight", {C}, ours + "ln2.weight"});
    m.push_back({hf + "ln_2.bias", {C}, ours + "ln2.bias"});
    m.push_back({hf + "mlp.c_fc.weight", {C, F}, ours + "mlp.fc1.weight", Mapping::transpose});
    m.push_back({hf + "mlp.c_fc.bias", {F}, ours + "mlp.fc1.bias"});
    m.push_back({hf + "mlp.c_proj.weight", {F, C}, ours + "mlp.fc2.weight", Mapping::transpose});
    m.push_back({hf + "mlp.c_proj.bias", {C}, ours + "mlp.fc2.bias"});
  }
  m.push_back({"transformer.ln_f.weight", {C}, "model.final_ln.weight"});
  m.push_back({"transformer.ln_f.bias", {C}, "model.final_ln.bias"});
  if (!g.tied) m.push_back({"lm_head.weight", {g.vocab, C}, "model.lm_head.weight", Mapping::rows});
  return m;
}

// The checkpoint shape each mapping reads from.
Shape expected_source_shape(const Mapping& m, const GptExportShape& g) {
  switch (m.kind) {
    case Mapping::rows:
      return {g.padded_vocab, m.hf_shape[1]};
    case Mapping::transpose:
      return {m.hf_shape[1], m.hf_shape[0]};
    case Mapping::qkv_weight:
      return {3 * g.hidden, g.hidden};
    default:
      return m.hf_shape;
  }
}

std::string config_json(const GptExportShape& g, DType dtype, std::optional<int32_t> eod) {
  const char* torch_dtype = dtype == DType::bf16 ? "bfloat16" : dtype == DType::f16 ? "float16" : "float32";
  // Without a known tokenizer: the byte tokenizer's end-of-document token, the last id.
  const int64_t eos = eod ? int64_t{*eod} : g.vocab - 1;
  std::string j = "{\n";
  auto add = [&](const std::string& key, const std::string& value) { j += fmt::format("  \"{}\": {},\n", key, value); };
  add("architectures", "[\"GPT2LMHeadModel\"]");
  add("model_type", "\"gpt2\"");
  add("vocab_size", std::to_string(g.vocab));
  add("n_positions", std::to_string(g.positions));
  add("n_ctx", std::to_string(g.positions));
  add("n_embd", std::to_string(g.hidden));
  add("n_layer", std::to_string(g.num_layers));
  add("n_head", std::to_string(g.heads));
  add("n_inner", std::to_string(g.ffn));
  add("activation_function", "\"gelu_new\"");
  add("layer_norm_epsilon", num(g.layernorm_eps));
  add("resid_pdrop", num(g.dropout));
  add("embd_pdrop", num(g.dropout));
  add("attn_pdrop", num(g.attention_dropout));
  add("initializer_range", num(g.init_std));
  add("scale_attn_weights", "true");
  add("use_cache", "true");
  add("tie_word_embeddings", g.tied ? "true" : "false");
  add("bos_token_id", std::to_string(eos));
  add("eos_token_id", std::to_string(eos));
  j += fmt::format("  \"torch_dtype\": \"{}\"\n}}\n", torch_dtype);
  return j;
}

// model.KEY of the stored config, or `fallback` when absent (required when fallback is nullopt).
struct ModelKeys {
  YAML::Node model;
  std::string where;
  template <class T>
  T get(const char* key, std::optional<T> fallback) const {
    YAML::Node v = model[key];
    if (!v.IsDefined() || v.IsNull()) {
      if (fallback) return *fallback;
      throw CheckpointError(fmt::format("{}: model.{} missing", where, key));
    }
    try {
      return v.as<T>();
    } catch (const YAML::Exception&) {
      throw CheckpointError(fmt::format("{}: model.{} has a bad value", where, key));
    }
  }
};

}  // namespace

GptExportShape gpt_export_shape(const CheckpointReader& ckpt) {
  const std::string where = ckpt::join_path(ckpt.dir(), "metadata.yaml") + ": config";
  YAML::Node model;
  try {
    model = YAML::Load(ckpt.state().config_yaml)["model"];
  } catch (const YAML::Exception& e) {
    throw CheckpointError(fmt::format("{}: invalid YAML: {}", where, e.what()));
  }
  if (!model.IsMap()) throw CheckpointError(fmt::format("{}: has no model section", where));
  ModelKeys keys{model, where};
  auto arch = keys.get<std::string>("arch", std::string("gpt"));
  if (arch != "gpt") throw CheckpointError(fmt::format("{}: model.arch {} has no GPT-2 export", where, arch));
  GptExportShape g;
  g.num_layers = keys.get<int64_t>("num_layers", std::nullopt);
  g.hidden = keys.get<int64_t>("hidden_size", std::nullopt);
  g.heads = keys.get<int64_t>("num_heads", std::nullopt);
  g.ffn = keys.get<int64_t>("ffn_hidden_size", int64_t{0});
  g.vocab = keys.get<int64_t>("vocab_size", std::nullopt);
  g.positions = keys.get<int64_t>("max_position_embeddings", int64_t{0});
  g.seq_length = keys.get<int64_t>("seq_length", int64_t{0});
  if (g.positions == 0) g.positions = g.seq_length;
  g.tied = keys.get<bool>("tie_embeddings", true);
  g.layernorm_eps = keys.get<double>("layernorm_eps", 1e-5);
  g.dropout = keys.get<double>("dropout", 0.1);
  g.attention_dropout = keys.get<double>("attention_dropout", 0.1);
  g.init_std = keys.get<double>("init_std", 0.02);
  if (g.ffn == 0) g.ffn = 4 * g.hidden;
  if (g.num_layers <= 0 || g.hidden <= 0 || g.heads <= 0 || g.vocab <= 0 || g.hidden % g.heads != 0)
    throw CheckpointError(
        fmt::format("{}: model.num_layers={}, hidden_size={}, num_heads={}, vocab_size={} do not "
                    "describe a GPT model",
                    where, g.num_layers, g.hidden, g.heads, g.vocab));

  // The stored tensors fix what the config may leave implicit: padded vocabulary and positions.
  const std::string wte = "model.embedding.word_embeddings.weight", wpe = "model.embedding.position_embeddings.weight";
  for (const auto& name : {wte, wpe})
    if (!ckpt.has(name))
      throw CheckpointError(fmt::format("{}: has no tensor {} (not a GPT checkpoint?)", ckpt.dir(), name));
  const Shape& ws = ckpt.info(wte).global_shape;
  const Shape& ps = ckpt.info(wpe).global_shape;
  if (ws.size() != 2 || ws[0] < g.vocab)
    throw CheckpointError(fmt::format("{}: tensor {} has shape {}, fewer rows than vocab_size={}", ckpt.dir(), wte,
                                      shape_str(ws), g.vocab));
  g.padded_vocab = ws[0];
  if (ps.size() != 2 || (g.positions != 0 && ps[0] != g.positions))
    throw CheckpointError(fmt::format("{}: tensor {} has shape {} but the config says {} positions", ckpt.dir(), wpe,
                                      shape_str(ps), g.positions));
  g.positions = ps[0];
  return g;
}

void export_hf_gpt2(const CheckpointReader& ckpt, const std::string& out_dir, DType dtype, std::optional<int32_t> eod) {
  if (!is_floating(dtype))
    throw CheckpointError(fmt::format("export: dtype {} is not a float type", dtype_name(dtype)));
  const GptExportShape g = gpt_export_shape(ckpt);
  const std::vector<Mapping> maps = mappings(g);
  std::vector<SafetensorsSpec> specs;
  for (const auto& m : maps) {
    if (!ckpt.has(m.src))
      throw CheckpointError(fmt::format("{}: has no tensor {} (needed for {})", ckpt.dir(), m.src, m.hf_name));
    Shape want = expected_source_shape(m, g), have = ckpt.info(m.src).global_shape;
    if (have != want)
      throw CheckpointError(fmt::format("{}: tensor {} has shape {}, expected {} for this config", ckpt.dir(), m.src,
                                        shape_str(have), shape_str(want)));
    specs.push_back({m.hf_name, dtype, m.hf_shape});
  }

  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) throw CheckpointError(fmt::format("{}: cannot create export directory: {}", out_dir, ec.message()));
  SafetensorsWriter w(ckpt::join_path(out_dir, "model.safetensors"), std::move(specs),
                      {{"format", "pt"}, {"megatrain.iteration", std::to_string(ckpt.state().iteration)}});
  for (const auto& m : maps) w.write(produce(ckpt, m, g));
  w.finish();

  std::string cfg = ckpt::join_path(out_dir, "config.json"), tmp = cfg + ".tmp";
  ::unlink(tmp.c_str());
  try {
    ckpt::write_file_durably(tmp, config_json(g, dtype, eod));
    if (::rename(tmp.c_str(), cfg.c_str()) != 0) ckpt::throw_os_error(cfg, "cannot rename " + tmp + " to it", errno);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
}

}  // namespace mt
