// tokenizer_sidecar.h: PREFIX.tokenizer.yaml, written by `data prepare` beside PREFIX.bin/.idx: which tokenizer
// made the ids (its kind, its files as absolute paths, the named end-of-document token), its vocabulary size,
// end-of-document id and vocabulary hash (Tokenizer::vocabulary_hash). `model.vocab_size: auto` reads vocab_size from it (core/config); `data inspect
// --decode` rebuilds the tokenizer from it.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/tokenizer/tokenizer.h"

namespace mt {

struct TokenizerSidecar {
  TokenizerOptions tokenizer;  // name and files, as make_tokenizer takes them
  int64_t vocab_size = 0;
  int32_t eod = 0;
  std::optional<uint32_t> vocab_hash;  // none in sidecars written before it was recorded
};

std::string tokenizer_sidecar_path(const std::string& prefix);  // PREFIX.tokenizer.yaml

// The sidecar's text for `options` (files made absolute) and the tokenizer built from them.
std::string tokenizer_sidecar_yaml(const TokenizerOptions& options, const Tokenizer& tokenizer);

// nullopt when PREFIX.tokenizer.yaml does not exist; DataError naming the file when it is malformed.
std::optional<TokenizerSidecar> read_tokenizer_sidecar(const std::string& prefix);
// The same for a sidecar at `path` (a checkpoint's tokenizer.yaml, `ckpt export --tokenizer-sidecar`).
std::optional<TokenizerSidecar> read_tokenizer_sidecar_file(const std::string& path);

// What differs between the tokenizers two sidecars record, one "what: a vs b" entry each: the kind, vocab_size,
// vocab_hash (when both have one), the end-of-document id and, for hf, add_special_tokens. Empty when the ids of
// one mean what they mean in the other. The file paths are not compared: a moved file is the same tokenizer.
std::vector<std::string> tokenizer_differences(const TokenizerSidecar& a, const TokenizerSidecar& b);

}  // namespace mt
