// test_normalizer.cpp: tokenizer.json's normalizers (NFC/NFD/NFKC/NFKD, Lowercase, Strip, Replace with a String or
// a Regex, Sequence) give the text Hugging Face's tokenizers gives (expected values from tokenizers 0.23.3's
// normalize_str), the byte-level fixtures with normalizers match its ids (golden files from
// tests/interop/make_golden.py), added tokens meet the normalizer in tokenizers' order, and the normalizers that
// are not implemented are refused by name.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/data/indexed_dataset.h"
#include "core/data/json_line.h"
#include "core/tokenizer/normalizer.h"
#include "core/tokenizer/tokenizer.h"
#include "tests/unit/source_root.h"
#include "tests/unit/temp_dir.h"

namespace mt {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path fixtures() { return testing_util::source_root() / "tests" / "data" / "tokenizer"; }

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string normalize(const std::string& normalizer_json, const std::string& text) {
  return load_normalizer(json::parse(normalizer_json), "test").apply(text);
}

TEST(Normalizer, LowercaseIsRustsCharToLowercaseForEveryCharacter) {
  const std::string lower = R"({"type": "Lowercase"})";
  EXPECT_EQ(normalize(lower, "ABC xyz 123"), "abc xyz 123");
  EXPECT_EQ(normalize(lower, "İstanbul"), "i\u0307stanbul");  // full mapping: i + combining dot, not Turkish 'i'
  EXPECT_EQ(normalize(lower, "DIYARBAKIR"), "diyarbakir");    // root locale: I -> i, never dotless ı
  // Every capital sigma becomes σ: tokenizers maps character by character, so no final ς.
  EXPECT_EQ(normalize(lower, "ΟΔΟΣ ΚΑΙ ΑΣ. Σ"), "οδοσ και ασ. σ");
  EXPECT_EQ(normalize(lower, "ǅ ẞ Ꭰ ᾈ ς"), "ǆ ß ꭰ ᾀ ς");  // titlecase digraph, capital sharp s, Cherokee, iota
}

TEST(Normalizer, UnicodeFormsMatchTokenizers) {
  EXPECT_EQ(normalize(R"({"type": "NFKC"})", "ﬁ ① Å ｶ ²"), "fi 1 Å カ 2");
  EXPECT_EQ(normalize(R"({"type": "NFD"})", "é Å 각"), "e\u0301 A\u030a \u1100\u1161\u11a8");
  EXPECT_EQ(normalize(R"({"type": "NFC"})", "e\u0301 A\u030a \u1100\u1161\u11a8 a\u0307\u0323"), "é Å 각 ạ\u0307");
  EXPECT_EQ(normalize(R"({"type": "NFKD"})", "ﬁ é"), "fi e\u0301");
  // tokenizers' tables are Unicode 9.0's: no NFKC decomposition of U+32FF (12.1), no reordering around U+1DF6
  // (10.0, combining class 232 since), U+1F23B (9.0) decomposed.
  EXPECT_EQ(normalize(R"({"type": "NFKC"})", "\u32ff \U0001F23B"), "\u32ff 配");
  EXPECT_EQ(normalize(R"({"type": "NFD"})", "a\u1df6\u0323 a\u0301\u0323"), "a\u1df6\u0323 a\u0323\u0301");
  EXPECT_EQ(normalize(R"({"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]})", "ＡＢＣ Ⅻ"),
            "abc xii");
}

TEST(Normalizer, StripRemovesUnicodeWhiteSpaceOnTheChosenSides) {
  EXPECT_EQ(normalize(R"({"type": "Strip", "strip_left": true, "strip_right": true})", "\u0085\u00a0 x \u3000\u2029"),
            "x");
  // U+200B and U+180E are not White_Space.
  EXPECT_EQ(normalize(R"({"type": "Strip", "strip_left": true, "strip_right": false})", " \t x \u200b "), "x \u200b ");
  EXPECT_EQ(normalize(R"({"type": "Strip", "strip_left": false, "strip_right": true})", " x \u180e \n"), " x \u180e");
  EXPECT_EQ(normalize(R"({"type": "Strip", "strip_left": true, "strip_right": true})", " \n\t "), "");
}

TEST(Normalizer, ReplaceWithRegexFindsMatchesAsOniguruma) {
  auto replace = [](const std::string& regex, const std::string& content) {
    return json{{"type", "Replace"}, {"pattern", {{"Regex", regex}}}, {"content", content}}.dump();
  };
  // An empty match right after a match is skipped: no '-' between "xx" and 'c'.
  EXPECT_EQ(normalize(replace("x*", "-"), "abxxc"), "-a-b-c-");
  EXPECT_EQ(normalize(replace("x*", "-"), ""), "");  // tokenizers replaces nothing in an empty text
  // \s is White_Space (U+0085 yes, U+180E no), as in Oniguruma.
  EXPECT_EQ(normalize(replace("\\s+", " "), "a \t\n b\u0085c\u180ed"), "a b c\u180ed");
  EXPECT_EQ(normalize(replace("(a)(b)", "$2$1"), "abab"), "$2$1$2$1");  // the content is literal
  EXPECT_EQ(normalize(replace("\\p{Mn}+", ""), "e\u0301a\u0323\u0307"), "ea");
  EXPECT_EQ(normalize(R"({"type": "Replace", "pattern": {"String": "ab"}, "content": "X"})", "aabab"), "aXX");
}

