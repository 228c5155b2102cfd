// config_document.cpp: the checks and edits of the YAML document before typed reading: --set overrides and
// the key check (unknown keys with a nearest-key hint, duplicate keys).
#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "core/config/config.h"
#include "core/config/config_keys.h"
#include "core/config/config_reader_detail.h"
#include "core/config/config_source.h"

namespace mt::config_detail {
namespace {

using config_keys::Key;

// ---- the schema: every section path ("" is the top level) and its keys, taken from config_keys::visit ----

struct Schema {
  std::map<std::string, std::vector<std::string>> keys;  // section path -> its keys in order
};

class SchemaBuilder {
 public:
  Schema schema;
  template <class F>
  void section(const char* name, F&& body) {
    schema.keys[path_].push_back(name);
    const std::string outer = path_;
    path_ = join(path_, name);
    schema.keys[path_];
    body();
    path_ = outer;
  }
  template <class T>
  void field(const Key& k, const T&) {
    schema.keys[path_].push_back(k.name);
  }

 private:
  std::string path_;
};

const Schema& schema() {
  static const Schema s = [] {
    SchemaBuilder b;
    const Config c;
    config_keys::visit(b, c);
    return b.schema;
  }();
  return s;
}

// ---- "did you mean": the same name in another section, else the nearest name by edit distance ----

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string unknown_key_message(const std::string& section, const std::string& name) {
  const std::string key = lower(name);
  const size_t threshold = std::max<size_t>(1, (key.size() + 1) / 3);
  std::string best;
  size_t best_distance = threshold + 1;
  // Another section's key must be strictly nearer to win over this section's (an exact name always is).
  auto consider = [&](const std::string& sec, const std::string& candidate, bool elsewhere) {
    const size_t raw = edit_distance(key, candidate);
    const size_t d = raw + (elsewhere && raw > 0 ? 1 : 0);
    if (d < best_distance) best_distance = d, best = join(sec, candidate);
  };
  const auto& here = schema().keys.at(section);
  for (const auto& k : here) consider(section, k, false);
  for (const auto& [sec, keys] : schema().keys)
    if (sec != section)
      for (const auto& k : keys) consider(sec, k, true);
  if (best.empty() && key.size() >= 3)  // "layers" -> num_layers, "warmup" -> warmup_iters
    for (const auto& k : here)
      if (k.find(key) != std::string::npos) {
        best = join(section, k);
        break;
      }
  if (!best.empty()) return fmt::format("unknown key (did you mean {}?)", best);
  return fmt::format("unknown key (expected one of: {})", fmt::join(here, ", "));
}

}  // namespace

// ---- the key check: unknown and duplicate keys, in document order ----

void check_keys(const YAML::Node& node, const std::string& path, const ConfigSource& src) {
  if (!node.IsMap()) return;  // a section that is not a mapping is a type error, reported by the reader
  const auto& known = schema().keys.at(path);
  std::set<std::string> seen;
  for (auto it = node.begin(); it != node.end(); ++it) {
    const YAML::Node key = it->first;  // a handle: it->first lives in a temporary of the iterator
    if (!key.IsScalar())
      src.fail(path.empty() ? "(top level)" : path, "keys must be plain names, got " + describe(key), key.Mark());
    const std::string& name = key.Scalar();
    const std::string full = join(path, name);
    if (!seen.insert(name).second) src.fail(full, "duplicate key", key.Mark());
    if (path.empty() && name == config_keys::kDerivedSection) continue;  // written by to_yaml, recomputed
    if (std::find(known.begin(), known.end(), name) == known.end())
      src.fail_unknown(full, unknown_key_message(path, name), key.Mark());
    if (schema().keys.count(full)) check_keys(it->second, full, src);
  }
}

// ---- overrides: "a.b.c=value", the value parsed as YAML, set in the document before the checks ----

namespace {

std::string trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return std::string(s);
}

}  // namespace

void apply_override(YAML::Node& root, const std::string& text, ConfigSource& src) {
  const size_t eq = text.find('=');
  if (eq == std::string::npos)
    throw ConfigError(fmt::format("{}: --set {}: expected key.path=value", src.name(), text));
  const std::string path = trim(std::string_view(text).substr(0, eq));
  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    const size_t dot = path.find('.', start);
    parts.push_back(path.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (parts.back().empty())
      throw ConfigError(
          fmt::format("{}: --set {}: empty key in '{}'; expected key.path=value", src.name(), text, path));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  if (parts[0] == config_keys::kDerivedSection)
    throw ConfigError(fmt::format("{}: --set {}: derived values are computed, not set; set the keys they come from",
                                  src.name(), text));
  const std::string value_text = text.substr(eq + 1);
  YAML::Node value;
  try {
    value = trim(value_text).empty() ? YAML::Node(std::string()) : YAML::Load(value_text);
  } catch (const YAML::ParserException& e) {
    throw ConfigError(fmt::format("{}: --set {}: the value is not valid YAML: {}", src.name(), text, e.msg));
  }
  src.add_override(text, path);
  YAML::Node cur = root;
  std::string at;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    at = join(at, parts[i]);
    YAML::Node next = cur[parts[i]];
    if (!next.IsDefined() || next.IsNull()) {
      cur[parts[i]] = YAML::Node(YAML::NodeType::Map);
      next.reset(cur[parts[i]]);
    } else if (!next.IsMap()) {
      throw ConfigError(fmt::format("{}: --set {}: {} is {}, not a section", src.name(), text, at, describe(next)));
    }
    cur.reset(next);
  }
  cur[parts.back()] = value;
}

}  // namespace mt::config_detail
