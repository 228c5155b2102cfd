// loss_scaler.h: Megatron's dynamic loss scaler for fp16 (and the constant scale 1 for fp32/bf16).
#pragma once
#include <cstdint>

namespace mt {

struct LossScalerOptions {
  double initial = 4294967296.0;  // 2^32
  double min = 1.0;
  int64_t window = 1000;   // clean steps before the scale grows
  int64_t hysteresis = 2;  // overflowing steps tolerated before the scale backs off
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
};

class LossScaler {
 public:
  // dynamic = false: the scale stays 1 and update() only reports.
  LossScaler(bool dynamic, LossScalerOptions opt);
  double scale() const { return scale_; }
  bool dynamic() const { return dynamic_; }
  // After each step: found_inf means the step was skipped. Backs off once hysteresis overflows have been
  // seen (then on every further overflow), grows after `window` clean steps in a row.
  void update(bool found_inf);

  // Resumable state.
  struct State {
    double scale;
    int64_t growth_tracker;
    int64_t hysteresis_tracker;
  };
  State state() const { return {scale_, growth_tracker_, hysteresis_tracker_}; }
  void restore(const State& s);

 private:
  bool dynamic_;
  LossScalerOptions opt_;
  double scale_;
  int64_t growth_tracker_ = 0;
  int64_t hysteresis_tracker_;
};

}  // namespace mt
