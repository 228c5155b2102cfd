// test_meta_step.cpp: the trainer's step on the meta device (app/train/meta_step.h). Its memory is the trainer's by
// construction; what is checked here is what the measurement adds: the microbatches it measures reach the config's
// peaks on every stage and schedule, a layout of any size is measured without its memory, and the zero-bubble V
// weights it gives the trainer.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "app/train/meta_step.h"
#include "core/config/config.h"

namespace mt::app {
namespace {

Config layout(const std::string& parallel, int64_t world, int64_t global_batch, const std::string& arch = "gpt") {
  const std::string yaml = fmt::format(
      "model: {{arch: {}, num_layers: 8, hidden_size: 32, num_heads: 4, ffn_hidden_size: 64, seq_length: 16, "
      "vocab_size: 64}}\n"
      "parallel: {}\n"
      "training: {{micro_batch_size: 1, global_batch_size: {}, train_iters: 1, precision: bf16}}\n"
      "optimizer: {{lr: 1.0e-3, warmup_iters: 0}}\n"
      "data: {{synthetic: true}}\n",
      arch, parallel, global_batch);
  return parse_config(yaml, "meta.yaml", {}, world);
}

TEST(MetaStep, FewerMicrobatchesReachTheConfigsPeaksOnEveryStage) {
  struct Case {
    std::string parallel;
    int64_t world;
  };
  for (const Case& c :
       {Case{"{pipeline: 1, data: 1}", 1}, Case{"{pipeline: 2}", 2}, Case{"{pipeline: 4}", 4},
        Case{"{pipeline: 2, virtual_pipeline: 2}", 2}, Case{"{pipeline: 2, pipeline_schedule: zb-h1}", 2},
        Case{"{pipeline: 2, virtual_pipeline: 2, pipeline_schedule: zb-v}", 2},
        Case{"{pipeline: 4, virtual_pipeline: 2}", 4}, Case{"{pipeline: 4, pipeline_schedule: zb-h1}", 4},
        Case{"{pipeline: 4, virtual_pipeline: 2, pipeline_schedule: zb-v}", 4},
        Case{"{pipeline: 2, data: 2, shard: gradients, grad_bucket_size: 2000}", 4},
        Case{"{data: 2, shard: gradients, grad_bucket_size: 2000}", 2},
        Case{"{data: 2, shard: parameters, grad_bucket_size: 2000}", 2},
        Case{"{pipeline: 2, virtual_pipeline: 2, data: 2, shard: parameters}", 4}}) {
    const Config cfg = layout(c.parallel, c.world, 48);
    const int64_t fewer = peaks_microbatches(cfg);
    ASSERT_LT(fewer, cfg.training.num_microbatches / 2) << c.parallel;
    for (int stage = 0; stage < cfg.parallel.pipeline; ++stage) {
      const MetaStep all = measure_step(cfg, stage, {});
      const MetaStep some = measure_step(cfg, stage, {.microbatches = fewer});
      EXPECT_EQ(all.memory.peak, some.memory.peak) << c.parallel << " stage " << stage;
      EXPECT_EQ(all.memory.peak_total, some.memory.peak_total) << c.parallel << " stage " << stage;
      EXPECT_EQ(all.peak_in_flight, some.peak_in_flight) << c.parallel << " stage " << stage;
      EXPECT_EQ(all.parameters, some.parameters);
      // The ops scale with the microbatches (the GEMMs' FLOPs above all).
      EXPECT_GT(all.counts.flops(), some.counts.flops());
    }
  }
}

TEST(MetaStep, MeasuresALayoutFarLargerThanThisMachine) {
  // An 8B-sized Llama on TP 8: 2 GB of parameters on the rank measured, none of it allocated.
  const std::string yaml =
      "model: {arch: llama, num_layers: 32, hidden_size: 4096, num_heads: 32, num_query_groups: 8, "
      "ffn_hidden_size: 14336, seq_length: 8192, vocab_size: 128256}\n"
      "parallel: {tensor: 8, sequence_parallel: true}\n"
      "training: {micro_batch_size: 1, global_batch_size: 8, train_iters: 1, precision: bf16}\n"
      "optimizer: {lr: 1.0e-3, warmup_iters: 0}\n"
      "data: {synthetic: true}\n";
  const Config cfg = parse_config(yaml, "llama8b.yaml", {}, 8);
  const MetaStep step = measure_step(cfg, 0, {.mirror = meta::Mirror::cuda, .microbatches = 1});
  const double params = static_cast<double>(step.parameters);
  EXPECT_GT(params, 8.0e9 / 8 * 0.95);
  EXPECT_LT(params, 8.1e9 / 8 * 1.05);
  EXPECT_EQ(step.memory.peak[static_cast<size_t>(MemKind::parameter)], 2 * step.parameters);
  EXPECT_GT(step.memory.peak_total, int64_t{10} << 30);
  // 6 N T FLOPs per token and more (attention): the GEMMs of a training step of T tokens.
  EXPECT_GT(step.counts.flops(), 6.0 * params * 8192);
}

TEST(MetaStep, ZeroBubbleVWeighsItsPairsOnlyForZbV) {
  EXPECT_TRUE(measure_schedule_memory(layout("{pipeline: 2}", 2, 8), meta::Mirror::cpu).forward.empty());
  const ScheduleMemory m = measure_schedule_memory(
      layout("{pipeline: 2, virtual_pipeline: 2, pipeline_schedule: zb-v}", 2, 8), meta::Mirror::cpu);
  ASSERT_EQ(m.forward.size(), 4u);
  ASSERT_EQ(m.backward_input.size(), 4u);
  EXPECT_EQ(m.forward[1], 1.0);                         // the unit: stage p - 1's first chunk, layers only
  EXPECT_GT(m.forward[3], 1.0);                         // the last virtual stage keeps the head's logits too
  for (double b : m.backward_input) EXPECT_LT(b, 0.5);  // B frees most of what the forward kept
}

}  // namespace
}  // namespace mt::app
