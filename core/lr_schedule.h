// lr_schedule.h: linear warmup to the peak learning rate, then cosine, linear or no decay to min_lr.
#pragma once
#include <cstdint>

#include "core/config/config.h"

namespace mt {

struct LrSchedule {
  double lr = 0;  // peak
  double min_lr = 0;
  int64_t warmup_iters = 0;
  int64_t decay_iters = 0;  // the step at which min_lr is reached (warmup included)
  LrDecay decay = LrDecay::cosine;

  // Learning rate of optimizer step `step` (1-based count of successful steps, so skipped fp16 steps
  // do not advance the schedule).
  double at(int64_t step) const;
};

}  // namespace mt
