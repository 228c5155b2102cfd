// cmd_ckpt.cpp: `megatrain ckpt inspect DIR [--verify]` and `megatrain ckpt export DIR --format hf --output OUT`
// (`ckpt import` is cmd_ckpt_import.cpp).
#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "app/cli/commands.h"
#include "app/cli/option_checks.h"
#include "app/cli/progress_flags.h"
#include "app/train/checkpointing.h"
#include "core/checkpoint/checkpoint.h"
#include "core/io/file_io.h"
#include "core/hf/hf_export.h"
#include "core/hf/hf_tokenizer_export.h"
#include "core/tensor/finite.h"

namespace mt::app {

void add_ckpt_import_command(CLI::App& ckpt);  // cmd_ckpt_import.cpp

namespace {

// Throws CheckpointError naming every floating tensor that holds an inf or NaN (weights nothing can compute with,
// e.g. from an import of a broken model or a save before the non-finite check).
void verify_finite(const CheckpointReader& ckpt) {
  std::vector<std::string> bad;
  for (const auto& t : ckpt.tensors()) {
    if (!is_floating(t.dtype)) continue;
    Tensor values = Tensor::empty(t.global_shape, DType::f32);
    ckpt.read(t.name, values);
    if (const NonFinite n = find_nonfinite(values))
      bad.push_back(fmt::format("{}: {}", t.name, describe(n, values.numel())));
  }
  if (!bad.empty())
    throw CheckpointError(fmt::format("{}: verify: {} tensor{} not finite: {}", ckpt.dir(), bad.size(),
                                      bad.size() == 1 ? " is" : "s are", fmt::join(bad, "; ")));
}

void inspect(const std::string& dir, bool verify) {
  const CheckpointReader ckpt = open_checkpoint(dir);  // DIR: a checkpoint or a save directory
  const CheckpointState& s = ckpt.state();
  fmt::print("checkpoint: {}\niteration: {}\n", ckpt.dir(), s.iteration);
  fmt::print("state:{}\n", s.values.empty() ? " {}" : "");
  for (const auto& [k, v] : s.values) fmt::print("  {}: {}\n", k, v);
  double numel = 0, bytes = 0;  // sums of checked per-tensor sizes: doubles cannot wrap
  size_t width = 0;
  for (const auto& t : ckpt.tensors()) width = std::max(width, t.name.size());
  fmt::print("tensors: {}\n", ckpt.tensors().size());
  for (const auto& t : ckpt.tensors()) {
    size_t n = ckpt.num_slices(t.name);
    fmt::print("  {:<{}}  {:<4}  {:<14}  {} slice{}\n", t.name, width, dtype_name(t.dtype), shape_str(t.global_shape),
               n, n == 1 ? "" : "s");
    numel += static_cast<double>(shape_numel(t.global_shape));
    bytes += static_cast<double>(shape_numel(t.global_shape)) * static_cast<double>(dtype_size(t.dtype));
  }
  fmt::print("total: {:.0f} values, {:.1f} MiB\n", numel, bytes / (1 << 20));
  if (verify) {
    ckpt.verify_all();  // throws on the first bad slice
    verify_finite(ckpt);
    fmt::print("verify: OK (every checksum matches, every value is finite)\n");
  }
  std::fflush(stdout);
}

// The tokenizer to export: --tokenizer-sidecar when given, else the checkpoint's tokenizer.yaml, else none.
std::optional<TokenizerSidecar> export_tokenizer(const CheckpointReader& ckpt, const std::string& sidecar) {
  if (!sidecar.empty()) {
    auto s = read_tokenizer_sidecar_file(sidecar);
    if (!s) throw CheckpointError(fmt::format("{}: --tokenizer-sidecar names no file", sidecar));
    return s;
  }
  return read_tokenizer_sidecar_file(io::join_path(ckpt.dir(), kCheckpointTokenizerFile));
}

struct ExportArgs {
  std::string dir, format = "hf", output, dtype = "fp32", tokenizer_sidecar;
  std::string lora = "merged";       // a LoRA checkpoint: merged | peft
  int64_t eos_id = -1, bos_id = -1;  // -1: not given
  ProgressMode progress = ProgressMode::automatic;
};

// The bos / eos ids config.json states: the tokenizer's (those generation_config.json states too, hf_special_ids),
// or --eos-id / --bos-id for a checkpoint without one; else none (null), with a warning saying how to give them.
std::optional<HfSpecialIds> export_ids(const CheckpointReader& ckpt, const std::optional<TokenizerSidecar>& tok,
                                       const ExportArgs& a, int64_t vocab) {
  const bool given = a.eos_id >= 0 || a.bos_id >= 0;
  if (tok && given)
    throw std::invalid_argument(fmt::format(
        "--eos-id / --bos-id: the export states the ids of the tokenizer ({}: {}, eod {}); the options are for a "
        "checkpoint that records none",
        a.tokenizer_sidecar.empty() ? io::join_path(ckpt.dir(), kCheckpointTokenizerFile) : a.tokenizer_sidecar,
        name_of(tok->tokenizer.kind), tok->eod));
  if (tok) return hf_special_ids(*tok);
  if (!given) {
    spdlog::warn(
        "{}: no {}, so the end-of-document id of its data is unknown: config.json states bos_token_id and "
        "eos_token_id as null; pass --eos-id N (and --bos-id N where it differs), or --tokenizer-sidecar "
        "PREFIX.tokenizer.yaml, to state them",
        ckpt.dir(), kCheckpointTokenizerFile);
    return std::nullopt;
  }
  if (a.eos_id < 0) throw std::invalid_argument(fmt::format("--bos-id {}: needs --eos-id as well", a.bos_id));
  for (const auto& [flag, id] : {std::pair{"--eos-id", a.eos_id}, std::pair{"--bos-id", a.bos_id}})
    if (id >= vocab)
      throw std::invalid_argument(fmt::format("{} {}: not an id of the model, whose vocab_size is {} (ids 0 to {})",
                                              flag, id, vocab, vocab - 1));
  return HfSpecialIds{static_cast<int32_t>(a.bos_id >= 0 ? a.bos_id : a.eos_id), static_cast<int32_t>(a.eos_id)};
}

// A LoRA checkpoint holds only its adapters: the merged model or a PEFT adapter, against its base (the training run's
// training.init_from, as that run named it, holding the weights the checkpoint records).
void run_lora_export(const ExportArgs& a, const CheckpointReader& ckpt, const HfLoraShape& l) {
  if (l.base.empty())
    throw CheckpointError(fmt::format(
        "{}: a LoRA checkpoint whose frozen base was the seeded initialization (no training.init_from): there is no "
        "base checkpoint to export it against",
        ckpt.dir()));
  const std::optional<std::string> base_dir = resolve_resume_checkpoint(l.base);
  if (!base_dir)
    throw CheckpointError(
        fmt::format("{}: its base, training.init_from: {}, holds no checkpoint (run the export from "
                    "the directory the training ran in)",
                    ckpt.dir(), l.base));
  CheckpointReader base(*base_dir);
  check_lora_base(ckpt.state(), ckpt.dir(), lora_base_of(base), l.base);
  if (a.lora == "peft") {
    export_peft_adapter(ckpt, base, a.output, parse_dtype(a.dtype));
    fmt::print(
        "exported the LoRA adapter of {} (iteration {}, rank {}, alpha {}) for the base {} to "
        "{}/adapter_model.safetensors and {}/adapter_config.json\n",
        ckpt.dir(), ckpt.state().iteration, l.rank, l.alpha, *base_dir, a.output, a.output);
    std::fflush(stdout);
    return;
  }
  const std::optional<TokenizerSidecar> tok = export_tokenizer(ckpt, a.tokenizer_sidecar);
  const HfModelShape g = hf_export_shape(base);
  Progress writing({.what = "ckpt export", .enabled = progress_wanted(a.progress)});
  export_hf_lora_merged(ckpt, base, a.output, parse_dtype(a.dtype), export_ids(ckpt, tok, a, g.vocab),
                        writing.hook("tensors"));
  writing.finish();
  fmt::print("exported {} (iteration {}) merged into its base {} (W + {} B A) to {}/model.safetensors\n", ckpt.dir(),
             ckpt.state().iteration, *base_dir, l.alpha / static_cast<double>(l.rank), a.output);
  if (tok) export_hf_tokenizer(*tok, a.output, g.seq_length > 0 ? g.seq_length : g.positions);
  std::fflush(stdout);
}

void run_export(const ExportArgs& a) {
  const CheckpointReader ckpt = open_checkpoint(a.dir);  // held while it is read: a live run keeps it
  if (const std::optional<HfLoraShape> l = hf_lora_shape(ckpt)) return run_lora_export(a, ckpt, *l);
  if (a.lora != "merged")
    throw std::invalid_argument(fmt::format("--lora {}: {} is not a LoRA checkpoint", a.lora, ckpt.dir()));
  const std::optional<TokenizerSidecar> tok = export_tokenizer(ckpt, a.tokenizer_sidecar);
  const HfModelShape g = hf_export_shape(ckpt);
  const std::optional<HfSpecialIds> ids = export_ids(ckpt, tok, a, g.vocab);
  if (tok && tok->vocab_size > g.vocab)
    throw CheckpointError(fmt::format("{}: the tokenizer has {} ids but the model's vocab_size is {}", ckpt.dir(),
                                      tok->vocab_size, g.vocab));
  Progress writing({.what = "ckpt export", .enabled = progress_wanted(a.progress)});
  mt::export_hf(ckpt, a.output, parse_dtype(a.dtype), ids, writing.hook("tensors"));
  writing.finish();
  fmt::print("exported {} (iteration {}) to {}/model.safetensors and {}/config.json\n", ckpt.dir(),
             ckpt.state().iteration, a.output, a.output);
  if (tok) {
    const auto files = export_hf_tokenizer(*tok, a.output, g.seq_length > 0 ? g.seq_length : g.positions);
    fmt::print("tokenizer ({}, eod {}): {}\n", name_of(tok->tokenizer.kind), tok->eod, fmt::join(files, ", "));
  } else {
    fmt::print(
        "no tokenizer: the checkpoint has no {} (its data had no tokenizer sidecar); pass "
        "--tokenizer-sidecar PREFIX.tokenizer.yaml to export one\n",
        kCheckpointTokenizerFile);
  }
  std::fflush(stdout);
}

}  // namespace

void add_ckpt_commands(CLI::App& root) {
  CLI::App* ckpt = root.add_subcommand("ckpt", "Inspect, export and import checkpoints");
  ckpt->require_subcommand(1);

  // The option values live as long as the callbacks that read them.
  struct InspectArgs {
    std::string dir;
    bool verify = false;
  };
  auto ia = std::make_shared<InspectArgs>();
  CLI::App* ins = ckpt->add_subcommand("inspect", "Print a checkpoint's iteration, state and tensor index");
  ins->add_option("dir", ia->dir, "Checkpoint directory, or a save directory with a `latest` marker")->required();
  ins->add_flag("--verify", ia->verify, "Check every stored byte against its checksum");
  ins->callback([ia] { inspect(ia->dir, ia->verify); });

  auto ea = std::make_shared<ExportArgs>();
  CLI::App* exp = ckpt->add_subcommand("export",
                                       "Export a checkpoint for Hugging Face transformers (GPT2LMHeadModel, "
                                       "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
                                       "MixtralForCausalLM, Qwen2MoeForCausalLM or Qwen3MoeForCausalLM)");
  exp->add_option("dir", ea->dir, "Checkpoint directory, or a save directory with a `latest` marker")->required();
  exp->add_option("--format", ea->format, "Export format")->check(CLI::IsMember({"hf"}))->capture_default_str();
  exp->add_option("--output,-o", ea->output, "Output directory (model.safetensors, config.json)")->required();
  exp->add_option("--dtype", ea->dtype, "Weight dtype in the export")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
  exp->add_option("--tokenizer-sidecar", ea->tokenizer_sidecar,
                  "Tokenizer sidecar (PREFIX.tokenizer.yaml) to export instead of the checkpoint's tokenizer.yaml");
  exp->add_option("--eos-id", ea->eos_id,
                  "config.json's eos_token_id (and bos_token_id, unless --bos-id) for a checkpoint that records no "
                  "tokenizer: its data's end-of-document id")
      ->check(at_least(0));
  exp->add_option("--bos-id", ea->bos_id, "config.json's bos_token_id, with --eos-id")->check(at_least(0));
  exp->add_option("--lora", ea->lora,
                  "For a LoRA checkpoint (finetune.lora): merged (the base with W + alpha/rank B A) or peft (a PEFT "
                  "adapter: adapter_config.json + adapter_model.safetensors)")
      ->check(CLI::IsMember({"merged", "peft"}))
      ->capture_default_str();
  add_progress_flags(exp, ea->progress);
  exp->callback([ea] { run_export(*ea); });

  add_ckpt_import_command(*ckpt);
}

}  // namespace mt::app
