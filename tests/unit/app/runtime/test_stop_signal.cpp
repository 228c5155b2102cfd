// test_stop_signal.cpp: the stop handlers catch the signals that ask a run to checkpoint and stop, and leave an
// ignored one ignored (nohup, the --nproc launcher).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>

#include "app/runtime/stop_signal.h"

namespace mt::app {
namespace {

// Runs `body` in a forked child (installing handlers and raising signals would disturb the test process) and
// returns its exit status: 0 when every check in it held, else the number of the first that failed.
int in_child(const std::function<int()>& body) {
  const pid_t pid = fork();
  if (pid == 0) _exit(body());
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status)) << "the child died of signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

sighandler_t disposition(int sig) {
  struct sigaction now {};
  sigaction(sig, nullptr, &now);
  return now.sa_handler;
}

// `nohup megatrain train` used to save and stop on SIGHUP all the same (issue 30, item 10).
TEST(StopSignal, AnIgnoredSignalStaysIgnored) {
  EXPECT_EQ(in_child([] {
              signal(SIGHUP, SIG_IGN);
              install_stop_signals();
              if (disposition(SIGHUP) != SIG_IGN) return 1;
              raise(SIGHUP);
              if (stop_signal() != 0) return 2;
              return 0;
            }),
            0);
}

TEST(StopSignal, ADefaultSignalIsCaughtAndRecorded) {
  for (int sig : {SIGHUP, SIGTERM, SIGUSR1, SIGINT}) {
    EXPECT_EQ(in_child([sig] {
                signal(sig, SIG_DFL);
                install_stop_signals();
                if (disposition(sig) == SIG_DFL || disposition(sig) == SIG_IGN) return 1;
                raise(sig);
                if (stop_signal() != sig) return 2;
                return 0;
              }),
              0)
        << "signal " << sig;
  }
}

}  // namespace
}  // namespace mt::app
