#include "app/runtime/stop_signal.h"

#include <signal.h>

#include <atomic>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <ctime>

namespace mt::app {

namespace {

std::atomic<int> g_signal{0};
std::atomic<int64_t> g_first_signal_ns{0};

// clock_gettime is async-signal-safe.
extern "C" void on_signal(int sig) {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  const int64_t now = static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
  if (g_signal.exchange(sig) == 0) {
    g_first_signal_ns.store(now);
  } else if (now - g_first_signal_ns.load() > 2000000000) {
    std::_Exit(128 + sig);
  }
}

// Catches `sig` unless it is ignored now: nohup (and the --nproc launcher for SIGHUP) ignores it so that the run
// outlives the terminal, and a handler here would turn the hang-up into a stop all the same (issue 30, item 10).
void catch_unless_ignored(int sig) {
  struct sigaction now {};
  if (sigaction(sig, nullptr, &now) == 0 && now.sa_handler == SIG_IGN) return;
  std::signal(sig, on_signal);
}

}  // namespace

void install_stop_signals() {
  catch_unless_ignored(SIGTERM);
  catch_unless_ignored(SIGUSR1);
  catch_unless_ignored(SIGINT);
  catch_unless_ignored(SIGHUP);  // the terminal closed: like SIGTERM
}

int stop_signal() { return g_signal.load(); }

}  // namespace mt::app
