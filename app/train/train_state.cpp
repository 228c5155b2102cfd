#include "app/train/train_state.h"

#include <limits>

#include <fmt/format.h>

namespace mt::app {

namespace {

// The keys of metadata.yaml's state map (stable: checkpoints written since the first release use them).
constexpr const char* kConsumed = "consumed_samples";
constexpr const char* kSkipped = "skipped_iters";
constexpr const char* kNan = "nan_iters";
constexpr const char* kSteps = "optimizer_steps";
constexpr const char* kScale = "loss_scale";
constexpr const char* kGrowth = "loss_scale_growth_tracker";
constexpr const char* kHysteresis = "loss_scale_hysteresis_tracker";
constexpr const char* kSeed = "seed";
constexpr const char* kSpikeCount = "loss_spike_count";
constexpr const char* kSpikeMean = "loss_spike_mean";
constexpr const char* kSpikeVar = "loss_spike_var";

class StateReader {
 public:
  StateReader(const CheckpointState& s, const std::string& dir) : s_(s), dir_(dir) {}

  [[noreturn]] void fail(const std::string& key, const std::string& why) const {
    throw CheckpointError(fmt::format("{}: state value '{}' {}", dir_, key, why));
  }
  int64_t integer(const char* key) const {
    const std::string& v = value(key);
    try {
      size_t used = 0;
      const int64_t x = std::stoll(v, &used);
      if (used == v.size()) return x;
    } catch (const std::exception&) {
    }
    throw CheckpointError(fmt::format("{}: state value '{}' = '{}' is not an integer", dir_, key, v));
  }
  bool has(const char* key) const { return s_.values.count(key) > 0; }
  double real(const char* key) const {
    const std::string& v = value(key);
    try {
      size_t used = 0;
      const double x = std::stod(v, &used);
      if (used == v.size() && std::isfinite(x)) return x;
    } catch (const std::exception&) {
    }
    throw CheckpointError(fmt::format("{}: state value '{}' = '{}' is not a finite number", dir_, key, v));
  }
  // A non-negative integer no larger than at_most (the iteration, for per-iteration counters).
  int64_t counter(const char* key, int64_t at_most, int64_t iteration) const {
    const int64_t v = integer(key);
    if (v < 0) fail(key, fmt::format("= {} is negative", v));
    if (v > at_most) fail(key, fmt::format("= {} is more than the iteration {}", v, iteration));
    return v;
  }

 private:
  const std::string& value(const char* key) const {
    auto it = s_.values.find(key);
    if (it == s_.values.end()) throw CheckpointError(fmt::format("{}: metadata lacks state value '{}'", dir_, key));
    return it->second;
  }
  const CheckpointState& s_;
  const std::string& dir_;
};

}  // namespace

void TrainState::save(CheckpointState& s) const {
  s.iteration = iteration;
  s.values = {{kConsumed, std::to_string(consumed_samples)},
              {kSkipped, std::to_string(skipped_iters)},
              {kNan, std::to_string(nan_iters)},
              {kSteps, std::to_string(optimizer_steps)},
              {kScale, fmt::format("{}", loss_scaler.scale)},
              {kGrowth, std::to_string(loss_scaler.growth_tracker)},
              {kHysteresis, std::to_string(loss_scaler.hysteresis_tracker)},
              {kSeed, std::to_string(seed)}};
  if (loss_spike.count > 0) {  // a detector never fed reads back as absent
    s.values[kSpikeCount] = std::to_string(loss_spike.count);
    s.values[kSpikeMean] = fmt::format("{}", loss_spike.mean);  // the shortest form that reads back exactly
    s.values[kSpikeVar] = fmt::format("{}", loss_spike.var);
  }
}

TrainState TrainState::load(const CheckpointState& s, const std::string& dir) {
  const StateReader r(s, dir);
  TrainState t;
  t.iteration = s.iteration;
  if (t.iteration < 0) r.fail("iteration", fmt::format("= {} is negative", t.iteration));
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  const int64_t it = t.iteration;
  t.consumed_samples = r.counter(kConsumed, kMax, it);
  if (t.consumed_samples < it)
    r.fail(kConsumed,
           fmt::format("= {} is less than one sample per iteration ({} iterations)", t.consumed_samples, it));
  t.skipped_iters = r.counter(kSkipped, it, it);
  t.nan_iters = r.counter(kNan, it, it);
  t.optimizer_steps = r.counter(kSteps, it, it);
  if (t.optimizer_steps + t.skipped_iters != it)
    r.fail(kSteps,
           fmt::format("= {} plus skipped_iters = {} is not the iteration {}", t.optimizer_steps, t.skipped_iters, it));
  t.loss_scaler.scale = r.real(kScale);
  if (!(t.loss_scaler.scale > 0)) r.fail(kScale, fmt::format("= {} is not positive", t.loss_scaler.scale));
  t.loss_scaler.growth_tracker = r.counter(kGrowth, kMax, it);
  t.loss_scaler.hysteresis_tracker = r.counter(kHysteresis, kMax, it);
  t.seed = r.counter(kSeed, kMax, it);
  if (r.has(kSpikeCount) || r.has(kSpikeMean) || r.has(kSpikeVar)) {
    t.loss_spike.count = r.counter(kSpikeCount, it, it);
    t.loss_spike.mean = r.real(kSpikeMean);
    t.loss_spike.var = r.real(kSpikeVar);
    if (t.loss_spike.var < 0) r.fail(kSpikeVar, fmt::format("= {} is negative", t.loss_spike.var));
  }
  return t;
}

}  // namespace mt::app
