// option_checks.h: CLI11 validators whose messages name the value and the rule, e.g. "--max-new-tokens: 0 is less
// than 1" (CLI11's NonNegativeNumber prints a range ending in DBL_MAX's 309 digits), and that catch an integer
// beyond int64 before CLI11 converts it.
#pragma once
#include <cstdint>

#include <CLI/CLI.hpp>

namespace mt::app {

// An integer of at least `min`.
CLI::Validator at_least(int64_t min);
// A finite number above `bound`.
CLI::Validator above(double bound);

}  // namespace mt::app
