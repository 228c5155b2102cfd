// hf_config_json.h: the small JSON writer the Hugging Face config.json files are made with (keys in the order
// given, two-space indent, as transformers' save_pretrained writes them).
#pragma once
#include <charconv>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/hf/hf_mapping.h"
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

// config.json's bos_token_id and eos_token_id: the tokenizer's (or those the user gave); unknown, both null, which
// transformers reads as "none" (left out, it would take its own class's defaults, Llama's 1 and 2, ids that mean
// nothing here).
inline std::pair<std::string, std::string> bos_eos_ids(std::optional<HfSpecialIds> ids) {
  if (ids) return {std::to_string(ids->bos), std::to_string(ids->eos)};
  return {"null", "null"};
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

// A config.json value of a model shape, as JSON text.
using ConfigValue = std::function<std::string(const HfModelShape&)>;
inline ConfigValue integer(int64_t HfModelShape::*field) {
  return [field](const HfModelShape& s) { return std::to_string(s.*field); };
}
inline ConfigValue real(double HfModelShape::*field) {
  return [field](const HfModelShape& s) { return num(s.*field); };
}
inline ConfigValue moe_integer(int64_t HfMoeShape::*field) {
  return [field](const HfModelShape& s) { return std::to_string(s.moe.*field); };
}
inline ConfigValue literal(const char* json) {
  return [json](const HfModelShape&) { return std::string(json); };
}

// One key of an architecture's config.json and its value.
struct ConfigKey {
  const char* name;
  ConfigValue value;
};

// What a family's config.json says (hf_config_families.cpp): its model class (name_of(family)), model_type and its
// own keys, in the order written.
struct ConfigLayout {
  HfArch family;
  const char* model_type;
  std::vector<ConfigKey> keys;
};

// The config.json of `s`: architectures, model_type and vocab_size, then the layout's keys, then
// tie_word_embeddings, bos_token_id, eos_token_id and torch_dtype.
inline std::string config_json(const ConfigLayout& layout, const HfModelShape& s, DType dtype,
                               std::optional<HfSpecialIds> ids) {
  Object j;
  j.add("architectures", fmt::format("[\"{}\"]", name_of(layout.family)));
  j.add("model_type", fmt::format("\"{}\"", layout.model_type));
  j.add("vocab_size", std::to_string(s.vocab));
  for (const ConfigKey& k : layout.keys) j.add(k.name, k.value(s));
  const auto [bos, eos] = bos_eos_ids(ids);
  j.add("tie_word_embeddings", boolean(s.tied));
  j.add("bos_token_id", bos);
  j.add("eos_token_id", eos);
  j.add("torch_dtype", fmt::format("\"{}\"", torch_dtype(dtype)));
  return j.str();
}

}  // namespace mt::hf_json
