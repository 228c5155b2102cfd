// test_command_errors.cpp: `megatrain plan` and `megatrain generate` as a user runs them, where a flag or a --set
// used to give a wrong answer or a message without the file or key (issue 30, item 12).
#include <gtest/gtest.h>

#include <filesystem>
#include <stdexcept>
#include <string>

#include "tests/unit/app/cli/cli_run.h"
#include "core/config/config.h"
#include "tests/unit/expect_contains.h"
#include "tests/unit/source_root.h"
#include "tests/unit/temp_dir.h"

using namespace mt;

namespace {

// Runs `args` as megatrain does; returns what it printed.
std::string run(const std::string& args) {
  ::testing::internal::CaptureStdout();
  try {
    cli_test::run_cli(args);
  } catch (...) {
    ::testing::internal::GetCapturedStdout();
    throw;
  }
  return ::testing::internal::GetCapturedStdout();
}

std::string error_of(const std::string& args) {
  try {
    run(args);
  } catch (const std::exception& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an error from: " << args;
  return "";
}

const std::string kTiny = testing_util::source_path("configs/gpt-tiny.yaml");

// --search replaces the layout: a config whose own layout needs 8 ranks is searched on --world 4, not refused.
TEST(PlanCommand, SearchOnAnotherWorldThanTheConfigsLayout) {
  const std::string sets = " --set parallel.tensor=2 --set parallel.pipeline=2 --set parallel.data=2";
  const std::string text = run("plan --config " + kTiny + sets + " --gpu h100-80gb --search --world 4");
  EXPECT_CONTAINS(text, "on 4 x h100-80gb");
  EXPECT_CONTAINS(text, "the fastest in detail");
  // Without --search, the layout is planned as written, and --world must hold it.
  EXPECT_CONTAINS(error_of("plan --config " + kTiny + sets + " --gpu h100-80gb --world 4"), "parallel");
}

// A vocabulary of a billion was blamed on model.num_layers: the part of the parameters that is too large is named.
TEST(PlanCommand, OversizedVocabularyIsBlamedOnTheVocabulary) {
  const std::string msg =
      error_of("plan --config " + kTiny + " --set model.hidden_size=65536 --set model.num_heads=64" +
               " --set model.vocab_size=1000000000 --set model.tie_embeddings=false");
  EXPECT_CONTAINS(msg, "model.vocab_size: the model's");
  EXPECT_CONTAINS(msg, "the embedding tables of the padded vocabulary 1000000000");
  EXPECT_EQ(msg.find("model.num_layers:"), std::string::npos) << msg;
}

TEST(GenerateCommand, PromptFileThatIsADirectoryIsNamed) {
  testing_util::TempDir tmp("mt_prompt");
  EXPECT_EQ(error_of("generate --load " + (tmp / "none") + " --prompt-file " + tmp.path().string()),
            "--prompt-file " + tmp.path().string() + ": is a directory; give a text file");
  EXPECT_CONTAINS(error_of("generate --load " + (tmp / "none") + " --prompt-file " + (tmp / "missing.txt")),
                  "--prompt-file: " + (tmp / "missing.txt") + ": cannot open: No such file or directory");
}

}  // namespace
