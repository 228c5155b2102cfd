// finite.h: finding the inf and NaN values of a tensor, to name them where a non-finite weight, gradient or
// logit must not go on (an HF import, ckpt inspect --verify, a non-finite training step, generate).
#pragma once
#include <cstdint>
#include <span>
#include <string>

#include "core/tensor/tensor.h"

namespace mt {

// The inf and NaN values among some values: how many, and the first one's (flat) index and value.
struct NonFinite {
  int64_t count = 0;
  int64_t first = -1;  // -1 when count is 0
  float first_value = 0;
  explicit operator bool() const { return count > 0; }
};

NonFinite find_nonfinite(std::span<const float> values);
// Any floating dtype on any device (a copy to the host as floats unless it is an f32 host tensor).
NonFinite find_nonfinite(const Tensor& t);

// "3 of 48 values are not finite (the first, nan, at index 5)".
std::string describe(const NonFinite& n, int64_t numel);

}  // namespace mt
