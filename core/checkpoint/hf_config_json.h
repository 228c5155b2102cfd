// hf_config_json.h: the small JSON writer the Hugging Face config.json files are made with (keys in the order
// given, two-space indent, as transformers' save_pretrained writes them).
#pragma once
#include <charconv>
#include <cstdint>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "core/dtype.h"

namespace mt::hf_json {

// The shortest text that reads back as v: 0.1, not 0.10000000000000001.
inline std::string num(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}
inline std::string boolean(bool v) { return v ? "true" : "false"; }

// transformers' torch_dtype name of an export dtype.
inline const char* torch_dtype(DType dtype) {
  return dtype == DType::bf16 ? "bfloat16" : dtype == DType::f16 ? "float16" : "float32";
}

// Without a known tokenizer: the byte tokenizer's end-of-document token, the last id.
inline int64_t eos_id(std::optional<int32_t> eod, int64_t vocab) { return eod ? int64_t{*eod} : vocab - 1; }

// {"key": value, ...}: values are JSON text as given.
class Object {
 public:
  void add(const std::string& key, const std::string& value) {
    text_ += fmt::format("{}  \"{}\": {}", text_.empty() ? "{\n" : ",\n", key, value);
  }
  std::string str() const { return text_ + "\n}\n"; }

 private:
  std::string text_;
};

}  // namespace mt::hf_json
