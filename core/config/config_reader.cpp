// config_reader.cpp: load_config and parse_config: YAML text, then --set overrides, then the key check (unknown
// keys with a nearest-key hint), then typed values, then the rules.
#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string_view>
#include <set>
#include <tuple>
#include <sstream>
#include <string_view>

#include "core/config/config.h"
#include "core/config/config_keys.h"
#include "core/config/config_rules.h"
#include "core/config/config_source.h"

namespace mt {
namespace {

using config_keys::Key;

std::string join(const std::string& parent, const std::string& name) {
  return parent.empty() ? name : parent + "." + name;
}

std::string describe(const YAML::Node& n) {
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

std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

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

std::string trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return std::string(s);
}

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

// ---- typed reading: every key of every section, with its type checked ----

bool parse_int(const YAML::Node& n, int64_t& out) {
  if (!n.IsScalar()) return false;
  std::string_view s = n.Scalar();
  if (s.size() > 1 && s[0] == '+' && s[1] != '-') s.remove_prefix(1);
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return !s.empty() && ec == std::errc() && end == s.data() + s.size();
}

template <class F>
bool parse_real(const YAML::Node& n, F& out) {
  if (!n.IsScalar()) return false;
  std::string_view s = n.Scalar();
  if (s.size() > 1 && s[0] == '+' && s[1] != '-') s.remove_prefix(1);
  F v{};
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || !std::isfinite(v)) return false;
  out = v;
  return true;
}

bool parse_bool(const YAML::Node& n, bool& out) {
  if (!n.IsScalar()) return false;
  const std::string s = lower(n.Scalar());
  if (s != "true" && s != "false") return false;
  out = s == "true";
  return true;
}

class Reader {
 public:
  Reader(const YAML::Node& root, ConfigSource& src) : src_(src) { stack_.push_back({root, ""}); }

  template <class F>
  void section(const char* name, F&& body) {
    const std::string path = join(stack_.back().path, name);
    YAML::Node node;  // absent or empty: every key takes its default
    if (auto n = lookup(name)) {
      if (n->IsMap())
        node.reset(*n);
      else if (!n->IsNull())
        src_.fail(path, "expected a mapping of keys, got " + describe(*n), n->Mark());
    }
    stack_.push_back({node, path});
    body();
    stack_.pop_back();
  }

  void field(const Key& k, int64_t& out) {
    std::string path;
    auto n = value(k, path);
    if (!n) return;
    if (k.accepts_auto && n->IsScalar() && n->Scalar() == "auto") {
      out = 0;
    } else if (!parse_int(*n, out)) {
      src_.fail(path, fmt::format("expected an integer{}, got {}", k.accepts_auto ? " or 'auto'" : "", describe(*n)),
                n->Mark());
    }
  }
  void field(const Key& k, double& out) { real(k, out); }
  void field(const Key& k, float& out) { real(k, out); }
  void field(const Key& k, bool& out) {
    std::string path;
    auto n = value(k, path);
    if (n && !parse_bool(*n, out)) src_.fail(path, "expected true or false, got " + describe(*n), n->Mark());
  }
  void field(const Key& k, std::string& out) {
    std::string path;
    auto n = value(k, path);
    if (!n) return;
    if (n->IsNull())
      out.clear();
    else if (n->IsScalar())
      out = n->Scalar();
    else
      src_.fail(path, "expected a string, got " + describe(*n), n->Mark());
  }
  // One of the enum's names (config.h EnumNames); a planned name says it is not implemented yet.
  template <NamedEnum E>
  void field(const Key& k, E& out) {
    std::string path;
    auto n = value(k, path);
    if (!n) return;
    const auto& names = EnumNames<E>::names;
    const std::string choices = fmt::format("{}", fmt::join(names, ", "));
    if (!n->IsScalar()) src_.fail(path, fmt::format("expected one of {}, got {}", choices, describe(*n)), n->Mark());
    if (std::optional<E> e = parse_choice<E>(n->Scalar())) {
      out = *e;
      return;
    }
    for (const char* planned : EnumNames<E>::planned)
      if (n->Scalar() == planned)
        src_.fail(path, fmt::format("{} is not implemented yet (use {})", planned, fmt::join(names, " or ")),
                  n->Mark());
    src_.fail(path, fmt::format("expected one of {}, got '{}'", choices, n->Scalar()), n->Mark());
  }
  // A string or a list of strings.
  void field(const Key& k, std::vector<std::string>& out) {
    std::string path;
    auto n = value(k, path);
    if (!n) return;
    out.clear();
    if (n->IsScalar()) {
      out.push_back(n->Scalar());
    } else if (n->IsSequence()) {
      for (size_t i = 0; i < n->size(); ++i) {
        const YAML::Node e = (*n)[i];
        if (!e.IsScalar()) src_.fail(fmt::format("{}[{}]", path, i), "expected a string, got " + describe(e), e.Mark());
        out.push_back(e.Scalar());
      }
    } else if (!n->IsNull()) {
      src_.fail(path, "expected a string or a list of strings, got " + describe(*n), n->Mark());
    }
  }
  void field(const Key& k, std::vector<double>& out) { list(k, out, "a number", "numbers", parse_real<double>); }
  void field(const Key& k, std::vector<int64_t>& out) { list(k, out, "an integer", "integers", parse_int); }

