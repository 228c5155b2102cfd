// The SentencePiece -> tokenizer.json conversion (core/hf/hf_spm_tokenizer.h) on the fixtures: the model
// kind and vocabulary in id order, pieces SentencePiece never matches scored below every normal piece, control
// and unknown pieces as special added tokens, and the refusals of what tokenizers cannot express. Whether
// transformers then encodes as sentencepiece does is tests/e2e/hf_export_spm_tokenizer.sh.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/checkpoint/checkpoint.h"
#include "core/hf/hf_export.h"
#include "core/hf/hf_spm_tokenizer.h"
#include "core/hf/hf_tokenizer_export.h"
#include "tests/unit/source_root.h"
#include "tests/unit/temp_dir.h"

namespace mt {
namespace {

namespace fs = std::filesystem;
fs::path fixtures() { return testing_util::source_root() / "tests" / "data" / "tokenizer"; }

TEST(HfSpmTokenizer, UnigramHidesControlPieces) {
  const SpmModelProto m = read_spm_model((fixtures() / "spm-unigram.model").string());
  const auto j = spm_tokenizer_json(m, "spm-unigram.model");
  const auto& model = j["model"];
  EXPECT_EQ(model["type"], "Unigram");
  ASSERT_EQ(model["vocab"].size(), m.pieces.size());
  double lowest_normal = 0;
  for (size_t i = 0; i < m.pieces.size(); ++i) {
    EXPECT_EQ(model["vocab"][i][0], m.pieces[i].piece) << i;
    if (m.pieces[i].type == SpmPieceType::normal) {
      EXPECT_EQ(model["vocab"][i][1].get<double>(), static_cast<double>(m.pieces[i].score)) << i;
      lowest_normal = std::min(lowest_normal, model["vocab"][i][1].get<double>());
    }
  }
  for (int id : {0, 1, 2})  // <unk>, <s>, </s>: below any spelling of their 5 characters by normal pieces
    EXPECT_LT(model["vocab"][id][1].get<double>(), 6 * lowest_normal) << id;
  ASSERT_EQ(j["added_tokens"].size(), 3u);
  EXPECT_EQ(j["added_tokens"][1]["content"], "<s>");
  EXPECT_EQ(j["added_tokens"][1]["id"], 1);
  EXPECT_TRUE(j["added_tokens"][1]["special"].get<bool>());
  EXPECT_EQ(j["pre_tokenizer"], nullptr);
}

TEST(HfSpmTokenizer, BpeMergesFollowScores) {
  const SpmModelProto m = read_spm_model((fixtures() / "spm-bpe.model").string());
  const auto j = spm_tokenizer_json(m, "spm-bpe.model");
  const auto& model = j["model"];
  EXPECT_EQ(model["type"], "BPE");
  EXPECT_TRUE(model["byte_fallback"].get<bool>());
  EXPECT_EQ(model["vocab"]["<0x41>"], 3 + 0x41);
  ASSERT_FALSE(model["merges"].empty());
  // Ranked by the merged piece's score: the first merge makes the best-scored mergeable piece.
  const auto& first = model["merges"][0];
  const std::string merged = first[0].get<std::string>() + first[1].get<std::string>();
  auto chars = [](const std::string& s) {
    return std::count_if(s.begin(), s.end(), [](char c) { return (c & 0xC0) != 0x80; });
  };
  float best = -1e30f;  // the best score of a normal piece of two or more characters
  for (const SpmPiece& p : m.pieces)
    if (p.type == SpmPieceType::normal && chars(p.piece) > 1) best = std::max(best, p.score);
  EXPECT_EQ(m.pieces[model["vocab"][merged].get<int>()].score, best) << merged;
}

TEST(HfSpmTokenizer, RefusesWhatTokenizersCannotExpress) {
  SpmModelProto m = read_spm_model((fixtures() / "spm-unigram.model").string());
  m.trainer.treat_whitespace_as_suffix = true;
  EXPECT_THROW(spm_tokenizer_json(m, "x.model"), CheckpointError);
  m.trainer.treat_whitespace_as_suffix = false;
  m.trainer.model_type = SpmModelType::word;
  EXPECT_THROW(spm_tokenizer_json(m, "x.model"), CheckpointError);
}

// config.json states the bos / eos ids generation_config.json does, for every tokenizer kind: a SentencePiece
// model's own bos (<s>, 1) rather than the eod id; the others' eod id for both.
TEST(HfSpmTokenizer, ConfigJsonTakesBosAndEosFromTheTokenizer) {
  testing_util::TempDir dir;
  HfModelShape g;
  g.arch = HfArch::llama;
  g.num_layers = 1, g.hidden = 8, g.heads = 2, g.groups = 2, g.ffn = 16, g.vocab = 600, g.positions = 16;
  struct Case {
    std::string kind, file;
    int32_t eod, bos;
  };
  for (const Case& c : {Case{"sentencepiece", "spm-bpe.model", 2, 1}, Case{"hf", "llama3-tokenizer.json", 1, 1},
                        Case{"gpt2", "", 0, 0}, Case{"byte", "", 256, 256}}) {
    TokenizerSidecar sidecar;
    sidecar.tokenizer.kind = *parse_choice<TokenizerKind>(c.kind);
    sidecar.tokenizer.tokenizer_model = c.kind == "sentencepiece" ? (fixtures() / c.file).string() : "";
    sidecar.tokenizer.tokenizer_file = c.kind == "hf" ? (fixtures() / c.file).string() : "";
    sidecar.tokenizer.vocab_file = (fixtures() / "gpt2-vocab.json").string();
    sidecar.tokenizer.merge_file = (fixtures() / "gpt2-merges.txt").string();
    sidecar.eod = c.eod;
    const HfSpecialIds ids = hf_special_ids(sidecar);
    EXPECT_EQ(ids.bos, c.bos) << c.kind;
    EXPECT_EQ(ids.eos, c.eod) << c.kind;
    const std::string out = dir / c.kind;
    fs::create_directories(out);
    export_hf_tokenizer(sidecar, out, 16);
    std::ifstream in(out + "/generation_config.json");
    std::stringstream text;
    text << in.rdbuf();
    const auto gen = nlohmann::json::parse(text.str());
    for (const std::string& cfg_text :
         {hf_config_json(HfArch::llama, g, DType::f32, ids), hf_config_json(HfArch::gpt, g, DType::f32, ids)}) {
      const auto cfg = nlohmann::json::parse(cfg_text);
      EXPECT_EQ(cfg["bos_token_id"], gen["bos_token_id"]) << c.kind;
      EXPECT_EQ(cfg["eos_token_id"], gen["eos_token_id"]) << c.kind;
    }
  }
  // Without a tokenizer: no id is known, both null (vocab_size - 1 would mean nothing; issue 30, item 9).
  const auto cfg = nlohmann::json::parse(hf_config_json(HfArch::llama, g, DType::f32, std::nullopt));
  EXPECT_TRUE(cfg["bos_token_id"].is_null());
  EXPECT_TRUE(cfg["eos_token_id"].is_null());
}

}  // namespace
}  // namespace mt
