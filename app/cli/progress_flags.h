// progress_flags.h: --progress and --quiet, the progress line's switches of every long command (data prepare,
// ckpt import, ckpt export): by default the line is printed when standard error is a terminal.
#pragma once
#include <CLI/CLI.hpp>

#include "core/io/progress.h"

namespace mt::app {

// Adds --progress (always print, even under a pipe) and --quiet (never) to `cmd`; `mode` (which outlives the parse) holds the choice.
void add_progress_flags(CLI::App* cmd, ProgressMode& mode);

}  // namespace mt::app
