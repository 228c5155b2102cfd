// test_ckpt_import.cpp: `megatrain ckpt import --format hf` as a user runs it: the checkpoint it writes is one that
// resume and fine-tuning take, in another layout too, and an output holding a run's checkpoints is refused.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "app/train/checkpointing.h"
#include "app/train/train_state.h"
#include "core/checkpoint/checkpoint.h"
#include "core/config/config.h"
#include "core/hf/hf_export.h"
#include "core/hf/safetensors.h"
#include "tests/unit/app/cli/cli_run.h"
#include "tests/unit/core/checkpoint/checkpoint_fixture.h"
#include "tests/unit/core/hf/hf_tiny_model.h"
#include "tests/unit/file_text.h"
#include "tests/unit/temp_dir.h"

using namespace mt;

namespace {

using ckpt_test::error_of;
using cli_test::run_cli;
using hf_test::TinyModel;
using testing_util::slurp;

class CkptImport : public ::testing::Test {
 protected:
  testing_util::TempDir tmp_{"mt_ckpt_import"};
  std::string path(const std::string& name) const { return tmp_ / name; }
};

// The CLI writes a checkpoint that resume accepts: iteration 0, zero moments, the model keys of model.yaml.
TEST_F(CkptImport, CliImportWritesACheckpointThatResumeTakes) {
  TinyModel m(false, false);
  export_hf(CheckpointReader(m.save(path("ckpt"))), path("hf"));
  ::testing::internal::CaptureStdout();
  run_cli(fmt::format("ckpt import {} --format hf --output {} --seq-length 4", path("hf"), path("imp")));
  const std::string text = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(text.find("seq_length: 4"), std::string::npos) << text;
  CheckpointReader r(path("imp/iter_0000000"));
  EXPECT_EQ(*resolve_checkpoint(path("imp")), r.dir());
  const app::TrainState ts = app::TrainState::load(r.state(), r.dir());
  EXPECT_EQ(ts.iteration, 0);
  EXPECT_EQ(ts.optimizer_steps, 0);
  EXPECT_EQ(ts.consumed_samples, 0);
  r.verify_all();
  // The config resolution pads 11 to 128 rows at tensor=1.
  EXPECT_EQ(r.info("model.embedding.word_embeddings.weight").global_shape, (Shape{128, m.C}));
  Tensor e = Tensor::empty({128, m.C}, DType::f32);
  r.read("model.embedding.word_embeddings.weight", e);
  std::vector<float> want = m.v("embedding.word_embeddings.weight");
  want.resize(static_cast<size_t>(m.V * m.C));
  want.resize(static_cast<size_t>(128 * m.C), 0.f);
  EXPECT_EQ(e.to_floats(), want);
  Tensor q = Tensor::empty({3 * m.C, m.C}, DType::f32), zero = Tensor::empty({m.C}, DType::f32);
  r.read("model.layers.1.attn.qkv.weight", q);
  EXPECT_EQ(q.to_floats(), m.v("layers.1.attn.qkv.weight"));
  r.read("optimizer.exp_avg_sq.final_ln.bias", zero);
  EXPECT_EQ(zero.to_floats(), std::vector<float>(static_cast<size_t>(m.C), 0.f));
  EXPECT_EQ(r.tensors().size(), 3 * m.params.size());

  // A fine-tuning config built from model.yaml matches the stored model, in another layout too.
  const std::string model_yaml = slurp(path("imp/model.yaml"));
  const Config run = parse_config(model_yaml +
                                      "parallel: {tensor: 2}\ntraining: {train_iters: 5}\noptimizer: {lr: 0.01}\n"
                                      "data: {synthetic: true}\n",
                                  "ft.yaml", {}, 2);
  EXPECT_TRUE(app::model_shape_differences(r.state().config_yaml, to_yaml(run), r.dir()).empty());
  EXPECT_EQ(run.model.seq_length, 4);
  EXPECT_EQ(run.model.dropout, 0.f);
  EXPECT_EQ(run.model.max_position_embeddings, m.P);

  // fp16: the loss scale a fresh fp16 run starts with.
  run_cli(fmt::format("ckpt import {} --format hf --output {} --dtype fp16", path("hf"), path("imp16")));
  CheckpointReader r16(path("imp16/iter_0000000"));
  EXPECT_EQ(app::TrainState::load(r16.state(), r16.dir()).loss_scaler.scale, 4294967296.0);
}

// Before the llama model is merged the config resolution refuses arch: llama; after, the import succeeds.
TEST_F(CkptImport, CliImportOfALlama) {
  TinyModel m(true, false);
  export_hf(CheckpointReader(m.save(path("ckpt"))), path("hf"));
  ::testing::internal::CaptureStdout();
  run_cli(fmt::format("ckpt import {} --format hf --output {}", path("hf"), path("imp")));
  ::testing::internal::GetCapturedStdout();
  const std::optional<std::string> dir = resolve_checkpoint(path("imp"));
  ASSERT_TRUE(dir.has_value());
  CheckpointReader r(*dir);
  Tensor q = Tensor::empty({(m.H + 2 * m.G) * 4, m.C}, DType::f32);
  r.read("model.layers.0.attn.qkv.weight", q);
  EXPECT_EQ(q.to_floats(), m.v("layers.0.attn.qkv.weight"));
  EXPECT_FALSE(r.has("model.embedding.position_embeddings.weight"));
}

// An import into a save directory that holds checkpoints moved latest to iteration 0 and dropped the run's progress,
// and one into a live run's raced it (issue 30, item 1): both are refused, naming what is there, and nothing changes.
TEST_F(CkptImport, CliImportRefusesADirectoryWithCheckpointsOrALock) {
  TinyModel m(false, false);
  export_hf(CheckpointReader(m.save(path("ckpt"))), path("hf"));
  // m.save wrote iter_0000007 and latest into path("ckpt"): a run's save directory.
  const std::string before = slurp(path("ckpt/latest"));
  std::string msg = error_of([&] { run_cli(fmt::format("ckpt import {} --output {}", path("hf"), path("ckpt"))); });
  EXPECT_NE(msg.find("ckpt import: " + path("ckpt") +
                     " holds checkpoints (latest: iter_0000007); import into a new "
                     "directory"),
            std::string::npos)
      << msg;
  EXPECT_EQ(slurp(path("ckpt/latest")), before);
  EXPECT_FALSE(std::filesystem::exists(path("ckpt/iter_0000000")));

  // A second import into the same directory finds the first's checkpoint.
  ::testing::internal::CaptureStdout();
  run_cli(fmt::format("ckpt import {} --output {}", path("hf"), path("imp")));
  ::testing::internal::GetCapturedStdout();
  msg = error_of([&] { run_cli(fmt::format("ckpt import {} --output {}", path("hf"), path("imp"))); });
  EXPECT_NE(msg.find(path("imp") + " holds checkpoints (latest: iter_0000000)"), std::string::npos) << msg;

  // iter_* directories without latest count too.
  std::filesystem::create_directories(path("bare/iter_0000003"));
  msg = error_of([&] { run_cli(fmt::format("ckpt import {} --output {}", path("hf"), path("bare"))); });
  EXPECT_NE(msg.find("holds checkpoints (1 iter_* directory, the newest iter_0000003; no latest)"), std::string::npos)
      << msg;

  // A live run holds the flock of save_dir/.lock (another open file description conflicts like another process).
  std::filesystem::create_directories(path("live"));
  const std::string lock_file = path("live/.lock");
  const int fd = ::open(lock_file.c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, "4242\n", 5), 5);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  msg = error_of([&] { run_cli(fmt::format("ckpt import {} --output {}", path("hf"), path("live"))); });
  ::close(fd);
  EXPECT_EQ(msg, "ckpt import: " + path("live") + " is locked by a live run (" + lock_file +
                     " is held by pid 4242); import into a new directory");
  EXPECT_FALSE(std::filesystem::exists(path("live/latest")));
}

