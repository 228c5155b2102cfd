// test_plan_zero.cpp: the ZeRO stages in the planner. The model-state formula against the ZeRO paper's worked
// example (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
// figure 1: 7.5B parameters, mixed-precision Adam K = 12, 64-way data parallelism; GB = 1e9 bytes), and the
// per-rank prediction of parallel.shard: gradients and parameters against optimizer and none.
#include <gtest/gtest.h>

#include <cmath>

#include <fmt/format.h>

#include "core/config/config.h"
#include "plan/memory_model.h"

namespace mt::plan {
namespace {

TEST(PlanZero, ThePapersWorkedExampleToTheDigitItPrints) {
  const double psi = 7.5e9, gb = 1e9;
  // Exact values: (2 + 2 + 12) psi, 4 psi + 12 psi / 64, 2 psi + 14 psi / 64, 16 psi / 64.
  EXPECT_DOUBLE_EQ(zero_model_state_bytes(psi, 64, ShardStage::none) / gb, 120.0);
  EXPECT_DOUBLE_EQ(zero_model_state_bytes(psi, 64, ShardStage::optimizer) / gb, 31.40625);
  EXPECT_DOUBLE_EQ(zero_model_state_bytes(psi, 64, ShardStage::gradients) / gb, 16.640625);
  EXPECT_DOUBLE_EQ(zero_model_state_bytes(psi, 64, ShardStage::parameters) / gb, 1.875);
  // As the paper prints them (one decimal).
  auto printed = [&](ShardStage s) { return fmt::format("{:.1f}", zero_model_state_bytes(psi, 64, s) / gb); };
  EXPECT_EQ(printed(ShardStage::none), "120.0");
  EXPECT_EQ(printed(ShardStage::optimizer), "31.4");
  EXPECT_EQ(printed(ShardStage::gradients), "16.6");
  EXPECT_EQ(printed(ShardStage::parameters), "1.9");
  // One rank shards nothing.
  for (ShardStage s : {ShardStage::optimizer, ShardStage::gradients, ShardStage::parameters})
    EXPECT_DOUBLE_EQ(zero_model_state_bytes(psi, 1, s), zero_model_state_bytes(psi, 1, ShardStage::none));
}

Config tiny(const std::string& shard, int64_t dp, const std::string& precision = "fp32") {
  const std::string yaml = fmt::format(
      "model: {{num_layers: 16, hidden_size: 64, num_heads: 4, seq_length: 32, vocab_size: 256}}\n"
      "parallel: {{data: {}, shard: {}, grad_bucket_size: 5000}}\n"
      "training: {{micro_batch_size: 2, global_batch_size: {}, train_iters: 1, precision: {}}}\n"
      "optimizer: {{lr: 1.0e-3, warmup_iters: 0}}\n"
      "data: {{synthetic: true}}\n",
      dp, shard, 4 * dp, precision);
  return parse_config(yaml, "tiny.yaml", {}, dp);
}

TEST(PlanZero, ShardingTheGradientsLeavesAQuarterAtFourRanksPlusTheTransients) {
  const auto grads = [](const Config& c) {
    return predict_memory(c, Backend::cpu).stages.at(0).bytes[MemKind::gradient];
  };
  const auto optimizer = [](const Config& c) {
    return predict_memory(c, Backend::cpu).stages.at(0).bytes[MemKind::optimizer];
  };
  const Config none = tiny("none", 4), zero1 = tiny("optimizer", 4), zero2 = tiny("gradients", 4);
  EXPECT_EQ(grads(none), grads(zero1));  // ZeRO-1 reduce-scatters in place in the full buffer
  EXPECT_EQ(optimizer(zero1), optimizer(zero2));
  const int64_t n = predict_memory(none, Backend::cpu).stages.at(0).parameters;
  // The shard (a quarter, padding aside) and two bucket-sized transients of at most 5000 elements + padding
  // ... or one parameter when a parameter alone is larger than the bucket size.
  EXPECT_GT(grads(zero2), 4.0 * static_cast<double>(n) / 4);
  EXPECT_LT(grads(zero2), grads(none) / 2);
  EXPECT_GT(optimizer(none), 2 * optimizer(zero1));
}

// ZeRO-3 in bf16 at DP=4: the resident parameters are this rank's quarter (padding aside) and the gathered ones two
// units at most (a unit and the next one, prefetched); the gradients are ZeRO-2's but for a bucket and the
// optimizer state ZeRO-2's less the bf16 blocks, which are the parameters now.
TEST(PlanZero, ShardingTheParametersLeavesAQuarterPlusTwoGatheredUnits) {
  const Config none = tiny("none", 4, "bf16"), zero2 = tiny("gradients", 4, "bf16"),
               zero3 = tiny("parameters", 4, "bf16");
  const auto bytes = [](const Config& c, MemKind k) { return predict_memory(c, Backend::cpu).stages.at(0).bytes[k]; };
  const double n = static_cast<double>(predict_memory(none, Backend::cpu).stages.at(0).parameters);
  EXPECT_DOUBLE_EQ(bytes(none, MemKind::parameter), 2 * n);
  EXPECT_DOUBLE_EQ(bytes(none, MemKind::gathered), 0);
  EXPECT_GE(bytes(zero3, MemKind::parameter), 2 * n / 4);
  EXPECT_LT(bytes(zero3, MemKind::parameter), 2 * n / 4 * 1.01);
  // 16 layers of 64 wide: a layer is 12 * 64^2 + 13 * 64 elements, more than the embedding or the head with the
  // 256 x 64 table: two layers in bf16.
  const double layer = 12.0 * 64 * 64 + 13 * 64;
  EXPECT_DOUBLE_EQ(bytes(zero3, MemKind::gathered), 2 * (2 * layer));
  // ZeRO-2's gradients less one bucket (no bucket is shared with the next layer: cut at the units' borders), the
  // largest: at least the 256 x 64 table, less than it and the bucket size of 5000 elements.
  const double less = bytes(zero2, MemKind::gradient) - bytes(zero3, MemKind::gradient);
  EXPECT_GE(less, 4.0 * 256 * 64);
  EXPECT_LT(less, 4.0 * (256 * 64 + 5000));
  EXPECT_DOUBLE_EQ(bytes(zero3, MemKind::optimizer) + bytes(zero3, MemKind::parameter),
                   bytes(zero2, MemKind::optimizer));
  EXPECT_LT(predict_memory(zero3, Backend::cpu).max_total(), predict_memory(zero2, Backend::cpu).max_total());
}

}  // namespace
}  // namespace mt::plan
