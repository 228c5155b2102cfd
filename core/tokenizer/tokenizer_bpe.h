// tokenizer_bpe.h: a BPE tokenizer as Hugging Face's tokenizers runs one: added tokens are cut out of the raw
// text first, the rest is normalized, pre-tokenized (regex splits, or Metaspace), each piece is BPE-encoded
// (cached per word) on its bytes (byte-level: GPT-2, Llama-3) or on its characters with byte fallback
// (SentencePiece-style: Llama-2, Mistral), and the post-processor's special tokens go around the whole. The
// loaders for GPT-2's files and tokenizer.json build it (tokenizer_files.cpp).
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tokenizer/added_tokens.h"
#include "core/tokenizer/bpe.h"
#include "core/tokenizer/normalizer.h"
#include "core/tokenizer/post_processor.h"
#include "core/tokenizer/pretokenizer.h"
#include "core/tokenizer/tokenizer.h"

namespace mt {

struct ByteLevelBpeSpec {
  TokenizerKind kind = TokenizerKind::hf;  // gpt2 or hf
  BpeModel model;
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  std::optional<Metaspace> metaspace;  // instead of pre_tokenizer (SentencePiece-style)
  bool add_prefix_space = false;       // ByteLevel's: a piece not starting with ' ' gets one
  std::vector<AddedToken> added;
  SpecialTemplate specials;  // the post-processor's ids around each text (empty: none, or left out)
  int32_t eod = 0;
  int64_t vocab_size = 0;
  std::vector<std::string> id_bytes;  // id -> the bytes it decodes to (added tokens: their content)
  bool decode_strips_space = false;   // the decoder drops one leading space (the one the normalizer prepended)
};

class ByteLevelBpeTokenizer final : public Tokenizer {
 public:
  explicit ByteLevelBpeTokenizer(ByteLevelBpeSpec spec);
  TokenizerKind kind() const override { return spec_.kind; }
  int64_t vocab_size() const override { return spec_.vocab_size; }
  int32_t eod() const override { return spec_.eod; }
  TokenDType storage_dtype() const override { return token_dtype_for_vocab(spec_.vocab_size); }
  std::unique_ptr<EncodeCache> make_cache() const override;
  void encode_with(std::string_view text, std::vector<int32_t>& out, EncodeCache* cache) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  uint32_t vocabulary_hash() const override;

 private:
  void encode_text(std::string_view text, bool at_start, std::vector<int32_t>& out, EncodeCache& cache) const;

  ByteLevelBpeSpec spec_;
  std::vector<AddedToken> matched_;  // spec_.added, normalized=true ones with normalized content
  AddedTokenMatcher added_;          // points into matched_
};

}  // namespace mt
