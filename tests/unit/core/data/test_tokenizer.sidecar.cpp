// test_tokenizer.sidecar.cpp: the tokenizer record PREFIX.tokenizer.yaml holds a vocabulary hash that changes
// with what the ids stand for (and nothing else), and tokenizer_differences names what differs between two
// records (issue 30, item 6). Part of test_tokenizer.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/tokenizer/tokenizer.h"
#include "core/tokenizer/tokenizer_sidecar.h"
#include "tests/unit/core/data/tokenizer_fixtures.h"
#include "tests/unit/expect_contains.h"
#include "tests/unit/file_text.h"
#include "tests/unit/temp_dir.h"

namespace mt {
namespace {

namespace fs = std::filesystem;
using testing_util::fixture;
using testing_util::slurp;
using testing_util::spit;
using testing_util::TempDir;

TokenizerOptions gpt2(const std::string& vocab, const std::string& merges) {
  TokenizerOptions o;
  o.kind = TokenizerKind::gpt2;
  o.vocab_file = vocab;
  o.merge_file = merges;
  return o;
}

uint32_t hash_of(const TokenizerOptions& o) { return make_tokenizer(o)->vocabulary_hash(); }

TEST(TokenizerSidecar, VocabularyHashFollowsWhatTheIdsStandFor) {
  TempDir dir;
  const std::string vocab = fixture("gpt2-vocab.json"), merges = fixture("gpt2-merges.txt");
  const uint32_t base = hash_of(gpt2(vocab, merges));
  // The same files elsewhere: the same hash (paths are not part of it).
  fs::copy_file(vocab, dir / "copy-vocab.json");
  fs::copy_file(merges, dir / "copy-merges.txt");
  EXPECT_EQ(hash_of(gpt2(dir / "copy-vocab.json", dir / "copy-merges.txt")), base);
  // Two tokens trading ids: the same size, another vocabulary.
  nlohmann::json v = nlohmann::json::parse(slurp(vocab));
  std::swap(v["a"], v["b"]);
  spit(dir / "swapped.json", v.dump());
  EXPECT_NE(hash_of(gpt2(dir / "swapped.json", merges)), base);
  // One merge fewer: the same ids, another segmentation.
  std::string text = slurp(merges);
  text.erase(text.find_last_of('\n', text.size() - 2) + 1);
  spit(dir / "fewer-merges.txt", text);
  EXPECT_NE(hash_of(gpt2(vocab, dir / "fewer-merges.txt")), base);
  // The post-processor's <|begin_of_text|> is part of the ids' meaning too.
  TokenizerOptions bos = testing_util::hf_file(fixture("llama3-bos-tokenizer.json")), no_bos = bos;
  no_bos.add_special_tokens = false;
  EXPECT_NE(hash_of(bos), hash_of(no_bos));
  EXPECT_NE(hash_of(TokenizerOptions{}), base);
}

TEST(TokenizerSidecar, RecordsTheVocabularyHashAndReadsOlderRecordsWithout) {
  TempDir dir;
  const TokenizerOptions o = gpt2(fixture("gpt2-vocab.json"), fixture("gpt2-merges.txt"));
  const auto tokenizer = make_tokenizer(o);
  spit(dir / "d.tokenizer.yaml", tokenizer_sidecar_yaml(o, *tokenizer));
  const std::optional<TokenizerSidecar> s = read_tokenizer_sidecar(dir / "d");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->vocab_hash, tokenizer->vocabulary_hash());
  spit(dir / "old.tokenizer.yaml", "kind: gpt2\nvocab_size: 400\neod: 0\n");
  EXPECT_FALSE(read_tokenizer_sidecar(dir / "old")->vocab_hash.has_value());
  spit(dir / "bad.tokenizer.yaml", "kind: gpt2\nvocab_size: 400\neod: 0\nvocab_hash: crc32c:12x45678\n");
  try {
    read_tokenizer_sidecar(dir / "bad");
    ADD_FAILURE() << "a malformed vocab_hash was read";
  } catch (const DataError& e) {
    EXPECT_CONTAINS(std::string(e.what()), (dir / "bad.tokenizer.yaml") + ": vocab_hash: 'crc32c:12x45678'");
  }
}

TokenizerSidecar record(TokenizerKind kind, int64_t vocab_size, int32_t eod, std::optional<uint32_t> hash) {
  TokenizerSidecar s;
  s.tokenizer.kind = kind;
  s.vocab_size = vocab_size;
  s.eod = eod;
  s.vocab_hash = hash;
  return s;
}

TEST(TokenizerSidecar, DifferencesNameKindSizeHashAndSpecialIds) {
  const TokenizerSidecar gpt2 = record(TokenizerKind::gpt2, 400, 0, 0xabcdef01);
  EXPECT_TRUE(tokenizer_differences(gpt2, gpt2).empty());
  const TokenizerSidecar byte = record(TokenizerKind::byte, 257, 256, 0x12345678);
  EXPECT_EQ(tokenizer_differences(gpt2, byte),
            (std::vector<std::string>{"kind: gpt2 vs byte", "vocab_size: 400 vs 257",
                                      "vocab_hash: crc32c:abcdef01 vs crc32c:12345678",
                                      "eod (the end-of-document id): 0 vs 256"}));
  // A permuted vocabulary of the same size: only the hash tells.
  EXPECT_EQ(tokenizer_differences(gpt2, record(TokenizerKind::gpt2, 400, 0, 0xabcdef02)),
            (std::vector<std::string>{"vocab_hash: crc32c:abcdef01 vs crc32c:abcdef02"}));
  // A record written before the hash was: what is there is compared.
  EXPECT_TRUE(tokenizer_differences(gpt2, record(TokenizerKind::gpt2, 400, 0, std::nullopt)).empty());
  EXPECT_EQ(tokenizer_differences(gpt2, record(TokenizerKind::gpt2, 400, 3, std::nullopt)),
            (std::vector<std::string>{"eod (the end-of-document id): 0 vs 3"}));
  TokenizerSidecar hf = record(TokenizerKind::hf, 404, 1, 7), hf_no_bos = hf;
  hf_no_bos.tokenizer.add_special_tokens = false;
  EXPECT_EQ(tokenizer_differences(hf, hf_no_bos), (std::vector<std::string>{"add_special_tokens: true vs false"}));
  // Where the files are is not the tokenizer.
  TokenizerSidecar moved = gpt2;
  moved.tokenizer.vocab_file = "/elsewhere/vocab.json";
  EXPECT_TRUE(tokenizer_differences(gpt2, moved).empty());
}

}  // namespace
}  // namespace mt
