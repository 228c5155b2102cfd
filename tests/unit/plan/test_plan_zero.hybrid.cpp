// test_plan_zero.hybrid.cpp: hybrid sharding in the planner (parallel.shard_group): each stage's shards are 1/N of the
// model in groups of N, whatever the data-parallel size; a group of the whole data-parallel size is plain sharding.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "core/config/config.h"
#include "plan/layout.h"
#include "plan/memory_model.h"

namespace mt::plan {
namespace {

Config hybrid(const std::string& shard, int64_t dp, int64_t group) {
  const std::string yaml = fmt::format(
      "model: {{num_layers: 16, hidden_size: 64, num_heads: 4, seq_length: 32, vocab_size: 256}}\n"
      "parallel: {{data: {}, shard: {}, shard_group: {}, grad_bucket_size: 5000}}\n"
      "training: {{micro_batch_size: 2, global_batch_size: {}, train_iters: 1}}\n"
      "optimizer: {{lr: 1.0e-3, warmup_iters: 0}}\n"
      "data: {{synthetic: true}}\n",
      dp, shard, group, 4 * dp);
  return parse_config(yaml, "hybrid.yaml", {}, dp);
}

double optimizer_bytes(const Config& c) {
  return predict_memory(c, Backend::cpu).stages.at(0).bytes[MemKind::optimizer];
}

TEST(PlanZeroHybrid, TheShardsAreOneNthOfTheModelInGroupsOfN) {
  for (const char* stage : {"optimizer", "gradients", "parameters"}) {
    SCOPED_TRACE(stage);
    // Groups of 2 at DP 4 hold what DP 2 holds (the buckets padded to 4 instead of 2: within a few elements).
    const double dp2 = optimizer_bytes(hybrid(stage, 2, 0)), sg2 = optimizer_bytes(hybrid(stage, 4, 2)),
                 dp4 = optimizer_bytes(hybrid(stage, 4, 0));
    EXPECT_NEAR(sg2, dp2, 1e-3 * dp2);
    EXPECT_NEAR(sg2 / dp4, 2.0, 1e-3);
    // The whole group is plain sharding.
    EXPECT_EQ(optimizer_bytes(hybrid(stage, 4, 4)), dp4);
  }
  EXPECT_EQ(describe(layout_of(hybrid("optimizer", 4, 2))).find("shard group 2") != std::string::npos, true);
}

}  // namespace
}  // namespace mt::plan
