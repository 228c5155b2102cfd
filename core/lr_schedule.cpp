#include "core/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace mt {

double LrSchedule::at(int64_t step) const {
  if (warmup_iters > 0 && step <= warmup_iters)
    return lr * static_cast<double>(step) / static_cast<double>(warmup_iters);
  if (decay == LrDecay::constant) return lr;
  if (step >= decay_iters) return min_lr;
  double ratio =
      static_cast<double>(step - warmup_iters) / static_cast<double>(std::max<int64_t>(1, decay_iters - warmup_iters));
  double coeff = decay == LrDecay::linear ? 1.0 - ratio : 0.5 * (std::cos(M_PI * ratio) + 1.0);
  return min_lr + coeff * (lr - min_lr);
}

}  // namespace mt
