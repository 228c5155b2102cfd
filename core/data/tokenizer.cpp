// tokenizer.cpp: the byte tokenizer and the tokenizer registry.
#include "core/data/tokenizer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>

namespace mt {

void ByteTokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  out.reserve(out.size() + text.size());
  for (char c : text) out.push_back(static_cast<unsigned char>(c));
}

std::vector<std::string> supported_tokenizers() { return {"byte"}; }

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name) {
  if (name == "byte") return std::make_unique<ByteTokenizer>();
  throw std::invalid_argument(
      fmt::format("unknown tokenizer '{}' (supported: {})", name, fmt::join(supported_tokenizers(), ", ")));
}

}  // namespace mt
