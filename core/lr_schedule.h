// lr_schedule.h: linear warmup to the peak learning rate, then one of Megatron's decays to min_lr: cosine, linear,
// none (constant), warmup-stable-decay (wsd) or inverse square root.
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
  // wsd: the peak holds until the last wsd_decay_fraction * decay_iters steps, which anneal in this shape.
  double wsd_decay_fraction = 0.2;
  WsdShape wsd_decay_style = WsdShape::exponential;

  // Learning rate of optimizer step `step` (1-based count of successful steps, so skipped fp16 steps
  // do not advance the schedule).
  double at(int64_t step) const;
};

}  // namespace mt
