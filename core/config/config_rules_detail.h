// config_rules_detail.h: what the config_rules*.cpp files share: the bounds, the small checks that name a key, and
// one resolver per section. Not an interface: config_rules.h is.
#pragma once
#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/config/config.h"
#include "core/config/config_source.h"
#include "core/tensor/tensor.h"

namespace mt::config_rules {

inline constexpr int64_t kMaxLayers = int64_t{1} << 16;
inline constexpr int64_t kMaxWidth = int64_t{1} << 20;
inline constexpr int64_t kMaxSequence = int64_t{1} << 24;
inline constexpr int64_t kMaxVocab = (int64_t{1} << 31) - 1;
inline constexpr int64_t kMaxVocabMultiple = int64_t{1} << 20;
inline constexpr int64_t kMaxParallel = int64_t{1} << 20;  // ranks along one dimension
inline constexpr int64_t kMaxCount = int64_t{1} << 40;     // iterations, batch sizes, intervals
inline constexpr double kMaxTimeoutS = 1e7;                // about 115 days; times 1000 fits int64 milliseconds
// Bytes one tensor may hold (kMaxTensorBytes in core/tensor/tensor.h), as a double for products of config sizes.
inline constexpr double kMaxBytes = static_cast<double>(kMaxTensorBytes);

// Small checks that name the key and the value.
class Rules {
 public:
  explicit Rules(const ConfigSource& src) : src_(src) {}

  [[noreturn]] void fail(const std::string& path, const std::string& what) const { src_.fail(path, what); }
  bool given(const std::string& path) const { return src_.given(path); }
  void positive(const std::string& path, int64_t v) const {
    if (v < 1) fail(path, fmt::format("must be positive, got {}", v));
  }
  void positive(const std::string& path, double v) const {
    if (!(v > 0)) fail(path, fmt::format("must be positive, got {}", v));
    finite(path, v);
  }
  void finite(const std::string& path, double v) const {
    if (!std::isfinite(v)) fail(path, fmt::format("must be a finite number, got {}", v));
  }
  // Upper bounds keep every size and product computed from the config far from int64 overflow.
  void at_most(const std::string& path, int64_t v, int64_t max, const char* why) const {
    if (v > max) fail(path, fmt::format("{} is more than the largest supported {} ({})", v, max, why));
  }
  void at_most(const std::string& path, double v, double max, const char* why) const {
    if (v > max) fail(path, fmt::format("{} is more than the largest supported {} ({})", v, max, why));
  }
  void non_negative(const std::string& path, int64_t v) const {
    if (v < 0) fail(path, fmt::format("must be >= 0, got {}", v));
  }
  void non_negative(const std::string& path, double v) const {
    if (!(v >= 0)) fail(path, fmt::format("must be >= 0, got {}", v));
    finite(path, v);
  }
  void probability(const std::string& path, double v) const {  // [0, 1)
    if (!(v >= 0 && v < 1)) fail(path, fmt::format("must be in [0, 1), got {}", v));
  }
  void one_of(const std::string& path, const std::string& v, std::initializer_list<const char*> allowed) const {
    for (const char* a : allowed)
      if (v == a) return;
    fail(path, fmt::format("expected one of {}, got '{}'", fmt::join(allowed, ", "), v));
  }

 private:
  const ConfigSource& src_;
};

// One resolver per section, called by resolve_config in this order (config_rules.cpp); each checks its keys and
// fills the section's defaults and derived values.
void resolve_model(ModelConfig& m, const Rules& r);                    // config_rules.cpp
void resolve_parallel(Config& c, int64_t world_size, const Rules& r);  // config_rules_parallel.cpp
void resolve_moe(Config& c, const Rules& r);                           // config_rules_parallel.cpp
void resolve_training(Config& c, const Rules& r);                      // config_rules_training.cpp
void check_sizes(const Config& c, const Rules& r);                     // config_rules.cpp
void resolve_optimizer(Config& c, const Rules& r);                     // config_rules_training.cpp
void resolve_data(Config& c, const Rules& r);                          // config_rules_data.cpp
void resolve_checkpoint_and_logging(Config& c, const Rules& r);        // config_rules_data.cpp
void resolve_finetune(const Config& c, const Rules& r);                // config_rules_training.cpp

}  // namespace mt::config_rules
