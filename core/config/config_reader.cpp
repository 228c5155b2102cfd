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
#include "core/config/config_reader_detail.h"
#include "core/config/config_rules.h"
#include "core/config/config_source.h"

namespace mt {
using namespace config_detail;  // NOLINT(google-build-using-namespace): the document checks and helpers

namespace {

using config_keys::Key;

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
  // A document with the derived section is one to_yaml wrote; before issue 49 it wrote inert keys too, at their
  // defaults, which such a document may therefore still hold.
  Reader(const YAML::Node& root, ConfigSource& src)
      : src_(src), written_(root.IsMap() && root[config_keys::kDerivedSection].IsDefined()) {
    stack_.push_back({root, ""});
  }

  // Key k into `out` (holding its default), typed by read() below; a key the document sets although it means
  // nothing in this config (Key::inert) is refused.
  template <class T>
  void field(const Key& k, T& out) {
    const T before = out;
    read(k, out);
    if (!k.inert) return;
    const std::string path = join(stack_.back().path, k.name);
    if (src_.given(path) && !(written_ && out == before)) src_.fail(path, fmt::format("is set, but {}", k.inert));
  }

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

  void read(const Key& k, int64_t& out) {
    std::string path;
    auto n = value(k, path);
    if (!n) return;
    if (k.accepts_auto && n->IsScalar() && n->Scalar() == "auto") {
      out = 0;
    } else if (!parse_int(*n, out)) {
      src_.fail(path, fmt::format("expected an integer{}, got {}", k.accepts_auto ? " or 'auto'" : "", describe(*n)),
                n->Mark());
    } else if (k.refuses_zero && out == 0) {
      src_.fail(
          path,
          fmt::format("0 is not a valid value: leave the key out (or write auto) for the default ({})", k.refuses_zero),
          n->Mark());
    }
  }
  void read(const Key& k, double& out) { real(k, out); }
  void read(const Key& k, float& out) { real(k, out); }
  void read(const Key& k, bool& out) {
    std::string path;
    auto n = value(k, path);
    if (n && !parse_bool(*n, out)) src_.fail(path, "expected true or false, got " + describe(*n), n->Mark());
  }
  void read(const Key& k, std::string& out) {
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
  void read(const Key& k, E& out) {
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
  void read(const Key& k, std::vector<std::string>& out) {
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
  void read(const Key& k, std::vector<double>& out) { list(k, out, "a number", "numbers", parse_real<double>); }
  void read(const Key& k, std::vector<int64_t>& out) { list(k, out, "an integer", "integers", parse_int); }

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
    if (!n) return;
    if (k.zero_word && n->IsScalar() && n->Scalar() == k.zero_word) {
      out = 0;
    } else if (!parse_real(*n, out)) {
      src_.fail(path,
                fmt::format("expected a number{}, got {}", k.zero_word ? fmt::format(" or '{}'", k.zero_word) : "",
                            describe(*n)),
                n->Mark());
    } else if (k.refuses_zero && out == 0) {
      src_.fail(path,
                fmt::format("0 is not a valid value: leave the key out (or write {}) for the default ({})",
                            k.zero_word ? k.zero_word : "auto", k.refuses_zero),
                n->Mark());
    }
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
  bool written_;
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
      {"head_dim", c.model.head_dim, true},  // a key now; configs written before it list it here
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
// first training prefix (of a blend too) (core/tokenizer/tokenizer_sidecar.h writes it; only its vocab_size is read here).
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

struct ConfigDocument::Root {
  YAML::Node node;
};

ConfigDocument::ConfigDocument(const std::string& yaml_text, std::string source)
    : root_(std::make_unique<Root>(Root{load_document(yaml_text, source)})), source_(std::move(source)) {}

ConfigDocument::~ConfigDocument() = default;

namespace {

// parse_config's work on a loaded document, which the overrides write into.
Config parse_root(YAML::Node root, const std::string& source, const std::vector<std::string>& overrides,
                  int64_t world_size) {
  ConfigSource src(source);
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

}  // namespace

// Each parse on its own copy of the document (the overrides write into it); parse_config's document is its own.
Config ConfigDocument::parse(const std::vector<std::string>& overrides, int64_t world_size) const {
  return parse_root(YAML::Clone(root_->node), source_, overrides, world_size);
}

Config parse_config(const std::string& yaml_text, const std::string& source, const std::vector<std::string>& overrides,
                    int64_t world_size) {
  return parse_root(load_document(yaml_text, source), source, overrides, world_size);
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
    for (const char* key : {"tensor", "context", "pipeline", "data"}) {
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
