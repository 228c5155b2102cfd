// post_processor.h: what a tokenizer.json post_processor does to the ids of one text: the special tokens
// TemplateProcessing's `single` template puts before and after the sequence ($A), e.g. Llama-3's
// <|begin_of_text|>. Hugging Face's Tokenizer.encode applies it by default (add_special_tokens=True), and so
// does Megatron's HuggingFaceTokenizer.tokenize; ByteLevel only moves offsets, so it changes no ids.
#pragma once
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace mt {

struct SpecialTemplate {
  std::vector<int32_t> before, after;  // ids around the encoded text
};

// `j` is the post_processor member (null: none). TemplateProcessing, ByteLevel and Sequence of these are
// understood; anything else (BertProcessing, RobertaProcessing, ...) throws DataError naming `where` and the type.
SpecialTemplate load_post_processor(const nlohmann::json& j, const std::string& where);

}  // namespace mt
