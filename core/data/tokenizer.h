// tokenizer.h: text -> token ids for `megatrain data prepare`. Only the byte tokenizer exists for now.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/data/indexed_dataset.h"

namespace mt {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string name() const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int32_t eod() const = 0;               // end-of-document id
  virtual TokenDType storage_dtype() const = 0;  // the smallest dtype that holds every id
  virtual void encode(std::string_view text, std::vector<int32_t>& out) const = 0;  // appends to out
};

// Token = byte value 0..255, end of document 256: vocabulary 257, stored as uint16.
class ByteTokenizer final : public Tokenizer {
 public:
  std::string name() const override { return "byte"; }
  int64_t vocab_size() const override { return 257; }
  int32_t eod() const override { return 256; }
  TokenDType storage_dtype() const override { return TokenDType::u16; }
  void encode(std::string_view text, std::vector<int32_t>& out) const override;
};

// The names make_tokenizer accepts.
std::vector<std::string> supported_tokenizers();
// Throws std::invalid_argument listing the supported names for any other name.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name);

}  // namespace mt
