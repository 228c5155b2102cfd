// hf_import_detail.h: what hf_import.cpp (files, weights, the model YAML) and hf_import_families.cpp (each family's
// config.json read into an HfModelShape) share. Not an interface: hf_import.h is.
#pragma once
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/checkpoint/checkpoint.h"
#include "core/hf/hf_config_json.h"
#include "core/hf/hf_mapping.h"

namespace mt::hf_import {

using nlohmann::json;

// config.json's keys, each read with the file and key in every error; null counts as absent.
class ConfigKeys {
 public:
  ConfigKeys(json j, std::string file) : j_(std::move(j)), file_(std::move(file)) {
    if (!j_.is_object()) throw CheckpointError(fmt::format("{}: is not a JSON object", file_));
  }
  const std::string& file() const { return file_; }
  bool present(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  const json& raw(const char* key) const { return j_[key]; }
  const json& raw_object() const { return j_; }
  [[noreturn]] void fail(const char* key, const std::string& why) const {
    throw CheckpointError(fmt::format("{}: {} {}", file_, key, why));
  }
  int64_t integer(const char* key, std::optional<int64_t> fallback = std::nullopt) const {
    if (!present(key)) return fallback ? *fallback : (fail(key, "is missing"), 0);
    const json& v = j_[key];
    if (!v.is_number_integer()) fail(key, fmt::format("= {} is not an integer", v.dump()));
    const int64_t x = v.get<int64_t>();
    if (x <= 0) fail(key, fmt::format("= {} is not positive", x));
    return x;
  }
  double real(const char* key, std::optional<double> fallback = std::nullopt) const {
    if (!present(key)) return fallback ? *fallback : (fail(key, "is missing"), 0.0);
    const json& v = j_[key];
    if (!v.is_number() || !std::isfinite(v.get<double>())) fail(key, fmt::format("= {} is not a number", v.dump()));
    return v.get<double>();
  }
  bool flag(const char* key, bool fallback) const {
    if (!present(key)) return fallback;
    if (!j_[key].is_boolean()) fail(key, fmt::format("= {} is not true or false", j_[key].dump()));
    return j_[key].get<bool>();
  }
  std::string text(const char* key, const std::string& fallback) const {
    if (!present(key)) return fallback;
    if (!j_[key].is_string()) fail(key, fmt::format("= {} is not a string", j_[key].dump()));
    return j_[key].get<std::string>();
  }
  // A key whose value must be `want` for us to compute the same model.
  void require_flag(const char* key, bool fallback, bool want, const std::string& why) const {
    if (flag(key, fallback) != want) fail(key, fmt::format("= {}: {}", hf_json::boolean(!want), why));
  }

 private:
  json j_;
  std::string file_;
};

// The shape of the family config.json's `architectures` names (`arch`), every key it holds read or checked;
// throws CheckpointError naming the key otherwise.
HfModelShape hf_family_shape(const ConfigKeys& k, const std::string& arch);

}  // namespace mt::hf_import
