// lr_schedule.h: linear warmup to the peak learning rate, then one of Megatron's decays to min_lr: cosine, linear,
// none (constant), warmup-stable-decay (wsd) or inverse square root.
#pragma once
#include <array>
#include <cstdint>

#include "core/base/enum_names.h"

namespace mt {

// wsd: warmup-stable-decay (peak until the last optimizer.wsd_decay_fraction of decay_iters, then a WsdShape
// anneal to min_lr); inverse_square_root: lr * sqrt(warmup) / sqrt(step) after the warmup, floored at min_lr.
enum class LrDecay { cosine, linear, constant, wsd, inverse_square_root };
// The anneal of a wsd schedule (Megatron's --lr-wsd-decay-style; its minus_sqrt is our 1-sqrt).
enum class WsdShape { linear, cosine, exponential, one_minus_sqrt };
template <>
struct EnumNames<LrDecay> {
  static constexpr std::array names{"cosine", "linear", "constant", "wsd", "inverse_square_root"};
  static constexpr std::array<const char*, 0> planned{};
};
template <>
struct EnumNames<WsdShape> {
  static constexpr std::array names{"linear", "cosine", "exponential", "1-sqrt"};
  static constexpr std::array<const char*, 0> planned{};
};

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
