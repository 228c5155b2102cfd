// cmd_ckpt_import.cpp: `megatrain ckpt import HF_DIR --format hf --output OUT_DIR`: a transformers model of a
// family hf_import.h names (GPT-2, Llama, Mistral, Qwen2/3, Mixtral, Qwen2/3-MoE) becomes a committed checkpoint at
// iteration 0 (fp32 masters, zero Adam moments, no optimizer steps) that `megatrain train` with checkpoint.load:
// OUT_DIR continues in any layout, and that `megatrain eval` / `generate` read directly.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string_view>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "app/cli/commands.h"
#include "app/cli/option_checks.h"
#include "app/cli/progress_flags.h"
#include "app/train/train_state.h"
#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/save_dir.h"
#include "core/io/file_io.h"
#include "core/hf/hf_import.h"
#include "core/config/config.h"

namespace mt::app {
namespace {

struct ImportArgs {
  std::string dir, format = "hf", output, dtype = "fp32";
  int64_t seq_length = 0;  // 0: max_position_embeddings
  double dropout = 0;
  ProgressMode progress = ProgressMode::automatic;
};

// The model section of a to_yaml text: "model:" up to the next top-level key.
std::string model_section(const std::string& yaml) {
  const size_t begin = yaml.find("model:\n");
  size_t end = begin;
  while (end != std::string::npos && end < yaml.size()) {
    end = yaml.find('\n', end);
    if (end == std::string::npos || end + 1 >= yaml.size() || yaml[end + 1] != ' ') break;
    ++end;
  }
  return begin == std::string::npos ? std::string() : yaml.substr(begin, end + 1 - begin);
}

// An import writes iteration 0 and points `latest` at it: into a save directory of a run it dropped that run's
// progress (the next resume restarted from the imported weights), and into a locked one it raced the live run
// (issue 30, item 1). Such an output is refused, naming what is there.
void check_output_is_new(const std::string& output) {
  if (!std::filesystem::exists(output)) return;
  std::optional<std::string> latest;
  if (std::filesystem::exists(io::join_path(output, ckpt::kLatestFile))) {
    try {
      latest = ckpt::read_latest(output).value_or("");
    } catch (const CheckpointError&) {
      latest = "unreadable";
    }
  }
  const auto checkpoints = ckpt::list_checkpoints(output);
  if (!latest && checkpoints.empty()) return;
  const std::string what = latest ? "latest: " + *latest
                                  : fmt::format("{} iter_* director{}, the newest {}; no latest", checkpoints.size(),
                                                checkpoints.size() == 1 ? "y" : "ies", checkpoints.back().second);
  throw CheckpointError(
      fmt::format("ckpt import: {} holds checkpoints ({}); import into a new directory (importing would move latest to "
                  "iteration 0 and drop them)",
                  output, what));
}

void import_into(const ImportArgs& a);

void run_import(const ImportArgs& a) {
  // An import that fails leaves no directory it created (it would hold only the lock file, and look like a save
  // directory to the next import).
  const bool created = !std::filesystem::exists(a.output);
  // The lock keeps a run from starting on the directory while the import writes it, and refuses a live one's.
  std::optional<ckpt::SaveDirLock> lock;
  try {
    lock.emplace(a.output);
  } catch (const CheckpointError& e) {
    if (std::string_view(e.what()).find("in use by another run") == std::string_view::npos) throw;
    const std::string lock_file = io::join_path(a.output, ckpt::kLockFile);
    std::string pid;  // the holder writes its pid into the lock file
    std::ifstream in(lock_file);
    in >> pid;
    throw CheckpointError(
        fmt::format("ckpt import: {} is locked by a live run ({} is held{}); import into a new "
                    "directory",
                    a.output, lock_file, pid.empty() ? "" : " by pid " + pid));
  }
  try {
    check_output_is_new(a.output);
    import_into(a);
  } catch (...) {
    if (created) {
      lock.reset();
      std::error_code ec;
      std::filesystem::remove_all(a.output, ec);
    }
    throw;
  }
}

void import_into(const ImportArgs& a) {
  HfImportOptions opt{.dropout = a.dropout};
  if (a.seq_length > 0) opt.seq_length = a.seq_length;
  HfModelShape shape = read_hf_config(a.dir, opt);

  // The config resolution checks the model and pads the vocabulary (for tensor=1: the loader takes the rows
  // any other layout's padding shares and leaves the rest at their zeros). The training keys are placeholders
  // that a fine-tuning run's own config replaces.
  const std::string yaml =
      hf_model_yaml(shape) + fmt::format(
                                 "training: {{train_iters: 1, precision: {}}}\noptimizer: {{lr: 1.0e-4}}\n"
                                 "data: {{synthetic: true}}\ncheckpoint: {{load: none}}\n",
                                 a.dtype);
  const std::string source = io::join_path(a.dir, "config.json");
  Config cfg;
  try {
    cfg = parse_config(yaml, source + " (as a megatrain model)", {}, 1);
  } catch (const ConfigError& e) {
    throw CheckpointError(fmt::format("{}: this {} model has no megatrain configuration in this build: {}", source,
                                      arch_name(shape.arch), e.what()));
  }
  shape.padded_vocab = cfg.model.padded_vocab_size;
  Progress reading({.what = "ckpt import: read", .enabled = progress_wanted(a.progress)});
  const auto params = read_hf_weights(a.dir, shape, reading.hook("tensors"));
  reading.finish();

  std::vector<TensorSlice> slices;
  for (const auto& [name, t] : params) {
    const Tensor zeros = Tensor::zeros(t.shape(), DType::f32);
    slices.push_back({"model." + name, t.shape(), {}, t});
    slices.push_back({"optimizer.exp_avg." + name, t.shape(), {}, zeros});
    slices.push_back({"optimizer.exp_avg_sq." + name, t.shape(), {}, zeros});
  }
  CheckpointState state;
  state.config_yaml = to_yaml(cfg);
  // What a fresh run of this precision starts with: fp16's dynamic loss scale at its initial value.
  TrainState ts{.seed = cfg.training.seed};
  if (cfg.training.precision == Precision::fp16)
    ts.loss_scaler = {.scale = cfg.training.loss_scale.initial,
                      .growth_tracker = 0,
                      .hysteresis_tracker = cfg.training.loss_scale.hysteresis};
  ts.save(state);
  Progress saving({.what = "ckpt import: save", .enabled = progress_wanted(a.progress)});
  const std::string dir = save_checkpoint(a.output, state, slices, 0, saving.hook("tensors"));
  saving.finish();

  const std::string model = model_section(state.config_yaml);
  io::write_file_atomically(io::join_path(a.output, "model.yaml"),
                            fmt::format("# The model of {} (imported by megatrain ckpt import). A run that continues\n"
                                        "# from it (checkpoint.load: {}) needs these model keys; dropout and\n"
                                        "# attention_dropout may change.\n{}",
                                        a.dir, a.output, model));
  fmt::print("imported {} ({}) into {} (iteration 0)\nthe model section for a config that loads it ({}):\n{}", a.dir,
             hf_class_name(shape.arch), dir, io::join_path(a.output, "model.yaml"), model);
  std::fflush(stdout);
}

}  // namespace

void add_ckpt_import_command(CLI::App& ckpt) {
  auto a = std::make_shared<ImportArgs>();
  CLI::App* imp =
      ckpt.add_subcommand("import",
                          "Import a Hugging Face transformers model (GPT2LMHeadModel, LlamaForCausalLM, "
                          "MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
                          "MixtralForCausalLM, Qwen2MoeForCausalLM or Qwen3MoeForCausalLM) as a checkpoint");
  imp->add_option("dir", a->dir, "Model directory: config.json and model.safetensors (or its sharded index)")
      ->required();
  imp->add_option("--format", a->format, "Import format")->check(CLI::IsMember({"hf"}))->capture_default_str();
  imp->add_option("--output,-o", a->output, "Save directory for the checkpoint (iter_0000000, latest, model.yaml)")
      ->required();
  imp->add_option("--dtype", a->dtype,
                  "training.precision of the stored config (the weights are always stored as fp32 masters)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
  imp->add_option("--seq-length", a->seq_length, "model.seq_length (default: max_position_embeddings)")
      ->check(at_least(1));
  imp->add_option("--dropout", a->dropout, "model.dropout and model.attention_dropout")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  add_progress_flags(imp, a->progress);
  imp->callback([a] { run_import(*a); });
}

}  // namespace mt::app