TEST(Normalizer, RefusesWhatItDoesNotImplementByName) {
  auto expect_refused = [](const std::string& normalizer_json, const std::string& part) {
    try {
      load_normalizer(json::parse(normalizer_json), "file.json");
      ADD_FAILURE() << "accepted " << normalizer_json << "; expected an error naming " << part;
    } catch (const DataError& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("file.json"), std::string::npos) << e.what();
    }
  };
  expect_refused(R"({"type": "Precompiled", "precompiled_charsmap": "AAAA"})", "normalizer 'Precompiled'");
  expect_refused(R"({"type": "BertNormalizer", "clean_text": true, "lowercase": true})", "normalizer 'BertNormalizer'");
  expect_refused(R"({"type": "StripAccents"})", "normalizer 'StripAccents'");
  expect_refused(R"({"type": "Nmt"})", "normalizer 'Nmt'");
  expect_refused(R"({"type": "ByteLevel"})", "normalizer 'ByteLevel'");
  expect_refused(R"({"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Precompiled"}]})",
                 "normalizer 'Precompiled'");  // inside a Sequence too
  expect_refused(R"({"type": "Replace", "pattern": {"Regex": "(unclosed"}, "content": ""})", "(unclosed");
  expect_refused(R"({"type": "Replace", "pattern": {"String": ""}, "content": "x"})", "only a non-empty String");
  expect_refused(R"({"type": "Replace", "pattern": {"Regex": "a"}})", "Replace has no 'content'");
}

// The golden corpus, one document per JSON line.
std::vector<std::string> corpus() {
  std::vector<std::string> docs;
  std::istringstream in(read_all(fixtures() / "corpus.jsonl"));
  for (std::string line; std::getline(in, line);) docs.push_back(json_string_field(line, "text").value());
  return docs;
}

std::unique_ptr<Tokenizer> hf(const std::string& name) {
  TokenizerOptions o;
  o.kind = TokenizerKind::hf;
  o.tokenizer_file = (fixtures() / name).string();
  return make_tokenizer(o);
}

void expect_golden(const Tokenizer& tok, const std::string& name) {
  const std::vector<std::string> docs = corpus();
  std::istringstream in(read_all(fixtures() / ("expected-" + name + ".txt")));
  size_t d = 0;
  int64_t tokens = 0;
  for (std::string line; std::getline(in, line); ++d) {
    ASSERT_LT(d, docs.size()) << name;
    std::vector<int32_t> want, got;
    std::istringstream words(line);
    for (int32_t id; words >> id;) want.push_back(id);
    tok.encode(docs[d], got);
    EXPECT_EQ(got, want) << name << ": document " << d << " of corpus.jsonl";
    tokens += static_cast<int64_t>(got.size());
  }
  EXPECT_EQ(d, docs.size()) << name;
  EXPECT_GT(tokens, 1000) << name;
}

TEST(Normalizer, ByteLevelFixturesWithNormalizersMatchHuggingFace) {
  expect_golden(*hf("norm-nfkc-lower-tokenizer.json"), "hf-norm-nfkc-lower");
  expect_golden(*hf("norm-nfd-strip-tokenizer.json"), "hf-norm-nfd-strip");
}

// tokenizers' order: added tokens with normalized=false are cut from the raw text ("<MASK>" only as written), the
// rest is normalized, then those with normalized=true are matched with their content normalized too ("[[Tool]]"
// is matched as "[[tool]]", so "[[TOOL]]" and "[[tool]]" both give it). Ids from tokenizers 0.23.3.
TEST(Normalizer, AddedTokensMeetTheNormalizerInTokenizersOrder) {
  auto tok = hf("norm-nfkc-lower-tokenizer.json");
  EXPECT_EQ(tok->vocab_size(), 403);
  EXPECT_EQ(tok->eod(), 0);
  auto ids = [&](const std::string& text) {
    std::vector<int32_t> out;
    tok->encode(text, out);
    return out;
  };
  EXPECT_EQ(ids("[[TOOL]]x"), (std::vector<int32_t>{400, 88}));
  EXPECT_EQ(ids("[[tool]]"), (std::vector<int32_t>{400}));
  EXPECT_EQ(ids("Ｘ[[Tool]]"), (std::vector<int32_t>{88, 400}));  // NFKC: Ｘ -> x
  EXPECT_EQ(ids("<MASK>"), (std::vector<int32_t>{402}));
  EXPECT_EQ(ids("  <MASK>a"), (std::vector<int32_t>{402, 65}));             // lstrip
  EXPECT_EQ(ids(" <mask>"), (std::vector<int32_t>{345, 77, 367, 75, 30}));  // not the token: it is matched raw
}

}  // namespace
}  // namespace mt
