// report.h: a prediction as the text `megatrain plan` prints and as JSON (--json).
#pragma once
#include <string>
#include <vector>

#include "plan/planner.h"

namespace mt::plan {

std::string format_prediction(const Prediction& p, const Hardware& hw);
std::string format_search(const std::vector<Prediction>& ranked, const Hardware& hw, size_t top);
std::string prediction_json(const Prediction& p, const Hardware& hw);
std::string search_json(const std::vector<Prediction>& ranked, const Hardware& hw, size_t top);

}  // namespace mt::plan
