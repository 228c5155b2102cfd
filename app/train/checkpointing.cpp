#include "app/train/checkpointing.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <yaml-cpp/yaml.h>

#include "core/io/file_io.h"
#include "core/hf/hf_tokenizer_export.h"
#include "core/config/config.h"
#include "app/train/data_sources.h"

namespace mt::app {

namespace {

// Checkpoint files are written from host memory: device tensors are copied over first.
TensorSlice slice_of(const std::string& name, const Parameter& p, const Tensor& data) {
  return TensorSlice{.name = name,
                     .global_shape = p.global_shape,
                     .start = p.start,
                     .data = data.device() == Device::cpu ? data : data.to(Device::cpu, MemKind::workspace)};
}

void read_checked(const CheckpointReader& reader, const std::string& name, const Parameter& p, Tensor& out,
                  PartialLoad* partial = nullptr) {
  if (out.device() != Device::cpu) {  // read on the host (starting from out's values), then copy over
    Tensor host = out.to(Device::cpu, MemKind::workspace);
    read_checked(reader, name, p, host, partial);
    return out.copy_from(host);
  }
  if (!reader.has(name)) {
    if (partial) return partial->skipped.push_back(name + " (not in the checkpoint)");
    throw CheckpointError(fmt::format("{}: checkpoint has no tensor '{}' (a different model?)", reader.dir(), name));
  }
  const TensorInfo& info = reader.info(name);
  // Vocabulary tables are padded to a multiple of 128 * tensor-parallel size, so their row count depends on
  // the layout. Padding rows are never looked up and are left out of the softmax: only the rows both layouts
  // hold are read; rows beyond the checkpoint's keep their initial values.
  const bool padded_rows_differ =
      p.vocabulary_rows && info.global_shape.size() == 2 && info.global_shape[1] == p.global_shape[1];
  if (info.global_shape != p.global_shape && !padded_rows_differ) {
    if (partial)
      return partial->skipped.push_back(fmt::format("{} (shape {} in the checkpoint, {} here)", name,
                                                    shape_str(info.global_shape), shape_str(p.global_shape)));
    throw CheckpointError(fmt::format("{}: tensor '{}' has shape {} in the checkpoint but {} in this model",
                                      reader.dir(), name, shape_str(info.global_shape), shape_str(p.global_shape)));
  }
  if (partial) partial->loaded.push_back(name);
  if (info.global_shape == p.global_shape) return reader.read(name, out, p.start);
  const int64_t rows = std::clamp<int64_t>(info.global_shape[0] - p.start[0], 0, out.dim(0));
  if (rows == 0) return;
  Tensor part = out.slice(0, rows);
  reader.read(name, part, p.start);
}

}  // namespace

std::vector<TensorSlice> optimizer_tensors(const std::vector<OptimizerSlot>& slots,
                                           const std::function<bool(const Parameter&)>& keep) {
  std::vector<TensorSlice> out;
  for (const auto& s : slots) {
    const Parameter& p = *s.param;
    if (keep && !keep(p)) continue;
    out.push_back(slice_of("model." + p.name, p, s.master));
    out.push_back(slice_of("optimizer.exp_avg." + p.name, p, s.exp_avg));
    out.push_back(slice_of("optimizer.exp_avg_sq." + p.name, p, s.exp_avg_sq));
  }
  return out;
}

void load_parameters(const CheckpointReader& reader, const std::vector<Parameter*>& params) {
  for (Parameter* p : params) read_checked(reader, "model." + p->name, *p, p->value);
}

std::unique_ptr<GptModel> saved_model(const CheckpointReader& reader, const Config& cfg, DType dtype, Device device) {
  const bool lora = cfg.finetune.lora.enabled();
  auto model =
      std::make_unique<GptModel>(cfg.model, GptOptions{.dtype = dtype,
                                                       .device = device,
                                                       .seed = lora ? static_cast<uint64_t>(cfg.training.seed) : 0,
                                                       .lora = cfg.finetune.lora});
  if (!lora) {
    load_parameters(reader, model->parameters());
    return model;
  }
  std::vector<Parameter*> base, adapters;
  for (Parameter* p : model->parameters()) (p->frozen ? base : adapters).push_back(p);
  load_parameters(reader, adapters);
  const std::string& from = cfg.training.init_from;
  if (from.empty()) {  // the base was the seeded initialization, which the model is built with
    check_lora_base(reader.state(), reader.dir(), seeded_lora_base(cfg.training.seed), from);
    return model;
  }
  const std::optional<std::string> dir = resolve_resume_checkpoint(from);
  if (!dir)
    throw CheckpointError(
        fmt::format("{}: a LoRA checkpoint whose frozen base is training.init_from: {}, which holds "
                    "no checkpoint (run from the directory the training ran in)",
                    reader.dir(), from));
  const CheckpointReader base_reader(*dir);
  check_lora_base(reader.state(), reader.dir(), lora_base_of(base_reader), from);
  load_parameters(base_reader, base);
  return model;
}

void load_optimizer(const CheckpointReader& reader, const std::vector<OptimizerSlot>& slots, PartialLoad* partial,
                    const ProgressHook& progress) {
  std::vector<int64_t> bytes;  // three fp32 tensors of the slot's shape each
  for (const auto& s : slots) bytes.insert(bytes.end(), 3, static_cast<int64_t>(s.master.nbytes()));
  PieceCounter counter(progress, std::move(bytes));
  for (auto s : slots) {
    const Parameter& p = *s.param;
    for (const auto& [prefix, t] : {std::pair<const char*, Tensor*>{"model.", &s.master},
                                    {"optimizer.exp_avg.", &s.exp_avg},
                                    {"optimizer.exp_avg_sq.", &s.exp_avg_sq}}) {
      read_checked(reader, prefix + p.name, p, *t, partial);
      counter.piece_done();
    }
  }
}

void load_model_weights(const CheckpointReader& reader, const std::vector<OptimizerSlot>& slots) {
  for (auto s : slots) {
    read_checked(reader, "model." + s.param->name, *s.param, s.master);
    s.exp_avg.zero_();
    s.exp_avg_sq.zero_();
  }
}

std::vector<std::string> model_shape_differences(const std::string& stored_yaml, const std::string& run_yaml,
                                                 const std::string& dir) {
  YAML::Node stored, run;
  try {
    stored = YAML::Load(stored_yaml)["model"];
    run = YAML::Load(run_yaml)["model"];
  } catch (const YAML::Exception& e) {
    throw CheckpointError(fmt::format("{}: the stored config is not valid YAML: {}", dir, e.what()));
  }
  if (!stored.IsMap()) throw CheckpointError(fmt::format("{}: the stored config has no model section", dir));
  std::vector<std::string> out;
  // A key that may be auto (0 in older checkpoints, or absent) is set when it holds a number of its own.
  auto is_set = [](const YAML::Node& g) { return g.IsScalar() && g.Scalar() != "0" && g.Scalar() != "auto"; };
  for (const char* key :
       {"arch", "num_layers", "hidden_size", "num_heads", "ffn_hidden_size", "max_position_embeddings", "vocab_size",
        "tie_embeddings", "num_query_groups", "head_dim", "rotary_base", "qkv_bias", "qk_norm"}) {
    YAML::Node a = stored[key], b = run[key];
    // Keys newer than some checkpoints: one saved before they existed had a model without the feature, and
    // num_query_groups auto (0 before issue 30, or absent) means one key/value head per query head.
    const std::string_view k = key;
    if (k == "rotary_base" && !a.IsDefined()) continue;
    if (k == "qkv_bias" || k == "qk_norm") {  // absent: off, as in a checkpoint saved before the feature
      if (!a.IsDefined()) a = YAML::Node("false");
      if (!b.IsDefined()) b = YAML::Node("false");
    }
    if (k == "head_dim") {  // auto is the quotient (whose keys are compared already); a key since Qwen3
      if (!is_set(a) && !is_set(b)) continue;
      auto width = [&](const YAML::Node& model, const YAML::Node& given) -> std::string {
        if (is_set(given)) return given.Scalar();
        try {
          return std::to_string(model["hidden_size"].as<int64_t>() / model["num_heads"].as<int64_t>());
        } catch (const YAML::Exception&) {
          return "(missing)";
        }
      };
      const std::string old_w = width(stored, a), new_w = width(run, b);
      if (old_w != new_w) out.push_back(fmt::format("model.head_dim: {} -> {}", old_w, new_w));
      continue;
    }
    if (k == "num_query_groups") {
      if (!is_set(a) && !is_set(b)) continue;  // one key/value head per query head on both sides
      if (!is_set(a)) a = stored["num_heads"];
      if (!is_set(b)) b = run["num_heads"];
    }
    const std::string old_v = a.IsScalar() ? a.Scalar() : "(missing)", new_v = b.IsScalar() ? b.Scalar() : "(missing)";
    if (old_v != new_v) out.push_back(fmt::format("model.{}: {} -> {}", key, old_v, new_v));
  }
  // The mixture-of-experts keys that fix which tensors exist and their shapes (absent: a dense model, as every
  // checkpoint saved before MoE). Sequences (layer_pattern) compare by their flow-style text.
  const YAML::Node stored_moe = stored["moe"], run_moe = run["moe"];
  auto text = [](const YAML::Node& moe, const char* key, const char* dense) -> std::string {
    if (!moe.IsMap() || !moe["num_experts"] || moe["num_experts"].Scalar() == "0") return dense;
    const YAML::Node v = moe[key];
    if (!v.IsDefined()) return "(missing)";
    if (v.IsScalar()) return v.Scalar();
    YAML::Emitter e;
    e << YAML::Flow << v;
    return e.c_str();
  };
  for (const char* key :
       {"num_experts", "layer_freq", "layer_pattern", "ffn_hidden_size", "shared_expert_ffn_hidden_size"}) {
    const std::string dense = std::string_view(key) == "num_experts" ? "0" : "(dense)";
    const std::string old_v = text(stored_moe, key, dense.c_str()), new_v = text(run_moe, key, dense.c_str());
    if (old_v != new_v) out.push_back(fmt::format("model.moe.{}: {} -> {}", key, old_v, new_v));
  }
  return out;
}

std::vector<std::string> lora_differences(const std::string& stored_yaml, const LoraConfig& lora) {
  LoraConfig stored;
  stored.rank = 0;
  try {  // model_shape_differences has named a config that is not YAML
    if (const YAML::Node l = YAML::Load(stored_yaml)["finetune"]["lora"]; l.IsMap()) {
      if (l["rank"].IsScalar()) stored.rank = l["rank"].as<int64_t>();
      if (l["alpha"].IsScalar()) stored.alpha = l["alpha"].as<double>();
      if (l["targets"].IsSequence()) stored.targets = l["targets"].as<std::vector<std::string>>();
    }
  } catch (const YAML::Exception&) {
  }
  std::vector<std::string> out;
  if (stored.rank != lora.rank) out.push_back(fmt::format("finetune.lora.rank: {} -> {}", stored.rank, lora.rank));
  if (!stored.enabled() || !lora.enabled()) return out;
  if (stored.alpha != lora.alpha)
    out.push_back(fmt::format("finetune.lora.alpha: {} -> {} (the adapters' update is scaled by alpha / rank)",
                              stored.alpha, lora.alpha));
  auto missing = [](const LoraConfig& from, const LoraConfig& in) {
    std::vector<std::string> m;
    for (const std::string& t : from.targets)
      if (!in.targets_any(t)) m.push_back(t);
    return m;
  };
  const std::vector<std::string> dropped = missing(stored, lora), added = missing(lora, stored);
  if (!dropped.empty() || !added.empty()) {
    std::vector<std::string> why;
    if (!dropped.empty())
      why.push_back(fmt::format("the checkpoint's adapters of {} and their optimizer state would be dropped",
                                fmt::join(dropped, ", ")));
    if (!added.empty()) why.push_back(fmt::format("it holds no adapters of {}", fmt::join(added, ", ")));
    out.push_back(fmt::format("finetune.lora.targets: [{}] -> [{}] ({})", fmt::join(stored.targets, ", "),
                              fmt::join(lora.targets, ", "), fmt::join(why, "; ")));
  }
  return out;
}

namespace {
constexpr const char* kLoraBaseCheckpoint = "lora_base_checkpoint";
constexpr const char* kLoraBaseWeights = "lora_base_weights";
}  // namespace

std::string LoraBase::describe() const {
  return checkpoint.empty() ? fmt::format("the seeded initialization ({})", weights)
                            : fmt::format("the base {} (weights {})", checkpoint, weights);
}

LoraBase lora_base_of(const CheckpointReader& base) {
  return {.checkpoint = base.dir(), .weights = fmt::format("crc32 {:08x}", base.stored_checksum("model."))};
}

LoraBase seeded_lora_base(int64_t seed) { return {.weights = fmt::format("training.seed {}", seed)}; }

void record_lora_base(CheckpointState& s, const LoraBase& base) {
  s.values[kLoraBaseCheckpoint] = base.checkpoint;
  s.values[kLoraBaseWeights] = base.weights;
}

void check_lora_base(const CheckpointState& adapters, const std::string& dir, const LoraBase& now,
                     const std::string& init_from) {
  const auto weights = adapters.values.find(kLoraBaseWeights);
  if (weights == adapters.values.end()) {  // saved before the record: only the path can be compared
    std::string saved_from;
    try {
      if (const YAML::Node n = YAML::Load(adapters.config_yaml)["training"]["init_from"]; n && n.IsScalar())
        saved_from = n.Scalar();
    } catch (const YAML::Exception&) {
      return;  // the state checks have named what is wrong with it
    }
    if (saved_from != init_from)
      spdlog::warn(
          "{}: its LoRA adapters were trained on the base training.init_from: '{}', and now run on '{}': the same "
          "weights, or the adapters no longer fit their base (the checkpoint predates the record of its base's "
          "checksum)",
          dir, saved_from, init_from);
    return;
  }
  const auto checkpoint = adapters.values.find(kLoraBaseCheckpoint);
  const LoraBase recorded{.checkpoint = checkpoint == adapters.values.end() ? "" : checkpoint->second,
                          .weights = weights->second};
  if (recorded.weights != now.weights)
    throw CheckpointError(fmt::format(
        "{}: its LoRA adapters were trained on {}, but training.init_from: '{}' now gives {}: another base, "
        "which the adapters do not fit; set training.init_from to the base they were trained on",
        dir, recorded.describe(), init_from, now.describe()));
  if (recorded.checkpoint != now.checkpoint)
    spdlog::info("{}: its LoRA adapters were trained on {}; training.init_from: '{}' gives {}: the same weights", dir,
                 recorded.describe(), init_from, now.describe());
}

Config whole_model_config(const CheckpointReader& reader, const std::string& dir, int64_t micro_batch,
                          const std::string& device) {
  const std::string batch = std::to_string(micro_batch);
  std::vector<std::string> overrides = {"parallel.tensor=1",
                                        "parallel.pipeline=1",
                                        "parallel.virtual_pipeline=1",
                                        "parallel.data=1",
                                        "parallel.sequence_parallel=false",
                                        "parallel.layers_per_stage=[]",
                                        "parallel.expert=1",
                                        "parallel.expert_tensor=auto",
                                        "parallel.context=1",
                                        "training.global_batch_size=" + batch,
                                        "training.micro_batch_size=" + batch,
                                        "training.device=" + device,
                                        "parallel.backend=auto"};
  // Configs stored before issue 30 (item 8) wrote the default of these keys as 0, which the reader now refuses:
  // read such a 0 as the auto it meant.
  try {
    const YAML::Node model = YAML::Load(reader.state().config_yaml)["model"];
    for (const char* key : {"num_query_groups", "ffn_hidden_size"})
      if (model.IsMap() && model[key].IsScalar() && model[key].Scalar() == "0")
        overrides.push_back(fmt::format("model.{}=auto", key));
  } catch (const YAML::Exception&) {
    // parse_config below names what is wrong with the text
  }
  return parse_config(reader.state().config_yaml, dir + "/metadata.yaml", overrides, 1);
}

void write_checkpoint_tokenizer(const std::string& tmp_dir, const std::vector<std::string>& data_train) {
  if (data_train.empty()) return;
  const std::string sidecar = tokenizer_sidecar_path(parse_data_blend(data_train).prefixes.front());
  std::error_code ec;
  if (!std::filesystem::exists(sidecar, ec)) return;
  std::ifstream in(sidecar, std::ios::binary);
  if (!in)
    throw CheckpointError(fmt::format("{}: cannot read the tokenizer sidecar to store it in the checkpoint", sidecar));
  std::ostringstream text;
  text << in.rdbuf();
  io::write_file_durably(io::join_path(tmp_dir, kCheckpointTokenizerFile), text.str());
}

void check_checkpoint_tokenizer(const std::string& dir, const Config& cfg) {
  if (cfg.data.synthetic || cfg.data.train.empty()) return;
  check_same_tokenizer("the checkpoint", io::join_path(dir, kCheckpointTokenizerFile), "data.train's first dataset",
                       tokenizer_sidecar_path(parse_data_blend(cfg.data.train).prefixes.front()), cfg);
}

}  // namespace mt::app
