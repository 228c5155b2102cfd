// json_line.cpp: a recursive-descent JSON validator that keeps one top-level string member.
#include "core/data/json_line.h"

#include <fmt/format.h>

namespace mt {

namespace {

constexpr int kMaxDepth = 256;

class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}

  std::optional<std::string> top_level_field(std::string_view key) {
    skip_ws();
    if (peek() != '{') fail(at_end() ? "empty line, expected a JSON object" : "expected a JSON object '{'");
    ++pos_;
    std::optional<std::string> found;
    skip_ws();
    if (peek() == '}') {
      ++pos_;
    } else {
      for (;;) {
        skip_ws();
        if (peek() != '"') fail("expected a string as object key");
        ++pos_;
        std::string name;
        parse_string(&name);
        skip_ws();
        expect(':', "expected ':' after object key");
        skip_ws();
        if (name == key) {
          if (peek() != '"') fail(fmt::format("the value of \"{}\" is not a string", std::string(key)));
          ++pos_;
          std::string value;
          parse_string(&value);
          found = std::move(value);
        } else {
          parse_value(1);
        }
        skip_ws();
        if (peek() == ',') {
          ++pos_;
          continue;
        }
        expect('}', "expected ',' or '}' in object");
        break;
      }
    }
    skip_ws();
    if (!at_end()) fail("unexpected text after the JSON object");
    return found;
  }

 private:
  bool at_end() const { return pos_ >= s_.size(); }
  char peek() const { return at_end() ? '\0' : s_[pos_]; }
  [[noreturn]] void fail(const std::string& what) const {
    throw JsonError(fmt::format("column {}: {}", pos_ + 1, what));
  }
  void expect(char c, const char* what) {
    if (peek() != c || at_end()) fail(what);
    ++pos_;
  }
  void skip_ws() {
    while (!at_end() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }

  void parse_value(int depth) {
    if (depth > kMaxDepth) fail("nesting too deep");
    switch (peek()) {
      case '{':
        parse_container(depth, '}');
        return;
      case '[':
        parse_container(depth, ']');
        return;
      case '"':
        ++pos_;
        parse_string(nullptr);
        return;
      case 't':
        literal("true");
        return;
      case 'f':
        literal("false");
        return;
      case 'n':
        literal("null");
        return;
      default:
        if (peek() == '-' || (peek() >= '0' && peek() <= '9')) {
          parse_number();
          return;
        }
        fail(at_end() ? "unexpected end of line, expected a value" : "expected a value");
    }
  }

  // An object ('}') or an array (']') whose contents are validated and dropped.
  void parse_container(int depth, char close) {
    ++pos_;
    skip_ws();
    if (peek() == close) {
      ++pos_;
      return;
    }
    for (;;) {
      skip_ws();
      if (close == '}') {
        if (peek() != '"') fail("expected a string as object key");
        ++pos_;
        parse_string(nullptr);
        skip_ws();
        expect(':', "expected ':' after object key");
        skip_ws();
      }
      parse_value(depth + 1);
      skip_ws();
      if (peek() == ',' && !at_end()) {
        ++pos_;
        continue;
      }
      expect(close, close == '}' ? "expected ',' or '}' in object" : "expected ',' or ']' in array");
      return;
    }
  }

  void literal(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) fail("invalid literal (expected true, false or null)");
    pos_ += word.size();
  }

  void digits() {
    if (!(peek() >= '0' && peek() <= '9') || at_end()) fail("expected a digit");
    while (!at_end() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
  }

  void parse_number() {
    if (peek() == '-') ++pos_;
    if (peek() == '0' && !at_end())
      ++pos_;  // no leading zeros: "01" leaves '1' as unexpected text
    else
      digits();
    if (peek() == '.' && !at_end()) {
      ++pos_;
      digits();
    }
    if ((peek() == 'e' || peek() == 'E') && !at_end()) {
      ++pos_;
      if (peek() == '+' || peek() == '-') ++pos_;
      digits();
    }
  }

  uint32_t hex4() {
    if (pos_ + 4 > s_.size()) fail("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = s_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9')
        v |= static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f')
        v |= static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        v |= static_cast<uint32_t>(c - 'A' + 10);
      else
        fail("invalid hex digit in \\u escape");
    }
    return v;
  }

  static void put_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  // After the opening quote; leaves pos_ after the closing quote. out == nullptr only validates.
  void parse_string(std::string* out) {
    for (;;) {
      if (at_end()) fail("unterminated string");
      const char c = s_[pos_];
      if (c == '"') {
        ++pos_;
        return;
      }
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in string (must be escaped)");
      if (c != '\\') {
        if (out) *out += c;
        ++pos_;
        continue;
      }
      ++pos_;
      if (at_end()) fail("unterminated escape");
      const char e = s_[pos_++];
      char plain = 0;
      switch (e) {
        case '"':
          plain = '"';
          break;
        case '\\':
          plain = '\\';
          break;
        case '/':
          plain = '/';
          break;
        case 'b':
          plain = '\b';
          break;
        case 'f':
          plain = '\f';
          break;
        case 'n':
          plain = '\n';
          break;
        case 'r':
          plain = '\r';
          break;
        case 't':
          plain = '\t';
          break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xDC00 && cp <= 0xDFFF) fail("unpaired low surrogate in \\u escape");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (s_.substr(pos_, 2) != "\\u") fail("high surrogate not followed by a \\u low surrogate");
            pos_ += 2;
            const uint32_t lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail("high surrogate not followed by a low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          if (out) put_utf8(*out, cp);
          continue;
        }
        default:
          --pos_;
          fail(fmt::format("invalid escape '\\{}'", e));
      }
      if (out) *out += plain;
    }
  }

  std::string_view s_;
  size_t pos_ = 0;
};

}  // namespace

std::optional<std::string> json_string_field(std::string_view line, std::string_view key) {
  return Parser(line).top_level_field(key);
}

}  // namespace mt
