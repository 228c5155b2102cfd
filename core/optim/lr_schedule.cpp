#include "core/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace mt {
namespace {

// The share of the peak-to-min_lr gap left after a fraction `ratio` in [0, 1] of a wsd anneal (Megatron's
// formulas: exponential halves the gap's double each unit, 1-sqrt drops fast at first then slowly).
double wsd_coeff(WsdShape shape, double ratio) {
  switch (shape) {
    case WsdShape::linear:
      return 1.0 - ratio;
    case WsdShape::cosine:
      return 0.5 * (std::cos(M_PI * ratio) + 1.0);
    case WsdShape::exponential:
      return 2.0 * std::pow(0.5, ratio) - 1.0;
    case WsdShape::one_minus_sqrt:
      return 1.0 - std::sqrt(ratio);
  }
  return 0.0;
}

}  // namespace

double LrSchedule::at(int64_t step) const {
  if (warmup_iters > 0 && step <= warmup_iters)
    return lr * static_cast<double>(step) / static_cast<double>(warmup_iters);
  if (decay == LrDecay::constant) return lr;
  if (decay == LrDecay::inverse_square_root) {
    // As Megatron: min_lr once past decay_iters (by default train_iters, so never within a run).
    if (step > decay_iters) return min_lr;
    const double w = static_cast<double>(std::max<int64_t>(warmup_iters, 1));
    return std::max(min_lr, lr * std::sqrt(w) / std::sqrt(static_cast<double>(std::max<int64_t>(step, 1))));
  }
  if (step >= decay_iters) return min_lr;
  if (decay == LrDecay::wsd) {
    const double anneal = wsd_decay_fraction * static_cast<double>(decay_iters);  // steps, > 0
    const double anneal_start = static_cast<double>(decay_iters) - anneal;
    if (static_cast<double>(step) <= anneal_start) return lr;
    return min_lr + wsd_coeff(wsd_decay_style, (static_cast<double>(step) - anneal_start) / anneal) * (lr - min_lr);
  }
  double ratio =
      static_cast<double>(step - warmup_iters) / static_cast<double>(std::max<int64_t>(1, decay_iters - warmup_iters));
  double coeff = decay == LrDecay::linear ? 1.0 - ratio : 0.5 * (std::cos(M_PI * ratio) + 1.0);
  return min_lr + coeff * (lr - min_lr);
}

}  // namespace mt
