// straggler.cpp: the ranks' busy times compared within their pipeline stage (straggler.h).
#include "app/train/straggler.h"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

namespace mt::app {

StragglerWatch::StragglerWatch(double margin, int ranks_per_stage, int reports)
    : margin_(margin), per_stage_(std::max(1, ranks_per_stage)), reports_(std::max(1, reports)) {}

StragglerVerdict StragglerWatch::observe(const std::vector<double>& busy_ms) {
  if (busy_ms.empty() || busy_ms.size() % static_cast<size_t>(per_stage_) != 0)
    throw std::logic_error(
        fmt::format("straggler watch: {} ranks' times for stages of {} ranks", busy_ms.size(), per_stage_));
  StragglerVerdict v;
  v.excess = -1;
  for (size_t s = 0; s < busy_ms.size(); s += static_cast<size_t>(per_stage_)) {
    std::vector<double> stage(busy_ms.begin() + static_cast<std::ptrdiff_t>(s),
                              busy_ms.begin() + static_cast<std::ptrdiff_t>(s) + per_stage_);
    std::vector<double> sorted = stage;
    std::sort(sorted.begin(), sorted.end());
    const size_t n = sorted.size();
    const double median = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
    for (size_t i = 0; i < stage.size(); ++i) {
      const double excess = median > 0 ? stage[i] / median - 1 : 0;
      if (excess > v.excess) {
        v = {.slowest_rank = static_cast<int>(s + i), .busy_ms = stage[i], .median_ms = median, .excess = excess};
      }
    }
  }
  const bool slow = margin_ > 0 && per_stage_ > 1 && v.excess > margin_;
  if (slow && slow_rank_ == v.slowest_rank) {
    ++slow_for_;
  } else {
    slow_rank_ = slow ? std::optional<int>(v.slowest_rank) : std::nullopt;
    slow_for_ = slow ? 1 : 0;
  }
  v.intervals_slow = slow_for_;
  v.warn = slow && slow_for_ >= reports_;
  return v;
}

std::string straggler_line(const StragglerVerdict& v) {
  return fmt::format(
      "busy ms/iter (beside the collectives' waits): stage median {:.2f}, slowest rank {} {:.2f} ({:+.0f}%)",
      v.median_ms, v.slowest_rank, v.busy_ms, 100 * v.excess);
}

}  // namespace mt::app
