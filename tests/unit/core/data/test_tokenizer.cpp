// test_tokenizer.cpp: the BPE tokenizers (added tokens with single_word / lstrip / rstrip included) give
// exactly the ids of Hugging Face's `tokenizers` (golden values in tests/data/tokenizer/, made by
// tests/interop/make_golden.py), invalid UTF-8 is replaced as Python's
// errors="replace" decoding does, unsupported tokenizer.json components are refused by name, and `data
// prepare --workers N` writes the documents in input order (the command line's options: app/cli/test_data_commands.cpp).
#include <gtest/gtest.h>

#include "tests/unit/core/data/tokenizer_fixtures.h"
#include "tests/unit/expect_contains.h"
#include "tests/unit/source_root.h"
#include "tests/unit/temp_dir.h"
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/tokenizer/bpe.h"
#include "core/data/json_line.h"
#include "core/data/prepare.h"
#include "core/tokenizer/pretokenizer.h"
#include "core/tokenizer/tokenizer.h"
#include "core/tokenizer/tokenizer_sidecar.h"
#include "core/tokenizer/utf8.h"

namespace mt {
namespace {

namespace fs = std::filesystem;
using testing_util::expected;
using testing_util::fixture;
using testing_util::hf_file;

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The golden corpus: one document per JSON line (raw invalid UTF-8 bytes pass through the JSONL reader).
std::vector<std::string> corpus() {
  std::vector<std::string> docs;
  std::istringstream in(read_all(fixture("corpus.jsonl")));
  for (std::string line; std::getline(in, line);) docs.push_back(json_string_field(line, "text").value());
  return docs;
}

TokenizerOptions gpt2_files() {
  TokenizerOptions o;
  o.kind = TokenizerKind::gpt2;
  o.vocab_file = fixture("gpt2-vocab.json");
  o.merge_file = fixture("gpt2-merges.txt");
  return o;
}

using testing_util::TempDir;

// Writes a copy of fixture `name` with the first `from` replaced by `to` (which must be present).
std::string edited_fixture(const TempDir& dir, const std::string& name, const std::string& from,
                           const std::string& to) {
  std::string text = read_all(fixture(name));
  const size_t at = text.find(from);
  if (at == std::string::npos) throw std::runtime_error("'" + from + "' not in " + name);
  text.replace(at, from.size(), to);
  const std::string path = dir / name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

void expect_golden(const Tokenizer& tok, const std::string& name) {
  const std::vector<std::string> docs = corpus();
  const auto want = expected(name);
  ASSERT_EQ(docs.size(), want.size()) << name;
  ASSERT_GE(docs.size(), 40u);
  int64_t tokens = 0;
  for (size_t d = 0; d < docs.size(); ++d) {
    std::vector<int32_t> got;
    tok.encode(docs[d], got);
    EXPECT_EQ(got, want[d]) << name << ": document " << d << " of corpus.jsonl";
    tokens += static_cast<int64_t>(got.size());
  }
  EXPECT_GT(tokens, 1000) << name;
}

TEST(Tokenizer, Gpt2VocabAndMergesMatchHuggingFace) {
  auto tok = make_tokenizer(gpt2_files());
  EXPECT_EQ(tok->kind(), TokenizerKind::gpt2);
  EXPECT_EQ(tok->vocab_size(), 400);
  EXPECT_EQ(tok->eod(), 0);  // <|endoftext|>, the trainer's first special token
  EXPECT_EQ(tok->storage_dtype(), TokenDType::u16);
  expect_golden(*tok, "gpt2");
}

TEST(Tokenizer, HfGpt2TokenizerJsonWithStringMergesMatchesHuggingFace) {
  auto tok = make_tokenizer(hf_file(fixture("gpt2-tokenizer.json")));
  EXPECT_EQ(tok->kind(), TokenizerKind::hf);
  EXPECT_EQ(tok->eod(), 0);
  expect_golden(*tok, "hf-gpt2");  // <|endoftext|> in the text is the special token here, unlike gpt2
}

TEST(Tokenizer, HfLlama3StyleTokenizerJsonMatchesHuggingFace) {
  auto tok = make_tokenizer(hf_file(fixture("llama3-tokenizer.json")));
  EXPECT_EQ(tok->vocab_size(), 404);  // 400 trained + the added [[tool]], [[sw]], <r>, <mask>
  EXPECT_EQ(tok->eod(), 1);           // <|end_of_text|>
  expect_golden(*tok, "hf-llama3");
  TokenizerOptions o = hf_file(fixture("llama3-tokenizer.json"));
  o.eod_token = "<|eot_id|>";
  EXPECT_EQ(make_tokenizer(o)->eod(), 4);
}

// Llama-3's post-processor (TemplateProcessing "<|begin_of_text|> $A") puts BOS before every text by default, as
// tokenizers' encode(add_special_tokens=True) and Megatron's HuggingFaceTokenizer.tokenize do; without the
// specials the ids are the file's without a post-processor.
TEST(Tokenizer, HfPostProcessorAddsBosUnlessLeftOut) {
  auto tok = make_tokenizer(hf_file(fixture("llama3-bos-tokenizer.json")));
  EXPECT_EQ(tok->vocab_size(), 404);
  EXPECT_EQ(tok->eod(), 1);
  expect_golden(*tok, "hf-llama3-bos");  // every line starts with 0, <|begin_of_text|>
  std::vector<int32_t> empty;
  tok->encode("", empty);
  EXPECT_EQ(empty, (std::vector<int32_t>{0}));
  TokenizerOptions plain = hf_file(fixture("llama3-bos-tokenizer.json"));
  plain.add_special_tokens = false;
  expect_golden(*make_tokenizer(plain), "hf-llama3");
}

// SentencePiece-style BPE tokenizer.json (transformers' LlamaConverter layout, made from spm-bpe.model by
// train_tokenizers.py): characters as first symbols, byte fallback, <s> added by the post-processor. The legacy
// normalizer (Prepend + Replace) and the Metaspace pre-tokenizer, whose prepend_scheme "first" puts no "▁" after an
// added token (golden ids from tokenizers 0.23.3).
TEST(Tokenizer, HfSentencePieceStyleBpeMatchesHuggingFace) {
  auto legacy = make_tokenizer(hf_file(fixture("llama2-tokenizer.json")));
  EXPECT_EQ(legacy->vocab_size(), 600);
  EXPECT_EQ(legacy->eod(), 2);  // </s>
  expect_golden(*legacy, "hf-llama2");
  auto meta = make_tokenizer(hf_file(fixture("llama2-metaspace-tokenizer.json")));
  expect_golden(*meta, "hf-llama2-metaspace");
  std::vector<int32_t> a, b;
  legacy->encode("a</s>b c", a);
  meta->encode("a</s>b c", b);
  EXPECT_EQ(a, (std::vector<int32_t>{1, 316, 315, 2, 316, 354, 316, 343}));
  EXPECT_EQ(b, (std::vector<int32_t>{1, 316, 315, 2, 354, 316, 343}));
  for (const auto* tok : {legacy.get(), meta.get()}) {
    TokenizerOptions o =
        hf_file(fixture(tok == legacy.get() ? "llama2-tokenizer.json" : "llama2-metaspace-tokenizer.json"));
    o.add_special_tokens = false;
    const std::string text = "Hi  there, caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x99\x82\tend";
    std::vector<int32_t> ids;
    make_tokenizer(o)->encode(text, ids);
    EXPECT_EQ(tok->decode(ids), text);  // "▁" as spaces, <0xAB> as bytes, the prepended space stripped
  }
}

TEST(Tokenizer, InvalidUtf8BecomesReplacementCharactersLikePython) {
  const std::string fffd = "\xEF\xBF\xBD";
  struct Case {
    std::string in, out;
  };
  // Python: bytes.decode("utf-8", errors="replace"), one U+FFFD per maximal subpart.
  const std::vector<Case> cases = {
      {"plain", "plain"},
      {"\xC3\xA9", "\xC3\xA9"},
      {"a\xFF"
       "b",
       "a" + fffd + "b"},
      {"\xE2\x82"
       "a",
       fffd + "a"},                                     // truncated 3-byte sequence: one
      {"\xED\xA0\x80", fffd + fffd + fffd},             // a surrogate: E D's second byte is out of range
      {"\xC0\xAF", fffd + fffd},                        // overlong lead bytes never start a sequence
      {"\xE0\x80\xAF", fffd + fffd + fffd},             // E0 needs A0..BF next
      {"\xF4\x90\x80\x80", fffd + fffd + fffd + fffd},  // above U+10FFFF
      {"\xF0\x9F\x98", fffd},                           // truncated emoji at the end
      {"\xF0\x9F\x98"
       "x\xF0\x9F\x98\x80",
       fffd + "x\xF0\x9F\x98\x80"},
      {"\x80\x80", fffd + fffd},
      {"\xE2\x28\xA1", fffd + "(" + fffd},
  };
  for (const Case& c : cases) {
    std::string scratch;
    EXPECT_EQ(std::string(valid_utf8(c.in, scratch)), c.out) << testing::PrintToString(c.in);
  }
  // The tokenizer sees the replaced text: its ids are those of the text with U+FFFD written out.
  auto tok = make_tokenizer(hf_file(fixture("llama3-tokenizer.json")));
  std::vector<int32_t> a, b;
  tok->encode("x\xE2\x82 y\xFF", a);
  tok->encode("x" + fffd + " y" + fffd, b);
  EXPECT_EQ(a, b);
}

TEST(Tokenizer, BpeMergesLowestRankFirstAndLeftmostFirst) {
  BpeModel m;
  int32_t id = 0;
  for (const char* t : {"a", "b", "c", "ab", "bc", "abc", "aa"}) m.add_token(t, id++);
  ASSERT_TRUE(m.add_merge("b", "c"));  // rank 0
  ASSERT_TRUE(m.add_merge("a", "b"));  // rank 1
  ASSERT_TRUE(m.add_merge("a", "bc"));
  ASSERT_TRUE(m.add_merge("a", "a"));
  EXPECT_FALSE(m.add_merge("c", "c"));  // "cc" is not a token
  std::vector<int32_t> out;
  m.encode_word("abc", out);  // b+c before a+b, then a+bc
  EXPECT_EQ(out, (std::vector<int32_t>{5}));
  out.clear();
  m.encode_word("aaa", out);  // the leftmost pair first
  EXPECT_EQ(out, (std::vector<int32_t>{6, 0}));
  out.clear();
  m.encode_word("abd", out);  // a byte with no token is dropped (no unk)
  EXPECT_EQ(out, (std::vector<int32_t>{3}));
}

// A copy of fixture `name` as JSON, edited by `edit`, written to `dir`.
template <class Edit>
std::string edited_json(const TempDir& dir, const std::string& name, Edit&& edit) {
  nlohmann::json j = nlohmann::json::parse(read_all(fixture(name)));
  edit(j);
  const std::string path = dir / name;
  std::ofstream(path, std::ios::binary) << j.dump();
  return path;
}

void expect_refused_naming(const TokenizerOptions& o, const std::vector<std::string>& parts) {
  try {
    make_tokenizer(o);
    ADD_FAILURE() << "accepted; expected an error naming " << parts.front();
  } catch (const DataError& e) {
    for (const std::string& part : parts) EXPECT_CONTAINS(std::string(e.what()), part);
  }
}

TEST(Tokenizer, RefusesWhatItDoesNotImplementByName) {
  TempDir dir;
  auto expect_refused = [](const TokenizerOptions& o, const std::string& part) {
    try {
      make_tokenizer(o);
      ADD_FAILURE() << "accepted; expected an error naming " << part;
    } catch (const DataError& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  expect_refused(hf_file(edited_fixture(dir, "gpt2-tokenizer.json", "\"pre_tokenizer\": {\"type\": \"ByteLevel\"",
                                        "\"pre_tokenizer\": {\"type\": \"Whitespace\"")),
                 "pre_tokenizer 'Whitespace' is not supported");
  expect_refused(hf_file(edited_fixture(dir, "gpt2-tokenizer.json", "\"normalizer\": null",
                                        "\"normalizer\": {\"type\": \"BertNormalizer\"}")),
                 "normalizer 'BertNormalizer'");
  expect_refused(hf_file(edited_fixture(dir, "llama3-tokenizer.json", "\"behavior\": \"Isolated\"",
                                        "\"behavior\": \"MergedWithPrevious\"")),
                 "Split with behavior 'MergedWithPrevious'");
  expect_refused(
      hf_file(edited_fixture(dir, "gpt2-tokenizer.json", "\"byte_fallback\": false", "\"byte_fallback\": true")),
      "byte_fallback");
  expect_refused(
      hf_file(edited_fixture(dir, "llama2-tokenizer.json", "\"type\": \"Prepend\"", "\"type\": \"Precompiled\"")),
      "normalizer 'Precompiled' is not supported");
  expect_refused(hf_file(edited_fixture(dir, "llama2-metaspace-tokenizer.json", "\"prepend_scheme\": \"first\"",
                                        "\"prepend_scheme\": \"sometimes\"")),
                 "Metaspace prepend_scheme 'sometimes'");
  expect_refused(hf_file(edited_fixture(dir, "llama2-metaspace-tokenizer.json", "\"type\": \"Metaspace\"",
                                        "\"type\": \"WhitespaceSplit\"")),
                 "pre_tokenizer 'WhitespaceSplit' is not supported");
  expect_refused(hf_file(edited_fixture(dir, "gpt2-tokenizer.json", "\"post_processor\": null",
                                        "\"post_processor\": {\"type\": \"RobertaProcessing\"}")),
                 "post_processor 'RobertaProcessing' is not supported");
  expect_refused(hf_file(edited_fixture(dir, "llama3-bos-tokenizer.json", "\"ids\": [0]", "\"ids\": [9999]")),
                 "post_processor special token id 9999");
  expect_refused(hf_file(edited_fixture(dir, "llama3-bos-tokenizer.json", "{\"Sequence\": {\"id\": \"A\"",
                                        "{\"Sequence\": {\"id\": \"B\"")),
                 "TemplateProcessing: the single template names sequence 'B'");
  TokenizerOptions eod = hf_file(fixture("llama3-tokenizer.json"));
  eod.eod_token = "<|nope|>";
  expect_refused(eod, "--eod-token '<|nope|>'");
  TokenizerOptions no_eos = hf_file(edited_json(dir, "llama3-tokenizer.json", [](nlohmann::json& j) {
    j["added_tokens"][1]["content"] = "<|stop|>";  // renamed in both places, as ids must agree
    j["model"]["vocab"].erase("<|end_of_text|>");
    j["model"]["vocab"]["<|stop|>"] = 1;
  }));
  expect_refused(no_eos, "no known end-of-text token");
  TokenizerOptions gpt2 = gpt2_files();
  gpt2.merge_file.clear();
  expect_refused(gpt2, "--merge-file");
  expect_refused(hf_file(dir / "missing.json"), "missing.json");
}

// Each id stands for one token (issue 30, item 7): an empty vocabulary, an id given to two tokens, an added token
// away from the id Hugging Face's tokenizers would give it, are refused naming the file and the entry.
TEST(Tokenizer, RefusesIdsThatDoNotStandForOneToken) {
  TempDir dir;
  const std::string name = "llama3-tokenizer.json", where = (dir / name) + ": ";
  auto llama3 = [&](auto&& edit) { return hf_file(edited_json(dir, name, edit)); };
  auto added = [](nlohmann::json& j, const std::string& content) -> nlohmann::json& {
    for (nlohmann::json& t : j["added_tokens"])
      if (t["content"] == content) return t;
    throw std::runtime_error("no added token " + content);
  };
  expect_refused_naming(llama3([](nlohmann::json& j) { j["model"]["vocab"] = nlohmann::json::object(); }),
                        {where + "the vocabulary is empty"});
  expect_refused_naming(llama3([](nlohmann::json& j) { j["model"]["vocab"]["aa"] = 5; }),
                        {where + "tokens '!' and 'aa' both have id 5"});
  expect_refused_naming(llama3([&](nlohmann::json& j) { added(j, "[[sw]]")["id"] = 400; }),
                        {where + "added tokens '[[tool]]' and '[[sw]]' both have id 400"});
  expect_refused_naming(llama3([&](nlohmann::json& j) { added(j, "<mask>")["id"] = 99999; }),
                        {where + "added token '<mask>' has id 99999", "(ids 0..402)", "takes the next id, 403"});
  expect_refused_naming(llama3([&](nlohmann::json& j) { added(j, "[[tool]]")["id"] = 5; }),
                        {where + "added token '[[tool]]' has id 5, which the vocabulary gives to '!'"});
  expect_refused_naming(llama3([&](nlohmann::json& j) { added(j, "<|eot_id|>")["id"] = 404; }),
                        {where + "added token '<|eot_id|>' has id 404, but the vocabulary gives it id 4"});
  TokenizerOptions gpt2 = gpt2_files();
  gpt2.vocab_file = edited_json(dir, "gpt2-vocab.json", [](nlohmann::json& j) { j["aa"] = j["!"]; });
  expect_refused_naming(gpt2, {gpt2.vocab_file + ": tokens '!' and 'aa' both have id"});
  EXPECT_EQ(make_tokenizer(hf_file(fixture(name)))->vocab_size(), 404);  // the fixture itself: 400 + 4 added
}

// A tokenizer.json that is not a JSON object, or has an entry of another JSON type, is named with what was
// expected, not only in the JSON library's words (issue 30, item 12).
TEST(Tokenizer, RefusesATokenizerJsonOfAnotherShapeNamingTheFile) {
  TempDir dir;
  const std::string array = dir / "array.json", text = dir / "text.json";
  std::ofstream(array) << "[1, 2]";
  std::ofstream(text) << "\"tokenizer\"";
  expect_refused_naming(hf_file(array), {array + ": not a tokenizer.json: expected a JSON object", "found array"});
  expect_refused_naming(hf_file(text), {text + ": not a tokenizer.json", "found string"});
  const std::string bad_added =
      edited_json(dir, "llama3-tokenizer.json", [](nlohmann::json& j) { j["added_tokens"][0] = 7; });
  expect_refused_naming(hf_file(bad_added), {bad_added + ": unexpected JSON structure"});
}

TEST(Tokenizer, PrepareWithWorkersKeepsDocumentOrder) {
  TempDir dir;
  const auto want = expected("hf-llama3");
  for (int workers : {1, 2, 3}) {
    PrepareOptions opt;
    opt.inputs = {fixture("corpus.jsonl"), fixture("corpus.jsonl")};
    opt.output_prefix = dir / ("w" + std::to_string(workers));
    opt.tokenizer = hf_file(fixture("llama3-tokenizer.json"));
    opt.workers = workers;
    const PrepareStats s = prepare_dataset(opt);
    EXPECT_EQ(s.vocab_size, 404);
    IndexedDataset ds(opt.output_prefix);
    ASSERT_EQ(ds.num_documents(), static_cast<int64_t>(2 * want.size()));
    const auto index = ds.document_index();
    for (int64_t d = 0; d < ds.num_documents(); ++d) {
      std::vector<int32_t> got;
      for (int64_t q = index[d]; q < index[d + 1]; ++q) {
        std::vector<int32_t> buf(static_cast<size_t>(ds.sequence_lengths()[q]));
        ds.read(q, 0, buf);
        got.insert(got.end(), buf.begin(), buf.end());
      }
      std::vector<int32_t> w = want[static_cast<size_t>(d) % want.size()];
      w.push_back(1);  // <|end_of_text|>
      EXPECT_EQ(got, w) << "workers " << workers << ", document " << d;
    }
  }
}

}  // namespace
}  // namespace mt

namespace mt {
namespace {

// Pieces of `text` under GPT-2's pattern.
std::vector<std::string> gpt2_pieces(const std::string& text) {
  PreTokenizer pre;
  pre.add_step(std::make_unique<RegexSplit>(kGpt2SplitPattern, false, "test"));
  SplitScratch scratch;
  std::vector<std::string_view> pieces, tmp;
  pre.split(text, pieces, tmp, scratch);
  return std::vector<std::string>(pieces.begin(), pieces.end());
}

// Whitespace as Oniguruma (Hugging Face's regex engine) sees it: the Unicode White_Space property. Expected
// pieces from tokenizers 0.23's ByteLevel pre-tokenizer.
TEST(PreTokenizer, WhitespaceAgreesWithOniguruma) {
  using V = std::vector<std::string>;
  EXPECT_EQ(gpt2_pieces("!\xC2\x85"), (V{"!", "\xC2\x85"}));          // U+0085 NEL: space
  EXPECT_EQ(gpt2_pieces("!\xC2\xA0"), (V{"!", "\xC2\xA0"}));          // U+00A0: space
  EXPECT_EQ(gpt2_pieces("!\xE1\x9A\x80"), (V{"!", "\xE1\x9A\x80"}));  // U+1680: space
  EXPECT_EQ(gpt2_pieces("!\xE2\x80\x87"), (V{"!", "\xE2\x80\x87"}));  // U+2007: space
  EXPECT_EQ(gpt2_pieces("!\xE1\xA0\x8E"), (V{"!\xE1\xA0\x8E"}));      // U+180E: not space (Cf since Unicode 6.3)
  EXPECT_EQ(gpt2_pieces("!\xE2\x80\x8B"), (V{"!\xE2\x80\x8B"}));      // U+200B: not space
  EXPECT_EQ(gpt2_pieces("!\x1C"), (V{"!\x1C"}));                      // U+001C: not space
  EXPECT_EQ(gpt2_pieces("a  b\n"), (V{"a", " ", " b", "\n"}));
  EXPECT_EQ(gpt2_pieces("I'm 42"), (V{"I", "'m", " 42"}));
}

}  // namespace
}  // namespace mt

namespace mt {
namespace {

// SentencePiece (.model through libsentencepiece): golden ids from the Python sentencepiece package 0.1.97 (the
// version of Debian's libsentencepiece-dev) for the fixture models made by tests/interop/train_sentencepiece.py:
// encode(text.decode("utf-8", errors="replace"), out_type=int). Invalid UTF-8 becomes U+FFFD per maximal
// subpart first, as for the BPE tokenizers. tests/e2e/tokenizer_interop.sh compares a whole corpus.
#define SKIP_WITHOUT_SENTENCEPIECE() \
  if (!have_sentencepiece()) GTEST_SKIP() << "megatrain was built without SentencePiece (libsentencepiece-dev)"

TokenizerOptions spm_model(const std::string& name) {
  TokenizerOptions o;
  o.kind = TokenizerKind::sentencepiece;
  o.tokenizer_model = fixture(name);
  return o;
}

struct SpmGolden {
  std::string text;
  std::vector<int32_t> ids;
};

void expect_spm_golden(const std::string& model, int64_t vocab, const std::vector<SpmGolden>& golden) {
  auto tok = make_tokenizer(spm_model(model));
  EXPECT_EQ(tok->kind(), TokenizerKind::sentencepiece);
  EXPECT_EQ(tok->vocab_size(), vocab);
  EXPECT_EQ(tok->eod(), 2);  // </s>
  EXPECT_EQ(tok->storage_dtype(), TokenDType::u16);
  auto cache = tok->make_cache();
  for (const SpmGolden& g : golden) {
    std::vector<int32_t> ids;
    tok->encode_with(g.text, ids, cache.get());
    EXPECT_EQ(ids, g.ids) << model << ": " << g.text;
  }
}

TEST(SentencePieceTokenizer, BpeWithByteFallbackMatchesPython) {
  SKIP_WITHOUT_SENTENCEPIECE();
  expect_spm_golden(
      "spm-bpe.model", 600,
      {
          {"Hello world", {316, 378, 323, 297, 332, 316, 347, 332, 333, 337, 335}},
          {"  The quick brown fox\x0a\x09jumps  over 42 dogs.",
           {316, 316, 316, 350, 311, 316, 374, 346, 338, 343, 348, 316, 354, 333, 332, 347, 336, 316, 340, 332, 339,
            13,  319, 381, 346, 345, 353, 334, 316, 316, 332, 361, 305, 316, 324, 322, 313, 332, 352, 334, 360}},
          {"Stra\xc3\x9f"
           "e, Gr\xc3\xbc\xc3\x9f"
           "e: \xe6\x88\x91\xe8\x83\xbd\xe5\x90\x9e\xe4\xb8\x8b\xe7\x8e\xbb\xe7\x92\x83 \xf0\x9f\x98\x80 "
           "\xd0\xa1\xd1\x8a\xd0\xb5\xd1\x88\xd1\x8c",
           {316, 357, 331, 333, 315, 384, 323, 355, 316, 382, 333, 198, 191, 384, 323, 403, 316,
            510, 514, 509, 505, 511, 512, 316, 544, 316, 492, 212, 141, 412, 212, 139, 212, 143}},
          {"caf\xc3 \xff ok \xe2\x82 end\xed\xa0\x80!",
           {316, 343, 315, 340, 463, 316, 463, 316, 332, 348, 316, 463, 316, 309, 463, 463, 463, 317}},
          {"aaaaaaaaaaaaaaaaaaa !?!?!? <s> </s> <unk>",
           {316, 267, 259, 315, 316, 261, 260, 283, 334, 349, 283, 421, 334, 349, 283, 346, 336, 348, 349}},
          {"", {}},
      });
}

TEST(SentencePieceTokenizer, UnigramMatchesPython) {
  SKIP_WITHOUT_SENTENCEPIECE();
  expect_spm_golden("spm-unigram.model", 500,
                    {
                        {"Hello world", {3, 48, 16, 192, 39, 3, 40, 39, 10, 14, 7}},
                        {"  The quick brown fox\x0a\x09jumps  over 42 dogs.",
                         {3, 17, 38,  16,  3,  120, 25,  15,  18, 3, 24, 10, 39, 40, 27, 3,  13, 39,
                          9, 0,  458, 378, 22, 430, 174, 223, 10, 3, 97, 3,  7,  39, 53, 11, 30}},
                        {"Stra\xc3\x9f"
                         "e, Gr\xc3\xbc\xc3\x9f"
                         "e: \xe6\x88\x91\xe8\x83\xbd\xe5\x90\x9e\xe4\xb8\x8b\xe7\x8e\xbb\xe7\x92\x83 \xf0\x9f\x98\x80 "
                         "\xd0\xa1\xd1\x8a\xd0\xb5\xd1\x88\xd1\x8c",
                         {3,   20,  12,  10,  4,   218, 19, 3,   54, 10,  0, 218, 101, 3,
                          322, 316, 318, 317, 319, 320, 3,  348, 3,  310, 0, 98,  0}},
                        {"caf\xc3 \xff ok \xe2\x82 end\xed\xa0\x80!",
                         {233, 4, 13, 456, 3, 456, 174, 18, 3, 456, 3, 83, 456, 456, 456, 99}},
                        // Unigram's segmentation of long runs changed after 0.1.97 (0.2.x gives other ids here).
                        {"aaaaaaaaaaaaaaaaaaa !?!?!? <s> </s> <unk>",
                         {3, 6, 4, 4, 4, 208, 77, 99, 77, 99, 77, 94, 11, 68, 94, 266, 11, 68, 94, 414, 18, 68}},
                    });
}

TEST(SentencePieceTokenizer, EndOfDocumentIsTheModelsEosOrNamed) {
  SKIP_WITHOUT_SENTENCEPIECE();
  auto refused = [](const TokenizerOptions& o, const std::string& what) {
    try {
      make_tokenizer(o);
      ADD_FAILURE() << "accepted; expected an error with " << what;
    } catch (const DataError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  refused(spm_model("spm-noeos.model"),
          "no end-of-sentence piece (eos_id is -1); name the end-of-document piece "
          "with --eod-token");
  TokenizerOptions named = spm_model("spm-noeos.model");
  named.eod_token = "<s>";
  EXPECT_EQ(make_tokenizer(named)->eod(), 1);
  named.eod_token = "</s>";
  refused(named, "--eod-token '</s>' is not a piece of the model");
  named.eod_token = "<unk>";
  EXPECT_EQ(make_tokenizer(named)->eod(), 0);
  TokenizerOptions none;
  none.kind = TokenizerKind::sentencepiece;
  refused(none, "needs --tokenizer-model");
  refused(spm_model("gpt2-vocab.json"), "cannot load the SentencePiece model");
  refused(spm_model("no-such.model"), "cannot load the SentencePiece model");
}

// One of the two builds runs here: with the library the option makes a tokenizer, without it says why not.
TEST(SentencePieceTokenizer, TheOptionWorksOrSaysTheBuildHasNoLibrary) {
  try {
    auto tok = make_tokenizer(spm_model("spm-bpe.model"));
    EXPECT_TRUE(have_sentencepiece()) << "a SentencePiece tokenizer from a build without the library";
    EXPECT_GT(tok->vocab_size(), 0);
  } catch (const DataError& e) {
    EXPECT_FALSE(have_sentencepiece()) << e.what();
    EXPECT_NE(std::string(e.what()).find("built without SentencePiece"), std::string::npos) << e.what();
  }
}

TEST(SentencePieceTokenizer, PrepareWithWorkersWritesTheSameIds) {
  SKIP_WITHOUT_SENTENCEPIECE();
  TempDir dir;
  std::vector<std::string> files;
  for (int workers : {1, 3}) {
    PrepareOptions opt;
    opt.inputs = {fixture("corpus.jsonl"), fixture("corpus.jsonl")};
    opt.output_prefix = dir / ("spm" + std::to_string(workers));
    opt.tokenizer = spm_model("spm-unigram.model");
    opt.workers = workers;
    const PrepareStats s = prepare_dataset(opt);
    EXPECT_EQ(s.vocab_size, 500);
    files.push_back(read_all(opt.output_prefix + ".bin") + read_all(opt.output_prefix + ".idx"));
  }
  EXPECT_EQ(files[0], files[1]);
  EXPECT_FALSE(files[0].empty());
}

// One 50 MB line took libsentencepiece 11 GB and died as std::bad_alloc (issue 30, item 11): a document longer
// than spm_chunk_bytes is encoded in pieces cut at spaces, and the ids are those of the whole document. Unigram's
// best path sums float scores over the whole text, so where two segmentations score alike within its rounding
// (the corpus's run of 300 tabs: 16-tab pieces or single tabs) the whole document's choice depends on how much
// text comes before; the unigram check reads the corpus with its tab runs made single tabs.
TEST(SentencePieceTokenizer, ALongDocumentIsEncodedInPiecesWithTheWholeDocumentsIds) {
  SKIP_WITHOUT_SENTENCEPIECE();
  std::string text;
  for (const std::string& doc : corpus()) text += doc + (text.size() % 3 == 0 ? "  " : " ");
  text += "end";
  std::string single_tabs;
  for (char c : text)
    if (c != '\t' || single_tabs.empty() || single_tabs.back() != '\t') single_tabs += c;
  for (const auto& [model, input] : {std::pair{"spm-bpe.model", &text}, {"spm-unigram.model", &single_tabs}}) {
    std::vector<int32_t> whole;
    make_tokenizer(spm_model(model))->encode(*input, whole);  // the default chunk is longer than the text
    for (int64_t chunk : {64, 200, 1000}) {
      TokenizerOptions o = spm_model(model);
      o.spm_chunk_bytes = chunk;
      std::vector<int32_t> pieces;
      make_tokenizer(o)->encode(*input, pieces);
      EXPECT_EQ(pieces, whole) << model << " in pieces of " << chunk << " bytes";
    }
  }
}

// A long document with no space to cut it at is refused, naming the file and line where it starts, instead of
// taking the memory of the whole.
TEST(SentencePieceTokenizer, ALongDocumentThatCannotBeCutIsRefusedWithItsFileAndLine) {
  SKIP_WITHOUT_SENTENCEPIECE();
  TempDir dir;
  const std::string uncut(1024, 'x'), too_long(1025, 'y');  // 16 x 64 bytes may be encoded at once
  std::ofstream(dir / "a.jsonl") << "{\"text\": \"short\"}\n\n{\"text\": \"" << uncut << "\"}\n{\"text\": \""
                                 << too_long << "\"}\n";
  std::ofstream(dir / "b.txt") << "short\n\n" << uncut << "\n\nfirst\n" << too_long << "\n";
  for (const auto& [input, where] :
       {std::pair{dir / "a.jsonl", dir / "a.jsonl:4: "}, {dir / "b.txt", dir / "b.txt:5: "}})
    for (int workers : {1, 2}) {
      PrepareOptions opt;
      opt.inputs = {input};
      opt.output_prefix = dir / "out";
      opt.tokenizer = spm_model("spm-unigram.model");
      opt.tokenizer.spm_chunk_bytes = 64;
      opt.workers = workers;
      try {
        prepare_dataset(opt);
        ADD_FAILURE() << input << ": a document with no cut within 1024 bytes was accepted";
      } catch (const DataError& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find(where + "sentencepiece: a document of "), std::string::npos) << what;
        EXPECT_NE(what.find("bytes is refused: it has no space between two printable ASCII characters to cut it "
                            "at within 1024 bytes from byte 0"),
                  std::string::npos)
            << what;
      }
      EXPECT_FALSE(fs::exists(dir / "out.bin"));
    }
  std::ofstream(dir / "c.txt") << "short\n\n" << uncut << "\n";
  PrepareOptions ok;
  ok.inputs = {dir / "c.txt"};
  ok.output_prefix = dir / "ok";
  ok.tokenizer = spm_model("spm-unigram.model");
  ok.tokenizer.spm_chunk_bytes = 64;
  EXPECT_EQ(prepare_dataset(ok).documents, 2);
}

}  // namespace
}  // namespace mt

namespace mt {
namespace {

// decode() gives back the bytes of the ids (eod left out); data inspect --decode shows them as valid UTF-8 with
// the tokenizer data prepare recorded in PREFIX.tokenizer.yaml.
TEST(TokenizerDecode, EveryKindGivesBackTheText) {
  const std::string text = "Hello w\xc3\xb6rld, caf\xc3\xa9 \xf0\x9f\x98\x80 42\tend";
  std::vector<TokenizerOptions> kinds = {TokenizerOptions{}, hf_file(fixture("llama3-tokenizer.json"))};
  TokenizerOptions gpt2;
  gpt2.kind = TokenizerKind::gpt2;
  gpt2.vocab_file = fixture("gpt2-vocab.json");
  gpt2.merge_file = fixture("gpt2-merges.txt");
  kinds.push_back(gpt2);
  if (have_sentencepiece()) kinds.push_back(spm_model("spm-bpe.model"));
  for (const TokenizerOptions& o : kinds) {
    auto tok = make_tokenizer(o);
    std::vector<int32_t> ids;
    tok->encode(text, ids);
    ids.push_back(tok->eod());
    EXPECT_EQ(tok->decode(ids), text) << name_of(tok->kind());
    const std::vector<int32_t> outside = {static_cast<int32_t>(tok->vocab_size()), -1};
    EXPECT_EQ(tok->decode(outside), "\xEF\xBF\xBD\xEF\xBF\xBD") << name_of(tok->kind());
  }
  // Invalid UTF-8 was replaced before encoding; the byte tokenizer keeps the bytes, inspect replaces them.
  ByteTokenizer bytes;
  std::vector<int32_t> ids;
  bytes.encode(
      "a\xff"
      "b",
      ids);
  EXPECT_EQ(bytes.decode(ids),
            "a\xff"
            "b");
}

TEST(TokenizerDecode, PrepareRecordsTheTokenizerAndInspectDecodesWithIt) {
  TempDir dir;
  const std::string in = dir / "in.txt";
  std::ofstream(in, std::ios::binary) << "Hello w\xc3rld \xff ok\n\nSecond \xf0\x9f\x98\x80 doc\n";
  std::vector<TokenizerOptions> kinds = {TokenizerOptions{}, hf_file(fixture("llama3-tokenizer.json"))};
  if (have_sentencepiece()) kinds.push_back(spm_model("spm-unigram.model"));
  for (const TokenizerOptions& o : kinds) {
    PrepareOptions opt;
    opt.inputs = {in};
    const std::string name(name_of(o.kind));
    opt.output_prefix = dir / name;
    opt.tokenizer = o;
    const PrepareStats s = prepare_dataset(opt);
    const auto sidecar = read_tokenizer_sidecar(opt.output_prefix);
    ASSERT_TRUE(sidecar) << name;
    EXPECT_EQ(sidecar->tokenizer.kind, o.kind);
    EXPECT_EQ(sidecar->vocab_size, s.vocab_size);
    EXPECT_EQ(sidecar->eod, make_tokenizer(o)->eod());
    EXPECT_EQ(sidecar->tokenizer.tokenizer_file, o.tokenizer_file);
    EXPECT_EQ(sidecar->tokenizer.tokenizer_model, o.tokenizer_model);
    const std::string shown = inspect_dataset(opt.output_prefix, 0, 5);
    EXPECT_NE(shown.find("decoded by " + name + ") ---\nHello w\xEF\xBF\xBDrld \xEF\xBF\xBD ok\n"), std::string::npos)
        << shown;
    EXPECT_NE(shown.find("---\nSecond \xf0\x9f\x98\x80 doc\n"), std::string::npos) << shown;
  }
  fs::remove(dir / "byte.tokenizer.yaml");
  try {
    inspect_dataset(dir / "byte", 0, 1);
    ADD_FAILURE() << "decoded without a sidecar";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("byte.tokenizer.yaml does not exist"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(inspect_dataset(dir / "byte", 1, 0));  // without --decode no sidecar is needed
}

}  // namespace
}  // namespace mt
