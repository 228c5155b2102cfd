#include "parallel/group.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "parallel/communicator.h"

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

}  // namespace mt
