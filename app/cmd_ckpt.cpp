// cmd_ckpt.cpp: `megatrain ckpt inspect DIR [--verify]` and `megatrain ckpt export DIR --format hf --output OUT`.
#include <algorithm>
#include <cstdio>
#include <memory>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "app/commands.h"
#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/hf_export.h"

namespace mt::app {
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
    fmt::print("  {:<{}}  {:<4}  {:<14}  {} slice{}\n", t.name, width, dtype_name(t.dtype), shape_str(t.global_shape), n,
               n == 1 ? "" : "s");
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

}  // namespace

void add_ckpt_commands(CLI::App& root) {
  CLI::App* ckpt = root.add_subcommand("ckpt", "Inspect and export checkpoints");
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
    std::string dir, format = "hf", output, dtype = "fp32";
  };
  auto ea = std::make_shared<ExportArgs>();
  CLI::App* exp = ckpt->add_subcommand("export", "Export a checkpoint for Hugging Face transformers (GPT2LMHeadModel)");
  exp->add_option("dir", ea->dir, "Checkpoint directory, or a save directory with a `latest` marker")->required();
  exp->add_option("--format", ea->format, "Export format")->check(CLI::IsMember({"hf"}))->capture_default_str();
  exp->add_option("--output,-o", ea->output, "Output directory (model.safetensors, config.json)")->required();
  exp->add_option("--dtype", ea->dtype, "Weight dtype in the export")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
  exp->callback([ea] {
    CheckpointReader ckpt(checkpoint_at(ea->dir));
    export_hf_gpt2(ckpt, ea->output, parse_dtype(ea->dtype));
    fmt::print("exported {} (iteration {}) to {}/model.safetensors and {}/config.json\n", ckpt.dir(),
               ckpt.state().iteration, ea->output, ea->output);
    std::fflush(stdout);
  });
}

}  // namespace mt::app
