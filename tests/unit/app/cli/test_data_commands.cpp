// test_data_commands.cpp: `megatrain data prepare` and `data inspect` (app::add_data_commands) as a user runs them:
// the datasets and tokenizer sidecars they write, what they print, and their errors.
#include <CLI/CLI.hpp>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "app/cli/commands.h"
#include "core/data/indexed_dataset.h"
#include "core/data/prepare.h"
#include "core/tokenizer/tokenizer.h"
#include "core/tokenizer/tokenizer_sidecar.h"
#include "tests/unit/core/data/tokenizer_fixtures.h"
#include "tests/unit/file_text.h"
#include "tests/unit/temp_dir.h"

namespace mt {
namespace {

using testing_util::expected;
using testing_util::fixture;
using testing_util::hf_file;
using testing_util::TempDir;

// ---- data prepare and inspect (test_data.cpp tests the dataset they make) ----

TEST(Prepare, CommandLineRunsPrepareAndInspect) {
  TempDir dir;
  testing_util::spit(dir / "in.txt", "one\n\ntwo");
  CLI::App app("megatrain");
  app::add_data_commands(app);
  const std::string in = dir / "in.txt", out = dir / "cli";
  std::vector<const char*> argv = {"megatrain", "data",      "prepare",     "--input", in.c_str(),
                                   "--output",  out.c_str(), "--tokenizer", "byte"};
  app.parse(static_cast<int>(argv.size()), argv.data());
  IndexedDataset ds(out);
  EXPECT_EQ(ds.num_documents(), 2);
  EXPECT_EQ(ds.num_tokens(), 8);

  CLI::App app2("megatrain");
  app::add_data_commands(app2);
  std::vector<const char*> argv2 = {"megatrain", "data", "inspect", out.c_str()};
  testing::internal::CaptureStdout();
  app2.parse(static_cast<int>(argv2.size()), argv2.data());
  const std::string printed = testing::internal::GetCapturedStdout();
  EXPECT_NE(printed.find("documents   2"), std::string::npos) << printed;

  CLI::App app3("megatrain");
  app::add_data_commands(app3);
  const std::string nope = dir / "nope";
  std::vector<const char*> argv3 = {"megatrain", "data", "inspect", nope.c_str()};
  EXPECT_THROW(app3.parse(static_cast<int>(argv3.size()), argv3.data()), DataError);
}

// An existing prefix is refused (issue 30, item 3) and --overwrite replaces it.
TEST(Prepare, CommandLineOverwriteFlagReplacesAnExistingPrefix) {
  TempDir dir;
  testing_util::spit(dir / "in.txt", "one\n\ntwo");
  const std::string in = dir / "in.txt", out = dir / "cli";
  auto prepare = [&](std::vector<const char*> extra) {
    CLI::App app("megatrain");
    app::add_data_commands(app);
    std::vector<const char*> argv = {"megatrain", "data",      "prepare",     "--input", in.c_str(),
                                     "--output",  out.c_str(), "--tokenizer", "byte"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    testing::internal::CaptureStdout();
    try {
      app.parse(static_cast<int>(argv.size()), argv.data());
    } catch (...) {
      testing::internal::GetCapturedStdout();
      throw;
    }
    testing::internal::GetCapturedStdout();
  };
  prepare({});
  testing_util::spit(dir / "in.txt", "one");
  try {
    prepare({});
    ADD_FAILURE() << "an existing prefix was replaced without --overwrite";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find(out + ".bin already exists; pass --overwrite"), std::string::npos) << e.what();
  }
  EXPECT_EQ(IndexedDataset(out).num_documents(), 2);
  prepare({"--overwrite"});
  EXPECT_EQ(IndexedDataset(out).num_documents(), 1);
}

// ---- the tokenizer options (test_tokenizer.cpp tests the tokenizers themselves) ----

TEST(Tokenizer, HfPostProcessorIsRecordedInTheSidecar) {
  TempDir dir;
  for (bool specials : {true, false}) {
    PrepareOptions opt;
    opt.inputs = {fixture("corpus.jsonl")};
    opt.output_prefix = dir / (specials ? "with" : "without");
    opt.tokenizer = hf_file(fixture("llama3-bos-tokenizer.json"));
    opt.tokenizer.add_special_tokens = specials;
    prepare_dataset(opt);
    const auto sidecar = read_tokenizer_sidecar(opt.output_prefix);
    ASSERT_TRUE(sidecar);
    EXPECT_EQ(sidecar->tokenizer.add_special_tokens, specials);
    IndexedDataset ds(opt.output_prefix);
    std::vector<int32_t> first(static_cast<size_t>(ds.sequence_lengths()[0]));
    ds.read(0, 0, first);
    EXPECT_EQ(first.front() == 0, specials);  // <|begin_of_text|>
    EXPECT_EQ(first.back(), 1);               // <|end_of_text|> still ends the document
  }
  // A sidecar written before the post-processor was applied has no add_special_tokens: its ids have none.
  std::ofstream(dir / "old.tokenizer.yaml") << "kind: hf\nfiles:\n  tokenizer_file: /x.json\nvocab_size: 404\neod: 1\n";
  EXPECT_FALSE(read_tokenizer_sidecar(dir / "old")->tokenizer.add_special_tokens);
  // The command line's --no-special-tokens.
  const std::string out = dir / "cli", in = fixture("corpus.jsonl"), file = fixture("llama3-bos-tokenizer.json");
  CLI::App app("megatrain");
  app::add_data_commands(app);
  std::vector<const char*> argv = {
      "megatrain", "data",        "prepare", "--input",          in.c_str(),   "--output",
      out.c_str(), "--tokenizer", "hf",      "--tokenizer-file", file.c_str(), "--no-special-tokens"};
  testing::internal::CaptureStdout();
  app.parse(static_cast<int>(argv.size()), argv.data());
  testing::internal::GetCapturedStdout();
  EXPECT_FALSE(read_tokenizer_sidecar(out)->tokenizer.add_special_tokens);
}

TEST(Tokenizer, CommandLineTakesTheTokenizerFiles) {
  TempDir dir;
  const std::string out = dir / "cli", in = fixture("corpus.jsonl"), vocab = fixture("gpt2-vocab.json"),
                    merges = fixture("gpt2-merges.txt");
  CLI::App app("megatrain");
  app::add_data_commands(app);
  std::vector<const char*> argv = {"megatrain",   "data",         "prepare",      "--input",   in.c_str(),
                                   "--output",    out.c_str(),    "--tokenizer",  "gpt2",      "--vocab-file",
                                   vocab.c_str(), "--merge-file", merges.c_str(), "--workers", "2"};
  testing::internal::CaptureStdout();
  app.parse(static_cast<int>(argv.size()), argv.data());
  const std::string printed = testing::internal::GetCapturedStdout();
  EXPECT_NE(printed.find("vocab_size 400"), std::string::npos) << printed;
  IndexedDataset ds(out);
  EXPECT_EQ(ds.num_documents(), static_cast<int64_t>(expected("gpt2").size()));
}

}  // namespace
}  // namespace mt
