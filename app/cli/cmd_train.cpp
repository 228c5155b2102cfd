// cmd_train.cpp: `megatrain --config F` and `megatrain train --config F`.
#include <string>
#include <string_view>
#include <vector>

#include <filesystem>

#include <unistd.h>

#include <fmt/format.h>

#include "app/cli/commands.h"
#include "app/cli/option_checks.h"
#include "app/train/data_sources.h"
#include "app/runtime/local_launcher.h"
#include "app/train/trainer.h"
#include "core/config/config.h"
#include "core/tensor/backend.h"
#include "parallel/store/launch.h"

namespace mt::app {

namespace {

struct TrainArgs {
  std::string config;
  std::vector<std::string> overrides;
  std::string load;
  int64_t exit_after = 0;
  int nproc = 0;               // > 0: launch this many local ranks of this command
  bool prefix_output = false;  // with --nproc: "[rank N] " before every line of each rank
  int max_restarts = 0;        // with --nproc: restarts after a restartable failure (local_launcher.h)
};

void add_train_options(CLI::App& app, TrainArgs& a) {
  app.add_option("-c,--config", a.config, "YAML run configuration")->check(CLI::ExistingFile);
  app.add_option("--set", a.overrides, "override a config key: --set model.num_layers=4 (repeatable)")
      ->take_all()
      ->allow_extra_args(false);
  app.add_option("--load", a.load, "resume from this checkpoint (a checkpoint or a save_dir with `latest`)");
  app.add_option("--exit-after", a.exit_after, "save a checkpoint and stop after this iteration (1 or more)")
      ->check(at_least(1));
  app.add_option("--nproc", a.nproc, "start this many local ranks (like torchrun --standalone) and supervise them")
      ->check(CLI::Range(1, 4096));
  app.add_flag("--prefix-output", a.prefix_output, "with --nproc: prefix each rank's output lines with its rank");
  app.add_option("--max-restarts", a.max_restarts,
                 "with --nproc: start every rank again after a rank dies or times out, this many times at most "
                 "(each resumes from the latest checkpoint; a refused input is never restarted)")
      ->check(CLI::Range(0, 1000));
}

// The path of this executable, so the launcher starts the same binary.
std::string self_executable() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) throw std::runtime_error("--nproc: cannot find this executable (/proc/self/exe): " + ec.message());
  return p.string();
}

// megatrain --nproc N ...: the same train command once per rank, with torchrun-style variables set.
int launch(const TrainArgs& a) {
  LaunchOptions opt{.nproc = a.nproc, .prefix_output = a.prefix_output, .max_restarts = a.max_restarts};
  opt.argv = {self_executable(), "train", "--config", a.config};
  for (const std::string& o : a.overrides) opt.argv.insert(opt.argv.end(), {"--set", o});
  if (!a.load.empty()) opt.argv.insert(opt.argv.end(), {"--load", a.load});
  if (a.exit_after > 0) opt.argv.insert(opt.argv.end(), {"--exit-after", std::to_string(a.exit_after)});
  return launch_local(opt);
}

// The fp32 state of each rank's parameters (value, gradient, master copy, two Adam moments: 20 bytes a
// parameter) must fit in this machine's memory when training on the CPU: refused here, naming the keys, rather
// than failing in the allocator after minutes of building. (A GPU's memory is checked by its allocator.)
void check_fits_in_host_memory(const Config& cfg, int64_t local_ranks) {
  if (cfg.training.device != DeviceChoice::cpu && has_backend(Device::cuda)) return;
  const double pages = static_cast<double>(::sysconf(_SC_PHYS_PAGES)),
               page = static_cast<double>(::sysconf(_SC_PAGESIZE));
  if (pages <= 0 || page <= 0) return;
  const double per_rank =
      estimated_parameters(cfg.model) / static_cast<double>(cfg.parallel.tensor * cfg.parallel.pipeline);
  const double need = per_rank * 20 * static_cast<double>(local_ranks);
  if (need > pages * page)
    throw ConfigError(fmt::format(
        "{}: model.num_layers={}, model.hidden_size={}, model.ffn_hidden_size={}, vocabulary {}: {:.3g} parameters "
        "per rank (times {} local ranks) need {:.1f} GiB of training state, more than this machine's {:.1f} GiB of "
        "memory",
        cfg.source, cfg.model.num_layers, cfg.model.hidden_size, cfg.model.ffn_hidden_size, cfg.model.padded_vocab_size,
        per_rank, local_ranks, need / (1 << 30), pages * page / (1 << 30)));
}

