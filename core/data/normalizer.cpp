// normalizer.cpp: tokenizer.json normalizers (see normalizer.h).
#include "core/data/normalizer.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "core/data/indexed_dataset.h"

namespace mt {

using nlohmann::json;

namespace {

std::string type_of(const json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : "?";
}

// Prepend: the string before a non-empty text.
class Prepend final : public NormalizerStep {
 public:
  explicit Prepend(std::string s) : s_(std::move(s)) {}
  void apply(std::string_view in, std::string& out) const override {
    out.clear();
    if (in.empty()) return;
    out.reserve(s_.size() + in.size());
    out.append(s_).append(in);
  }

 private:
  std::string s_;
};

// Replace with a String pattern: every non-overlapping occurrence, left to right.
class ReplaceString final : public NormalizerStep {
 public:
  ReplaceString(std::string pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void apply(std::string_view in, std::string& out) const override {
    out.clear();
    out.reserve(in.size());
    size_t at = 0;
    for (size_t hit; (hit = in.find(pattern_, at)) != std::string_view::npos; at = hit + pattern_.size())
      out.append(in.substr(at, hit - at)).append(content_);
    out.append(in.substr(at));
  }

 private:
  std::string pattern_, content_;
};

void add_steps(const json& j, const std::string& where, Normalizer& n) {
  const std::string t = type_of(j);
  if (t == "Sequence") {
    for (const json& s : j.value("normalizers", json::array())) add_steps(s, where, n);
    return;
  }
  if (t == "Prepend") {
    if (!j.contains("prepend") || !j["prepend"].is_string())
      throw DataError(fmt::format("{}: normalizer Prepend has no 'prepend' string", where));
    n.add_step(std::make_unique<Prepend>(j["prepend"].get<std::string>()));
    return;
  }
  if (t == "Replace") {
    const json& p = j.value("pattern", json());
    if (!j.contains("content") || !j["content"].is_string())
      throw DataError(fmt::format("{}: normalizer Replace has no 'content' string", where));
    if (p.is_object() && p.contains("String") && p["String"].is_string() && !p["String"].get<std::string>().empty()) {
      n.add_step(std::make_unique<ReplaceString>(p["String"].get<std::string>(), j["content"].get<std::string>()));
      return;
    }
    throw DataError(fmt::format("{}: normalizer Replace with pattern {} is not supported (only a non-empty String)",
                                where, p.dump()));
  }
  throw DataError(
      fmt::format("{}: normalizer '{}' is not supported (Prepend, Replace, or a Sequence of them)", where, t));
}

}  // namespace

std::string_view Normalizer::apply(std::string_view in, std::string& a, std::string& b) const {
  std::string_view cur = in;
  bool into_a = true;
  for (const auto& step : steps_) {
    std::string& out = into_a ? a : b;
    step->apply(cur, out);
    cur = out;
    into_a = !into_a;
  }
  return cur;
}

Normalizer load_normalizer(const json& j, const std::string& where) {
  Normalizer n;
  if (!j.is_null()) add_steps(j, where, n);
  return n;
}

}  // namespace mt
