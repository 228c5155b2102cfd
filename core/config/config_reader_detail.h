// config_reader_detail.h: what config_reader.cpp and config_document.cpp share. Not an interface: config.h is.
#pragma once
#include <yaml-cpp/yaml.h>

#include <cctype>
#include <string>

#include "core/config/config_source.h"

namespace mt::config_detail {

inline std::string join(const std::string& parent, const std::string& name) {
  return parent.empty() ? name : parent + "." + name;
}

inline std::string describe(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Scalar:
      return "'" + n.Scalar() + "'";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    default:
      return "an empty value";
  }
}

inline std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// The key check: unknown and duplicate keys, in document order.
void check_keys(const YAML::Node& node, const std::string& path, const ConfigSource& src);

// An override "a.b.c=value", the value parsed as YAML, set in the document before the checks.
void apply_override(YAML::Node& root, const std::string& text, ConfigSource& src);

}  // namespace mt::config_detail
