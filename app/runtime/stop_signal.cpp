#include "app/runtime/stop_signal.h"

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

}  // namespace

void install_stop_signals() {
  std::signal(SIGTERM, on_signal);
  std::signal(SIGUSR1, on_signal);
  std::signal(SIGINT, on_signal);
  std::signal(SIGHUP, on_signal);  // the terminal closed: like SIGTERM
}

int stop_signal() { return g_signal.load(); }

}  // namespace mt::app
