#include "core/optim/loss_scaler.h"

#include <algorithm>

namespace mt {

LossScaler::LossScaler(bool dynamic, LossScalerOptions opt)
    : dynamic_(dynamic), opt_(opt), scale_(dynamic ? opt.initial : 1.0), hysteresis_tracker_(opt.hysteresis) {}

void LossScaler::update(bool found_inf) {
  if (!dynamic_) return;
  if (found_inf) {
    growth_tracker_ = 0;
    if (--hysteresis_tracker_ <= 0) scale_ = std::max(scale_ * opt_.backoff_factor, opt_.min);
    return;
  }
  if (++growth_tracker_ == opt_.window) {
    growth_tracker_ = 0;
    hysteresis_tracker_ = opt_.hysteresis;
    scale_ *= opt_.growth_factor;
  }
}

void LossScaler::restore(const State& s) {
  scale_ = s.scale;
  growth_tracker_ = s.growth_tracker;
  hysteresis_tracker_ = s.hysteresis_tracker;
}

}  // namespace mt
