// config_writer.cpp: to_yaml, the resolved configuration as YAML that parses back to the same Config.
#include <fmt/format.h>

#include <cctype>
#include <charconv>
#include <string>
#include <utility>
#include <string_view>
#include <vector>

#include "core/config/config.h"
#include "core/config/config_keys.h"

namespace mt {
namespace {

using config_keys::Key;

bool looks_like_number(std::string_view s) {
  double d;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), d);
  return ec == std::errc() && end == s.data() + s.size();
}

bool yaml_special_word(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  for (const char* w : {"null", "true", "false", "yes", "no", "on", "off", "y", "n", ".inf", ".nan"})
    if (s == w) return true;
  return false;
}

// Plain when it cannot be read as anything else, double-quoted otherwise.
std::string quote(const std::string& s) {
  bool plain = !s.empty() && !yaml_special_word(s) && !looks_like_number(s) && s.front() != '-';
  for (char ch : s)
    plain = plain && (std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '.' || ch == '/' || ch == '-');
  if (plain) return s;
  std::string out = "\"";
  for (char ch : s) {
    const auto u = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\')
      out += '\\', out += ch;
    else if (u < 0x20 || u == 0x7f)
      out += fmt::format("\\x{:02x}", u);
    else
      out += ch;
  }
  return out + "\"";
}

// Floats and doubles in their shortest form that reads back to the same value.
std::string scalar(double v) { return fmt::format("{}", v); }
std::string scalar(float v) { return fmt::format("{}", v); }
std::string scalar(int64_t v) { return fmt::format("{}", v); }
std::string scalar(bool v) { return v ? "true" : "false"; }
std::string scalar(const std::string& v) { return quote(v); }
template <NamedEnum E>
std::string scalar(E v) {
  return std::string(name_of(v));
}

template <class T>
std::string scalar(const std::vector<T>& v) {
  std::vector<std::string> items;
  for (const auto& x : v) items.push_back(scalar(x));
  return fmt::format("[{}]", fmt::join(items, ", "));
}

class Writer {
 public:
  std::string out;

  template <class F>
  void section(const char* name, F&& body) {
    out += fmt::format("{:{}}{}:\n", "", indent_, name);
    indent_ += 2;
    body();
    indent_ -= 2;
  }
  // A key that means nothing in this config (Key::inert) is left out: the reader would refuse it.
  template <class T>
  void field(const Key& k, const T& v) {
    if (!k.inert) line(k.name, text(k, v));
  }
  template <class T>
  static std::string text(const Key&, const T& v) {
    return scalar(v);
  }
  static std::string text(const Key& k, const int64_t& v) { return k.accepts_auto && v == 0 ? "auto" : scalar(v); }
  static std::string text(const Key& k, const double& v) { return k.zero_word && v == 0 ? k.zero_word : scalar(v); }
  void line(const char* name, const std::string& value) {
    out += fmt::format("{:{}}{}: {}\n", "", indent_, name, value);
  }

 private:
  int indent_ = 0;
};

}  // namespace

std::string to_yaml(const Config& c) {
  Writer w;
  // model.head_dim is written as auto while it is the quotient, so a written config follows a later change of
  // hidden_size or num_heads (eval's overrides of a checkpoint's config) as the file it came from did.
  Config out = c;
  ModelConfig& m = out.model;
  if (m.num_heads > 0 && m.hidden_size % m.num_heads == 0 && m.head_dim == m.hidden_size / m.num_heads) m.head_dim = 0;
  config_keys::visit(w, std::as_const(out));
  // Computed from the keys above on every read; written for people and tools, skipped by the reader.
  w.section(config_keys::kDerivedSection, [&] {
    w.line("padded_vocab_size", scalar(c.model.padded_vocab_size));
    w.line("data_parallel_size", scalar(c.parallel.data));
    w.line("world_size", scalar(c.parallel.world_size));
    w.line("num_microbatches", scalar(c.training.num_microbatches));
    w.line("tokens_per_iteration", scalar(c.training.global_batch_size * c.model.seq_length));
  });
  return w.out;
}

}  // namespace mt
