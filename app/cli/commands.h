// commands.h: the subcommands of the megatrain CLI. Each add_* function attaches its subcommand(s) to
// the root CLI11 app; a command reports failure by throwing (std::exception with a message that names the
// file, key or rank), which main() prints as "megatrain: error: ..." with exit code 1 (2 for a refused input: app/runtime/exit_codes.h).
#pragma once
#include <CLI/CLI.hpp>

namespace mt::app {

void add_train_command(CLI::App& root);   // megatrain train / megatrain --config F
void add_eval_command(CLI::App& root);    // megatrain eval --checkpoint DIR --data PREFIX --samples K
void add_data_commands(CLI::App& root);   // megatrain data prepare|inspect
void add_ckpt_commands(CLI::App& root);   // megatrain ckpt inspect|export
void add_info_command(CLI::App& root);    // megatrain info [--require-gpu]
void add_plan_command(CLI::App& root);    // megatrain plan --config F [--world N] [--gpu G] [--search]
void add_bench_commands(CLI::App& root);  // megatrain bench kernels [--device cpu|cuda] [-o rates.yaml]
void add_debug_commands(CLI::App& root);  // megatrain debug hang RUN_DIR

// megatrain generate --load DIR --prompt TEXT [--greedy | --temperature T --top-k K --top-p P --seed S]
void add_generate_command(CLI::App& root);

}  // namespace mt::app
