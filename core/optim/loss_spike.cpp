#include "core/optim/loss_spike.h"

#include <algorithm>
#include <cmath>

namespace mt {

bool LossSpikeDetector::observe(double loss) {
  if (!std::isfinite(loss)) return false;
  mean_before_ = s_.mean;
  // Both conditions as one threshold: above mean + k sigma and above mean * ratio.
  threshold_before_ = std::max(s_.mean + opt_.sigmas * std::sqrt(s_.var), s_.mean * opt_.ratio);
  const bool spike = s_.count >= opt_.warmup && s_.count > 0 && loss > threshold_before_;
  const double x = spike ? threshold_before_ : loss;
  if (s_.count == 0) {
    s_.mean = x;
    s_.var = 0;
  } else {
    // West's exponentially weighted mean and variance.
    const double alpha = 2.0 / (static_cast<double>(opt_.window) + 1.0);
    const double diff = x - s_.mean, incr = alpha * diff;
    s_.mean += incr;
    s_.var = (1.0 - alpha) * (s_.var + diff * incr);
  }
  ++s_.count;
  return spike;
}

}  // namespace mt
