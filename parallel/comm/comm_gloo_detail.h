// comm_gloo_detail.h: what the Gloo communicator (comm_gloo.cpp) and its rendezvous (comm_gloo_rendezvous.cpp)
// share: the group's description and failure record, and the communicator's construction.
#pragma once
#include <algorithm>
#include <cctype>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <gloo/context.h>

#include "parallel/comm/communicator.h"
#include "parallel/comm/shared_rounds.h"

namespace mt::gloo_detail {

inline std::string seconds_str(Millis t) { return fmt::format("{:g} s", static_cast<double>(t.count()) / 1000.0); }

inline bool mentions_timeout(std::string_view what) {
  std::string s(what);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s.find("timed out") != std::string::npos || s.find("timeout") != std::string::npos;
}

// What every message names: the group, this rank, the timeout.
struct GroupInfo {
  std::string name;
  std::vector<int> members;  // global ranks
  int rank = 0;              // within the group
  Millis timeout{0};

  std::string who(int r) const { return fmt::format("rank {} (global {})", r, members.at(r)); }
  CommError misuse(std::string_view op, const std::string& what) const {
    return CommError(fmt::format("{}: {} on {}: {}", name, op, who(rank), what));
  }
  // Turns an exception from Gloo into a CommError naming the collective; the group is broken from then on.
  CommError failure(std::string_view op, const std::exception& e) const {
    bool timed_out = mentions_timeout(e.what());
    CommError error(fmt::format("{}: {} {} on {}: {}", name, op,
                                timed_out ? "timed out after " + seconds_str(timeout) : std::string("failed"),
                                who(rank), e.what()));
    record_failure(error.what());
    return error;
  }

  // Gloo closes every pair of a context once one operation fails or times out, so the first failure is
  // kept and later operations fail at once, naming it, instead of reporting a misleading pair closure.
  // Ranks waiting for this one in a shared-memory round stop at once too.
  void record_failure(const std::string& what) const {
    if (shm) shm->abandon();
    std::lock_guard lock(mu);
    if (first_failure.empty()) first_failure = what;
  }
  void throw_if_broken(std::string_view op) const {
    std::lock_guard lock(mu);
    if (!first_failure.empty())
      throw CommError(fmt::format("{}: {} on {}: the communicator is unusable after an earlier failure: {}", name, op,
                                  who(rank), first_failure));
  }

  std::shared_ptr<SharedRounds> shm;  // the small collectives' path when every rank is on this host, else null
  mutable std::mutex mu;
  mutable std::string first_failure;  // the message of the first CommError from the transport
};

// The communicator of a group whose Gloo context is connected (and whose shared-memory rounds, if any, joined).
std::unique_ptr<Communicator> make_communicator(std::shared_ptr<const GroupInfo> group,
                                                std::shared_ptr<gloo::Context> context);

}  // namespace mt::gloo_detail
