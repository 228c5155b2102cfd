#include "parallel/sharding/hybrid_shard.h"

#include <stdexcept>

#include <fmt/format.h>

namespace mt {

namespace {

void check_group(const std::vector<int>& dp_members, int n, int index) {
  const int d = static_cast<int>(dp_members.size());
  if (n < 1 || d % n != 0)
    throw std::invalid_argument(fmt::format("parallel.shard_group={} does not divide the data-parallel size {}", n, d));
  if (index < 0 || index >= d)
    throw std::out_of_range(fmt::format("data-parallel index {} is outside the group of {}", index, d));
}

}  // namespace

std::vector<int> shard_group_members(const std::vector<int>& dp_members, int n, int index) {
  check_group(dp_members, n, index);
  const int first = index / n * n;
  return {dp_members.begin() + first, dp_members.begin() + first + n};
}

std::vector<int> replica_group_members(const std::vector<int>& dp_members, int n, int index) {
  check_group(dp_members, n, index);
  std::vector<int> members;
  for (int j = index % n; j < static_cast<int>(dp_members.size()); j += n) members.push_back(dp_members[j]);
  return members;
}

std::unique_ptr<Work> hybrid_reduce_scatter(Communicator& dp, Communicator& replicas, const Tensor& bucket,
                                            Tensor& out) {
  const int d = dp.size(), g = replicas.size();
  if (g == 1) return dp.reduce_scatter(bucket, out);
  const int n = d / g;
  if (n * g != d || bucket.numel() % d != 0 || out.numel() * n != bucket.numel())
    throw std::invalid_argument(fmt::format(
        "hybrid reduce-scatter over {} with {} replicas: bucket {} is not {} blocks of {} (a multiple of {})",
        dp.name(), g, bucket.describe(), n, out.describe(), d));
  const int64_t shard = out.numel(), piece = shard / g;
  // Block k of the staging is piece k / n of shard k % n: what rank k of dp owns.
  Tensor staging = Tensor::empty({bucket.numel()}, bucket.dtype(), bucket.device(), MemKind::workspace);
  for (int k = 0; k < d; ++k) {
    const int64_t from = (k % n) * shard + (k / n) * piece;
    staging.slice(k * piece, (k + 1) * piece).copy_from(bucket.slice(from, from + piece));
  }
  Tensor mine = Tensor::empty({piece}, bucket.dtype(), bucket.device(), MemKind::workspace);
  dp.reduce_scatter(staging, mine)->wait();
  return replicas.all_gather(mine, out);
}

}  // namespace mt
