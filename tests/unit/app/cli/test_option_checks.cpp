// test_option_checks.cpp: the CLI's number validators name the value and the rule, catch integers beyond int64
// before CLI11 converts them, and pass what they should.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "app/cli/commands.h"
#include "app/cli/option_checks.h"

namespace mt::app {
namespace {

// The message CLI11 gives for `args` on an app with --n (at_least(1)) and --x (above(0)); "" when it parses.
std::string error_of(const std::vector<std::string>& args, int64_t* n = nullptr) {
  CLI::App app("t");
  int64_t count = 0;
  double x = 1;
  app.add_option("--n", count)->check(at_least(1));
  app.add_option("--x", x)->check(above(0));
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  if (n) *n = count;
  return "";
}

TEST(OptionChecks, IntegersBelowTheMinimumNameTheValueAndTheRule) {
  EXPECT_EQ(error_of({"--n", "0"}), "--n: 0 is less than 1");
  EXPECT_EQ(error_of({"--n", "-1"}), "--n: -1 is less than 1");
  EXPECT_EQ(error_of({"--n", "1.5"}), "--n: 1.5 is not an integer");
  EXPECT_EQ(error_of({"--n", "abc"}), "--n: abc is not an integer");
}

TEST(OptionChecks, AnIntegerBeyondInt64IsOutOfRangeNotWrapped) {
  EXPECT_EQ(error_of({"--n", "99999999999999999999"}),
            "--n: 99999999999999999999 is out of range (an integer from 1 to 9223372036854775807)");
  int64_t n = 0;
  EXPECT_EQ(error_of({"--n", "9223372036854775807"}, &n), "");
  EXPECT_EQ(n, INT64_MAX);
}

TEST(OptionChecks, NumbersAboveABound) {
  EXPECT_EQ(error_of({"--x", "0"}), "--x: 0 is not above 0");
  EXPECT_EQ(error_of({"--x", "-0.5"}), "--x: -0.5 is not above 0");
  EXPECT_EQ(error_of({"--x", "inf"}), "--x: inf is not a finite number");
  EXPECT_EQ(error_of({"--x", "0.05"}), "");
}

// The commands use them: --exit-after 0 was silently ignored, --max-new-tokens 0 printed DBL_MAX's 309 digits.
TEST(OptionChecks, TheCommandsRefuseZeroCounts) {
  for (const auto& [command, option] : std::vector<std::pair<std::string, std::string>>{
           {"train", "--exit-after"}, {"generate", "--max-new-tokens"}, {"eval", "--samples"}}) {
    CLI::App root("megatrain");
    add_train_command(root);
    add_generate_command(root);
    add_eval_command(root);
    try {
      root.parse(std::vector<std::string>{"0", option, command});
      ADD_FAILURE() << command << " " << option << " 0 was accepted";
    } catch (const CLI::ParseError& e) {
      EXPECT_EQ(std::string(e.what()), option + ": 0 is less than 1") << command;
    }
  }
}

}  // namespace
}  // namespace mt::app
