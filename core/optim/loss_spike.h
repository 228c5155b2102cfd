// loss_spike.h: a loss spike detector over running statistics of the per-iteration loss (training.loss_spike,
// see LossSpikeConfig in core/config/config.h for the rule and its defaults).
#pragma once
#include <cstdint>

namespace mt {

struct LossSpikeOptions {
  int64_t window = 100;  // exponential smoothing 2 / (window + 1)
  int64_t warmup = 100;  // losses fed before any spike is flagged
  double sigmas = 6.0;   // a spike is above mean + sigmas * stddev ...
  double ratio = 1.2;    // ... and above mean * ratio
};

class LossSpikeDetector {
 public:
  // What a checkpoint keeps, so that a resumed run flags the spikes an uninterrupted one would.
  struct State {
    int64_t count = 0;  // finite losses fed so far
    double mean = 0, var = 0;
  };

  explicit LossSpikeDetector(LossSpikeOptions opt) : opt_(opt) {}

  // Feeds one iteration's loss; true when it is a spike. A non-finite loss is no spike (the NaN counters and
  // training.max_nonfinite_iters deal with it) and leaves the statistics alone; a spike enters them clipped to
  // the threshold.
  bool observe(double loss);
  // The running mean and standard deviation before the last observe (what a spike was compared with).
  double mean_before() const { return mean_before_; }
  double threshold_before() const { return threshold_before_; }
  const State& state() const { return s_; }
  void restore(const State& s) { s_ = s; }

 private:
  LossSpikeOptions opt_;
  State s_;
  double mean_before_ = 0, threshold_before_ = 0;
};

}  // namespace mt
