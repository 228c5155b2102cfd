// cli_run.h: runs a megatrain command line (`ckpt ...`, `eval ...`, `generate ...`, `plan ...`, `data ...`) as a
// user types it, through the commands main() registers; what it prints goes to standard output as usual.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "app/cli/commands.h"

namespace mt::cli_test {

inline void run_cli(const std::string& args) {
  CLI::App root("megatrain");
  app::add_ckpt_commands(root);
  app::add_data_commands(root);
  app::add_eval_command(root);
  app::add_generate_command(root);
  app::add_plan_command(root);
  root.parse(args, false);
}

}  // namespace mt::cli_test
