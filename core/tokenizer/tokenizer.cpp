// tokenizer.cpp: the byte tokenizer and the tokenizer registry.
#include "core/tokenizer/tokenizer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <optional>
#include <stdexcept>

#include "core/io/crc.h"

namespace mt {

std::unique_ptr<Tokenizer> load_bpe_tokenizer(const TokenizerOptions& options);            // tokenizer_files.cpp
std::unique_ptr<Tokenizer> load_sentencepiece_tokenizer(const TokenizerOptions& options);  // tokenizer_spm.cpp

void ByteTokenizer::encode_with(std::string_view text, std::vector<int32_t>& out, EncodeCache*) const {
  out.reserve(out.size() + text.size());
  for (char c : text) out.push_back(static_cast<unsigned char>(c));
}

std::string ByteTokenizer::decode(std::span<const int32_t> ids) const {
  std::string s;
  for (int32_t t : ids) {
    if (t >= 0 && t < 256)
      s += static_cast<char>(t);
    else if (t != eod())
      s += "\xEF\xBF\xBD";  // U+FFFD
  }
  return s;
}

uint32_t ByteTokenizer::vocabulary_hash() const {
  std::vector<std::string> pieces;
  for (int b = 0; b < 256; ++b) pieces.emplace_back(1, static_cast<char>(b));
  const int32_t eod_id = eod();
  return hash_vocabulary(pieces, {&eod_id, 1});
}

uint32_t hash_vocabulary(std::span<const std::string> pieces, std::span<const int32_t> ids) {
  std::string bytes;
  auto append_int = [&](int64_t v) {  // little-endian whatever the host's order, so the hash is the same anywhere
    for (int shift = 0; shift < 64; shift += 8) bytes += static_cast<char>((static_cast<uint64_t>(v) >> shift) & 0xFF);
  };
  for (const std::string& p : pieces) {
    append_int(static_cast<int64_t>(p.size()));
    bytes += p;
  }
  for (int32_t id : ids) append_int(id);
  return crc32c(bytes.data(), bytes.size());
}

TokenDType token_dtype_for_vocab(int64_t vocab_size) { return vocab_size < 65500 ? TokenDType::u16 : TokenDType::i32; }

TokenizerKind parse_tokenizer_kind(std::string_view name) {
  if (const std::optional<TokenizerKind> kind = parse_choice<TokenizerKind>(name)) return *kind;
  throw std::invalid_argument(
      fmt::format("unknown tokenizer '{}' (supported: {})", name, fmt::join(EnumNames<TokenizerKind>::names, ", ")));
}

std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerOptions& options) {
  switch (options.kind) {
    case TokenizerKind::byte:
      return std::make_unique<ByteTokenizer>();
    case TokenizerKind::gpt2:
    case TokenizerKind::hf:
      return load_bpe_tokenizer(options);
    case TokenizerKind::sentencepiece:
      return load_sentencepiece_tokenizer(options);
  }
  throw std::invalid_argument(fmt::format("tokenizer kind {} out of range", static_cast<int>(options.kind)));
}

}  // namespace mt
