// config_source.h: where each config key came from (file line:column, a --set override or a default), so every
// ConfigError names it.
#pragma once
#include <yaml-cpp/mark.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace mt {

class ConfigSource {
 public:
  explicit ConfigSource(std::string name) : name_(std::move(name)) {}
  const std::string& name() const { return name_; }

  // An override "--set <text>" that set the key at `path` (later ones win).
  void add_override(std::string text, std::string path);
  // The value at `path` was read from the document at `mark`.
  void record(const std::string& path, const YAML::Mark& mark) { marks_[path] = mark; }

  // Whether the document (or an override) gave `path` a value: false for a default.
  bool given(const std::string& path) const { return marks_.count(path) != 0; }

  // "F:4:16" (a file position), "F: --set a.b=1" (an override) or "F" (a default).
  std::string where(const std::string& path, const YAML::Mark& mark) const;
  // Throws ConfigError "<where>: <path>: <what>", at `mark` or else at the recorded position of `path`.
  [[noreturn]] void fail(const std::string& path, const std::string& what) const;
  [[noreturn]] void fail(const std::string& path, const std::string& what, const YAML::Mark& mark) const;
  // The same for an unknown key; when an override named exactly this key the path is not repeated:
  // "F: --set model.hiden_size=8: unknown key (did you mean model.hidden_size?)".
  [[noreturn]] void fail_unknown(const std::string& path, const std::string& what, const YAML::Mark& mark) const;

 private:
  struct Override {
    std::string text, path;
  };
  const Override* override_for(const std::string& path, const YAML::Mark& mark) const;

  std::string name_;
  std::vector<Override> overrides_;
  std::map<std::string, YAML::Mark> marks_;
};

}  // namespace mt
