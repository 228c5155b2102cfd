// tokenizer_fixtures.h: the tokenizer fixtures of tests/data/tokenizer/ (made by tests/interop/make_golden.py) and
// the golden ids Hugging Face's `tokenizers` gives the corpus, for the tokenizer tests and the `data prepare` ones.
#pragma once
#include <cstdint>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "core/tokenizer/tokenizer.h"
#include "tests/unit/file_text.h"
#include "tests/unit/source_root.h"

namespace mt::testing_util {

inline std::filesystem::path fixtures() { return source_root() / "tests" / "data" / "tokenizer"; }

inline std::string fixture(const std::string& name) { return (fixtures() / name).string(); }

// The ids of each document of corpus.jsonl under the tokenizer `name` (expected-<name>.txt: one line a document).
inline std::vector<std::vector<int32_t>> expected(const std::string& name) {
  std::vector<std::vector<int32_t>> ids;
  std::istringstream in(slurp(fixture("expected-" + name + ".txt")));
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    ids.emplace_back();
    for (int32_t id; words >> id;) ids.back().push_back(id);
  }
  return ids;
}

// The options of a Hugging Face tokenizer.json.
inline TokenizerOptions hf_file(const std::string& path) {
  TokenizerOptions o;
  o.kind = TokenizerKind::hf;
  o.tokenizer_file = path;
  return o;
}

}  // namespace mt::testing_util
