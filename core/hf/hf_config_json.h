// hf_config_json.h: the small JSON writer the Hugging Face config.json files are made with (keys in the order
// given, two-space indent, as transformers' save_pretrained writes them).
#pragma once
#include <charconv>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "core/hf/hf_tokenizer_export.h"
#include "core/base/dtype.h"

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

// config.json's bos_token_id and eos_token_id: the tokenizer's; without a known tokenizer, the byte tokenizer's
// end-of-document token, the last id, for both.
inline std::pair<std::string, std::string> bos_eos_ids(std::optional<HfSpecialIds> ids, int64_t vocab) {
  if (ids) return {std::to_string(ids->bos), std::to_string(ids->eos)};
  return {std::to_string(vocab - 1), std::to_string(vocab - 1)};
}

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

// The keys every exported config.json starts with: architectures, model_type, vocab_size.
inline Object begin_config(const char* architecture, const char* model_type, int64_t vocab) {
  Object j;
  j.add("architectures", fmt::format("[\"{}\"]", architecture));
  j.add("model_type", fmt::format("\"{}\"", model_type));
  j.add("vocab_size", std::to_string(vocab));
  return j;
}

// The keys every exported config.json ends with: tie_word_embeddings, bos_token_id, eos_token_id, torch_dtype.
inline std::string end_config(Object& j, bool tied, int64_t vocab, std::optional<HfSpecialIds> ids, DType dtype) {
  const auto [bos, eos] = bos_eos_ids(ids, vocab);
  j.add("tie_word_embeddings", boolean(tied));
  j.add("bos_token_id", bos);
  j.add("eos_token_id", eos);
  j.add("torch_dtype", fmt::format("\"{}\"", torch_dtype(dtype)));
  return j.str();
}

}  // namespace mt::hf_json
