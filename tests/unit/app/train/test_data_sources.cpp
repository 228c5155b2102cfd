// test_data_sources.cpp: a run's datasets must share one tokenizer, and a resume must use the checkpoint's
// (issue 30, item 6): check_data_tokenizers and check_checkpoint_tokenizer compare the tokenizer records
// (PREFIX.tokenizer.yaml, a checkpoint's tokenizer.yaml), name both and what differs, and
// data.allow_tokenizer_change lets a run go on.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "app/train/checkpointing.h"
#include "app/train/data_sources.h"
#include "core/config/config.h"
#include "core/data/indexed_dataset.h"
#include "tests/unit/expect_contains.h"
#include "tests/unit/file_text.h"
#include "tests/unit/temp_dir.h"

namespace mt::app {
namespace {

using testing_util::spit;
using testing_util::TempDir;

const std::string kByte = "kind: byte\nfiles: {}\nvocab_size: 257\neod: 256\nvocab_hash: \"crc32c:0000abcd\"\n";
const std::string kGpt2 = "kind: gpt2\nvocab_size: 400\neod: 0\nvocab_hash: \"crc32c:12345678\"\n";
const std::string kGpt2Permuted = "kind: gpt2\nvocab_size: 400\neod: 0\nvocab_hash: \"crc32c:87654321\"\n";

// The message of the DataError `f` throws ("" when it throws none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

Config data_config(std::vector<std::string> train, std::vector<std::string> valid = {}) {
  Config cfg;
  cfg.data.train = std::move(train);
  cfg.data.valid = std::move(valid);
  return cfg;
}

TEST(DataTokenizers, DatasetsOfOneRunShareOneTokenizer) {
  TempDir dir;
  const std::string a = dir / "a", b = dir / "b", c = dir / "c", none = dir / "none";
  spit(a + ".tokenizer.yaml", kByte);
  spit(b + ".tokenizer.yaml", kGpt2);
  spit(c + ".tokenizer.yaml", kByte);
  EXPECT_EQ(error_of([&] { check_data_tokenizers(data_config({a, c}, {c})); }), "");
  EXPECT_EQ(error_of([&] { check_data_tokenizers(data_config({a, none})); }), "");  // no record: nothing to compare

  const std::string concat = error_of([&] { check_data_tokenizers(data_config({a, c, b})); });
  EXPECT_CONTAINS(concat, "data.train[0] (" + a + ".tokenizer.yaml) and data.train[2] (" + b + ".tokenizer.yaml)");
  EXPECT_CONTAINS(concat, "record different tokenizers (kind: byte vs gpt2; vocab_size: 257 vs 400; ");
  EXPECT_CONTAINS(concat, "eod (the end-of-document id): 256 vs 0)");
  EXPECT_CONTAINS(concat, "data.allow_tokenizer_change: true");
  const std::string blend = error_of([&] { check_data_tokenizers(data_config({"0.5", a, "0.5", b})); });
  EXPECT_CONTAINS(blend, "data.train[1] (" + a + ".tokenizer.yaml) and data.train[3] (" + b + ".tokenizer.yaml)");
  EXPECT_CONTAINS(error_of([&] { check_data_tokenizers(data_config({a}, {b})); }), "and data.valid[0] (");

  Config allowed = data_config({a, b});
  allowed.data.allow_tokenizer_change = true;
  EXPECT_EQ(error_of([&] { check_data_tokenizers(allowed); }), "");
  Config synthetic = data_config({a, b});
  synthetic.data.synthetic = true;
  EXPECT_EQ(error_of([&] { check_data_tokenizers(synthetic); }), "");
}

TEST(DataTokenizers, ResumeRefusesDataOfAnotherTokenizerUnlessAllowed) {
  TempDir dir;
  const std::string ckpt = dir / "iter_0000002", byte = dir / "byte", gpt2 = dir / "gpt2", permuted = dir / "perm";
  std::filesystem::create_directory(ckpt);
  spit(byte + ".tokenizer.yaml", kByte);
  spit(gpt2 + ".tokenizer.yaml", kGpt2);
  spit(permuted + ".tokenizer.yaml", kGpt2Permuted);
  EXPECT_EQ(error_of([&] { check_checkpoint_tokenizer(ckpt, data_config({gpt2})); }), "");  // saved without one
  spit(ckpt + "/tokenizer.yaml", kGpt2);
  EXPECT_EQ(error_of([&] { check_checkpoint_tokenizer(ckpt, data_config({gpt2, byte})); }), "");

  const std::string other = error_of([&] { check_checkpoint_tokenizer(ckpt, data_config({byte})); });
  EXPECT_CONTAINS(other, "the checkpoint (" + ckpt + "/tokenizer.yaml) and data.train's first dataset (" + byte +
                             ".tokenizer.yaml) record different tokenizers (kind: gpt2 vs byte;");
  const std::string perm = error_of([&] { check_checkpoint_tokenizer(ckpt, data_config({"1", permuted})); });
  EXPECT_CONTAINS(perm, "(vocab_hash: crc32c:12345678 vs crc32c:87654321)");

  Config allowed = data_config({byte});
  allowed.data.allow_tokenizer_change = true;
  EXPECT_EQ(error_of([&] { check_checkpoint_tokenizer(ckpt, allowed); }), "");
}

}  // namespace
}  // namespace mt::app
