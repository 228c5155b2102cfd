// main.cpp: the megatrain command line.
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "app/cli/commands.h"
#include "app/runtime/exit_codes.h"
#include "core/config/config.h"
#include "core/data/json_line.h"
#include "core/io/file_error.h"

namespace {

// A refused configuration or input (app/runtime/exit_codes.h): the same command would fail the same way again.
bool refused_input(const std::exception& e) {
  return dynamic_cast<const mt::ConfigError*>(&e) || dynamic_cast<const mt::FileError*>(&e) ||
         dynamic_cast<const mt::JsonError*>(&e) || dynamic_cast<const std::invalid_argument*>(&e);
}

}  // namespace

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
  mt::app::add_debug_commands(app);
  // `megatrain help [COMMAND [SUBCOMMAND]]`: what users type first; prints exactly what
  // `megatrain [COMMAND [SUBCOMMAND]] --help` prints (the same formatter, the same usage path) and exits 0.
  std::vector<std::string> help_topic;
  CLI::App* help = app.add_subcommand("help", "print this help, or a command's: megatrain help data prepare");
  help->add_option("command", help_topic, "a command and its subcommand, e.g. train, data prepare, ckpt export")
      ->expected(0, 2);
  help->callback([&] {
    const CLI::App* topic = &app;
    std::string commands;  // the commands found so far, as typed
    for (const std::string& name : help_topic) {
      try {
        topic = topic->get_subcommand(name);
      } catch (const CLI::OptionNotFound&) {
        throw std::runtime_error(fmt::format("help: '{}' is not a command (megatrain {}--help lists them)",
                                             fmt::join(help_topic, " "), commands.empty() ? "" : commands + " "));
      }
      commands += (commands.empty() ? "" : " ") + topic->get_name();
    }
    // --help's usage line names argv[0], then each command: App::help's path.
    const std::string path = commands.empty() ? app.get_name() : app.get_name() + " " + commands;
    fmt::print("{}", topic->get_formatter()->make_help(topic, path, CLI::AppFormatMode::Normal));
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
    return refused_input(e) ? mt::app::kExitRefusedInput : mt::app::kExitFailure;
  }
  return 0;
}