// The config for a process that no launcher started: when its layout needs more ranks than the one it has, the
// error ends with how to start them (a user who adds --set parallel.tensor=2 has usually forgotten --nproc).
Config load_single_process_config(const std::string& path, const std::vector<std::string>& overrides) {
  try {
    return load_config(path, overrides, 1);
  } catch (const ConfigError& e) {
    const int64_t needed = layout_world_size(path, overrides);
    if (needed <= 1 || std::string_view(e.what()).find("world size 1") == std::string_view::npos) throw;
    throw ConfigError(
        fmt::format("{}; this is one process: add --nproc {} to start {} local ranks (or launch "
                    "under torchrun / srun)",
                    e.what(), needed, needed));
  }
}

void run(const TrainArgs& a) {
  if (a.max_restarts > 0 && a.nproc == 0)
    throw ConfigError(
        "--max-restarts restarts the ranks --nproc starts; under torchrun or srun use their own restarts "
        "(torchrun --max-restarts, srun --requeue), which exit code 2 (a refused input) should not trigger");
  if (a.nproc > 0) {
    // Validate the config and find its data for the whole job before starting anything.
    const Config cfg = load_config(a.config, a.overrides, a.nproc);
    // A restart resumes from the latest checkpoint; without one to resume it would train from the start again.
    if (a.max_restarts > 0 && (cfg.checkpoint.save_dir.empty() || cfg.checkpoint.load != "auto"))
      throw ConfigError(fmt::format(
          "--max-restarts {} needs checkpoint.save_dir set and checkpoint.load: auto (got save_dir '{}', load '{}'), "
          "so that a restarted run resumes from its latest checkpoint",
          a.max_restarts, cfg.checkpoint.save_dir, cfg.checkpoint.load));
    check_fits_in_host_memory(cfg, a.nproc);
    check_data_files(cfg, false);  // the checksums: by rank 0 of the job, once
    if (int rc = launch(a); rc != 0) throw CLI::RuntimeError(rc);
    return;
  }
  std::vector<std::string> overrides = a.overrides;
  if (!a.load.empty()) overrides.push_back("checkpoint.load=" + a.load);
  const LaunchEnv env = detect_launch_env();
  Config cfg = env.launcher == "single" ? load_single_process_config(a.config, overrides)
                                        : load_config(a.config, overrides, env.world_size);
  check_fits_in_host_memory(cfg, 1);
  // Before train() prints the resolved config, so the error is not buried under it; rank 0 alone reads the data
  // through for its checksums.
  check_data_files(cfg, env.rank == 0);
  train(cfg, TrainOptions{.exit_after = a.exit_after}, env);
}

}  // namespace

void add_train_command(CLI::App& root) {
  static TrainArgs root_args, sub_args;
  add_train_options(root, root_args);
  CLI::App* sub = root.add_subcommand("train", "train a model (the default command)");
  add_train_options(*sub, sub_args);
  sub->callback([sub] {
    if (sub_args.config.empty()) throw CLI::RequiredError("--config");
    run(sub_args);
  });
  root.callback([&root] {
    if (!root.get_subcommands().empty()) return;
    if (root_args.config.empty()) throw CLI::CallForHelp();
    run(root_args);
  });
}

}  // namespace mt::app
