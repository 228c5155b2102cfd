// nonfinite.h: finding inf / NaN in parameters and gradients, to name them when training goes non-finite and
// to keep non-finite weights out of checkpoints.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "core/tensor/parameter.h"

namespace mt::app {

// The first parameter, in model order, whose gradient (grads = true) or value holds an inf or NaN; nullopt when
// none does. Copies each tensor to the host as floats: meant for rare checks (a non-finite iteration, a save).
std::optional<std::string> first_nonfinite(const std::vector<Parameter*>& params, bool grads);

// "layers.3.mlp.fc1.weight (layer 3)"; names outside the layers stay as they are.
std::string describe_parameter(const std::string& name);

}  // namespace mt::app