 private:
  struct Level {
    YAML::Node node;
    std::string path;
  };

  std::optional<YAML::Node> lookup(const std::string& name) const {
    const YAML::Node& map = stack_.back().node;
    if (!map.IsMap()) return std::nullopt;
    for (auto it = map.begin(); it != map.end(); ++it)
      if (it->first.Scalar() == name) return it->second;
    return std::nullopt;
  }

  // The node of key k in the current section (recording where it is), or nullopt when absent.
  std::optional<YAML::Node> value(const Key& k, std::string& path) {
    path = join(stack_.back().path, k.name);
    auto n = lookup(k.name);
    if (!n) {
      if (k.required) src_.fail(path, "required key is missing");
      return std::nullopt;
    }
    src_.record(path, n->Mark());
    return n;
  }

  template <class F>
  void real(const Key& k, F& out) {
    std::string path;
    auto n = value(k, path);
    if (n && !parse_real(*n, out)) src_.fail(path, "expected a number, got " + describe(*n), n->Mark());
  }

  template <class T, class Parse>
  void list(const Key& k, std::vector<T>& out, const char* one, const char* what, Parse parse) {
    std::string path;
    auto n = value(k, path);
    if (!n) return;
    const std::string expected =
        k.length ? fmt::format("a list of {} {}", k.length, what) : fmt::format("a list of {}", what);
    if (n->IsNull() && k.length == 0) {
      out.clear();
      return;
    }
    if (!n->IsSequence()) src_.fail(path, fmt::format("expected {}, got {}", expected, describe(*n)), n->Mark());
    if (k.length && n->size() != k.length)
      src_.fail(path, fmt::format("expected {}, got {} entries", expected, n->size()), n->Mark());
    out.assign(n->size(), T{});
    for (size_t i = 0; i < n->size(); ++i) {
      const YAML::Node e = (*n)[i];
      if (!parse(e, out[i]))
        src_.fail(fmt::format("{}[{}]", path, i), fmt::format("expected {}, got {}", one, describe(e)), e.Mark());
    }
  }

  ConfigSource& src_;
  std::vector<Level> stack_;
};

// The `derived:` section that to_yaml writes (checkpoints store it) is recomputed, never read. So that an edit
// there is not silently ignored, its keys must be the ones to_yaml writes, integers, and (when no --set changed
// what they derive from) equal to the recomputed values. The values that depend on the launch (world size,
// data-parallel size and what follows from them) are compared only when the world size is the same.
void check_derived(const YAML::Node& root, const Config& c, const ConfigSource& src, bool overridden) {
  const YAML::Node d = root[config_keys::kDerivedSection];
  if (!d.IsDefined() || d.IsNull()) return;
  const std::string section = config_keys::kDerivedSection;
  if (!d.IsMap())
    src.fail(section, "expected the mapping of derived values that to_yaml writes, got " + describe(d), d.Mark());
  const bool same_world = [&] {
    const YAML::Node w = d["world_size"];
    int64_t v = 0;
    return !w.IsDefined() || (parse_int(w, v) && v == c.parallel.world_size);
  }();
  const std::vector<std::tuple<const char*, int64_t, bool>> computed = {
      {"padded_vocab_size", c.model.padded_vocab_size, true},
      {"head_dim", c.model.head_dim, true},
      {"data_parallel_size", c.parallel.data, same_world},
      {"world_size", c.parallel.world_size, same_world},
      {"num_microbatches", c.training.num_microbatches, same_world},
      {"tokens_per_iteration", c.training.global_batch_size * c.model.seq_length, same_world}};
  for (auto it = d.begin(); it != d.end(); ++it) {
    const std::string name = it->first.IsScalar() ? it->first.Scalar() : std::string("?");
    const std::string path = section + "." + name;
    auto known = std::find_if(computed.begin(), computed.end(), [&](const auto& e) { return name == std::get<0>(e); });
    if (known == computed.end())
      src.fail(path, "unknown derived value; derived values are computed, set the keys they come from instead",
               it->first.Mark());
    int64_t v = 0;
    if (!parse_int(it->second, v))
      src.fail(path, "expected an integer, got " + describe(it->second), it->second.Mark());
    if (!overridden && std::get<2>(*known) && v != std::get<1>(*known))
      src.fail(path,
               fmt::format("is {} here but the keys above give {}; derived values are computed, not read: "
                           "remove the derived section or change the keys they come from",
                           v, std::get<1>(*known)),
               it->second.Mark());
  }
}

// model.vocab_size: auto takes the vocabulary size `data prepare` recorded in PREFIX.tokenizer.yaml beside the
// first training prefix (of a blend too) (core/data/tokenizer_sidecar.h writes it; only its vocab_size is read here).
void resolve_auto_vocab(const YAML::Node& root, Config& c, const ConfigSource& src) {
  const YAML::Node model = root["model"];
  const YAML::Node v = model.IsMap() ? model["vocab_size"] : YAML::Node();
  if (!v.IsDefined() || !v.IsScalar() || v.Scalar() != "auto") return;
  if (c.data.train.empty())
    src.fail("model.vocab_size", "is 'auto' but data.train names no dataset to take the tokenizer's vocabulary from",
             v.Mark());
  // data.train may be a weighted blend ([w0, prefix0, ...]): the first dataset's prefix, not its weight.
  const std::string sidecar = parse_data_blend(c.data.train).prefixes.front() + ".tokenizer.yaml";
  std::error_code ec;
  if (!std::filesystem::exists(sidecar, ec))
    src.fail("model.vocab_size",
             fmt::format("is 'auto' but {} does not exist (data prepare writes it; datasets prepared before it did "
                         "have none): set model.vocab_size to the tokenizer's vocabulary size",
                         sidecar),
             v.Mark());
  try {
    const YAML::Node s = YAML::LoadFile(sidecar);
    const YAML::Node size = s.IsMap() ? s["vocab_size"] : YAML::Node();
    int64_t n = 0;
    if (!size.IsDefined() || !parse_int(size, n) || n <= 0)
      src.fail("model.vocab_size", fmt::format("is 'auto' but {} has no positive vocab_size", sidecar), v.Mark());
    c.model.vocab_size = n;
  } catch (const YAML::Exception& e) {
    src.fail("model.vocab_size", fmt::format("is 'auto' but {} is not valid YAML: {}", sidecar, e.what()), v.Mark());
  }
}

YAML::Node load_document(const std::string& text, const std::string& source) {
  try {
    return YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    if (e.mark.is_null()) throw ConfigError(fmt::format("{}: malformed YAML: {}", source, e.msg));
    throw ConfigError(fmt::format("{}:{}:{}: malformed YAML: {}", source, e.mark.line + 1, e.mark.column + 1, e.msg));
  }
}

}  // namespace

