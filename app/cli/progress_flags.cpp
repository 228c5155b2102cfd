#include "app/cli/progress_flags.h"

namespace mt::app {

void add_progress_flags(CLI::App* cmd, ProgressMode& mode) {
  CLI::Option* progress = cmd->add_flag(
      "--progress", [&mode](int64_t) { mode = ProgressMode::always; },
      "Print a progress line every few seconds on standard error even when it is not a terminal");
  cmd->add_flag(
         "--quiet", [&mode](int64_t) { mode = ProgressMode::never; },
         "No progress lines (by default they are printed when standard error is a terminal)")
      ->excludes(progress);
}

}  // namespace mt::app
