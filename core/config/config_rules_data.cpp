// config_rules_data.cpp: the rules of data.* (and parse_data_blend, its lists read as Megatron reads them),
// checkpoint.* and logging.*: what a run reads and writes.
#include <fmt/format.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "core/config/config_rules_detail.h"

namespace mt {
namespace config_rules {
namespace {

// One data.train / data.valid list: no empty path, and blend weights finite and > 0 (megatron-core asserts it).
void check_data_list(const Rules& r, const char* key, const std::vector<std::string>& items) {
  const DataBlend blend = parse_data_blend(items);
  const size_t stride = blend.weights.empty() ? 1 : 2, offset = blend.weights.empty() ? 0 : 1;
  for (size_t i = 0; i < blend.prefixes.size(); ++i)
    if (blend.prefixes[i].empty()) r.fail(fmt::format("{}[{}]", key, i * stride + offset), "is an empty path");
  for (size_t i = 0; i < blend.weights.size(); ++i)
    if (!std::isfinite(blend.weights[i]) || !(blend.weights[i] > 0))
      r.fail(fmt::format("{}[{}]", key, 2 * i),
             fmt::format("blend weight {} must be a finite number > 0", items[2 * i]));
  // Each weight is divided by their sum: a sum beyond the largest double made every share 0.
  const double sum = std::accumulate(blend.weights.begin(), blend.weights.end(), 0.0);
  if (!std::isfinite(sum))
    r.fail(key, fmt::format("the blend weights sum to {} (beyond the largest double, {:g}); they are relative, so "
                            "scale them down",
                            sum, std::numeric_limits<double>::max()));
}

}  // namespace

void resolve_data(Config& c, const Rules& r) {
  const DataConfig& d = c.data;
  if (d.train.empty() && !d.synthetic)
    r.fail("data.train", "needs at least one dataset prefix (or set data.synthetic: true)");
  check_data_list(r, "data.train", d.train);
  check_data_list(r, "data.valid", d.valid);
  for (size_t i = 0; i < d.split.size(); ++i) r.non_negative(fmt::format("data.split[{}]", i), d.split[i]);
  if (!(std::accumulate(d.split.begin(), d.split.end(), 0.0) > 0))
    r.fail("data.split", fmt::format("[{}] must have a positive sum", fmt::join(d.split, ", ")));
}

void resolve_checkpoint_and_logging(Config& c, const Rules& r) {
  const CheckpointConfig& k = c.checkpoint;
  r.non_negative("checkpoint.save_interval", k.save_interval);
  r.non_negative("checkpoint.keep_last", k.keep_last);
  if (k.load.empty()) r.fail("checkpoint.load", "expected auto, none or a checkpoint path, got ''");
  if (!c.training.init_from.empty() && k.load != "auto" && k.load != "none")
    r.fail("training.init_from",
           fmt::format("starts from {}'s weights with a fresh optimizer and data position, but checkpoint.load: {} "
                       "resumes a run; set one of them (checkpoint.load: auto resumes this run's own checkpoints "
                       "in checkpoint.save_dir and otherwise starts from training.init_from)",
                       c.training.init_from, k.load));
  const LoggingConfig& l = c.logging;
  if (l.dir.empty()) r.fail("logging.dir", "needs a run directory, got ''");
  r.positive("logging.interval", l.interval);
  r.non_negative("logging.straggler_margin", l.straggler_margin);
  r.non_negative("logging.eval_interval", l.eval_interval);
  r.non_negative("logging.eval_iters", l.eval_iters);
  r.non_negative("logging.profile_iteration", l.profile_iteration);
  r.at_most("logging.interval", l.interval, kMaxCount, "interval");
  r.at_most("logging.eval_interval", l.eval_interval, kMaxCount, "interval");
  r.at_most("logging.eval_iters", l.eval_iters, int64_t{1} << 24, "number of validation iterations");
  r.at_most("checkpoint.save_interval", k.save_interval, kMaxCount, "interval");
  r.at_most("checkpoint.keep_last", k.keep_last, kMaxCount, "count");
  r.at_most("logging.profile_iteration", l.profile_iteration, kMaxCount, "iteration");
  if (l.profile_iteration > c.training.train_iters)
    r.fail("logging.profile_iteration", fmt::format("iteration {} is past training.train_iters={}: it would never run",
                                                    l.profile_iteration, c.training.train_iters));
  if (l.eval_interval > 0 && l.eval_iters == 0)
    r.fail("logging.eval_iters", fmt::format("must be positive when logging.eval_interval={}", l.eval_interval));
  if (!l.trace_iterations.empty() && !l.trace)
    r.fail("logging.trace_iterations", "is set, but logging.trace is false: set logging.trace: true");
  for (size_t i = 0; i < l.trace_iterations.size(); ++i) {
    const std::string key = fmt::format("logging.trace_iterations[{}]", i);
    r.positive(key, l.trace_iterations[i]);
    if (l.trace_iterations[i] > c.training.train_iters)
      r.fail(key, fmt::format("iteration {} is past training.train_iters={}: it would never run", l.trace_iterations[i],
                              c.training.train_iters));
    if (i > 0 && l.trace_iterations[i] <= l.trace_iterations[i - 1])
      r.fail(key, fmt::format("{} does not follow {}: list the iterations in ascending order, each once",
                              l.trace_iterations[i], l.trace_iterations[i - 1]));
  }
  r.one_of("logging.level", l.level, {"trace", "debug", "info", "warn", "error", "critical", "off"});
}

}  // namespace config_rules

DataBlend parse_data_blend(const std::vector<std::string>& items) {
  DataBlend blend;
  if (!items.empty() && items.size() % 2 == 0) {
    for (size_t i = 0; i < items.size(); i += 2) {
      // Python's float(): the whole item, surrounding blanks allowed.
      const std::string& s = items[i];
      char* end = nullptr;
      const double w = std::strtod(s.c_str(), &end);
      while (end && *end && std::isspace(static_cast<unsigned char>(*end))) ++end;
      if (s.empty() || end == s.c_str() || *end != '\0') {
        blend.weights.clear();
        break;
      }
      blend.weights.push_back(w);
    }
  }
  if (blend.weights.empty()) {
    blend.prefixes = items;
  } else {
    for (size_t i = 1; i < items.size(); i += 2) blend.prefixes.push_back(items[i]);
  }
  return blend;
}

}  // namespace mt
