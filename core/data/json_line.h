// json_line.h: a small strict JSON reader for one JSONL line, extracting one top-level string field.
#pragma once
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace mt {

// A malformed line; the message says what is wrong and at which column (1-based byte).
class JsonError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// `line` must hold exactly one JSON object (surrounding whitespace allowed). Returns the value of its
// top-level member `key` decoded to UTF-8 (escapes \" \\ \/ \b \f \n \r \t and \uXXXX, surrogate pairs
// combined), or nullopt when the object has no such member. The whole line is validated (RFC 8259);
// a malformed line, a lone surrogate, or a `key` whose value is not a string throws JsonError.
// With duplicate keys the last one wins, as in Python's json.
std::optional<std::string> json_string_field(std::string_view line, std::string_view key);

}  // namespace mt
