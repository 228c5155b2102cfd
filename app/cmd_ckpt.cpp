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
  int64_t numel = 0, bytes = 0;
  size_t width = 0;
  for (const auto& t : ckpt.tensors()) width = std::max(width, t.name.size());
  fmt::print("tensors: {}\n", ckpt.tensors().size());
  for (const auto& t : ckpt.tensors()) {
    size_t n = ckpt.num_slices(t.name);
    fmt::print("  {:<{}}  {:<4}  {:<14}  {} slice{}\n", t.name, width, dtype_name(t.dtype), shape_str(t.global_shape), n,
               n == 1 ? "" : "s");
    numel += shape_numel(t.global_shape);
    bytes += shape_numel(t.global_shape) * static_cast<int64_t>(dtype_size(t.dtype));
  }
  fmt::print("total: {} values, {:.1f} MiB\n", numel, static_cast<double>(bytes) / (1 << 20));
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

  CLI::App* ins = ckpt->add_subcommand("inspect", "Print a checkpoint's iteration, state and tensor index");
  auto dir = std::make_shared<std::string>();
  auto verify = std::make_shared<bool>(false);
  ins->add_option("dir", *dir, "Checkpoint directory, or a save directory with a `latest` marker")->required();
  ins->add_flag("--verify", *verify, "Check every stored byte against its checksum");
  ins->callback([dir, verify] { inspect(*dir, *verify); });

  CLI::App* exp = ckpt->add_subcommand("export", "Export a checkpoint for Hugging Face transformers (GPT2LMHeadModel)");
  auto edir = std::make_shared<std::string>();
  auto format = std::make_shared<std::string>("hf");
  auto out = std::make_shared<std::string>();
  auto dtype = std::make_shared<std::string>("fp32");
  exp->add_option("dir", *edir, "Checkpoint directory, or a save directory with a `latest` marker")->required();
  exp->add_option("--format", *format, "Export format")->check(CLI::IsMember({"hf"}))->capture_default_str();
  exp->add_option("--output,-o", *out, "Output directory (model.safetensors, config.json)")->required();
  exp->add_option("--dtype", *dtype, "Weight dtype in the export")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
  exp->callback([edir, out, dtype] {
    CheckpointReader ckpt(checkpoint_at(*edir));
    export_hf_gpt2(ckpt, *out, parse_dtype(*dtype));
    fmt::print("exported {} (iteration {}) to {}/model.safetensors and {}/config.json\n", ckpt.dir(),
               ckpt.state().iteration, *out, *out);
    std::fflush(stdout);
  });
}

}  // namespace mt::app
