// test_plan_offload.cpp: optimizer.offload in the planner: the masters and moments leave the device total for the
// host pool (MemKind::host), sized as core/optim/host_offload.h allocates it; the host budget
// (optimizer.offload_host_memory_gib) decides `fits`; and the search tries offload only where nothing fits the
// device otherwise, and only with a budget.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "core/config/config.h"
#include "core/optim/host_offload.h"
#include "plan/hardware.h"
#include "plan/memory_model.h"
#include "plan/planner.h"

namespace mt::plan {
namespace {

Config tiny(const std::string& shard, int64_t dp, const std::string& precision, bool offload, double budget_gib = 0) {
  const std::string yaml = fmt::format(
      "model: {{num_layers: 4, hidden_size: 64, num_heads: 4, seq_length: 32, vocab_size: 256}}\n"
      "parallel: {{data: {}, shard: {}, grad_bucket_size: 5000}}\n"
      "training: {{micro_batch_size: 2, global_batch_size: {}, train_iters: 1, precision: {}}}\n"
      "optimizer: {{lr: 1.0e-3, warmup_iters: 0, offload: {}, offload_host_memory_gib: {}}}\n"
      "data: {{synthetic: true}}\n",
      dp, shard, 2 * dp, precision, offload ? "true" : "false", budget_gib);
  return parse_config(yaml, "tiny.yaml", {}, dp);
}

KindBytes bytes(const Config& c) { return predict_memory(c, Backend::cpu).stages.at(0).bytes; }

TEST(PlanOffload, TheMastersAndMomentsMoveToTheHostPool) {
  // ZeRO-1 at DP 2 in bf16: the device keeps the bf16 block for the all-gather (2 of 14 bytes per shard element).
  const KindBytes off = bytes(tiny("optimizer", 2, "bf16", false)), on = bytes(tiny("optimizer", 2, "bf16", true));
  const double shard = off[MemKind::optimizer] / 14;
  EXPECT_DOUBLE_EQ(on[MemKind::optimizer], 2 * shard);
  EXPECT_DOUBLE_EQ(off.total - on.total, 12 * shard);
  EXPECT_DOUBLE_EQ(off[MemKind::host], 0);
  EXPECT_DOUBLE_EQ(on[MemKind::host],
                   static_cast<double>(offload_host_bytes(static_cast<int64_t>(shard), DType::bf16,
                                                          {.enabled = true, .chunk_elements = 5000})));
  // No sharding, fp32: the parameters are the values, the host holds 12 bytes each plus two f32 chunks.
  const KindBytes none = bytes(tiny("none", 1, "fp32", true));
  const double n =
      static_cast<double>(predict_memory(tiny("none", 1, "fp32", true), Backend::cpu).stages[0].parameters);
  EXPECT_DOUBLE_EQ(none[MemKind::optimizer], 0);
  EXPECT_DOUBLE_EQ(none[MemKind::host], 12 * n + 2 * 5000 * 4);
  // ZeRO-3 in fp32: the resident parameter shard is a device copy of the host masters.
  const KindBytes z3off = bytes(tiny("parameters", 2, "fp32", false)),
                  z3on = bytes(tiny("parameters", 2, "fp32", true));
  EXPECT_DOUBLE_EQ(z3on[MemKind::optimizer], 0);
  EXPECT_GT(z3on[MemKind::parameter], z3off[MemKind::parameter]);
  EXPECT_LT(z3on.total, z3off.total);
}

TEST(PlanOffload, TheHostBudgetDecidesWhetherItFits) {
  const Hardware hw = builtin_hardware("cpu");
  EXPECT_TRUE(predict(tiny("none", 1, "fp32", true), hw).fits);         // no budget
  EXPECT_TRUE(predict(tiny("none", 1, "fp32", true, 1.0), hw).fits);    // 1 GiB
  EXPECT_FALSE(predict(tiny("none", 1, "fp32", true, 1e-5), hw).fits);  // 10 KiB
}

TEST(PlanOffload, SearchTriesOffloadOnlyWhereNothingElseFitsAndOnlyWithABudget) {
  // One rank (no data parallelism, no ZeRO), one micro batch size, no recomputation: one layout, which fits the
  // device only with offload once the device is sized between the two totals.
  Hardware hw = builtin_hardware("cpu");
  const double with = predict(tiny("none", 1, "fp32", true), hw).memory.max_total();
  const double without = predict(tiny("none", 1, "fp32", false), hw).memory.max_total();
  ASSERT_LT(with, without);
  const SearchOptions opt{.micro_batch_sizes = {2}, .allow_recompute = false};
  hw.memory_bytes = without * 2;
  std::vector<Prediction> r = search(tiny("none", 1, "fp32", false, 1.0), 1, hw, opt);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_FALSE(r[0].config.optimizer.offload);  // fits without: not offloaded
  hw.memory_bytes = (with + without) / 2;
  EXPECT_TRUE(search(tiny("none", 1, "fp32", false), 1, hw, opt).empty());  // no budget: offload not tried
  r = search(tiny("none", 1, "fp32", false, 1.0), 1, hw, opt);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(r[0].config.optimizer.offload);
  EXPECT_TRUE(search(tiny("none", 1, "fp32", false, 1e-5), 1, hw, opt).empty());  // the host budget too small
}

}  // namespace
}  // namespace mt::plan
