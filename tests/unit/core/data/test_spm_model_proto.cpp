// The SentencePiece .model reader (core/tokenizer/spm_model_proto.h) on the committed fixtures, against what the
// Python sentencepiece package (SentencePieceProcessor: get_piece_size, id_to_piece, get_score, is_control,
// is_unknown, is_byte, unk/bos/eos/pad_id) reports for them, and its errors on damaged files.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "core/data/indexed_dataset.h"  // DataError
#include "core/tokenizer/spm_model_proto.h"
#include "tests/unit/source_root.h"
#include "tests/unit/file_text.h"

namespace mt {
namespace {

namespace fs = std::filesystem;
fs::path fixtures() { return testing_util::source_root() / "tests" / "data" / "tokenizer"; }

SpmModelProto fixture(const char* name) { return read_spm_model((fixtures() / name).string()); }

void expect_piece(const SpmModelProto& m, size_t id, const std::string& piece, float score, SpmPieceType type) {
  ASSERT_LT(id, m.pieces.size());
  EXPECT_EQ(m.pieces[id].piece, piece) << "id " << id;
  EXPECT_EQ(m.pieces[id].score, score) << "id " << id;  // the float as stored, bit for bit
  EXPECT_EQ(m.pieces[id].type, type) << "id " << id;
}

TEST(SpmModelProto, BpeFixtureMatchesSentencePiece) {
  const SpmModelProto m = fixture("spm-bpe.model");
  EXPECT_EQ(m.pieces.size(), 600u);
  EXPECT_EQ(m.trainer.model_type, SpmModelType::bpe);
  EXPECT_TRUE(m.trainer.byte_fallback);
  EXPECT_EQ(m.trainer.unk_id, 0);
  EXPECT_EQ(m.trainer.bos_id, 1);
  EXPECT_EQ(m.trainer.eos_id, 2);
  EXPECT_EQ(m.trainer.pad_id, -1);
  EXPECT_EQ(m.trainer.unk_piece, "<unk>");
  EXPECT_EQ(m.trainer.eos_piece, "</s>");
  EXPECT_EQ(m.normalizer.name, "identity");
  EXPECT_TRUE(m.normalizer.precompiled_charsmap.empty());
  EXPECT_TRUE(m.normalizer.add_dummy_prefix);
  EXPECT_FALSE(m.normalizer.remove_extra_whitespaces);  // trained with remove_extra_whitespaces=False
  EXPECT_TRUE(m.normalizer.escape_whitespaces);
  expect_piece(m, 0, "<unk>", 0.f, SpmPieceType::unknown);
  expect_piece(m, 1, "<s>", 0.f, SpmPieceType::control);
  expect_piece(m, 2, "</s>", 0.f, SpmPieceType::control);
  expect_piece(m, 3, "<0x00>", 0.f, SpmPieceType::byte);
  expect_piece(m, 4, "<0x01>", 0.f, SpmPieceType::byte);
  expect_piece(m, 300, "63", -41.f, SpmPieceType::normal);
  expect_piece(m, 599, "\xCE\xB3", -340.f, SpmPieceType::normal);  // γ
  int bytes = 0;
  for (const SpmPiece& p : m.pieces) bytes += p.type == SpmPieceType::byte;
  EXPECT_EQ(bytes, 256);
}

TEST(SpmModelProto, UnigramFixturesMatchSentencePiece) {
  const SpmModelProto m = fixture("spm-unigram.model");
  EXPECT_EQ(m.pieces.size(), 500u);
  EXPECT_EQ(m.trainer.model_type, SpmModelType::unigram);
  EXPECT_FALSE(m.trainer.byte_fallback);
  EXPECT_EQ(m.trainer.eos_id, 2);
  EXPECT_TRUE(m.normalizer.remove_extra_whitespaces);
  EXPECT_TRUE(m.normalizer.add_dummy_prefix);
  expect_piece(m, 3, "\xE2\x96\x81", -2.5321943759918213f, SpmPieceType::normal);  // ▁
  expect_piece(m, 4, "a", -2.7933199405670166f, SpmPieceType::normal);
  expect_piece(m, 250, "47", -7.038234710693359f, SpmPieceType::normal);
  expect_piece(m, 499, "5", -10.167952537536621f, SpmPieceType::normal);

  const SpmModelProto noeos = fixture("spm-noeos.model");
  EXPECT_EQ(noeos.pieces.size(), 500u);
  EXPECT_EQ(noeos.trainer.eos_id, -1);  // a ten-byte varint in the file
  EXPECT_EQ(noeos.trainer.bos_id, 1);
  expect_piece(noeos, 1, "<s>", 0.f, SpmPieceType::control);
  expect_piece(noeos, 4, "!?!?!?!?!?!?!?!?", -3.950498580932617f, SpmPieceType::normal);
  expect_piece(noeos, 499, "`", -9.717307090759277f, SpmPieceType::normal);
}

void expect_refused(const std::string& bytes, const std::string& needle) {
  try {
    parse_spm_model(bytes, "bad.model");
    FAIL() << "accepted a model that should fail with '" << needle << "'";
  } catch (const DataError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("bad.model"), std::string::npos) << what;
    EXPECT_NE(what.find(needle), std::string::npos) << what;
  }
}

TEST(SpmModelProto, DamagedFilesNameTheFileAndTheField) {
  const std::string good = testing_util::slurp((fixtures() / "spm-unigram.model").string());
  ASSERT_GT(good.size(), 100u);
  expect_refused(good.substr(0, good.size() - 3), "truncated");                       // cut inside the last field
  expect_refused(good.substr(0, 5), "ModelProto");                                    // cut inside the first piece
  expect_refused(std::string("\x0b", 1), "wire type 3");                              // field 1, start-group
  expect_refused(std::string(), "no pieces");                                         // empty file
  expect_refused(std::string("\x0a\x02\x18\x09", 4), "pieces[0]: type = 9");          // a piece of type 9
  expect_refused(std::string("\x0a\x03\x0a\x01x", 5), "unk_id = 0 names piece 'x'");  // piece 0 is not <unk>
  expect_refused(std::string("\x0a\x02\x18\x02\x12\x02\x18\x07", 8), "model_type = 7");
  expect_refused(std::string("\x0a\x02\x18\x02\x12\x03\xc0\x02\x05", 9), "trainer_spec.unk_id = 5");
  expect_refused(std::string("\x0a\x02\x18\x02", 4), "trainer_spec.bos_id = 1 is outside the 1 pieces");
  EXPECT_THROW(read_spm_model((fixtures() / "no-such.model").string()), DataError);
}

}  // namespace
}  // namespace mt
