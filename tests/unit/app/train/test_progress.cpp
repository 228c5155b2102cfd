// test_progress.cpp: what a person watching a run reads: the interval line (short by default, Megatron's long
// one with logging.verbose_line), its elapsed time and ETA, and the loss spike detector with its checkpoint state.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>

#include "app/train/metrics.h"
#include "app/train/train_state.h"
#include "core/optim/loss_spike.h"

using namespace mt;

namespace {

// A GPU run well under way: the figures of a typical interval.
app::IntervalReport gpu_report() {
  return app::IntervalReport{.iteration = 1200,
                             .train_iters = 100000,
                             .consumed_samples = 1200 * 512,
                             .consumed_tokens = 1200 * 512 * 2048,
                             .ms_per_iter = 8123.4,
                             .tokens_per_s = 129084,
                             .tflops_per_gpu = 412.34,
                             .peak_tflops = 989.4,
                             .lr = 3e-4f,
                             .loss = 3.45212,
                             .loss_scale = 1,
                             .grad_norm = 1.2345,
                             .peak_bytes = 60LL << 30,
                             .device = Device::cuda,
                             .elapsed_s = 3723,
                             .eta_s = 273000};
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(ProgressLine, DurationsReadAtAGlance) {
  EXPECT_EQ(app::format_duration(0), "0s");
  EXPECT_EQ(app::format_duration(59.4), "59s");
  EXPECT_EQ(app::format_duration(60), "1m00s");
  EXPECT_EQ(app::format_duration(725), "12m05s");
  EXPECT_EQ(app::format_duration(3723), "1h02m");
  EXPECT_EQ(app::format_duration(86400 * 2 + 3 * 3600 + 59), "2d03h");
  EXPECT_EQ(app::format_duration(std::numeric_limits<double>::quiet_NaN()), "?");
}

TEST(ProgressLine, EtaIsTheRemainingIterationsAtThePace) {
  EXPECT_DOUBLE_EQ(app::eta_seconds(100, 1000, 0.5), 450.0);
  EXPECT_DOUBLE_EQ(app::eta_seconds(1000, 1000, 0.5), 0.0);
  EXPECT_DOUBLE_EQ(app::eta_seconds(1200, 1000, 0.5), 0.0);  // past the end (a resumed longer run): nothing left
}

TEST(ProgressLine, ShortLineFitsAConsoleAndShowsWhatMatters) {
  const std::string line = app::interval_line(gpu_report());
  EXPECT_LE(line.size(), 130u) << line;
  for (const char* part : {"iter 1200/100000", "1h02m ETA 3d03h", "loss 3.4521", "lr 3.00e-04", "grad norm 1.234",
                           "129084 tokens/s", "412 TFLOP/s/GPU", "MFU 41.7%"})
    EXPECT_TRUE(contains(line, part)) << part << " missing from: " << line;
  // Zero counters, the loss scale of a run without one and the samples stay in metrics.jsonl.
  for (const char* part : {"skipped", "nan", "loss scale", "consumed"})
    EXPECT_FALSE(contains(line, part)) << part << " in: " << line;
}

TEST(ProgressLine, ShortLineAddsCountersLossScaleAndOnlyKnownMfu) {
  app::IntervalReport r = gpu_report();
  r.skipped_iters = 3;
  r.nan_iters = 1;
  r.fp16 = true;
  r.loss_scale = 65536;
  r.peak_tflops = 0;  // a GPU whose peak is unknown, or the CPU
  const std::string line = app::interval_line(r);
  EXPECT_TRUE(contains(line, "| skipped 3")) << line;
  EXPECT_TRUE(contains(line, "| nan 1")) << line;
  EXPECT_TRUE(contains(line, "| loss scale 65536")) << line;
  EXPECT_FALSE(contains(line, "MFU")) << line;
  EXPECT_LE(line.size(), 160u) << line;  // everything at once: still one line
}

// fp16's overflow steps printed "grad norm -nan | ... | nan 0".
TEST(ProgressLine, AnOverflowStepSaysSoInsteadOfNan) {
  app::IntervalReport r = gpu_report();
  r.fp16 = true;
  r.last_overflow = true;
  r.grad_norm = std::numeric_limits<double>::quiet_NaN();
  EXPECT_TRUE(contains(app::interval_line(r), "grad norm overflow (step skipped)")) << app::interval_line(r);
  r.verbose_line = true;
  const std::string verbose = app::interval_line(r);
  EXPECT_TRUE(contains(verbose, "grad norm overflow (step skipped)")) << verbose;
  EXPECT_FALSE(contains(verbose, "nan |")) << verbose;
  r.fp16 = false;  // bf16 / fp32: not a loss-scale overflow
  EXPECT_TRUE(contains(app::interval_line(r), "grad norm not finite (step skipped)"));
}

TEST(ProgressLine, VerboseLineKeepsEveryFigure) {
  app::IntervalReport r = gpu_report();
  r.verbose_line = true;
  const std::string line = app::interval_line(r);
  for (const char* part :
       {"iteration    1200/100000", "consumed samples", "ms/iter", "tokens/s", "TFLOP/s/GPU", "MFU  41.7%",
        "loss scale 1", "grad norm 1.2345", "skipped 0", "nan 0", "elapsed 1h02m", "ETA 3d03h"})
    EXPECT_TRUE(contains(line, part)) << part << " missing from: " << line;
}

namespace {

LossSpikeOptions spike_options() { return {.window = 50, .warmup = 50, .sigmas = 6, .ratio = 1.2}; }

}  // namespace

// A falling curve with batch noise (a few percent, heavier tails now and then) is never a spike.
TEST(LossSpike, NoFalseSpikeOnANoisyFallingCurve) {
  LossSpikeDetector d(spike_options());
  std::mt19937 rng(7);
  std::normal_distribution<double> noise(0.0, 0.03);
  for (int i = 0; i < 5000; ++i) {
    const double loss = 2.5 + 8.0 * std::exp(-i / 300.0);
    const double n = noise(rng) * (i % 97 == 0 ? 3.0 : 1.0);
    EXPECT_FALSE(d.observe(loss * (1.0 + n))) << "iteration " << i;
  }
}

TEST(LossSpike, ASpikeIsFlaggedAgainstTheRunningMean) {
  LossSpikeDetector d(spike_options());
  std::mt19937 rng(1);
  std::normal_distribution<double> noise(0.0, 0.01);
  for (int i = 0; i < 200; ++i) ASSERT_FALSE(d.observe(3.0 + noise(rng)));
  EXPECT_TRUE(d.observe(6.0));
  EXPECT_NEAR(d.mean_before(), 3.0, 0.01);
  EXPECT_GE(d.threshold_before(), d.mean_before() * 1.2);
  // The spike entered clipped: the mean barely moved and the next normal loss is no spike.
  EXPECT_LT(d.state().mean, 3.05);
  EXPECT_FALSE(d.observe(3.0));
  // Non-finite losses are the NaN counter's business, and leave the statistics alone.
  const LossSpikeDetector::State before = d.state();
  EXPECT_FALSE(d.observe(std::numeric_limits<double>::infinity()));
  EXPECT_FALSE(d.observe(std::numeric_limits<double>::quiet_NaN()));
  EXPECT_EQ(d.state().count, before.count);
}

TEST(LossSpike, NothingIsFlaggedDuringWarmup) {
  LossSpikeDetector d(spike_options());
  for (int i = 0; i < 49; ++i) EXPECT_FALSE(d.observe(i % 2 ? 3.0 : 30.0));
}

// Both conditions: a quiet curve's tiny step up is many sigmas but not `ratio` above the mean.
TEST(LossSpike, NeedsBothSigmasAndRatio) {
  LossSpikeDetector d(spike_options());
  for (int i = 0; i < 100; ++i) ASSERT_FALSE(d.observe(3.0 + (i % 2) * 1e-4));
  EXPECT_FALSE(d.observe(3.1));  // 1000 sigmas, 3% up
  EXPECT_TRUE(d.observe(3.7));
}

// A lasting jump (a new data mix) is flagged for a while, then followed: skip cannot skip forever.
TEST(LossSpike, ALastingLevelShiftIsFollowed) {
  LossSpikeDetector d(spike_options());
  for (int i = 0; i < 100; ++i) ASSERT_FALSE(d.observe(3.0 + (i % 2) * 0.01));
  int flagged = 0;
  for (int i = 0; i < 1000; ++i) flagged += d.observe(4.5 + (i % 2) * 0.01);
  EXPECT_GT(flagged, 0);
  EXPECT_LT(flagged, 200);
  EXPECT_NEAR(d.state().mean, 4.5, 0.05);
}

TEST(LossSpike, StateTravelsInTheCheckpoint) {
  app::TrainState t;
  t.iteration = 10;
  t.consumed_samples = 80;
  t.optimizer_steps = 10;
  t.loss_spike = {.count = 10, .mean = 3.0000000000000004, .var = 0.1234567891234};
  CheckpointState s;
  t.save(s);
  const app::TrainState back = app::TrainState::load(s, "ck");
  EXPECT_EQ(back.loss_spike.count, 10);
  EXPECT_EQ(back.loss_spike.mean, t.loss_spike.mean);  // exactly: a resumed run flags what the first would
  EXPECT_EQ(back.loss_spike.var, t.loss_spike.var);
  s.values["loss_spike_var"] = "-1";
  EXPECT_THROW(app::TrainState::load(s, "ck"), CheckpointError);
  // Older checkpoints have no statistics: a fresh detector.
  for (const char* k : {"loss_spike_count", "loss_spike_mean", "loss_spike_var"}) s.values.erase(k);
  EXPECT_EQ(app::TrainState::load(s, "ck").loss_spike.count, 0);
}
