// The SentencePiece -> tokenizer.json conversion (core/checkpoint/hf_spm_tokenizer.h) on the fixtures: the model
// kind and vocabulary in id order, pieces SentencePiece never matches scored below every normal piece, control
// and unknown pieces as special added tokens, and the refusals of what tokenizers cannot express. Whether
// transformers then encodes as sentencepiece does is tests/e2e/hf_export_spm_tokenizer.sh.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/hf_spm_tokenizer.h"

namespace mt {
namespace {

namespace fs = std::filesystem;
const fs::path kFixtures = fs::path(MEGATRAIN_SOURCE_DIR) / "tests" / "data" / "tokenizer";

TEST(HfSpmTokenizer, UnigramHidesControlPieces) {
  const SpmModelProto m = read_spm_model((kFixtures / "spm-unigram.model").string());
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
  const SpmModelProto m = read_spm_model((kFixtures / "spm-bpe.model").string());
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
  SpmModelProto m = read_spm_model((kFixtures / "spm-unigram.model").string());
  m.trainer.treat_whitespace_as_suffix = true;
  EXPECT_THROW(spm_tokenizer_json(m, "x.model"), CheckpointError);
  m.trainer.treat_whitespace_as_suffix = false;
  m.trainer.model_type = SpmModelType::word;
  EXPECT_THROW(spm_tokenizer_json(m, "x.model"), CheckpointError);
}

}  // namespace
}  // namespace mt
