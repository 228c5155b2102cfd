// tokenizer.h: text -> token ids for `megatrain data prepare`: the byte tokenizer, GPT-2's byte-level BPE
// (vocab.json + merges.txt), Hugging Face byte-level BPE (tokenizer.json) and SentencePiece (.model).
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/enum_names.h"
#include "core/io/file_error.h"
#include "core/tokenizer/token_dtype.h"

namespace mt {

// The tokenizers `data prepare` runs: byte values; GPT-2's byte-level BPE (vocab.json + merges.txt); a Hugging Face
// byte-level BPE tokenizer.json; SentencePiece (.model). Named in `--tokenizer` and the sidecar's `kind`.
enum class TokenizerKind { byte, gpt2, hf, sentencepiece };
template <>
struct EnumNames<TokenizerKind> {
  static constexpr std::array names{"byte", "gpt2", "hf", "sentencepiece"};
  static constexpr std::array<const char*, 0> planned{};
};
// The kind a name spells; throws std::invalid_argument "unknown tokenizer 'NAME' (supported: byte, gpt2, ...)".
TokenizerKind parse_tokenizer_kind(std::string_view name);

// Per-thread scratch a tokenizer keeps between calls (the BPE word cache, regex match buffers). One cache
// must not be used by two threads at once; the tokenizer itself is shared read-only.
class EncodeCache {
 public:
  virtual ~EncodeCache() = default;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual TokenizerKind kind() const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int32_t eod() const = 0;               // end-of-document id
  virtual TokenDType storage_dtype() const = 0;  // the smallest dtype that holds every id
  // A fresh cache for one worker thread (nullptr when the tokenizer keeps none).
  virtual std::unique_ptr<EncodeCache> make_cache() const { return nullptr; }
  // Appends the ids of `text` to out. `cache` is nullptr or one made by this tokenizer's make_cache().
  virtual void encode_with(std::string_view text, std::vector<int32_t>& out, EncodeCache* cache) const = 0;
  // The bytes the ids stand for, the end-of-document id left out (it separates documents); not necessarily valid
  // UTF-8 (a byte tokenizer's, or a byte-level BPE's, ids can split a character): see valid_utf8(). An id
  // outside the vocabulary decodes to U+FFFD.
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // A CRC-32C of what the ids stand for: each id's text (a BPE's bytes, with its merges in rank order and the
  // post-processor's ids; a SentencePiece model's pieces; the byte tokenizer's bytes). Two tokenizers with
  // different hashes give the same id different meanings; `data prepare` records it as the sidecar's vocab_hash.
  virtual uint32_t vocabulary_hash() const = 0;
  // The same, with a cache that lives for this call only.
  void encode(std::string_view text, std::vector<int32_t>& out) const {
    std::unique_ptr<EncodeCache> cache = make_cache();
    encode_with(text, out, cache.get());
  }
};

// Token = byte value 0..255, end of document 256: vocabulary 257, stored as uint16.
class ByteTokenizer final : public Tokenizer {
 public:
  TokenizerKind kind() const override { return TokenizerKind::byte; }
  int64_t vocab_size() const override { return 257; }
  int32_t eod() const override { return 256; }
  TokenDType storage_dtype() const override { return TokenDType::u16; }
  void encode_with(std::string_view text, std::vector<int32_t>& out, EncodeCache* cache) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  uint32_t vocabulary_hash() const override;
};

// The CRC-32C vocabulary_hash() gives: of `pieces` (id order, each after its length, so that no two lists give the
// same bytes) and then `ids` (merges, special ids: what else fixes the meaning of the ids).
uint32_t hash_vocabulary(std::span<const std::string> pieces, std::span<const int32_t> ids = {});

// What make_tokenizer needs: the kind and the files that kind reads.
struct TokenizerOptions {
  TokenizerKind kind = TokenizerKind::byte;
  std::string vocab_file;       // gpt2: GPT-2's vocab.json
  std::string merge_file;       // gpt2: GPT-2's merges.txt
  std::string tokenizer_file;   // hf: a Hugging Face tokenizer.json
  std::string tokenizer_model;  // sentencepiece: a SentencePiece .model file
  std::string eod_token;        // hf, sentencepiece: the end-of-document token's text (default: the known eos)
  // hf: apply tokenizer.json's post-processor (e.g. Llama-3's <|begin_of_text|> before each text), as
  // tokenizers' encode (add_special_tokens=True) and Megatron's HuggingFaceTokenizer.tokenize do.
  bool add_special_tokens = true;
  // sentencepiece: libsentencepiece takes about 200 bytes of memory per byte of a document it encodes (11 GB for
  // one 50 MB line), so a longer document is encoded in pieces of at most this many bytes, cut at a space between
  // two printable ASCII characters where the model makes that exact (the ids are those of the whole document,
  // but for unigram's ties within float rounding: tokenizer_spm.cpp and docs/data.md say when). Where no such cut is found, a piece may grow to 16 times this; a document that
  // would need a longer one is refused (DataError).
  int64_t spm_chunk_bytes = int64_t{1} << 20;
};

// Megatron's rule: uint16 below 65500 ids, int32 from there.
TokenDType token_dtype_for_vocab(int64_t vocab_size);

// Whether this build links libsentencepiece (found by pkg-config at configure time).
bool have_sentencepiece();

// Throws DataError naming the file for a missing, malformed or unsupported tokenizer file.
std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerOptions& options);

}  // namespace mt