Config parse_config(const std::string& yaml_text, const std::string& source, const std::vector<std::string>& overrides,
                    int64_t world_size) {
  ConfigSource src(source);
  YAML::Node root = load_document(yaml_text, source);
  try {
    if (root.IsNull()) root.reset(YAML::Node(YAML::NodeType::Map));
    if (!root.IsMap()) {
      const YAML::Mark m = root.Mark();
      throw ConfigError(
          fmt::format("{}:{}:{}: expected a mapping of sections (model, parallel, training, ...) at "
                      "the top level, got {}",
                      source, m.line + 1, m.column + 1, describe(root)));
    }
    for (const auto& o : overrides) apply_override(root, o, src);
    check_keys(root, "", src);
    Config c;
    c.source = source;
    Reader reader(root, src);
    config_keys::visit(reader, c);
    resolve_auto_vocab(root, c, src);
    resolve_config(c, world_size, src);
    check_derived(root, c, src, !overrides.empty());
    return c;
  } catch (const YAML::Exception& e) {  // not expected: every access above is checked
    throw ConfigError(fmt::format("{}: {}", source, e.what()));
  }
}

namespace {
constexpr size_t kMaxConfigBytes = size_t{16} << 20;
}  // namespace

Config load_config(const std::string& path, const std::vector<std::string>& overrides, int64_t world_size) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw ConfigError(fmt::format("{}: config file not found", path));
  if (std::filesystem::is_directory(path, ec))
    throw ConfigError(fmt::format("{}: is a directory, expected a YAML config file", path));
  // Only a regular file of bounded size: /dev/zero or a FIFO would be read without end.
  if (!std::filesystem::is_regular_file(path, ec))
    throw ConfigError(
        fmt::format("{}: is not a regular file (a device, FIFO or socket), expected a YAML config file", path));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(fmt::format("{}: cannot open the config file", path));
  std::string text(kMaxConfigBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxConfigBytes)
    throw ConfigError(
        fmt::format("{}: is larger than {} MiB; a config file is a few KiB of YAML", path, kMaxConfigBytes >> 20));
  return parse_config(text, path, overrides, world_size);
}

int64_t layout_world_size(const std::string& path, const std::vector<std::string>& overrides, bool* data_auto) {
  if (data_auto) *data_auto = true;
  try {
    ConfigSource src(path);
    YAML::Node root = YAML::LoadFile(path);
    for (const auto& o : overrides) apply_override(root, o, src);
    int64_t world = 1;
    for (const char* key : {"tensor", "pipeline", "data"}) {
      const YAML::Node n = root["parallel"] ? root["parallel"][key] : YAML::Node();
      int64_t v = 1;
      const bool automatic = !n.IsDefined() || n.IsNull() || (n.IsScalar() && n.Scalar() == "auto");
      if (!automatic && !(parse_int(n, v) && v >= 1)) return 0;
      if (data_auto && std::string_view(key) == "data") *data_auto = automatic;
      world *= v;
    }
    return world;
  } catch (const std::exception&) {  // unreadable: load_config says why
    return 0;
  }
}

}  // namespace mt
