// main.cpp: the megatrain command line.
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "app/cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"megatrain: train GPT models with Megatron-LM's parallelism, in one C++ binary"};
  app.set_version_flag("--version", std::string("megatrain ") + MEGATRAIN_VERSION);
  app.require_subcommand(0, 1);
  mt::app::add_train_command(app);
  mt::app::add_eval_command(app);
  mt::app::add_generate_command(app);
  mt::app::add_data_commands(app);
  mt::app::add_ckpt_commands(app);
  mt::app::add_info_command(app);
  mt::app::add_plan_command(app);
  mt::app::add_bench_commands(app);
  // `megatrain help [COMMAND]`: what users type first; prints the same text as --help and exits 0.
  std::string help_topic;
  CLI::App* help = app.add_subcommand("help", "print this help, or a command's: megatrain help train");
  help->add_option("command", help_topic, "a command, e.g. train, data, ckpt");
  help->callback([&] {
    const CLI::App* topic = &app;
    try {
      if (!help_topic.empty()) topic = app.get_subcommand(help_topic);
    } catch (const CLI::OptionNotFound&) {
      throw std::runtime_error(fmt::format("help: '{}' is not a command (megatrain --help lists them)", help_topic));
    }
    fmt::print("{}", topic->help());
  });
  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& e) {
    return e.get_exit_code();  // the launcher's ranks have reported their own failure
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "megatrain: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
