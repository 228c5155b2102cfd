#include "app/runtime/heartbeat.h"

#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace mt::app {

namespace {

std::string key_of(int rank) { return fmt::format("heartbeat/{}", rank); }
// Added to a rank's counter when it ends on its own: a negative counter means "exited", not "silent".
constexpr int64_t kExited = -(int64_t(1) << 60);

}  // namespace

Heartbeat::Heartbeat(const LaunchEnv& env, Millis period, Millis timeout)
    : env_(env), period_(period), store_(connect_tcp_store(env.master_addr, env.master_port, timeout, timeout)) {
  thread_ = std::thread([this] { beat(); });
}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
  try {
    store_->add(key_of(env_.rank), kExited);
  } catch (const std::exception&) {
  }
}

void Heartbeat::beat() {
  std::unique_lock lock(mu_);
  while (!stop_) {
    lock.unlock();
    try {
      store_->add(key_of(env_.rank), 1);
    } catch (const std::exception&) {
      return;  // the store is gone (rank 0 ended or stopped): nothing left to tell
    }
    lock.lock();
    wake_.wait_for(lock, period_, [this] { return stop_; });
  }
}

std::string Heartbeat::silent_ranks() const {
  const Millis quick{2000};
  try {
    auto store = connect_tcp_store(env_.master_addr, env_.master_port, quick, quick);
    auto read_all = [&] {
      std::vector<int64_t> counts(static_cast<size_t>(env_.world_size));
      for (int r = 0; r < env_.world_size; ++r) counts[static_cast<size_t>(r)] = store->add(key_of(r), 0);
      return counts;
    };
    const std::vector<int64_t> before = read_all();
    std::this_thread::sleep_for(3 * period_);
    const std::vector<int64_t> after = read_all();
    std::vector<int> silent;
    for (int r = 0; r < env_.world_size; ++r)
      if (r != env_.rank && after[static_cast<size_t>(r)] >= 0 &&
          after[static_cast<size_t>(r)] == before[static_cast<size_t>(r)])
        silent.push_back(r);
    if (silent.empty()) return "";
    return fmt::format(" (ranks whose heartbeat stopped, likely stopped or frozen: [{}])", fmt::join(silent, ", "));
  } catch (const std::exception&) {
    return fmt::format(
        " (the rendezvous store on rank 0 does not answer within {} s: rank 0 is likely stopped or "
        "gone)",
        quick.count() / 1000);
  }
}

}  // namespace mt::app
