// cmd_train.cpp: `megatrain --config F` and `megatrain train --config F`.
#include <string>
#include <vector>

#include "app/commands.h"
#include "app/trainer.h"
#include "core/config/config.h"
#include "parallel/launch.h"

namespace mt::app {

namespace {

struct TrainArgs {
  std::string config;
  std::vector<std::string> overrides;
  std::string load;
  int64_t exit_after = 0;
};

void add_train_options(CLI::App& app, TrainArgs& a) {
  app.add_option("-c,--config", a.config, "YAML run configuration")->check(CLI::ExistingFile);
  app.add_option("--set", a.overrides, "override a config key: --set model.num_layers=4 (repeatable)")
      ->take_all()
      ->allow_extra_args(false);
  app.add_option("--load", a.load, "resume from this checkpoint (a checkpoint or a save_dir with `latest`)");
  app.add_option("--exit-after", a.exit_after, "save a checkpoint and stop after this iteration")
      ->check(CLI::NonNegativeNumber);
}

void run(const TrainArgs& a) {
  std::vector<std::string> overrides = a.overrides;
  if (!a.load.empty()) overrides.push_back("checkpoint.load=" + a.load);
  const LaunchEnv env = detect_launch_env();
  Config cfg = load_config(a.config, overrides, env.world_size);
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
