// tokenizer_sidecar.cpp: writes and reads PREFIX.tokenizer.yaml (see tokenizer_sidecar.h).
#include "core/tokenizer/tokenizer_sidecar.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

namespace mt {

namespace {

namespace fs = std::filesystem;

std::string absolute(const std::string& path) {
  if (path.empty()) return path;
  std::error_code ec;
  const fs::path p = fs::absolute(path, ec);
  return ec ? path : p.lexically_normal().string();
}

// The file options, in the order TokenizerOptions declares them.
template <class F>
void each_file(TokenizerOptions& o, F&& f) {
  f("vocab_file", o.vocab_file);
  f("merge_file", o.merge_file);
  f("tokenizer_file", o.tokenizer_file);
  f("tokenizer_model", o.tokenizer_model);
}

std::string hash_text(uint32_t hash) { return fmt::format("crc32c:{:08x}", hash); }

std::optional<uint32_t> parse_hash(const YAML::Node& node, const std::string& path) {
  if (!node) return std::nullopt;
  const std::string text = node.as<std::string>(), digits = text.substr(std::min<size_t>(text.size(), 7));
  if (!text.starts_with("crc32c:") || digits.size() != 8 ||
      !std::all_of(digits.begin(), digits.end(), [](unsigned char c) { return std::isxdigit(c); }))
    throw DataError(fmt::format("{}: vocab_hash: '{}' is not crc32c: and 8 hex digits", path, text));
  return static_cast<uint32_t>(std::stoul(digits, nullptr, 16));
}

template <class T>
void differ(std::vector<std::string>& out, const char* what, const T& a, const T& b) {
  if (a != b) out.push_back(fmt::format("{}: {} vs {}", what, a, b));
}

}  // namespace

std::string tokenizer_sidecar_path(const std::string& prefix) { return prefix + ".tokenizer.yaml"; }

std::string tokenizer_sidecar_yaml(const TokenizerOptions& options, const Tokenizer& tokenizer) {
  TokenizerOptions o = options;
  YAML::Emitter out;
  out << YAML::Comment("written by megatrain data prepare: the tokenizer of this dataset's ids");
  out << YAML::BeginMap;
  out << YAML::Key << "kind" << YAML::Value << std::string(name_of(o.kind));
  out << YAML::Key << "files" << YAML::Value << YAML::BeginMap;
  each_file(o, [&](const char* key, std::string& path) {
    if (!path.empty()) out << YAML::Key << key << YAML::Value << absolute(path);
  });
  out << YAML::EndMap;
  if (!o.eod_token.empty()) out << YAML::Key << "eod_token" << YAML::Value << o.eod_token;
  if (o.kind == TokenizerKind::hf) out << YAML::Key << "add_special_tokens" << YAML::Value << o.add_special_tokens;
  out << YAML::Key << "vocab_size" << YAML::Value << tokenizer.vocab_size();
  out << YAML::Key << "eod" << YAML::Value << tokenizer.eod();
  out << YAML::Key << "vocab_hash" << YAML::Value << YAML::DoubleQuoted << hash_text(tokenizer.vocabulary_hash());
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

std::optional<TokenizerSidecar> read_tokenizer_sidecar(const std::string& prefix) {
  return read_tokenizer_sidecar_file(tokenizer_sidecar_path(prefix));
}

std::optional<TokenizerSidecar> read_tokenizer_sidecar_file(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(fmt::format("{}: cannot read the tokenizer sidecar", path));
  std::ostringstream text;
  text << in.rdbuf();
  TokenizerSidecar s;
  try {
    const YAML::Node root = YAML::Load(text.str());
    if (!root.IsMap() || !root["kind"] || !root["vocab_size"] || !root["eod"])
      throw DataError(fmt::format("{}: not a tokenizer sidecar (kind, vocab_size and eod are required)", path));
    const std::string kind = root["kind"].as<std::string>();
    const std::optional<TokenizerKind> parsed = parse_choice<TokenizerKind>(kind);
    if (!parsed)
      throw DataError(fmt::format("{}: kind: '{}' is not a tokenizer (supported: {})", path, kind,
                                  fmt::join(EnumNames<TokenizerKind>::names, ", ")));
    s.tokenizer.kind = *parsed;
    if (const YAML::Node files = root["files"]; files && files.IsMap())
      each_file(s.tokenizer, [&](const char* key, std::string& file) {
        if (files[key]) file = files[key].as<std::string>();
      });
    if (root["eod_token"]) s.tokenizer.eod_token = root["eod_token"].as<std::string>();
    // Sidecars from before the post-processor was applied do not have it: their ids have no specials added.
    s.tokenizer.add_special_tokens = root["add_special_tokens"] && root["add_special_tokens"].as<bool>();
    s.vocab_size = root["vocab_size"].as<int64_t>();
    s.eod = root["eod"].as<int32_t>();
    s.vocab_hash = parse_hash(root["vocab_hash"], path);
  } catch (const YAML::Exception& e) {
    throw DataError(fmt::format("{}: malformed tokenizer sidecar: {}", path, e.what()));
  }
  if (s.vocab_size <= 0) throw DataError(fmt::format("{}: vocab_size must be positive", path));
  return s;
}

std::vector<std::string> tokenizer_differences(const TokenizerSidecar& a, const TokenizerSidecar& b) {
  std::vector<std::string> out;
  differ(out, "kind", name_of(a.tokenizer.kind), name_of(b.tokenizer.kind));
  differ(out, "vocab_size", a.vocab_size, b.vocab_size);
  if (a.vocab_hash && b.vocab_hash) differ(out, "vocab_hash", hash_text(*a.vocab_hash), hash_text(*b.vocab_hash));
  differ(out, "eod (the end-of-document id)", a.eod, b.eod);
  if (a.tokenizer.kind == TokenizerKind::hf && b.tokenizer.kind == TokenizerKind::hf)
    differ(out, "add_special_tokens", a.tokenizer.add_special_tokens, b.tokenizer.add_special_tokens);
  return out;
}

}  // namespace mt
