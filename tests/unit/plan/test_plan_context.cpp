// test_plan_context.cpp: the planner's context parallelism (parallel.context): activations per rank, the key/value
// transfers in the step time, the gradients' reduction over data x context ranks, and the search over CP. The
// measured side (plan against the training log's peaks, CP 2 and 4, GPT and Llama) is tests/e2e/plan_memory.sh.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "core/config/config.h"
#include "plan/planner.h"
#include "tests/unit/source_root.h"

namespace mt::plan {
namespace {

// Llama 3 8B at a 64k sequence, TP 1 and no SP, on `world` ranks: CP and the rest from `sets`.
Config long_llama(std::vector<std::string> sets, int64_t world) {
  sets.insert(sets.begin(), {"model.seq_length=65536", "model.max_position_embeddings=65536", "parallel.tensor=1",
                             "parallel.sequence_parallel=false", "parallel.distributed_optimizer=false",
                             "training.global_batch_size=8"});
  return load_config(testing_util::source_path("configs/llama3-8b.yaml"), sets, world);
}

double activations(const Prediction& p) { return p.memory.stages.at(0).bytes[MemKind::activation]; }

// Everything a layer keeps is per token, so it falls as 1/CP; the ring's two key/value blocks and its f32 partial
// outputs are per token too. What does not fall: nothing of size T at this shape, so within a few per cent of 1/CP.
TEST(PlanContext, ActivationsPerRankFallAsOneOverCp) {
  const Hardware h100 = builtin_hardware("h100-80gb");
  const double one = activations(predict(long_llama({"parallel.data=1"}, 1), h100));
  for (int64_t cp : {2, 4, 8}) {
    const double at =
        activations(predict(long_llama({fmt::format("parallel.context={}", cp), "parallel.data=1"}, cp), h100));
    const double ratio = one / at;
    fmt::print("CP {}: activations {:.2f} GiB per rank, {:.2f}x less than one rank's {:.2f} GiB\n", cp,
               at / 1073741824.0, ratio, one / 1073741824.0);
    EXPECT_GT(ratio, 0.95 * static_cast<double>(cp));
    EXPECT_LE(ratio, static_cast<double>(cp) * 1.001);
  }
}

// All-gather holds every rank's keys and values at once (CP blocks, and their f32 gradients in backward), the ring
// two: with 8 key/value heads of 128 at 64k / 4 tokens a block is 64 MiB in bf16. (A small vocabulary, so the
// peak is the first backward layer's attention and not the head's logits.)
TEST(PlanContext, AllGatherHoldsEveryRanksKeysTheRingTwo) {
  const Hardware h100 = builtin_hardware("h100-80gb");
  const double ring =
      activations(predict(long_llama({"parallel.context=4", "parallel.data=1", "model.vocab_size=1024"}, 4), h100));
  const double gathered = activations(predict(
      long_llama({"parallel.context=4", "parallel.context_comm=allgather", "parallel.data=1", "model.vocab_size=1024"},
                 4),
      h100));
  const double block = 16384.0 * 8 * 2 * 128 * 2;  // (B, T / CP, G, 2, D) bf16
  // Forward holds CP - 1 = 3 blocks more; backward 3 more and CP - 1 = 3 more f32 gradient blocks (6 bf16 blocks):
  // the peak grows by 3 to 9 blocks, as it falls in either.
  fmt::print("all-gather holds {:.2f} blocks more at the peak than the ring\n", (gathered - ring) / block);
  EXPECT_GE(gathered - ring, 3 * block);
  EXPECT_LE(gathered - ring, 9 * block);
}

// The step time: attention per rank is 1/CP of the causal work; the ring's transfers hide behind it where the
// link is fast enough, the all-gather's are exposed; the gradients reduce over the context ranks even at DP 1.
TEST(PlanContext, StepTimeCountsTheTransfersAndReducesOverDataTimesContext) {
  const Hardware h100 = builtin_hardware("h100-80gb");
  const Prediction one = predict(long_llama({"parallel.data=1"}, 1), h100);
  const Prediction ring = predict(long_llama({"parallel.context=4", "parallel.data=1"}, 4), h100);
  const Prediction gathered =
      predict(long_llama({"parallel.context=4", "parallel.context_comm=allgather", "parallel.data=1"}, 4), h100);
  EXPECT_EQ(one.time.cp_comm, 0);
  EXPECT_EQ(one.time.dp_comm, 0);
  EXPECT_NEAR(ring.time.attention, one.time.attention / 4, 0.05 * one.time.attention / 4);
  EXPECT_GT(ring.time.cp_comm, 0);  // the key/value gradients' hops are waited on
  EXPECT_GT(gathered.time.cp_comm, ring.time.cp_comm);
  EXPECT_GT(ring.time.dp_comm, 0);  // 4 replicas of the weights
  EXPECT_LT(ring.time.total, one.time.total);
  // The same gradient bytes over 4 context ranks as over 4 data-parallel ones.
  const Prediction dp4 = predict(long_llama({"parallel.data=4", "training.global_batch_size=8"}, 4), h100);
  EXPECT_NEAR(ring.time.dp_comm, dp4.time.dp_comm, 1e-9);
}

// ZeRO shards the optimizer state over the data x context ranks: CP 2 x DP 2 holds what DP 4 holds.
TEST(PlanContext, DistributedOptimizerShardsOverDataTimesContext) {
  const Hardware h100 = builtin_hardware("h100-80gb");
  const Prediction cpdp =
      predict(long_llama({"parallel.context=2", "parallel.data=2", "parallel.distributed_optimizer=true"}, 4), h100);
  const Prediction dp4 = predict(long_llama({"parallel.data=4", "parallel.distributed_optimizer=true"}, 4), h100);
  EXPECT_EQ(cpdp.memory.stages[0].bytes[MemKind::optimizer], dp4.memory.stages[0].bytes[MemKind::optimizer]);
}

// A 64k sequence of Llama 3 8B does not fit one H100's activations without cutting the sequence: the search finds
// CP layouts, keeps each one's sequence divisible by 2 CP (x TP with SP), and tries the ring and the all-gather.
TEST(PlanContext, SearchTriesContextParallelismAndBothCommunications) {
  const Hardware h100 = builtin_hardware("h100-80gb");
  const std::vector<Prediction> ranked =
      search(long_llama({"parallel.data=8"}, 8), 8, h100, {.micro_batch_sizes = {1}, .max_virtual_pipeline = 2});
  ASSERT_FALSE(ranked.empty());
  bool ring = false, gathered = false;
  for (const Prediction& p : ranked) {
    const int64_t cp = p.layout.context, tp = p.layout.tensor;
    EXPECT_EQ(p.config.parallel.context, cp);
    EXPECT_EQ(65536 % (2 * cp), 0);
    if (p.layout.sequence_parallel) {
      EXPECT_EQ((65536 / cp) % tp, 0);
    }
    if (cp > 1) (p.layout.context_allgather ? gathered : ring) = true;
  }
  EXPECT_TRUE(ring);
  EXPECT_TRUE(gathered);
  fmt::print("fastest: {} ({:.1f} GiB)\n", describe(ranked.front().layout),
             ranked.front().memory.max_total() / 1073741824.0);
  EXPECT_GT(ranked.front().layout.context, 1);
}

// CP serves a MoE capacity factor (its drops decided over the whole microbatch) and dropout (the masks keyed by
// global positions), so models with either are searched with it.
TEST(PlanContext, SearchTriesContextParallelismWithCapacityAndDropout) {
  const Hardware h100 = builtin_hardware("h100-80gb");
  const SearchOptions opt{.micro_batch_sizes = {1}, .max_virtual_pipeline = 1};
  const std::vector<std::string> moe = {"parallel.data=8", "model.seq_length=4096", "model.moe.num_experts=8",
                                        "model.moe.top_k=2", "model.moe.ffn_hidden_size=2048"};
  bool context = false;
  for (const Prediction& p : search(long_llama(moe, 8), 8, h100, opt)) context |= p.layout.context > 1;
  EXPECT_TRUE(context) << "dropless MoE searched without CP";
  std::vector<std::string> capacity = moe;
  capacity.push_back("model.moe.capacity_factor=1.25");
  context = false;
  for (const Prediction& p : search(long_llama(capacity, 8), 8, h100, opt)) context |= p.layout.context > 1;
  EXPECT_TRUE(context) << "MoE with a capacity factor searched without CP";
  context = false;
  for (const Prediction& p :
       search(long_llama({"parallel.data=8", "model.dropout=0.1", "model.seq_length=4096"}, 8), 8, h100, opt))
    context |= p.layout.context > 1;
  EXPECT_TRUE(context) << "dropout searched without CP";
}

}  // namespace
}  // namespace mt::plan

namespace mt::plan {
namespace {

// Chunks shorter than SearchOptions::min_context_chunk are not searched: at a 4096 sequence, CP 2 (chunks of 1024)
// and not CP 4 (512).
TEST(PlanContext, SearchKeepsChunksOfAtLeastMinContextChunkTokens) {
  const Hardware h100 = builtin_hardware("h100-80gb");
  const Config c = long_llama({"parallel.data=8", "model.seq_length=4096"}, 8);
  int64_t most = 1;
  for (const Prediction& p : search(c, 8, h100, {.micro_batch_sizes = {1}, .max_virtual_pipeline = 1}))
    most = std::max(most, p.layout.context);
  EXPECT_EQ(most, 2);
}

}  // namespace
}  // namespace mt::plan
