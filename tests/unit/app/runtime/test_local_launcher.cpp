// test_local_launcher.cpp: `--nproc N` as a launcher: every rank's torchrun variables, the first failure stopping
// the others promptly (SIGTERM, then SIGKILL after the grace), exit codes, prefixed output, unrunnable programs,
// and signals sent to the launcher (forwarded) or typed at its terminal (not sent twice). Ranks are /bin/sh
// scripts that write what they see into a temporary directory ($1).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "tests/unit/file_text.h"
#include "app/runtime/local_launcher.h"

using namespace mt::app;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

// Run by the launcher as a rank (MT_TEST_RANK_MODE=count_sigint), this binary writes a line to
// $MT_TEST_DIR/int.$RANK per SIGINT it gets, touches ready.$RANK, and exits 0 once the file "stop" appears.
int g_sigint_fd = -1;
extern "C" void count_sigint(int) { (void)!::write(g_sigint_fd, "int\n", 4); }

[[maybe_unused]] const bool g_is_counting_rank = [] {
  const char* mode = std::getenv("MT_TEST_RANK_MODE");
  if (!mode || std::string(mode) != "count_sigint") return false;
  const fs::path dir = std::getenv("MT_TEST_DIR");
  const std::string rank = std::getenv("RANK");
  g_sigint_fd = ::open((dir / ("int." + rank)).c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  struct sigaction sa {};
  sa.sa_handler = count_sigint;
  ::sigaction(SIGINT, &sa, nullptr);
  std::ofstream(dir / ("ready." + rank)) << "";
  while (!fs::exists(dir / "stop")) ::usleep(10000);
  ::_exit(0);
}();

std::string slurp(const fs::path& path) { return mt::testing_util::slurp(path.string()); }

bool process_is_gone(pid_t pid) { return ::kill(pid, 0) != 0 && errno == ESRCH; }

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// What a forked test process that ran the launcher left: its exit code (128 + signal when killed) and output.
struct Captured {
  int code = -1;
  std::string out, err;
};

// Runs `body` in a forked process whose stdout and stderr go to files, so that the launcher's output can be
// read and its signals do not reach the test runner. alarm() bounds a hung launcher.
Captured run_captured(const fs::path& dir, const std::function<int()>& body) {
  const fs::path out = dir / "captured.out", err = dir / "captured.err";
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(20);
    int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(o, STDOUT_FILENO);
    ::dup2(e, STDERR_FILENO);
    int code = 99;
    try {
      code = body();
    } catch (const std::exception& ex) {
      std::fprintf(stderr, "test body threw: %s\n", ex.what());
    }
    std::fflush(stdout);
    std::fflush(stderr);
    ::_exit(code);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  Captured c;
  c.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  c.out = slurp(out);
  c.err = slurp(err);
  return c;
}

// Waits (up to 5 s) until every file exists.
bool wait_for_files(const std::vector<fs::path>& files) {
  auto deadline = Clock::now() + 5s;
  while (Clock::now() < deadline) {
    bool all = true;
    for (const auto& f : files) all = all && fs::exists(f);
    if (all) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

class LocalLauncherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "mt_launcher_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // nproc ranks, each running `script` with the temporary directory as $1.
  LaunchOptions shell(int nproc, const std::string& script) const {
    LaunchOptions opt;
    opt.nproc = nproc;
    opt.argv = {"/bin/sh", "-c", script, "sh", dir_.string()};
    return opt;
  }

  std::vector<fs::path> files(const std::string& stem, std::vector<int> ranks) const {
    std::vector<fs::path> out;
    for (int r : ranks) out.push_back(dir_ / (stem + "." + std::to_string(r)));
    return out;
  }

  fs::path dir_;
};

TEST_F(LocalLauncherTest, EveryRankGetsItsTorchrunVariablesAndNoOtherLaunchers) {
  // Variables of an outer launcher must not reach the ranks: they would read them instead of ours.
  ::setenv("SLURM_PROCID", "5", 1);
  ::setenv("OMPI_COMM_WORLD_RANK", "5", 1);
  ::setenv("RANK", "9", 1);
  LaunchOptions opt = shell(4, R"(printf '%s %s %s %s %s %s %s%s\n' "$RANK" "$WORLD_SIZE" "$LOCAL_RANK" )"
                               R"("$LOCAL_WORLD_SIZE" "$MASTER_ADDR" "$MASTER_PORT" "${SLURM_PROCID-none}" )"
                               R"("${OMPI_COMM_WORLD_RANK-none}" > "$1/env.$RANK")");
  opt.master_port = 29517;
  int code = launch_local(opt);
  ::unsetenv("SLURM_PROCID");
  ::unsetenv("OMPI_COMM_WORLD_RANK");
  ::unsetenv("RANK");
  EXPECT_EQ(code, 0);
  for (int r = 0; r < 4; ++r)
    EXPECT_EQ(slurp(dir_ / ("env." + std::to_string(r))), fmt::format("{} 4 {} 4 127.0.0.1 29517 nonenone\n", r, r))
        << "rank " << r;
}

TEST_F(LocalLauncherTest, AutoPickedPortIsValidAndTheSameForAllRanks) {
  LaunchOptions opt = shell(3, R"(echo "$MASTER_PORT" > "$1/port.$RANK")");
  ASSERT_EQ(opt.master_port, 0);
  ASSERT_EQ(launch_local(opt), 0);
  std::string port0 = slurp(dir_ / "port.0");
  int port = std::atoi(port0.c_str());
  EXPECT_GE(port, 1);
  EXPECT_LE(port, 65535);
  EXPECT_EQ(slurp(dir_ / "port.1"), port0);
  EXPECT_EQ(slurp(dir_ / "port.2"), port0);
}

TEST(LocalLauncher, RankEnvironmentKeepsTheRestOfTheParentEnvironment) {
  std::vector<std::string> env = rank_environment({"PATH=/bin", "SLURM_PROCID=3", "SLURM_JOB_ID=12",
                                                   "OMPI_COMM_WORLD_SIZE=8", "RANK=7", "MASTER_PORT=1", "HOME=/h"},
                                                  1, 2, "10.0.0.1", 29500);
  EXPECT_EQ(env, (std::vector<std::string>{"PATH=/bin", "SLURM_JOB_ID=12", "HOME=/h", "RANK=1", "WORLD_SIZE=2",
                                           "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=10.0.0.1",
                                           "MASTER_PORT=29500"}));
}

TEST(LocalLauncher, RankEnvironmentGivesEveryRankTheLaunchsJobId) {
  std::vector<std::string> env =
      rank_environment({"MEGATRAIN_JOB_ID=outer", "HOME=/h"}, 0, 2, "127.0.0.1", 1, "c0ffee");
  EXPECT_EQ(env, (std::vector<std::string>{"HOME=/h", "RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=2",
                                           "MASTER_ADDR=127.0.0.1", "MASTER_PORT=1", "MEGATRAIN_JOB_ID=c0ffee"}));
}

TEST(LocalLauncher, RankEnvironmentSaysWhenTheLauncherServesTheStore) {
  std::vector<std::string> env =
      rank_environment({"MEGATRAIN_STORE_HOSTED=1", "HOME=/h"}, 1, 2, "127.0.0.1", 1, "c0ffee", true);
  EXPECT_EQ(env, (std::vector<std::string>{"HOME=/h", "RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2",
                                           "MASTER_ADDR=127.0.0.1", "MASTER_PORT=1", "MEGATRAIN_JOB_ID=c0ffee",
                                           "MEGATRAIN_STORE_HOSTED=1"}));
  // An outer launch's flag does not reach the ranks of one that does not serve the store.
  env = rank_environment({"MEGATRAIN_STORE_HOSTED=1"}, 0, 1, "127.0.0.1", 29500, "", false);
  EXPECT_EQ(std::count(env.begin(), env.end(), "MEGATRAIN_STORE_HOSTED=1"), 0);
}

// Without MASTER_PORT the launcher serves the rendezvous store itself on the port it gives the ranks, bound from
// before they start (no window in which another process could take it): each rank finds it listening there.
TEST_F(LocalLauncherTest, WithoutAPortTheLauncherServesTheStoreOnThePortItGives) {
  LaunchOptions opt = shell(2, R"(
    [ "$MEGATRAIN_STORE_HOSTED" = 1 ] || exit 3
    exec bash -c 'exec 3<>/dev/tcp/127.0.0.1/$MASTER_PORT' || exit 4
  )");
  ASSERT_EQ(opt.master_port, 0);
  EXPECT_EQ(launch_local(opt), 0);
  // With a port given, rank 0 serves the store (as under torchrun or Slurm): nothing listens there before it.
  LaunchOptions given = shell(1, R"([ -z "$MEGATRAIN_STORE_HOSTED" ] || exit 3)");
  given.master_port = 29518;
  EXPECT_EQ(launch_local(given), 0);
}

TEST_F(LocalLauncherTest, AllRanksSucceedingGivesZero) { EXPECT_EQ(launch_local(shell(4, "exit 0")), 0); }

// A rank writes its pid file under a temporary name and renames it: the peer that waits for the file to exist
// then fails (and so the launcher kills the writer) must never see it created but not yet written (pid 0).
TEST_F(LocalLauncherTest, FirstFailureStopsTheOthersPromptlyAndGivesItsCode) {
  // Rank 2 fails once the others are asleep for 30 s; the launcher must not wait for them.
  auto opt = shell(4, R"(
    if [ "$RANK" = 2 ]; then
      until [ -e "$1/pid.0" ] && [ -e "$1/pid.1" ] && [ -e "$1/pid.3" ]; do sleep 0.02; done
      exit 3
    fi
    echo $$ > "$1/pid.$RANK.tmp" && mv "$1/pid.$RANK.tmp" "$1/pid.$RANK"
    exec sleep 30)");
  auto start = Clock::now();
  EXPECT_EQ(launch_local(opt), 3);
  EXPECT_LT(seconds_since(start), 2.0);
  for (const auto& f : files("pid", {0, 1, 3})) {
    pid_t pid = std::atoi(slurp(f).c_str());
    ASSERT_GT(pid, 0) << f;
    EXPECT_TRUE(process_is_gone(pid)) << f << ": pid " << pid << " still runs";
  }
}

TEST_F(LocalLauncherTest, RankIgnoringSigtermIsKilledAfterTheGrace) {
  auto opt = shell(2, R"(
    if [ "$RANK" = 0 ]; then
      until [ -e "$1/pid.1" ]; do sleep 0.02; done
      exit 1
    fi
    trap '' TERM
    echo $$ > "$1/pid.1.tmp" && mv "$1/pid.1.tmp" "$1/pid.1"
    exec sleep 30)");
  opt.grace = 300ms;
  auto start = Clock::now();
  Captured c = run_captured(dir_, [&] { return launch_local(opt); });
  double elapsed = seconds_since(start);
  EXPECT_EQ(c.code, 1) << c.err;
  EXPECT_GE(elapsed, 0.3);
  EXPECT_LT(elapsed, 3.0);
  EXPECT_NE(c.err.find("rank 0 (pid "), std::string::npos) << c.err;
  EXPECT_NE(c.err.find("exited with code 1"), std::string::npos) << c.err;
  EXPECT_NE(c.err.find("rank(s) 1 (pid "), std::string::npos) << c.err;
  EXPECT_NE(c.err.find("sent SIGKILL"), std::string::npos) << c.err;
  pid_t pid = std::atoi(slurp(dir_ / "pid.1").c_str());
  ASSERT_GT(pid, 0);
  EXPECT_TRUE(process_is_gone(pid));
}

TEST_F(LocalLauncherTest, RankKilledBySignalGives128PlusTheSignal) {
  auto opt = shell(2, R"(if [ "$RANK" = 1 ]; then kill -KILL $$; fi; exec sleep 30)");
  Captured c = run_captured(dir_, [&] { return launch_local(opt); });
  EXPECT_EQ(c.code, 128 + SIGKILL);
  EXPECT_NE(c.err.find("rank 1 (pid "), std::string::npos) << c.err;
  EXPECT_NE(c.err.find("was killed by signal 9"), std::string::npos) << c.err;
}

TEST_F(LocalLauncherTest, AStoppedRankIsNamedBeforeThePeerThatTimedOutAndKilledAtOnce) {
  // Rank 1 stops itself (SIGSTOP); rank 0, "timing out" waiting for it, exits 1. The stopped rank is the cause:
  // named first, and killed without waiting out the 10 s grace (SIGTERM cannot reach a stopped process).
  auto opt = shell(2, R"(
    if [ "$RANK" = 1 ]; then echo $$ > "$1/pid.1.tmp" && mv "$1/pid.1.tmp" "$1/pid.1"; kill -STOP $$; exit 0; fi
    until [ -e "$1/pid.1" ]; do sleep 0.02; done
    sleep 0.3; exit 1)");
  const auto start = Clock::now();
  Captured c = run_captured(dir_, [&] { return launch_local(opt); });
  EXPECT_LT(seconds_since(start), 5.0);
  EXPECT_EQ(c.code, 1);
  const size_t stopped = c.err.find("rank 1 (pid "), failed = c.err.find("rank 0 (pid ");
  ASSERT_NE(stopped, std::string::npos) << c.err;
  EXPECT_NE(c.err.find("is stopped (SIGSTOP or a debugger)"), std::string::npos) << c.err;
  EXPECT_LT(stopped, failed) << c.err;
  pid_t pid = std::atoi(slurp(dir_ / "pid.1").c_str());
  ASSERT_GT(pid, 0);
  EXPECT_TRUE(process_is_gone(pid));
}

TEST_F(LocalLauncherTest, PrefixOutputLabelsEveryLineAndFlushesPartialLastLines) {
  auto opt = shell(2, R"(echo hello; printf 'two\nlines\n'; echo oops >&2; printf partial)");
  opt.prefix_output = true;
  Captured c = run_captured(dir_, [&] { return launch_local(opt); });
  EXPECT_EQ(c.code, 0);
  for (int r = 0; r < 2; ++r) {
    std::string p = fmt::format("[rank {}] ", r);
    for (const char* line : {"hello\n", "two\n", "lines\n", "partial\n"})
      EXPECT_NE(c.out.find(p + line), std::string::npos) << c.out;
    EXPECT_NE(c.err.find(p + "oops\n"), std::string::npos) << c.err;
  }
  std::istringstream lines(c.out);
  int n = 0;
  for (std::string line; std::getline(lines, line); ++n) EXPECT_EQ(line.rfind("[rank ", 0), 0u) << line;
  EXPECT_EQ(n, 8);
}

TEST_F(LocalLauncherTest, WithoutPrefixRanksWriteToTheLaunchersOutput) {
  Captured c = run_captured(dir_, [&] { return launch_local(shell(2, R"(echo "plain $RANK")")); });
  EXPECT_EQ(c.code, 0);
  EXPECT_NE(c.out.find("plain 0\n"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("plain 1\n"), std::string::npos) << c.out;
  EXPECT_EQ(c.out.find("[rank"), std::string::npos) << c.out;
}

TEST_F(LocalLauncherTest, UnrunnableProgramFailsSayingWhy) {
  const fs::path not_executable = dir_ / "not-executable";
  std::ofstream(not_executable) << "#!/bin/sh\n";
  const std::map<std::string, std::string> cases = {
      {"/nonexistent/megatrain-prog", "cannot run /nonexistent/megatrain-prog: No such file or directory"},
      {"megatrain-no-such-program", "cannot run megatrain-no-such-program: No such file or directory"},
      {not_executable.string(), "cannot run " + not_executable.string() + ": Permission denied"},
  };
  for (const auto& [prog, message] : cases) {
    LaunchOptions opt;
    opt.nproc = 2;
    opt.argv = {prog, "--flag"};
    Captured c = run_captured(dir_, [&] { return launch_local(opt); });
    EXPECT_EQ(c.code, 127) << prog;
    EXPECT_NE(c.err.find(message), std::string::npos) << c.err;
    EXPECT_NE(c.err.find("exited with code 127"), std::string::npos) << c.err;
  }
}

TEST_F(LocalLauncherTest, SigtermToTheLauncherIsForwardedToEveryRank) {
  auto opt = shell(3, R"(
    trap 'echo term > "$1/term.$RANK"; exit 0' TERM
    touch "$1/ready.$RANK"
    while :; do sleep 0.05; done)");
  auto ready = files("ready", {0, 1, 2});
  Captured c = run_captured(dir_, [&] {
    std::thread sender([&] {
      if (wait_for_files(ready)) ::kill(::getpid(), SIGTERM);
    });
    int code = launch_local(opt);
    sender.join();
    return code;
  });
  EXPECT_EQ(c.code, 0) << c.err;  // the ranks caught it and exited 0
  for (const auto& f : files("term", {0, 1, 2})) EXPECT_EQ(slurp(f), "term\n") << f;
  EXPECT_NE(c.err.find("received signal 15"), std::string::npos) << c.err;
}

TEST_F(LocalLauncherTest, CtrlCAtTheTerminalReachesEachRankOnce) {
  // The ranks share the launcher's process group, so the terminal's SIGINT reaches them directly; forwarding it
  // too would make a trainer take it as a second Ctrl-C and quit without its checkpoint. The ranks are this test
  // binary in its counting mode (a shell's trap would run once for two SIGINTs).
  LaunchOptions opt;
  opt.nproc = 2;
  opt.argv = {"/proc/self/exe"};
  auto ready = files("ready", {0, 1});
  auto stop = dir_ / "stop";
  Captured c = run_captured(dir_, [&] {
    ::setenv("MT_TEST_RANK_MODE", "count_sigint", 1);
    ::setenv("MT_TEST_DIR", dir_.c_str(), 1);
    // A new session whose controlling terminal is a fresh pty, this process its foreground group.
    if (::setsid() < 0) return 90;
    int master = ::posix_openpt(O_RDWR | O_NOCTTY);
    if (master < 0 || ::grantpt(master) != 0 || ::unlockpt(master) != 0) return 91;
    int slave = ::open(::ptsname(master), O_RDWR);
    if (slave < 0 || ::ioctl(slave, TIOCSCTTY, 0) != 0) return 92;
    std::thread typist([&] {
      if (!wait_for_files(ready)) return;
      (void)!::write(master, "\x03", 1);
      std::this_thread::sleep_for(300ms);  // a forwarded duplicate would have arrived by now
      std::ofstream(stop) << "";
    });
    int code = launch_local(opt);
    typist.join();
    return code;
  });
  EXPECT_EQ(c.code, 0) << c.err;
  for (const auto& f : files("int", {0, 1})) EXPECT_EQ(slurp(f), "int\n") << f;
  EXPECT_NE(c.err.find("from the terminal"), std::string::npos) << c.err;
}

TEST_F(LocalLauncherTest, CallersSignalDispositionsAreKeptForRanksAndRestoredAfter) {
  // As with nohup: a signal the caller ignores stays ignored in the ranks; the launcher's handlers go away after.
  auto opt = shell(1, R"(grep SigIgn /proc/$$/status | cut -f2 > "$1/sigign")");
  Captured c = run_captured(dir_, [&] {
    ::signal(SIGINT, SIG_IGN);
    ::signal(SIGTERM, SIG_DFL);
    int code = launch_local(opt);
    struct sigaction intr {
    }, term{};
    ::sigaction(SIGINT, nullptr, &intr);
    ::sigaction(SIGTERM, nullptr, &term);
    if (intr.sa_handler != SIG_IGN) return 80;
    if ((term.sa_flags & SA_SIGINFO) || term.sa_handler != SIG_DFL) return 81;
    return code;
  });
  ASSERT_EQ(c.code, 0) << c.err;
  unsigned long long ignored = std::stoull(slurp(dir_ / "sigign"), nullptr, 16);
  EXPECT_TRUE(ignored & (1ull << (SIGINT - 1))) << std::hex << ignored;
  EXPECT_FALSE(ignored & (1ull << (SIGTERM - 1))) << std::hex << ignored;
}

TEST(LocalLauncher, BadOptionsAreRejected) {
  LaunchOptions opt;
  opt.argv = {"/bin/true"};
  opt.nproc = 0;
  EXPECT_THROW(launch_local(opt), std::invalid_argument);
  opt.nproc = 1;
  opt.master_port = 70000;
  EXPECT_THROW(launch_local(opt), std::invalid_argument);
  opt.master_port = 0;
  opt.argv.clear();
  EXPECT_THROW(launch_local(opt), std::invalid_argument);
}

}  // namespace
