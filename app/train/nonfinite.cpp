#include "app/train/nonfinite.h"

#include <fmt/format.h>

#include "core/tensor/finite.h"

namespace mt::app {

std::optional<std::string> first_nonfinite(const std::vector<Parameter*>& params, bool grads) {
  for (const Parameter* p : params) {
    const Tensor& t = grads ? p->grad : p->value;
    if (t.defined() && find_nonfinite(t)) return p->name;
  }
  return std::nullopt;
}

std::string describe_parameter(const std::string& name) {
  constexpr std::string_view kLayers = "layers.";
  if (name.rfind(kLayers, 0) != 0) return name;
  const size_t end = name.find('.', kLayers.size());
  return fmt::format("{} (layer {})", name, name.substr(kLayers.size(), end - kLayers.size()));
}

}  // namespace mt::app
