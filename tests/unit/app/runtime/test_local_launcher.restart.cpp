// test_local_launcher.restart.cpp: --max-restarts (local_launcher.h): a restartable failure starts every rank again,
// up to the limit; a refused input (exit code 2, app/runtime/exit_codes.h) never.
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "app/runtime/exit_codes.h"
#include "app/runtime/local_launcher.h"
#include "tests/unit/temp_dir.h"

namespace mt::app {
namespace {

class LauncherRestarts : public ::testing::Test {
 protected:
  // nproc ranks of `script` (the temporary directory as $1), each start counted in $1/starts.$RANK first.
  LaunchOptions counted(int nproc, int max_restarts, const std::string& script) const {
    LaunchOptions opt;
    opt.nproc = nproc;
    opt.max_restarts = max_restarts;
    opt.argv = {"/bin/sh", "-c", "echo x >> \"$1/starts.$RANK\"; n=$(wc -l < \"$1/starts.$RANK\"); " + script, "sh",
                dir_.path().string()};
    return opt;
  }
  int starts(int rank) const {
    std::ifstream in(dir_ / ("starts." + std::to_string(rank)));
    int n = 0;
    for (std::string line; std::getline(in, line);) ++n;
    return n;
  }

  testing_util::TempDir dir_{"mt_restarts"};
};

TEST_F(LauncherRestarts, ARestartableFailureStartsEveryRankAgainUntilTheySucceed) {
  // Rank 0 fails its first two starts (a peer's timeout: exit 1, or a kill: 137) once rank 1 has started as often,
  // then succeeds.
  EXPECT_EQ(launch_local(counted(2, 5, R"sh(
    if [ "$RANK" = 1 ]; then [ $n -lt 3 ] && exec sleep 5; exit 0; fi
    until [ "$(cat "$1/starts.1" 2>/dev/null | wc -l)" -ge $n ]; do sleep 0.01; done
    [ $n = 1 ] && exit 1
    [ $n = 2 ] && kill -9 $$
    exit 0)sh")),
            0);
  EXPECT_EQ(starts(0), 3);
  EXPECT_EQ(starts(1), 3);
}

TEST_F(LauncherRestarts, TheLastFailureIsGivenOnceTheRestartsAreSpent) {
  EXPECT_EQ(launch_local(counted(2, 2, R"([ "$RANK" = 1 ] && exit 3; exit 0)")), 3);
  EXPECT_EQ(starts(1), 3);  // the first start and two restarts
}

TEST_F(LauncherRestarts, ARefusedInputIsNeverRestarted) {
  EXPECT_EQ(launch_local(counted(2, 5, R"([ "$RANK" = 0 ] && exit 2; exit 0)")), kExitRefusedInput);
  EXPECT_EQ(starts(0), 1);
  EXPECT_EQ(launch_local(counted(1, 5, "exit 106")), 106);  // a command-line error
  EXPECT_EQ(starts(0), 2);
}

TEST_F(LauncherRestarts, WithoutTheFlagAFailureIsFinal) {
  EXPECT_EQ(launch_local(counted(1, 0, "exit 1")), 1);
  EXPECT_EQ(starts(0), 1);
}

TEST(ExitCodes, OnlyFailuresARestartMayCureAreRestartable) {
  EXPECT_FALSE(restartable_exit(0));
  EXPECT_TRUE(restartable_exit(kExitFailure));
  EXPECT_FALSE(restartable_exit(kExitRefusedInput));
  EXPECT_FALSE(restartable_exit(106));  // CLI11's RequiredError
  EXPECT_FALSE(restartable_exit(127));  // the program cannot run
  EXPECT_TRUE(restartable_exit(128 + 9));
  EXPECT_TRUE(restartable_exit(128 + 15));
}

TEST(LauncherRestartOptions, ANegativeLimitIsRefused) {
  LaunchOptions opt;
  opt.argv = {"/bin/true"};
  opt.max_restarts = -1;
  EXPECT_THROW(launch_local(opt), std::invalid_argument);
}

}  // namespace
}  // namespace mt::app
