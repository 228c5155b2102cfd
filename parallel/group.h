// group.h: what every communicator backend checks and derives when it creates the communicator of a group.
#pragma once
#include <chrono>
#include <string>
#include <vector>

#include "parallel/store.h"

namespace mt {

// Checks a group's description (members distinct and ascending, this rank among them, a positive timeout, a
// store) and returns this rank's index in it. Throws CommError naming the group.
int rank_in_group(const std::string& name, const std::vector<int>& members, int global_rank,
                  std::chrono::milliseconds timeout, const Store* store);

// Each rank counts how often it created group `name` (per backend `kind`) on this store, so a second
// communicator of the same group gets fresh rendezvous keys; ranks create groups in the same order.
int64_t group_instance(Store& store, const std::string& kind, const std::string& name, int global_rank);

}  // namespace mt
