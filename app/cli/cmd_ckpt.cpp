// cmd_ckpt.cpp: `megatrain ckpt inspect DIR [--verify]` and `megatrain ckpt export DIR --format hf --output OUT`
// (`ckpt import` is cmd_ckpt_import.cpp).
#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "app/cli/commands.h"
#include "app/cli/progress_flags.h"
#include "core/checkpoint/checkpoint.h"
#include "core/io/file_io.h"
#include "core/hf/hf_export.h"
#include "core/hf/hf_tokenizer_export.h"

namespace mt::app {

void add_ckpt_import_command(CLI::App& ckpt);  // cmd_ckpt_import.cpp

namespace {

// DIR may be a checkpoint or a save directory with `latest`.
std::string checkpoint_at(const std::string& dir) {
  auto resolved = resolve_checkpoint(dir);
  if (!resolved)
    throw CheckpointError(fmt::format("{}: no checkpoint here (neither metadata.yaml nor a latest marker)", dir));
  return *resolved;
}

void inspect(const std::string& dir, bool verify) {
  CheckpointReader ckpt(checkpoint_at(dir));
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
    fmt::print("verify: OK (every checksum matches)\n");
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

void run_export(const std::string& dir, const std::string& output, DType dtype, const std::string& sidecar,
                ProgressMode progress) {
  CheckpointReader ckpt(checkpoint_at(dir));
  const std::optional<TokenizerSidecar> tok = export_tokenizer(ckpt, sidecar);
  const HfModelShape g = hf_export_shape(ckpt);
  if (tok && tok->vocab_size > g.vocab)
    throw CheckpointError(fmt::format("{}: the tokenizer has {} ids but the model's vocab_size is {}", ckpt.dir(),
                                      tok->vocab_size, g.vocab));
  // config.json states the bos/eos ids generation_config.json does (hf_special_ids).
  Progress writing({.what = "ckpt export", .enabled = progress_wanted(progress)});
  mt::export_hf(ckpt, output, dtype, tok ? std::optional<HfSpecialIds>(hf_special_ids(*tok)) : std::nullopt,
                writing.hook("tensors"));
  writing.finish();
  fmt::print("exported {} (iteration {}) to {}/model.safetensors and {}/config.json\n", ckpt.dir(),
             ckpt.state().iteration, output, output);
  if (tok) {
    const auto files = export_hf_tokenizer(*tok, output, g.seq_length > 0 ? g.seq_length : g.positions);
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

  struct ExportArgs {
    std::string dir, format = "hf", output, dtype = "fp32", tokenizer_sidecar;
    ProgressMode progress = ProgressMode::automatic;
  };
  auto ea = std::make_shared<ExportArgs>();
  CLI::App* exp = ckpt->add_subcommand(
      "export", "Export a checkpoint for Hugging Face transformers (GPT2LMHeadModel or LlamaForCausalLM)");
  exp->add_option("dir", ea->dir, "Checkpoint directory, or a save directory with a `latest` marker")->required();
  exp->add_option("--format", ea->format, "Export format")->check(CLI::IsMember({"hf"}))->capture_default_str();
  exp->add_option("--output,-o", ea->output, "Output directory (model.safetensors, config.json)")->required();
  exp->add_option("--dtype", ea->dtype, "Weight dtype in the export")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
  exp->add_option("--tokenizer-sidecar", ea->tokenizer_sidecar,
                  "Tokenizer sidecar (PREFIX.tokenizer.yaml) to export instead of the checkpoint's tokenizer.yaml");
  add_progress_flags(exp, ea->progress);
  exp->callback([ea] { run_export(ea->dir, ea->output, parse_dtype(ea->dtype), ea->tokenizer_sidecar, ea->progress); });

  add_ckpt_import_command(*ckpt);
}

}  // namespace mt::app
