#include "parallel/comm/group.h"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "parallel/comm/communicator.h"

namespace mt {

int rank_in_group(const std::string& name, const std::vector<int>& members, int global_rank,
                  std::chrono::milliseconds timeout, const Store* store) {
  if (members.empty()) throw CommError(name + ": the group has no members");
  for (size_t i = 1; i < members.size(); ++i)
    if (members[i] <= members[i - 1])
      throw CommError(fmt::format("{}: members [{}] must be distinct global ranks in ascending order", name,
                                  fmt::join(members, ", ")));
  auto it = std::find(members.begin(), members.end(), global_rank);
  if (it == members.end())
    throw CommError(fmt::format("{}: rank {} is not a member of the group (members [{}])", name, global_rank,
                                fmt::join(members, ", ")));
  if (timeout.count() <= 0)
    throw CommError(fmt::format("{}: timeout must be positive, got {} ms", name, timeout.count()));
  if (!store) throw CommError(name + ": no rendezvous store");
  return static_cast<int>(it - members.begin());
}

int64_t group_instance(Store& store, const std::string& kind, const std::string& name, int global_rank) {
  return store.add(fmt::format("{}/{}/created_by/{}", kind, name, global_rank), 1);
}

AllToAllTotals check_all_to_all(const Communicator& comm, const Tensor& in, const std::vector<int64_t>& send_counts,
                                const Tensor& out, const std::vector<int64_t>& recv_counts) {
  const std::string where = fmt::format("{}: all_to_all on rank {}", comm.name(), comm.rank());
  const size_t n = static_cast<size_t>(comm.size());
  if (send_counts.size() != n || recv_counts.size() != n)
    throw std::invalid_argument(fmt::format("{}: {} send counts and {} receive counts for a group of {}", where,
                                            send_counts.size(), recv_counts.size(), n));
  if (!in.defined() || !out.defined()) throw CommError(where + ": undefined tensor");
  if (in.dtype() != out.dtype())
    throw CommError(fmt::format("{}: input {} and output {} differ in dtype", where, in.describe(), out.describe()));
  AllToAllTotals totals;
  for (size_t r = 0; r < n; ++r) {
    if (send_counts[r] < 0 || recv_counts[r] < 0)
      throw CommError(fmt::format("{}: negative count for rank {} (send counts [{}], receive counts [{}])", where, r,
                                  fmt::join(send_counts, ", "), fmt::join(recv_counts, ", ")));
    totals.sent += send_counts[r];
    totals.received += recv_counts[r];
  }
  if (totals.sent > in.numel())
    throw CommError(fmt::format("{}: send counts [{}] sum to {} elements, more than input {}", where,
                                fmt::join(send_counts, ", "), totals.sent, in.describe()));
  if (totals.received > out.numel())
    throw CommError(fmt::format("{}: receive counts [{}] sum to {} elements, more than output {}", where,
                                fmt::join(recv_counts, ", "), totals.received, out.describe()));
  const auto self = static_cast<size_t>(comm.rank());
  if (send_counts[self] != recv_counts[self])
    throw CommError(fmt::format("{}: this rank sends itself {} elements but receives {} from itself", where,
                                send_counts[self], recv_counts[self]));
  return totals;
}

std::vector<int64_t> block_offsets(const std::vector<int64_t>& counts) {
  std::vector<int64_t> offsets(counts.size(), 0);
  for (size_t r = 1; r < counts.size(); ++r) offsets[r] = offsets[r - 1] + counts[r - 1];
  return offsets;
}

void copy_elements(const Tensor& src, int64_t src_at, Tensor& dst, int64_t dst_at, int64_t n) {
  if (n == 0) return;
  Tensor to = dst.view({dst.numel()}).slice(dst_at, dst_at + n);
  to.copy_from(src.view({src.numel()}).slice(src_at, src_at + n));
}

}  // namespace mt