// A refused import (here: a weight that is not finite, issue 30, item 5) writes nothing and leaves no directory it
// created: one holding only the lock file looked like a save directory to the next import.
TEST_F(CkptImport, ARefusedImportLeavesNothing) {
  TinyModel m(false, false);
  export_hf(CheckpointReader(m.save(path("ckpt"))), path("hf"));
  const std::string file = path("hf/model.safetensors");
  std::vector<std::pair<std::string, Tensor>> ts;
  {
    SafetensorsReader r(file);
    for (const auto& [name, entry] : r.tensors()) ts.emplace_back(name, r.read(name));
  }
  std::vector<float> v = ts.front().second.to_floats();
  v[1] = std::numeric_limits<float>::infinity();
  ts.front().second = Tensor::from_floats(v, ts.front().second.shape());
  write_safetensors(file, ts, DType::f32);
  const std::string msg =
      error_of([&] { run_cli(fmt::format("ckpt import {} --output {}", path("hf"), path("imp"))); });
  EXPECT_NE(msg.find("1 of"), std::string::npos) << msg;
  EXPECT_NE(msg.find("is not finite (the first, inf, at index 1)"), std::string::npos) << msg;
  EXPECT_FALSE(std::filesystem::exists(path("imp")));
  // An output directory that was there stays, with nothing imported into it.
  std::filesystem::create_directories(path("mine"));
  error_of([&] { run_cli(fmt::format("ckpt import {} --output {}", path("hf"), path("mine"))); });
  EXPECT_TRUE(std::filesystem::exists(path("mine")));
  EXPECT_FALSE(std::filesystem::exists(path("mine/latest")));
}

}  // namespace
