// test_grad_buffer.hybrid.cpp: hybrid sharding's groups (parallel/sharding/hybrid_shard.h) and its reduce-scatter, with
// threads as ranks over Gloo: four data-parallel ranks in shard groups of two; each rank's block of a bucket is the
// sum over all four ranks in rank order, bit for bit (((x_0 + x_1) + x_2) + x_3, as the whole group's reduce-scatter
// and all-reduce give), where summing in the group first ((x_0 + x_1) + (x_2 + x_3)) would round otherwise.
#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>
#include <vector>

#include "parallel/sharding/hybrid_shard.h"
#include "parallel/comm/thread_ranks.h"

namespace mt {
namespace {

TEST(HybridShard, GroupsAreConsecutiveRanksAndTheirReplicasAreStrided) {
  const std::vector<int> dp = {1, 3, 5, 7, 9, 11};  // global ranks of a data-parallel group, in its order
  EXPECT_EQ(shard_group_members(dp, 2, 3), (std::vector<int>{5, 7}));
  EXPECT_EQ(replica_group_members(dp, 2, 3), (std::vector<int>{3, 7, 11}));
  EXPECT_EQ(shard_group_members(dp, 3, 4), (std::vector<int>{7, 9, 11}));
  EXPECT_EQ(replica_group_members(dp, 3, 4), (std::vector<int>{3, 9}));
  EXPECT_EQ(shard_group_members(dp, 6, 0), dp);
  EXPECT_EQ(replica_group_members(dp, 6, 2), (std::vector<int>{5}));
  try {
    shard_group_members(dp, 4, 0);
    FAIL() << "a group of 4 of 6 ranks was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.shard_group=4 does not divide the data-parallel size 6"),
              std::string::npos)
        << e.what();
  }
}

TEST(HybridShard, ReduceScatterSumsEveryRankInRankOrder) {
  constexpr int kRanks = 4, kGroup = 2;
  constexpr int64_t kBucket = 16;  // a multiple of the 4 ranks; shards of 8
  // Values whose sum depends on the order: 1, 1e-8 ... make ((a + b) + c) + d differ from (a + b) + (c + d).
  auto value = [](int rank, int64_t i) {
    const float v[kRanks] = {1.0f, 3e-8f, 3e-8f, -1.0f};
    return v[rank] * static_cast<float>(1 + i % 3) + static_cast<float>(i) * 1e-3f;
  };
  std::vector<std::vector<float>> got(kRanks);
  auto store = make_hash_store();
  run_ranks(kRanks, [&](int r) {
    const std::vector<int> all = first_ranks(kRanks);
    auto dp = join_gloo(store, "dp", all, r);
    auto replicas = join_gloo(store, "replicas" + std::to_string(r % kGroup), replica_group_members(all, kGroup, r), r);
    std::vector<float> x(kBucket);
    for (int64_t i = 0; i < kBucket; ++i) x[static_cast<size_t>(i)] = value(r, i);
    Tensor bucket = Tensor::from_floats(x, {kBucket});
    const int64_t shard = kBucket / kGroup, i = r % kGroup;
    Tensor out = bucket.slice(i * shard, (i + 1) * shard);  // in place, as the gradient buffer does
    hybrid_reduce_scatter(*dp, *replicas, bucket, out)->wait();
    got[static_cast<size_t>(r)] = out.to_floats();
  });
  bool order_matters = false;
  for (int r = 0; r < kRanks; ++r) {
    const int64_t shard = kBucket / kGroup, i = r % kGroup;
    for (int64_t k = 0; k < shard; ++k) {
      const int64_t e = i * shard + k;
      volatile float sum = value(0, e);
      for (int j = 1; j < kRanks; ++j) sum = sum + value(j, e);
      volatile float grouped = value(0, e) + value(1, e), rest = value(2, e) + value(3, e);
      order_matters |= grouped + rest != sum;
      const float g = got[static_cast<size_t>(r)][static_cast<size_t>(k)], want = sum;
      EXPECT_EQ(std::memcmp(&g, &want, sizeof(float)), 0)
          << "rank " << r << " element " << e << ": " << g << " vs " << want;
    }
  }
  EXPECT_TRUE(order_matters) << "the values do not tell the summation orders apart";
}

}  // namespace
}  // namespace mt
