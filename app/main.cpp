// main.cpp: the megatrain command line.
#include <cstdio>
#include <exception>

#include <fmt/format.h>

#include "app/commands.h"

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
