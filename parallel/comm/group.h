// group.h: what every communicator backend checks and derives when it creates the communicator of a group, and
// the argument checks and block arithmetic of all_to_all that every backend shares.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/comm/communicator.h"
#include "parallel/store/store.h"

namespace mt {

// Checks a group's description (members distinct and ascending, this rank among them, a positive timeout, a
// store) and returns this rank's index in it. Throws CommError naming the group.
int rank_in_group(const std::string& name, const std::vector<int>& members, int global_rank,
                  std::chrono::milliseconds timeout, const Store* store);

// Each rank counts how often it created group `name` (per backend `kind`) on this store, so a second
// communicator of the same group gets fresh rendezvous keys; ranks create groups in the same order.
int64_t group_instance(Store& store, const std::string& kind, const std::string& name, int global_rank);

// Checks the arguments of Communicator::all_to_all on `comm` (count vectors of the group's size, else
// std::invalid_argument; counts >= 0, in and out defined and of one dtype, the counts within them, this rank's
// own block the same size both ways, else CommError naming the group, the op and the rank). Returns the
// elements sent and received in all.
struct AllToAllTotals {
  int64_t sent = 0, received = 0;
};
AllToAllTotals check_all_to_all(const Communicator& comm, const Tensor& in, const std::vector<int64_t>& send_counts,
                                const Tensor& out, const std::vector<int64_t>& recv_counts);

// Where each block starts: offsets[r] = counts[0] + ... + counts[r - 1].
std::vector<int64_t> block_offsets(const std::vector<int64_t>& counts);

// Copies n elements of src from element src_at to dst from element dst_at (any devices, one dtype).
void copy_elements(const Tensor& src, int64_t src_at, Tensor& dst, int64_t dst_at, int64_t n);

}  // namespace mt
