// ckpt_cli.h: runs `megatrain ckpt ...` as a user types it, through the command tree main() builds.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "app/cli/commands.h"

namespace mt::cli_test {

inline void run_ckpt_cli(const std::string& args) {
  CLI::App root("megatrain");
  app::add_ckpt_commands(root);
  root.parse(args, false);
}

}  // namespace mt::cli_test
