// tokenizer_sidecar.h: PREFIX.tokenizer.yaml, written by `data prepare` beside PREFIX.bin/.idx: which tokenizer
// made the ids (its kind, its files as absolute paths, the named end-of-document token), its vocabulary size
// and end-of-document id. `model.vocab_size: auto` reads vocab_size from it (core/config); `data inspect
// --decode` rebuilds the tokenizer from it.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "core/data/tokenizer.h"

namespace mt {

struct TokenizerSidecar {
  TokenizerOptions tokenizer;  // name and files, as make_tokenizer takes them
  int64_t vocab_size = 0;
  int32_t eod = 0;
};

std::string tokenizer_sidecar_path(const std::string& prefix);  // PREFIX.tokenizer.yaml

// The sidecar's text for `options` (files made absolute) and the tokenizer built from them.
std::string tokenizer_sidecar_yaml(const TokenizerOptions& options, const Tokenizer& tokenizer);

// nullopt when PREFIX.tokenizer.yaml does not exist; DataError naming the file when it is malformed.
std::optional<TokenizerSidecar> read_tokenizer_sidecar(const std::string& prefix);
// The same for a sidecar at `path` (a checkpoint's tokenizer.yaml, `ckpt export --tokenizer-sidecar`).
std::optional<TokenizerSidecar> read_tokenizer_sidecar_file(const std::string& path);

}  // namespace mt
