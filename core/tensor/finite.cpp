#include "core/tensor/finite.h"

#include <cmath>
#include <vector>

#include <fmt/format.h>

namespace mt {

NonFinite find_nonfinite(std::span<const float> values) {
  NonFinite n;
  for (size_t i = 0; i < values.size(); ++i) {
    if (std::isfinite(values[i])) continue;
    if (n.count++ == 0) {
      n.first = static_cast<int64_t>(i);
      n.first_value = values[i];
    }
  }
  return n;
}

NonFinite find_nonfinite(const Tensor& t) {
  if (t.dtype() == DType::f32 && t.device() == Device::cpu)
    return find_nonfinite(std::span<const float>(t.data<float>(), static_cast<size_t>(t.numel())));
  const std::vector<float> host = t.to_floats();
  return find_nonfinite(host);
}

std::string describe(const NonFinite& n, int64_t numel) {
  return fmt::format("{} of {} values {} not finite (the first, {}, at index {})", n.count, numel,
                     n.count == 1 ? "is" : "are", n.first_value, n.first);
}

}  // namespace mt
