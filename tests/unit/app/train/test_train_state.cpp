// test_train_state.cpp: the training state a checkpoint stores (app::TrainState), the model-shape and LoRA checks
// of a resume (app::model_shape_differences, app::lora_differences) and a LoRA checkpoint's base
// (app::check_lora_base).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "app/train/checkpointing.h"
#include "app/train/train_state.h"
#include "core/config/config.h"
#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/checkpoint_writer.h"
#include "core/checkpoint/save_dir.h"
#include "tests/unit/core/checkpoint/checkpoint_fixture.h"
#include "tests/unit/file_text.h"

namespace fs = std::filesystem;
using namespace mt;
using namespace mt::ckpt_test;

namespace {

using testing_util::slurp;
using testing_util::spit;

// Edited state values (iteration, consumed samples, optimizer steps, a "nan" loss scale) used to resume silently.
TEST(TrainState, EveryValueIsCheckedNamingTheField) {
  CheckpointState s;
  s.iteration = 10;
  s.values = {{"consumed_samples", "80"},
              {"skipped_iters", "1"},
              {"nan_iters", "0"},
              {"optimizer_steps", "9"},
              {"loss_scale", "65536"},
              {"loss_scale_growth_tracker", "3"},
              {"loss_scale_hysteresis_tracker", "2"},
              {"seed", "1234"}};
  const app::TrainState r = app::TrainState::load(s, "ck");
  EXPECT_EQ(r.consumed_samples, 80);
  EXPECT_EQ(r.optimizer_steps, 9);
  EXPECT_EQ(r.loss_scaler.scale, 65536.0);
  EXPECT_EQ(r.loss_scaler.hysteresis_tracker, 2);
  EXPECT_EQ(r.seed, 1234);
  // save writes back exactly what load read.
  CheckpointState again;
  r.save(again);
  EXPECT_EQ(again.iteration, s.iteration);
  EXPECT_EQ(again.values, s.values);
  const std::vector<std::tuple<std::string, std::string, std::string>> bad = {
      {"loss_scale", "nan", "'loss_scale' = 'nan' is not a finite number"},
      {"loss_scale", "inf", "'loss_scale' = 'inf' is not a finite number"},
      {"loss_scale", "-1", "'loss_scale' = -1 is not positive"},
      {"consumed_samples", "-8", "'consumed_samples' = -8 is negative"},
      {"consumed_samples", "5", "less than one sample per iteration"},
      {"optimizer_steps", "1.5", "'optimizer_steps' = '1.5' is not an integer"},
      {"optimizer_steps", "8", "'optimizer_steps' = 8 plus skipped_iters = 1 is not the iteration 10"},
      {"nan_iters", "11", "'nan_iters' = 11 is more than the iteration 10"},
      {"seed", "-1", "'seed' = -1 is negative"},
  };
  for (const auto& [key, value, part] : bad) {
    CheckpointState e = s;
    e.values[key] = value;
    std::string msg = error_of([&] { app::TrainState::load(e, "ck"); });
    EXPECT_NE(msg.find(part), std::string::npos) << key << "=" << value << ": " << msg;
  }
  CheckpointState missing = s;
  missing.values.erase("seed");
  EXPECT_NE(error_of([&] { app::TrainState::load(missing, "ck"); }).find("lacks state value 'seed'"),
            std::string::npos);
}

// A checkpoint of another model shape used to resume without a word.
TEST(ResumeState, ModelShapeDifferencesNameEachKey) {
  const std::string old_cfg =
      "model:\n  arch: gpt\n  num_layers: 2\n  hidden_size: 32\n  num_heads: 4\n"
      "  ffn_hidden_size: 128\n  max_position_embeddings: 32\n  vocab_size: 257\n"
      "  tie_embeddings: true\n  dropout: 0.1\n";
  EXPECT_TRUE(app::model_shape_differences(old_cfg, old_cfg, "ck").empty());
  std::string run = old_cfg;
  for (auto [from, to] :
       std::vector<std::pair<std::string, std::string>>{{"num_layers: 2", "num_layers: 1"},
                                                        {"num_heads: 4", "num_heads: 8"},
                                                        {"vocab_size: 257", "vocab_size: 300"},
                                                        {"tie_embeddings: true", "tie_embeddings: false"},
                                                        {"dropout: 0.1", "dropout: 0"}})
    run.replace(run.find(from), from.size(), to);
  EXPECT_EQ(app::model_shape_differences(old_cfg, run, "ck"),
            (std::vector<std::string>{"model.num_layers: 2 -> 1", "model.num_heads: 4 -> 8",
                                      "model.vocab_size: 257 -> 300", "model.tie_embeddings: true -> false"}));
  EXPECT_NE(error_of([&] { app::model_shape_differences("", run, "ck"); }).find("no model section"), std::string::npos);
  // Key/value groups: 0 or absent means one per head, so an explicit 4 equals a checkpoint without the key, and a
  // Llama with other groups or another rotary base differs.
  const std::string llama = old_cfg + "  num_query_groups: 4\n";
  EXPECT_TRUE(app::model_shape_differences(old_cfg, llama, "ck").empty());
  std::string gqa = llama;
  gqa.replace(gqa.find("num_query_groups: 4"), 19, "num_query_groups: 2");
  EXPECT_EQ(app::model_shape_differences(old_cfg, gqa + "  rotary_base: 10000\n", "ck"),
            (std::vector<std::string>{"model.num_query_groups: 4 -> 2"}));  // an old checkpoint has no rotary_base
  EXPECT_EQ(app::model_shape_differences(gqa + "  rotary_base: 10000\n", gqa + "  rotary_base: 500000\n", "ck"),
            (std::vector<std::string>{"model.rotary_base: 10000 -> 500000"}));
  // auto (written since issue 30, item 8) is the 0 of older checkpoints.
  EXPECT_TRUE(
      app::model_shape_differences(old_cfg + "  num_query_groups: 0\n", old_cfg + "  num_query_groups: auto\n", "ck")
          .empty());
  // head_dim: auto (or absent, before it was a key) is hidden / heads, so an explicit quotient equals it, another
  // width differs; QK-norm absent is off.
  EXPECT_TRUE(app::model_shape_differences(old_cfg, old_cfg + "  head_dim: auto\n", "ck").empty());
  EXPECT_TRUE(app::model_shape_differences(old_cfg, old_cfg + "  head_dim: 8\n", "ck").empty());
  EXPECT_EQ(app::model_shape_differences(old_cfg + "  head_dim: auto\n", old_cfg + "  head_dim: 12\n", "ck"),
            (std::vector<std::string>{"model.head_dim: 8 -> 12"}));
  EXPECT_EQ(app::model_shape_differences(old_cfg, old_cfg + "  qk_norm: true\n", "ck"),
            (std::vector<std::string>{"model.qk_norm: false -> true"}));
  EXPECT_TRUE(app::model_shape_differences(old_cfg, old_cfg + "  qk_norm: false\n  qkv_bias: false\n", "ck").empty());
}

// A LoRA resume with fewer targets used to drop the other adapters and their Adam state without a word; another
// rank failed on a tensor's shape without naming the key; another alpha rescaled what the adapters had learned.
TEST(ResumeState, LoraDifferencesNameEachKeyAndBothValues) {
  const std::string stored =
      "finetune:\n  lora:\n    rank: 4\n    alpha: 8\n    dropout: 0.1\n"
      "    targets: [qkv, proj, fc1, fc2]\n";
  LoraConfig same;
  same.rank = 4;
  same.alpha = 8;
  EXPECT_TRUE(app::lora_differences(stored, same).empty());
  LoraConfig fewer = same;
  fewer.targets = {"proj", "qkv"};
  fewer.dropout = 0.3;  // dropout shapes training, not the adapters
  EXPECT_EQ(app::lora_differences(stored, fewer),
            (std::vector<std::string>{"finetune.lora.targets: [qkv, proj, fc1, fc2] -> [proj, qkv] (the checkpoint's "
                                      "adapters of fc1, fc2 and their optimizer state would be dropped)"}));
  EXPECT_EQ(app::lora_differences("finetune:\n  lora:\n    rank: 4\n    alpha: 8\n    targets: [qkv]\n", same),
            (std::vector<std::string>{"finetune.lora.targets: [qkv] -> [qkv, proj, fc1, fc2] (it holds no adapters "
                                      "of proj, fc1, fc2)"}));
  LoraConfig other = same;
  other.rank = 8;
  other.alpha = 16;
  EXPECT_EQ(
      app::lora_differences(stored, other),
      (std::vector<std::string>{"finetune.lora.rank: 4 -> 8",
                                "finetune.lora.alpha: 8 -> 16 (the adapters' update is scaled by alpha / rank)"}));
  // A checkpoint without LoRA (or saved before it existed) has rank 0.
  EXPECT_EQ(app::lora_differences("model:\n  num_layers: 2\n", same),
            (std::vector<std::string>{"finetune.lora.rank: 0 -> 4"}));
  EXPECT_TRUE(app::lora_differences("model:\n  num_layers: 2\n", LoraConfig{}).empty());
}

// LoRA adapters fit only the base they were trained on: one replaced at the same path used to go unnoticed.
TEST(ResumeState, LoraBaseIsRecordedAndAnotherOneRefused) {
  const app::LoraBase base{.checkpoint = "base/ckpt/iter_0000006", .weights = "crc32 0123abcd"};
  CheckpointState s;
  s.config_yaml = "training:\n  init_from: base/ckpt\n";
  app::record_lora_base(s, base);
  app::check_lora_base(s, "ck", base, "base/ckpt");
  app::check_lora_base(s, "ck", {.checkpoint = "copy/iter_0000006", .weights = base.weights}, "copy");  // a copy
  const std::string msg = error_of([&] {
    app::check_lora_base(s, "ck", {.checkpoint = "base/ckpt/iter_0000009", .weights = "crc32 89abcdef"}, "base/ckpt");
  });
  for (const char* part :
       {"ck: its LoRA adapters were trained on the base base/ckpt/iter_0000006 (weights crc32 0123abcd)",
        "training.init_from: 'base/ckpt' now gives the base base/ckpt/iter_0000009 (weights crc32 89abcdef)"})
    EXPECT_NE(msg.find(part), std::string::npos) << msg;
  // The seeded initialization is its seed.
  CheckpointState seeded;
  app::record_lora_base(seeded, app::seeded_lora_base(42));
  app::check_lora_base(seeded, "ck", app::seeded_lora_base(42), "");
  EXPECT_NE(error_of([&] { app::check_lora_base(seeded, "ck", app::seeded_lora_base(7), ""); })
                .find("trained on the seeded initialization (training.seed 42), but training.init_from: '' now gives "
                      "the seeded initialization (training.seed 7)"),
            std::string::npos);
  // A checkpoint saved before the record: only the path can be compared (a warning).
  CheckpointState old;
  old.config_yaml = s.config_yaml;
  app::check_lora_base(old, "ck", {.checkpoint = "other/iter_0000001", .weights = "crc32 89abcdef"}, "other");
}

// Configs stored before issue 30 (item 8) wrote num_query_groups' default as 0, which a config file may no longer
// say: such a checkpoint still loads (export, generate, evaluate read it through whole_model_config).
TEST_F(CheckpointTest, StoredConfigsWithZeroDefaultsStillLoad) {
  const Config c = parse_config(
      "model:\n  arch: llama\n  num_layers: 2\n  hidden_size: 64\n  num_heads: 8\n  seq_length: 16\n"
      "  vocab_size: 257\ntraining:\n  train_iters: 10\noptimizer:\n  lr: 1.0e-3\ndata:\n  synthetic: true\n",
      "t.yaml", {}, 1);
  std::string old_yaml = to_yaml(c);
  const std::string now = "  num_query_groups: auto\n";
  ASSERT_NE(old_yaml.find(now), std::string::npos) << old_yaml;
  old_yaml.replace(old_yaml.find(now), now.size(), "  num_query_groups: 0\n");
  CheckpointState st = state_at(5);
  st.config_yaml = old_yaml;
  const std::string dir = save_checkpoint(save_, st, {}, 0);
  const Config back = app::whole_model_config(CheckpointReader(dir), dir, 1, "cpu");
  EXPECT_EQ(back.model.kv_heads(), 8);
  EXPECT_EQ(back.model.ffn_hidden_size, c.model.ffn_hidden_size);
}

}  // namespace
