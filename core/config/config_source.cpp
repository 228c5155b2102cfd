// config_source.cpp: locating config keys for error messages.
#include "core/config/config_source.h"

#include <fmt/format.h>

#include "core/config/config.h"

namespace mt {

namespace {

bool is_under(const std::string& path, const std::string& root) {
  return path == root ||
         (path.size() > root.size() && path.compare(0, root.size(), root) == 0 && path[root.size()] == '.');
}

}  // namespace

void ConfigSource::add_override(std::string text, std::string path) {
  overrides_.push_back({std::move(text), std::move(path)});
}

// The override that set `path` (or a section above it) wins over the file; a key with no file position may
// also be a section that an override created on its way down (--set modle.num_layers=4 creates `modle`).
const ConfigSource::Override* ConfigSource::override_for(const std::string& path, const YAML::Mark& mark) const {
  for (auto it = overrides_.rbegin(); it != overrides_.rend(); ++it)
    if (is_under(path, it->path)) return &*it;
  if (!mark.is_null()) return nullptr;
  for (auto it = overrides_.rbegin(); it != overrides_.rend(); ++it)
    if (is_under(it->path, path)) return &*it;
  return nullptr;
}

std::string ConfigSource::where(const std::string& path, const YAML::Mark& mark) const {
  if (const Override* o = override_for(path, mark)) return fmt::format("{}: --set {}", name_, o->text);
  if (!mark.is_null()) return fmt::format("{}:{}:{}", name_, mark.line + 1, mark.column + 1);
  return name_;
}

void ConfigSource::fail(const std::string& path, const std::string& what) const {
  auto it = marks_.find(path);
  fail(path, what, it == marks_.end() ? YAML::Mark::null_mark() : it->second);
}

void ConfigSource::fail(const std::string& path, const std::string& what, const YAML::Mark& mark) const {
  throw ConfigError(fmt::format("{}: {}: {}", where(path, mark), path, what));
}

void ConfigSource::fail_unknown(const std::string& path, const std::string& what, const YAML::Mark& mark) const {
  const Override* o = override_for(path, mark);
  if (o && o->path == path) throw ConfigError(fmt::format("{}: --set {}: {}", name_, o->text, what));
  fail(path, what, mark);
}

}  // namespace mt
