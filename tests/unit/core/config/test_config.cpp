// test_config.cpp: the YAML configuration: typed keys, unknown-key hints, overrides, rules, derived values and
// the to_yaml round trip, and every file in configs/.
#include <gtest/gtest.h>
#include <fmt/format.h>

#include "tests/unit/expect_contains.h"
#include <yaml-cpp/yaml.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "tests/unit/source_root.h"

using namespace mt;

namespace {

// A small valid config; tests change it with overrides or by editing the text.
const std::string kBase = R"(model:
  num_layers: 4
  hidden_size: 64
  num_heads: 8
  seq_length: 32
  vocab_size: 257
training:
  train_iters: 100
optimizer:
  lr: 1.0e-3
data:
  synthetic: true
)";

Config parse(const std::string& text, const std::vector<std::string>& overrides = {}, int64_t world = 1) {
  return parse_config(text, "t.yaml", overrides, world);
}
Config base(const std::vector<std::string>& overrides = {}, int64_t world = 1) {
  return parse(kBase, overrides, world);
}

// The ConfigError message, or a test failure when there is none.
std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}, int64_t world = 1) {
  try {
    parse(text, overrides, world);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no ConfigError for overrides [" << ::testing::PrintToString(overrides) << "]";
  return "";
}
std::string base_error(const std::vector<std::string>& overrides, int64_t world = 1) {
  return error_of(kBase, overrides, world);
}

std::string replace(std::string s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return s.replace(at, from.size(), to);
}

// ---------------------------------------------------------------------------------------------- reading

TEST(Config, DefaultsFillEveryOptionalKey) {
  const Config c = base();
  EXPECT_EQ(c.source, "t.yaml");
  EXPECT_EQ(c.model.arch, Arch::gpt);
  EXPECT_TRUE(c.model.tie_embeddings);
  EXPECT_EQ(c.model.make_vocab_size_divisible_by, 128);
  EXPECT_FLOAT_EQ(c.model.dropout, 0.1f);
  EXPECT_EQ(c.parallel.tensor, 1);
  EXPECT_EQ(c.parallel.pipeline, 1);
  EXPECT_FALSE(c.parallel.sequence_parallel);
  EXPECT_TRUE(c.parallel.layers_per_stage.empty());
  EXPECT_EQ(c.training.micro_batch_size, 1);
  EXPECT_EQ(c.training.precision, Precision::fp32);
  EXPECT_EQ(c.training.loss_scale.initial, 4294967296.0);
  EXPECT_EQ(c.training.loss_scale.hysteresis, 2);
  EXPECT_EQ(c.training.recompute, Recompute::none);
  EXPECT_EQ(c.training.device, DeviceChoice::automatic);
  EXPECT_EQ(c.parallel.backend, BackendChoice::automatic);
  EXPECT_EQ(c.optimizer.decay, LrDecay::cosine);
  EXPECT_EQ(c.optimizer.betas, (std::vector<double>{0.9, 0.999}));
  EXPECT_EQ(c.data.split, (std::vector<double>{969, 30, 1}));
  EXPECT_EQ(c.checkpoint.load, "auto");
  EXPECT_EQ(c.logging.interval, 10);
  EXPECT_EQ(c.logging.level, "info");
}

TEST(Config, DerivedValues) {
  const Config c = base({"parallel.tensor=2", "parallel.pipeline=2", "training.micro_batch_size=2"}, 8);
  EXPECT_EQ(c.model.ffn_hidden_size, 256);         // 4 * hidden
  EXPECT_EQ(c.model.max_position_embeddings, 32);  // seq_length
  EXPECT_EQ(c.model.padded_vocab_size, 512);       // 257 up to a multiple of 128 * 2
  EXPECT_EQ(c.model.head_dim, 8);
  EXPECT_EQ(c.parallel.data, 2);  // auto: 8 / (2 * 2)
  EXPECT_EQ(c.parallel.world_size, 8);
  EXPECT_EQ(c.training.global_batch_size, 4);  // micro * data
  EXPECT_EQ(c.training.num_microbatches, 1);
  EXPECT_EQ(c.optimizer.decay_iters, 100);  // train_iters

  const Config d = base({"training.global_batch_size=32", "training.micro_batch_size=4", "optimizer.decay_iters=50",
                         "model.ffn_hidden_size=100", "model.max_position_embeddings=64"},
                        2);
  EXPECT_EQ(d.training.num_microbatches, 4);  // 32 / (4 * 2)
  EXPECT_EQ(d.optimizer.decay_iters, 50);
  EXPECT_EQ(d.model.ffn_hidden_size, 100);
  EXPECT_EQ(d.model.max_position_embeddings, 64);
  EXPECT_EQ(d.model.padded_vocab_size, 384);  // tensor 1: a multiple of 128
}

TEST(Config, WrongTypeNamesFileLineColumnKeyAndValue) {
  EXPECT_EQ(error_of(replace(kBase, "hidden_size: 64", "hidden_size: abc")),
            "t.yaml:3:16: model.hidden_size: expected an integer, got 'abc'");
}

TEST(Config, WrongTypeForEveryKindOfKey) {
  EXPECT_CONTAINS(base_error({"model.num_layers=2.5"}), "model.num_layers: expected an integer, got '2.5'");
  EXPECT_CONTAINS(base_error({"model.dropout=high"}), "model.dropout: expected a number, got 'high'");
  EXPECT_CONTAINS(base_error({"optimizer.lr=[1]"}), "optimizer.lr: expected a number, got a list");
  EXPECT_CONTAINS(base_error({"model.tie_embeddings=maybe"}),
                  "model.tie_embeddings: expected true or false, got 'maybe'");
  EXPECT_CONTAINS(base_error({"training.precision=[bf16]"}),
                  "training.precision: expected one of fp32, bf16, fp16, got a list");
  EXPECT_CONTAINS(base_error({"parallel.data=many"}), "parallel.data: expected an integer or 'auto', got 'many'");
  EXPECT_CONTAINS(base_error({"optimizer.betas=0.9"}), "optimizer.betas: expected a list of 2 numbers, got '0.9'");
  EXPECT_CONTAINS(base_error({"optimizer.betas=[0.9, 0.95, 0.99]"}),
                  "optimizer.betas: expected a list of 2 numbers, got 3 entries");
  EXPECT_CONTAINS(base_error({"optimizer.betas=[0.9, x]"}), "optimizer.betas[1]: expected a number, got 'x'");
  EXPECT_CONTAINS(base_error({"parallel.layers_per_stage=[1, a]"}),
                  "parallel.layers_per_stage[1]: expected an integer, got 'a'");
  EXPECT_CONTAINS(base_error({"data.train={a: 1}"}),
                  "data.train: expected a string or a list of strings, got a mapping");
  EXPECT_CONTAINS(base_error({"data.valid=[a, [b]]"}), "data.valid[1]: expected a string, got a list");
  EXPECT_CONTAINS(base_error({"training.loss_scale=65536"}),
                  "training.loss_scale: expected a mapping of keys, got '65536'");
  EXPECT_CONTAINS(error_of(kBase + "logging: [a]\n"), "t.yaml:13:10: logging: expected a mapping of keys");
  EXPECT_CONTAINS(error_of(replace(kBase, "num_layers: 4", "num_layers:")),
                  "model.num_layers: expected an integer, got an empty value");
  EXPECT_CONTAINS(base_error({"optimizer.lr=.nan"}), "optimizer.lr: expected a number, got '.nan'");
}

TEST(Config, NumbersInEveryYamlSpelling) {
  const Config c = base({"optimizer.lr=2e-4", "optimizer.min_lr=+1.5e-5", "training.loss_scale.initial=65536",
                         "model.layernorm_eps=1e-6", "model.tie_embeddings=False"});
  EXPECT_EQ(c.optimizer.lr, 2e-4);
  EXPECT_EQ(c.optimizer.min_lr, 1.5e-5);
  EXPECT_EQ(c.training.loss_scale.initial, 65536.0);
  EXPECT_EQ(c.model.layernorm_eps, 1e-6f);
  EXPECT_FALSE(c.model.tie_embeddings);
}

TEST(Config, UnknownKeyGivesNearestKeyHint) {
  EXPECT_EQ(error_of(replace(kBase, "hidden_size: 64", "hiden_size: 64")),
            "t.yaml:3:3: model.hiden_size: unknown key (did you mean model.hidden_size?)");
}

TEST(Config, UnknownKeyHintsTheSectionThatHasIt) {
  EXPECT_CONTAINS(error_of(replace(kBase, "  vocab_size: 257\n", "  vocab_size: 257\n  micro_batch_size: 4\n")),
                  "model.micro_batch_size: unknown key (did you mean training.micro_batch_size?)");
  EXPECT_CONTAINS(error_of(replace(kBase, "  train_iters: 100\n", "  train_iters: 100\n  lr: 1\n")),
                  "training.lr: unknown key");
}

TEST(Config, UnknownSectionGivesHint) {
  EXPECT_CONTAINS(error_of(kBase + "logging_:\n  interval: 2\n"),
                  "t.yaml:13:1: logging_: unknown key (did you mean logging?)");
  EXPECT_CONTAINS(error_of(kBase + "num_layers: 3\n"), "num_layers: unknown key (did you mean model.num_layers?)");
}

TEST(Config, UnknownNestedKeyGivesHint) {
  EXPECT_CONTAINS(error_of(replace(kBase, "  train_iters: 100\n", "  train_iters: 100\n  loss_scale: {initail: 2}\n")),
                  "training.loss_scale.initail: unknown key (did you mean training.loss_scale.initial?)");
}

TEST(Config, UnknownKeyFarFromAnyListsTheSectionsKeys) {
  EXPECT_CONTAINS(base_error({"checkpoint.zzzzzz=1"}),
                  "unknown key (expected one of: save_dir, save_interval, keep_last, load, allow_partial_load)");
  EXPECT_CONTAINS(base_error({"optimizer.warmup=10"}), "did you mean optimizer.warmup_iters?");
}

TEST(Config, DuplicateKeyIsAnError) {
  EXPECT_CONTAINS(error_of(replace(kBase, "  num_heads: 8\n", "  num_heads: 8\n  num_heads: 4\n")),
                  "t.yaml:5:3: model.num_heads: duplicate key");
}

TEST(Config, MalformedYamlNamesFileAndLine) {
  const std::string msg = error_of("model:\n  num_layers: [1, 2\ntraining:\n  train_iters: 3\n");
  EXPECT_CONTAINS(msg, "t.yaml:");
  EXPECT_CONTAINS(msg, "malformed YAML");
  EXPECT_EQ(error_of("model:\n  a: b: c\n"), "t.yaml:2:7: malformed YAML: illegal map value");
}

TEST(Config, TopLevelMustBeAMapping) {
  EXPECT_CONTAINS(error_of("- a\n- b\n"), "t.yaml:1:1: expected a mapping of sections");
}

TEST(Config, EmptyDocumentMissesRequiredKeys) {
  EXPECT_EQ(error_of(""), "t.yaml: model.num_layers: required key is missing");
}

TEST(Config, MissingFileIsAConfigErrorNamingIt) {
  try {
    load_config("/nonexistent/dir/gpt.yaml", {});
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_CONTAINS(std::string(e.what()), "/nonexistent/dir/gpt.yaml");
    EXPECT_CONTAINS(std::string(e.what()), "not found");
  }
}

TEST(Config, LoadConfigReadsAFileAndNamesIt) {
  const auto path = std::filesystem::temp_directory_path() / "megatrain_test_config_load.yaml";
  { std::ofstream(path) << replace(kBase, "hidden_size: 64", "hidden_size: x"); }
  try {
    load_config(path.string(), {});
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), path.string() + ":3:16: model.hidden_size: expected an integer, got 'x'");
  }
  const Config c = load_config(path.string(), {"model.hidden_size=32"});
  EXPECT_EQ(c.source, path.string());
  EXPECT_EQ(c.model.hidden_size, 32);
  std::filesystem::remove(path);
}

TEST(Config, LayoutWorldSizeReadsTheParallelKeysAndOverrides) {
  const auto path = std::filesystem::temp_directory_path() / "megatrain_test_layout_world.yaml";
  { std::ofstream(path) << kBase + "parallel: {tensor: 2, data: auto}\n"; }
  EXPECT_EQ(layout_world_size(path.string(), {}), 2);
  EXPECT_EQ(layout_world_size(path.string(), {"parallel.pipeline=2", "parallel.data=3"}), 12);
  EXPECT_EQ(layout_world_size(path.string(), {"parallel.tensor=two"}), 0);  // load_config names the problem
  EXPECT_EQ(layout_world_size("/nonexistent/megatrain.yaml", {}), 0);
  std::filesystem::remove(path);
}

TEST(Config, RequiredKeys) {
  for (const std::string key : {"num_layers", "hidden_size", "num_heads", "seq_length", "vocab_size"}) {
    const std::string text = replace(kBase, "  " + key + ": ", "  # " + key + ": ");
    EXPECT_EQ(error_of(text), "t.yaml: model." + key + ": required key is missing");
  }
  EXPECT_CONTAINS(error_of(replace(kBase, "train_iters", "#train_iters")),
                  "training.train_iters: required key is missing");
  EXPECT_CONTAINS(error_of(replace(kBase, "lr: ", "#lr: ")), "optimizer.lr: required key is missing");
}

TEST(Config, ParallelDataAcceptsAutoOrAnInteger) {
  EXPECT_EQ(base({"parallel.data=auto"}, 4).parallel.data, 4);
  EXPECT_EQ(base({"parallel.data=4"}, 4).parallel.data, 4);
  EXPECT_EQ(base({"parallel.data=0"}, 2).parallel.data, 2);  // 0 is auto too
}

TEST(Config, DataTrainAcceptsAStringOrAList) {
  EXPECT_EQ(base({"data.train=corpus_text_document"}).data.train, std::vector<std::string>{"corpus_text_document"});
  EXPECT_EQ(base({"data.train=[a, b]", "data.valid=v"}).data.train, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(base({"data.valid=v"}).data.valid, std::vector<std::string>{"v"});
  const Config c = parse(kBase + "  train:\n    - /data/one\n    - /data/two\n");
  EXPECT_EQ(c.data.train, (std::vector<std::string>{"/data/one", "/data/two"}));
}

TEST(Config, LossScaleIsAMapping) {
  const Config c = parse(replace(kBase, "training:\n",
                                 "training:\n  precision: fp16\n  loss_scale: {initial: 65536, min: 2, window: 500, "
                                 "hysteresis: 3}\n"));
  EXPECT_EQ(c.training.loss_scale.initial, 65536.0);
  EXPECT_EQ(c.training.loss_scale.min, 2.0);
  EXPECT_EQ(c.training.loss_scale.window, 500);
  EXPECT_EQ(c.training.loss_scale.hysteresis, 3);
}

// The derived section is recomputed, never read; an edited value there is an error, not silently ignored
// (see ConfigDerived below).
TEST(Config, DerivedSectionIsCheckedNotRead) {
  EXPECT_CONTAINS(error_of(kBase + "derived:\n  head_dim: 999\n"), "derived.head_dim");
  EXPECT_CONTAINS(error_of(kBase + "derived:\n  anything: [1, 2]\n"), "derived.anything");
  EXPECT_EQ(parse(kBase + "derived:\n  head_dim: 8\n").model.head_dim, 8);
}

// ---------------------------------------------------------------------------------------------- overrides

TEST(ConfigOverride, Numbers) {
  const Config c = base({"model.num_layers=8", "optimizer.lr=3e-4", "model.dropout=0"});
  EXPECT_EQ(c.model.num_layers, 8);
  EXPECT_EQ(c.optimizer.lr, 3e-4);
  EXPECT_EQ(c.model.dropout, 0.0f);
}

TEST(ConfigOverride, Strings) {
  const Config c = base({"training.precision=bf16", "logging.dir=runs/x y", "checkpoint.load=/ckpt/iter_0000100"});
  EXPECT_EQ(c.training.precision, Precision::bf16);
  EXPECT_EQ(c.logging.dir, "runs/x y");
  EXPECT_EQ(c.checkpoint.load, "/ckpt/iter_0000100");
  EXPECT_EQ(base({"checkpoint.save_dir="}).checkpoint.save_dir, "");
}

TEST(ConfigOverride, Lists) {
  const Config c = base({"data.train=[a,b]", "optimizer.betas=[0.9,0.95]", "data.split=[1, 0, 0]"});
  EXPECT_EQ(c.data.train, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(c.optimizer.betas, (std::vector<double>{0.9, 0.95}));
  EXPECT_EQ(c.data.split, (std::vector<double>{1, 0, 0}));
  EXPECT_TRUE(base({"parallel.layers_per_stage=[]"}).parallel.layers_per_stage.empty());
}

TEST(ConfigOverride, Booleans) {
  const Config c = base({"model.tie_embeddings=false", "parallel.distributed_optimizer=true"});
  EXPECT_FALSE(c.model.tie_embeddings);
  EXPECT_TRUE(c.parallel.distributed_optimizer);
}

TEST(ConfigOverride, NestedKeysAndWholeSections) {
  EXPECT_EQ(base({"training.loss_scale.window=10"}).training.loss_scale.window, 10);
  const Config c = base({"training.loss_scale={initial: 1024, min: 4}"});
  EXPECT_EQ(c.training.loss_scale.initial, 1024.0);
  EXPECT_EQ(c.training.loss_scale.min, 4.0);
  EXPECT_EQ(c.training.loss_scale.window, 1000);
  EXPECT_EQ(base({"checkpoint={save_dir: out, keep_last: 2}"}).checkpoint.keep_last, 2);
}

TEST(ConfigOverride, CreatesAbsentKeysAndSectionsAndLaterOnesWin) {
  const Config c = base({"logging.interval=3", "logging.interval=5", "parallel.tensor=2"}, 2);
  EXPECT_EQ(c.logging.interval, 5);
  EXPECT_EQ(c.parallel.tensor, 2);
  const Config d = parse(replace(kBase, "data:\n  synthetic: true\n", "data:\n"), {"data.synthetic=true"});
  EXPECT_TRUE(d.data.synthetic);
}

TEST(ConfigOverride, UnknownKeyNamesTheOverride) {
  EXPECT_EQ(base_error({"model.hiden_size=8"}),
            "t.yaml: --set model.hiden_size=8: unknown key (did you mean model.hidden_size?)");
  EXPECT_EQ(base_error({"modle.num_layers=4"}),
            "t.yaml: --set modle.num_layers=4: modle: unknown key (did you mean model?)");
  EXPECT_EQ(base_error({"training.loss_scale={initl: 1}"}),
            "t.yaml: --set training.loss_scale={initl: 1}: training.loss_scale.initl: unknown key (did you mean "
            "training.loss_scale.initial?)");
}

TEST(ConfigOverride, WrongTypeAndRuleErrorsNameTheOverride) {
  EXPECT_EQ(base_error({"model.hidden_size=abc"}),
            "t.yaml: --set model.hidden_size=abc: model.hidden_size: expected an integer, got 'abc'");
  EXPECT_EQ(base_error({"parallel.tensor=3"}, 3),
            "t.yaml: --set parallel.tensor=3: parallel.tensor: 3 does not divide model.num_heads=8");
}

TEST(ConfigOverride, MalformedOverridesAreConfigErrors) {
  EXPECT_CONTAINS(base_error({"model.num_layers"}), "--set model.num_layers: expected key.path=value");
  EXPECT_CONTAINS(base_error({"=4"}), "--set =4: empty key");
  EXPECT_CONTAINS(base_error({"model..num_layers=4"}), "--set model..num_layers=4: empty key");
  EXPECT_CONTAINS(base_error({"model.num_layers.=4"}), "empty key");
  EXPECT_CONTAINS(base_error({"data.train=[a"}), "--set data.train=[a: the value is not valid YAML");
  EXPECT_CONTAINS(base_error({"model.num_layers.deeper=4"}),
                  "--set model.num_layers.deeper=4: model.num_layers is '4', not a section");
}

TEST(ConfigOverride, ValueMaySpanEqualsSigns) { EXPECT_EQ(base({"logging.dir=runs/a=b"}).logging.dir, "runs/a=b"); }

// ---------------------------------------------------------------------------------------------- rules

TEST(ConfigRules, SizesArePositive) {
  EXPECT_CONTAINS(base_error({"model.num_layers=0"}), "model.num_layers: must be positive, got 0");
  EXPECT_CONTAINS(base_error({"model.hidden_size=-64"}), "model.hidden_size: must be positive, got -64");
  EXPECT_CONTAINS(base_error({"model.seq_length=0"}), "model.seq_length: must be positive");
  EXPECT_CONTAINS(base_error({"model.vocab_size=0"}), "model.vocab_size: must be positive");
  EXPECT_CONTAINS(base_error({"model.ffn_hidden_size=-1"}), "model.ffn_hidden_size: must be positive");
  EXPECT_CONTAINS(base_error({"parallel.pipeline=0"}), "parallel.pipeline: must be positive");
  EXPECT_CONTAINS(base_error({"training.micro_batch_size=0"}), "training.micro_batch_size: must be positive");
  EXPECT_CONTAINS(base_error({"training.train_iters=0"}), "training.train_iters: must be positive");
  EXPECT_CONTAINS(base_error({"optimizer.lr=0"}), "optimizer.lr: must be positive, got 0");
  EXPECT_CONTAINS(base_error({"model.layernorm_eps=0"}), "model.layernorm_eps: must be positive");
}

TEST(ConfigRules, NumHeadsDividesHiddenSize) {
  EXPECT_CONTAINS(base_error({"model.num_heads=6"}), "model.num_heads: 6 does not divide model.hidden_size=64");
}

TEST(ConfigRules, TensorDividesNumHeads) {
  EXPECT_EQ(error_of(kBase + "parallel:\n  tensor: 3\n", {}, 3),
            "t.yaml:14:11: parallel.tensor: 3 does not divide model.num_heads=8");
  EXPECT_CONTAINS(base_error({"model.ffn_hidden_size=100", "parallel.tensor=8"}, 8),
                  "parallel.tensor: 8 does not divide model.ffn_hidden_size=100");
}

TEST(ConfigRules, ParallelSizesMultiplyToTheWorldSize) {
  EXPECT_CONTAINS(base_error({"parallel.tensor=2", "parallel.data=2"}, 8),
                  "parallel.data: parallel.tensor*pipeline*data = 2*1*2 = 4 does not match the world size 8");
  EXPECT_CONTAINS(base_error({"parallel.tensor=2", "parallel.pipeline=2"}, 6),
                  "parallel.data: auto needs the world size 6 divisible by parallel.tensor*pipeline = 2*2 = 4");
  EXPECT_CONTAINS(base_error({}, 0), "the world size must be positive, got 0");
  EXPECT_EQ(base({"parallel.tensor=2", "parallel.pipeline=2", "parallel.data=2"}, 8).parallel.world_size, 8);
}

TEST(ConfigRules, PipelineAtMostNumLayers) {
  EXPECT_CONTAINS(base_error({"parallel.pipeline=8"}, 8), "parallel.pipeline: 8 is more than model.num_layers=4");
}

TEST(ConfigRules, EvenSplitNeedsNumLayersDivisibleByStages) {
  EXPECT_CONTAINS(base_error({"model.num_layers=5", "parallel.pipeline=2"}, 2),
                  "model.num_layers: 5 is not divisible by parallel.pipeline*virtual_pipeline = 2*1 = 2");
  EXPECT_EQ(base({"model.num_layers=5", "parallel.pipeline=2", "parallel.layers_per_stage=[3, 2]"}, 2)
                .parallel.layers_per_stage,
            (std::vector<int64_t>{3, 2}));
}

TEST(ConfigRules, LayersPerStageCountAndSum) {
  EXPECT_CONTAINS(base_error({"parallel.pipeline=2", "parallel.layers_per_stage=[4]"}, 2),
                  "parallel.layers_per_stage: has 1 entries, expected parallel.pipeline*virtual_pipeline = "
                  "2*1 = 2");
  EXPECT_CONTAINS(base_error({"parallel.pipeline=2", "parallel.layers_per_stage=[3, 3]"}, 2),
                  "parallel.layers_per_stage: [3, 3] sums to 6, expected model.num_layers=4");
  EXPECT_CONTAINS(base_error({"parallel.pipeline=2", "parallel.layers_per_stage=[5, -1]"}, 2),
                  "parallel.layers_per_stage[1]: must be >= 0, got -1");
  EXPECT_EQ(base({"parallel.pipeline=2", "parallel.virtual_pipeline=2", "parallel.layers_per_stage=[1, 2, 1, 0]",
                  "training.global_batch_size=2"},
                 2)
                .parallel.virtual_pipeline,
            2);
}

TEST(ConfigRules, VirtualPipelineNeedsPipelineAndDivisibleLayers) {
  EXPECT_CONTAINS(base_error({"parallel.virtual_pipeline=2"}),
                  "parallel.virtual_pipeline: 2 needs parallel.pipeline > 1");
  EXPECT_CONTAINS(base_error({"parallel.virtual_pipeline=4", "parallel.pipeline=2"}, 2),
                  "model.num_layers: 4 is not divisible by parallel.pipeline*virtual_pipeline = 2*4 = 8");
  EXPECT_EQ(base({"parallel.virtual_pipeline=2", "parallel.pipeline=2", "training.global_batch_size=2"}, 2)
                .parallel.virtual_pipeline,
            2);
}

TEST(ConfigRules, InterleavedMicrobatchesAreAMultipleOfPipeline) {
  // Checked with the config (naming the keys), not by the schedule once every rank has started.
  EXPECT_CONTAINS(base_error({"parallel.virtual_pipeline=2", "parallel.pipeline=2", "training.micro_batch_size=2",
                              "training.global_batch_size=6"},
                             2),
                  "training.global_batch_size: 6 gives 3 microbatches (global_batch_size / (micro_batch_size * "
                  "data-parallel size) = 6/(2*1)), not a multiple of parallel.pipeline=2: the interleaved schedule "
                  "(parallel.virtual_pipeline=2)");
  EXPECT_EQ(base({"parallel.virtual_pipeline=2", "parallel.pipeline=2", "training.micro_batch_size=2",
                  "training.global_batch_size=8"},
                 2)
                .training.num_microbatches,
            4);
  // Plain 1F1B takes any number.
  EXPECT_EQ(base({"parallel.pipeline=2", "training.global_batch_size=3"}, 2).training.num_microbatches, 3);
}

TEST(ConfigRules, GlobalBatchDivisibleByMicroBatchTimesData) {
  EXPECT_CONTAINS(base_error({"training.global_batch_size=10", "training.micro_batch_size=2"}, 4),
                  "training.global_batch_size: 10 is not divisible by training.micro_batch_size*data-parallel "
                  "size = 2*4 = 8");
}

TEST(ConfigRules, Precision) {
  EXPECT_CONTAINS(base_error({"training.precision=fp8"}),
                  "training.precision: expected one of fp32, bf16, fp16, got 'fp8'");
  for (const char* p : {"fp32", "bf16", "fp16"})
    EXPECT_EQ(name_of(base({std::string("training.precision=") + p}).training.precision), p);
}

TEST(ConfigRules, Recompute) {
  EXPECT_CONTAINS(base_error({"training.recompute=some"}), "training.recompute: expected one of none, full, selective");
  EXPECT_EQ(base({"training.recompute=full"}).training.recompute, Recompute::full);
  // Selective: Megatron's default module, or the listed ones; each name checked.
  EXPECT_EQ(base({"training.recompute=selective"}).training.recompute_modules, std::vector<std::string>{"core_attn"});
  const Config c = base({"training.recompute=selective", "training.recompute_modules=[layernorm, mlp_act]"});
  EXPECT_EQ(c.training.recompute_modules, (std::vector<std::string>{"layernorm", "mlp_act"}));
  EXPECT_EQ(parse_config(to_yaml(c), c.source, {}, 1), c);
  EXPECT_CONTAINS(
      base_error({"training.recompute_modules=[mlp_act]"}),
      "training.recompute_modules: is set, but training.recompute is none: set training.recompute: selective");
  EXPECT_CONTAINS(base_error({"training.recompute=selective", "training.recompute_modules=[mlp]"}),
                  "training.recompute_modules[0]: expected one of core_attn, layernorm, mlp_act, moe_act, got 'mlp'");
  EXPECT_CONTAINS(base_error({"training.recompute=selective", "training.recompute_modules=[moe_act]"}),
                  "training.recompute_modules[0]: moe_act needs mixture-of-experts layers");
  EXPECT_CONTAINS(base_error({"training.recompute=selective", "training.recompute_modules=[core_attn, core_attn]"}),
                  "training.recompute_modules[1]: core_attn is listed twice");
  EXPECT_EQ(base({"training.recompute=full", "training.recompute_num_layers=1"}).training.recompute_num_layers, 1);
  EXPECT_CONTAINS(base_error({"training.recompute_num_layers=-1"}), "training.recompute_num_layers: must be >= 0");
  // More layers than the model has is refused, without overflow at the largest int64.
  EXPECT_EQ(base({"training.recompute=full", "training.recompute_num_layers=4"}).training.recompute_num_layers, 4);
  for (const char* n : {"5", "1000000000000", "9223372036854775807"})
    EXPECT_CONTAINS(base_error({"training.recompute=full", std::string("training.recompute_num_layers=") + n}),
                    fmt::format("training.recompute_num_layers: {} is more than model.num_layers=4", n));
  EXPECT_CONTAINS(base_error({"training.recompute=full", "training.recompute_num_layers=1e12"}),
                  "training.recompute_num_layers: expected an integer, got '1e12'");
  EXPECT_CONTAINS(base_error({"training.recompute=full", "training.recompute_method=every"}),
                  "training.recompute_method: expected one of block, uniform, got 'every'");
  // Uniform: groups of recompute_num_layers layers, any size from 1 to the model's layers (a chunk's last group
  // may be smaller); it needs full recomputation and a group size.
  for (const char* n : {"1", "3", "4"})
    EXPECT_EQ(base({"training.recompute=full", "training.recompute_method=uniform",
                    std::string("training.recompute_num_layers=") + n})
                  .training.recompute_method,
              "uniform");
  EXPECT_CONTAINS(base_error({"training.recompute=full", "training.recompute_method=uniform"}),
                  "training.recompute_num_layers: 0 with training.recompute_method: uniform: set the layers of each "
                  "recomputed group (>= 1");
  EXPECT_CONTAINS(base_error({"training.recompute=selective", "training.recompute_method=uniform"}),
                  "training.recompute_method: uniform is set, but training.recompute is selective");
  EXPECT_CONTAINS(
      base_error({"training.recompute=full", "training.recompute_method=uniform", "training.recompute_num_layers=5"}),
      "training.recompute_num_layers: 5 is more than model.num_layers=4");
}

TEST(ConfigRules, Device) {
#if defined(MEGATRAIN_WITH_CUDA)
  EXPECT_EQ(base({"training.device=cuda"}).training.device,
            DeviceChoice::cuda);  // whether a GPU is present is checked at start
#else
  EXPECT_CONTAINS(base_error({"training.device=cuda"}), "training.device: cuda: this megatrain was built without");
#endif
  EXPECT_EQ(base({"training.device=cpu"}).training.device, DeviceChoice::cpu);
  EXPECT_CONTAINS(base_error({"training.device=tpu"}), "training.device: expected one of auto, cuda, cpu, got 'tpu'");
  EXPECT_CONTAINS(base_error({"parallel.backend=mpi"}),
                  "parallel.backend: expected one of auto, nccl, gloo, got 'mpi'");
  EXPECT_CONTAINS(base_error({"training.device=cpu", "parallel.backend=nccl"}),
                  "parallel.backend: nccl needs training.device: cuda");
}

TEST(ConfigRules, Decay) {
  EXPECT_CONTAINS(base_error({"optimizer.decay=exp"}),
                  "optimizer.decay: expected one of cosine, linear, constant, wsd, inverse_square_root, got 'exp'");
  EXPECT_EQ(base({"optimizer.decay=linear"}).optimizer.decay, LrDecay::linear);
  EXPECT_EQ(base({"optimizer.decay=inverse_square_root"}).optimizer.decay, LrDecay::inverse_square_root);
}

TEST(ConfigRules, WarmupStableDecayFractionAndStyle) {
  const Config c = base({"optimizer.decay=wsd"});
  EXPECT_EQ(c.optimizer.decay, LrDecay::wsd);
  EXPECT_EQ(c.optimizer.wsd_decay_fraction, 0.2);  // defaults
  EXPECT_EQ(c.optimizer.wsd_decay_style, WsdShape::exponential);
  EXPECT_EQ(base({"optimizer.decay=wsd", "optimizer.wsd_decay_style=1-sqrt"}).optimizer.wsd_decay_style,
            WsdShape::one_minus_sqrt);
  EXPECT_CONTAINS(base_error({"optimizer.wsd_decay_style=sqrt"}),
                  "optimizer.wsd_decay_style: expected one of linear, cosine, exponential, 1-sqrt, got 'sqrt'");
  EXPECT_CONTAINS(base_error({"optimizer.wsd_decay_fraction=0"}),
                  "optimizer.wsd_decay_fraction: must be in (0, 1], got 0");
  EXPECT_CONTAINS(base_error({"optimizer.wsd_decay_fraction=1.5"}),
                  "optimizer.wsd_decay_fraction: must be in (0, 1], got 1.5");
  // 0.5 of 100 steps anneal, but only 40 are left after a warmup of 60.
  EXPECT_CONTAINS(base_error({"optimizer.decay=wsd", "optimizer.warmup_iters=60", "optimizer.wsd_decay_fraction=0.5"}),
                  "optimizer.wsd_decay_fraction: 0.5 of optimizer.decay_iters=100 is 50 anneal steps, more than the "
                  "40 left after optimizer.warmup_iters=60");
  EXPECT_EQ(base({"optimizer.decay=wsd", "optimizer.warmup_iters=50", "optimizer.wsd_decay_fraction=0.5"})
                .optimizer.wsd_decay_fraction,
            0.5);
  // Other decays ignore the fraction's relation to the warmup.
  EXPECT_EQ(base({"optimizer.warmup_iters=60", "optimizer.wsd_decay_fraction=0.5"}).optimizer.warmup_iters, 60);
}

TEST(ConfigRules, MinLrBetweenZeroAndLr) {
  EXPECT_CONTAINS(base_error({"optimizer.min_lr=0.01"}), "optimizer.min_lr: must be in [0, optimizer.lr=0.001]");
  EXPECT_CONTAINS(base_error({"optimizer.min_lr=-1e-5"}), "optimizer.min_lr: must be in [0");
  EXPECT_EQ(base({"optimizer.min_lr=1e-3"}).optimizer.min_lr, 1e-3);
}

TEST(ConfigRules, DropoutInZeroToOne) {
  EXPECT_CONTAINS(base_error({"model.dropout=1"}), "model.dropout: must be in [0, 1), got 1");
  EXPECT_CONTAINS(base_error({"model.attention_dropout=-0.1"}), "model.attention_dropout: must be in [0, 1)");
  EXPECT_FLOAT_EQ(base({"model.dropout=0.99"}).model.dropout, 0.99f);
}

TEST(ConfigRules, BetasInZeroToOne) {
  EXPECT_CONTAINS(base_error({"optimizer.betas=[0.9, 1.0]"}), "optimizer.betas[1]: must be in [0, 1), got 1");
}

TEST(ConfigRules, WarmupWithinDecayIters) {
  // decay_iters was never set: the message says where its value came from.
  EXPECT_CONTAINS(base_error({"optimizer.warmup_iters=101"}),
                  "optimizer.warmup_iters: 101 is more than optimizer.decay_iters=100 (unset, so it defaulted to "
                  "training.train_iters=100): lower optimizer.warmup_iters, raise training.train_iters or set "
                  "optimizer.decay_iters");
  EXPECT_CONTAINS(base_error({"optimizer.warmup_iters=20", "optimizer.decay_iters=10"}),
                  "optimizer.warmup_iters: 20 is more than optimizer.decay_iters=10");
  EXPECT_EQ(base({"optimizer.warmup_iters=100"}).optimizer.warmup_iters, 100);
}

TEST(ConfigRules, LossScaleValuesAreSane) {
  EXPECT_CONTAINS(base_error({"training.loss_scale.initial=0.5"}),
                  "training.loss_scale.initial: 0.5 is less than training.loss_scale.min=1");
  EXPECT_CONTAINS(base_error({"training.loss_scale.min=0"}), "training.loss_scale.min: must be positive");
  EXPECT_CONTAINS(base_error({"training.loss_scale.window=0"}), "training.loss_scale.window: must be positive");
  EXPECT_CONTAINS(base_error({"training.loss_scale.hysteresis=0"}), "training.loss_scale.hysteresis: must be positive");
}

TEST(ConfigRules, MaxPositionEmbeddingsCoverSeqLength) {
  EXPECT_CONTAINS(base_error({"model.max_position_embeddings=16"}),
                  "model.max_position_embeddings: 16 is less than model.seq_length=32");
}

TEST(ConfigRules, SequenceParallelNeedsTensorParallelism) {
  EXPECT_CONTAINS(base_error({"parallel.sequence_parallel=true"}),
                  "parallel.sequence_parallel: needs parallel.tensor > 1");
  EXPECT_CONTAINS(base_error({"parallel.sequence_parallel=true", "parallel.tensor=8", "model.seq_length=36"}, 8),
                  "parallel.sequence_parallel: needs model.seq_length=36 divisible by parallel.tensor=8");
  EXPECT_TRUE(base({"parallel.sequence_parallel=true", "parallel.tensor=2"}, 2).parallel.sequence_parallel);
}

TEST(ConfigRules, HybridShardingComposesWithContextAndExpertParallelism) {
  // A shard group is N data ranks with all their context ranks.
  EXPECT_EQ(base({"parallel.shard=optimizer", "parallel.shard_group=1", "parallel.context=2", "model.dropout=0",
                  "model.attention_dropout=0"},
                 4)
                .parallel.shard_group,
            1);
  // The experts shard over the expert-data-parallel ranks inside one shard group: EP 2 x DP 8 in groups of 4 holds
  // two expert-data ranks a group (of four); EP 4 x DP 4 in groups of 2: an expert group spans two shard groups, so
  // each expert-data rank is its own group (of one).
  const auto moe = [](int64_t dp, int64_t ep, int64_t group) {
    return base({"parallel.shard=optimizer", "model.moe.num_experts=4", fmt::format("parallel.expert={}", ep),
                 fmt::format("parallel.shard_group={}", group)},
                dp)
        .parallel;
  };
  EXPECT_EQ(moe(8, 2, 4).expert_shard_size(), 2);
  EXPECT_EQ(moe(8, 2, 4).expert_data(), 4);
  EXPECT_EQ(moe(4, 4, 2).expert_shard_size(), 1);
  EXPECT_EQ(moe(4, 2, 4).expert_shard_size(), moe(4, 2, 4).expert_data());  // the whole group: plain sharding
  EXPECT_CONTAINS(
      base_error({"parallel.shard=optimizer", "model.moe.num_experts=4", "parallel.expert=2", "parallel.shard_group=3"},
                 6),
      "parallel.shard_group: 3 makes shard groups of parallel.tensor x shard_group x context = 3 ranks");
}

TEST(ConfigRules, ShardParametersComposesWithEveryFeature) {
  const Config ok = base({"parallel.shard=parameters", "parallel.data=2"}, 2);
  EXPECT_EQ(ok.parallel.shard, ShardStage::parameters);
  // MoE composes: the experts are gathered over their own expert-data-parallel ranks.
  EXPECT_EQ(base({"parallel.shard=parameters", "parallel.data=2", "parallel.expert=2", "model.moe.num_experts=2"}, 2)
                .parallel.expert,
            2);
  // fp8 composes (a unit's weight casts are dropped with its weights), and so do the zero-bubble schedules (a
  // deferred W reads activations and output gradients, never the released weights).
  EXPECT_EQ(
      base({"parallel.shard=parameters", "parallel.data=2", "training.precision=bf16", "training.fp8.format=e4m3"}, 2)
          .training.fp8.format,
      Fp8Format::e4m3);
  EXPECT_EQ(base({"parallel.shard=parameters", "parallel.pipeline=2", "parallel.data=2",
                  "parallel.pipeline_schedule=zb-h1", "training.global_batch_size=8"},
                 4)
                .parallel.pipeline_schedule,
            PipelineSchedule::zb_h1);
  // Context parallelism composes: the context ranks hold the data-parallel ranks' weights, sharded over both.
  EXPECT_EQ(base({"parallel.shard=parameters", "parallel.context=2", "model.dropout=0", "model.attention_dropout=0"}, 2)
                .parallel.context,
            2);
  // The alias names both keys against this stage too.
  EXPECT_CONTAINS(base_error({"parallel.shard=parameters", "parallel.distributed_optimizer=true"}),
                  "conflicts with parallel.shard: parameters");
}

TEST(ConfigRules, ContextParallelSplitsTheSequence) {
  const std::vector<std::string> nodrop{"model.dropout=0", "model.attention_dropout=0"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.end(), nodrop.begin(), nodrop.end());
    return more;
  };
  // 32 tokens are not 2 x 3 chunks.
  EXPECT_CONTAINS(base_error(with({"parallel.context=3"}), 3),
                  "parallel.context: 3 needs model.seq_length=32 divisible by 2 x parallel.context = 6");
  // Sequence parallelism then splits each context rank's 36 / 2 = 18 tokens: not by 4.
  EXPECT_CONTAINS(base_error(with({"parallel.context=2", "parallel.tensor=4", "parallel.sequence_parallel=true",
                                   "model.seq_length=36", "model.num_heads=4"}),
                             8),
                  "parallel.sequence_parallel: needs each context rank's model.seq_length / parallel.context = 36 / 2 "
                  "= 18 tokens divisible by parallel.tensor=4");
  EXPECT_CONTAINS(base_error(with({"parallel.context=2", "model.moe.num_experts=4", "parallel.expert=4"}), 2),
                  "parallel.expert: 4 does not divide parallel.data x parallel.context = 1 x 2 = 2");
  EXPECT_CONTAINS(base_error(with({"parallel.context=2", "parallel.tensor=2", "model.moe.num_experts=8",
                                   "parallel.expert=8", "parallel.expert_tensor=1"}),
                             4),
                  "parallel.expert*expert_tensor = 8*1 = 8 does not divide parallel.tensor*context*data = 2*2*1 = 4");
  EXPECT_CONTAINS(base_error(with({"parallel.context=0"})), "parallel.context: must be positive");
  EXPECT_CONTAINS(base_error(with({"parallel.context=2", "parallel.data=2"}), 2),
                  "parallel.data: parallel.tensor*context*pipeline*data = 1*2*1*2 = 4 does not match the world size 2");
  EXPECT_CONTAINS(base_error(with({"parallel.context_comm=ring"})), "parallel.context_comm");
  // A MoE capacity factor: the drops are decided over the whole microbatch (models/moe_mlp.h), so CP takes it.
  EXPECT_EQ(base(with({"parallel.context=2", "model.moe.num_experts=2", "model.moe.capacity_factor=1.5"}), 2)
                .model.moe.capacity_factor,
            1.5);
  // Dropout (hidden, attention, LoRA's) is keyed by the chunks' global positions: context parallelism takes it.
  const Config dropped = base({"parallel.context=2", "model.dropout=0.1", "model.attention_dropout=0.1",
                               "finetune.lora.rank=4", "finetune.lora.dropout=0.1"},
                              2);
  EXPECT_EQ(dropped.parallel.context, 2);
  EXPECT_FLOAT_EQ(dropped.model.attention_dropout, 0.1f);
  const Config c = base(with({"parallel.context=2", "parallel.context_comm=allgather"}), 8);
  EXPECT_EQ(c.parallel.data, 4);  // auto: the world over tensor x context x pipeline
  EXPECT_EQ(c.parallel.data_context(), 8);
  EXPECT_EQ(c.parallel.context_comm, ContextComm::allgather);
  EXPECT_EQ(base().parallel.context_comm, ContextComm::p2p);
}

TEST(ConfigRules, TrainDataRequiredUnlessSynthetic) {
  EXPECT_CONTAINS(base_error({"data.synthetic=false"}), "data.train: needs at least one dataset prefix");
  EXPECT_CONTAINS(base_error({"data.train=[a, '']"}), "data.train[1]: is an empty path");
  // Weights of 1e308 each were reported as weight 0 (issue 30, item 12): their sum overflows, and the key says so.
  EXPECT_CONTAINS(base_error({"data.train=[1e308, a, 1e308, b]"}),
                  "data.train: the blend weights sum to inf (beyond the largest double, 1.79769e+308); they are "
                  "relative, so scale them down");
  EXPECT_EQ(base({"data.train=[1e307, a, 1e307, b]"}).data.train.size(), 4u);
  EXPECT_EQ(base({"data.synthetic=false", "data.train=corpus"}).data.train.size(), 1u);
}

TEST(ConfigRules, SplitIsThreeNonNegativeNumbersWithPositiveSum) {
  EXPECT_CONTAINS(base_error({"data.split=[1, 2]"}), "data.split: expected a list of 3 numbers, got 2 entries");
  EXPECT_CONTAINS(base_error({"data.split=[1, -1, 0]"}), "data.split[1]: must be >= 0, got -1");
  EXPECT_CONTAINS(base_error({"data.split=[0, 0, 0]"}), "data.split: [0, 0, 0] must have a positive sum");
}

TEST(ConfigRules, CheckpointLoadIsAutoNoneOrAPath) {
  for (const char* v : {"auto", "none", "runs/x/checkpoints/iter_0000010"})
    EXPECT_EQ(base({std::string("checkpoint.load=") + v}).checkpoint.load, v);
  EXPECT_CONTAINS(base_error({"checkpoint.load="}), "checkpoint.load: expected auto, none or a checkpoint path");
  EXPECT_CONTAINS(base_error({"checkpoint.keep_last=-1"}), "checkpoint.keep_last: must be >= 0");
  EXPECT_CONTAINS(base_error({"checkpoint.save_interval=-1"}), "checkpoint.save_interval: must be >= 0");
}

TEST(ConfigRules, LoggingIntervals) {
  EXPECT_CONTAINS(base_error({"logging.interval=0"}), "logging.interval: must be positive, got 0");
  EXPECT_CONTAINS(base_error({"logging.eval_interval=-1"}), "logging.eval_interval: must be >= 0, got -1");
  EXPECT_CONTAINS(base_error({"logging.eval_interval=5", "logging.eval_iters=0"}),
                  "logging.eval_iters: must be positive when logging.eval_interval=5");
  EXPECT_CONTAINS(base_error({"logging.level=loud"}), "logging.level: expected one of trace, debug, info");
  EXPECT_EQ(base({"logging.eval_interval=0"}).logging.eval_interval, 0);
}

TEST(ConfigRules, ArchAndOptimizerType) {
  EXPECT_CONTAINS(base_error({"model.arch=bert"}), "model.arch: expected one of gpt, llama, got 'bert'");
  EXPECT_CONTAINS(base_error({"optimizer.type=sgd"}), "optimizer.type: expected one of adamw, got 'sgd'");
}

TEST(ConfigRules, LlamaDefaults) {
  const Config g = base();
  EXPECT_EQ(g.model.kv_heads(), 8);  // GPT: one key/value head per query head
  EXPECT_TRUE(g.model.tie_embeddings);
  EXPECT_EQ(g.model.ffn_hidden_size, 256);
  const Config l = base({"model.arch=llama"});
  EXPECT_EQ(l.model.kv_heads(), 8);
  EXPECT_FALSE(l.model.tie_embeddings);     // untied unless the file says so
  EXPECT_EQ(l.model.ffn_hidden_size, 128);  // Megatron's SwiGLU default: 8 * 64 / 3 = 170, down to 64s
  EXPECT_EQ(l.model.rotary_base, 10000);
  EXPECT_TRUE(base({"model.arch=llama", "model.tie_embeddings=true"}).model.tie_embeddings);
  const Config gqa = base({"model.arch=llama", "model.num_query_groups=2", "model.rotary_base=500000"});
  EXPECT_EQ(gqa.model.num_query_groups, 2);
  EXPECT_EQ(gqa.model.rotary_base, 500000);
  EXPECT_EQ(base({"model.arch=llama", "model.num_query_groups=1"}).model.num_query_groups, 1);  // MQA
}

TEST(ConfigRules, GroupedQueryAttention) {
  EXPECT_CONTAINS(base_error({"model.num_query_groups=2"}),
                  "model.num_query_groups: grouped-query attention (2 groups for 8 heads) needs model.arch: llama");
  EXPECT_CONTAINS(base_error({"model.arch=llama", "model.num_query_groups=3"}),
                  "model.num_query_groups: 3 does not divide model.num_heads=8");
  EXPECT_CONTAINS(base_error({"model.arch=llama", "model.num_query_groups=-1"}), "model.num_query_groups: must be");
  // Tensor parallelism splits the key/value heads: 2 groups cannot go over 4 ranks.
  EXPECT_CONTAINS(base_error({"model.arch=llama", "model.num_query_groups=2", "parallel.tensor=4"}, 4),
                  "parallel.tensor: 4 does not divide model.num_query_groups=2");
  EXPECT_EQ(base({"model.arch=llama", "model.num_query_groups=2", "parallel.tensor=2"}, 2).parallel.tensor, 2);
  EXPECT_CONTAINS(base_error({"model.arch=llama", "model.rotary_base=0"}), "model.rotary_base: must be positive");
  // 1e39 passed and became inf in the float the rotary embeddings compute in (issue 30, item 12).
  EXPECT_CONTAINS(base_error({"model.arch=llama", "model.rotary_base=1e39"}),
                  "model.rotary_base: 1e+39 is more than the largest supported 3.4028234663852886e+38 (float: the "
                  "rotary embeddings compute in it)");
  // Rotary embeddings rotate pairs of the head dimension.
  EXPECT_CONTAINS(base_error({"model.arch=llama", "model.hidden_size=24"}), "head dimension");
}

// model.head_dim: auto is hidden_size / num_heads; a llama may set another width (Qwen3's), which frees num_heads
// from dividing hidden_size and counts in the parameters; gpt's heads split the hidden size. model.qk_norm is
// llama's and adds two (head_dim) weights a layer.
TEST(ConfigRules, HeadDimAndQkNorm) {
  EXPECT_EQ(base({"model.arch=llama"}).model.head_dim, 8);  // 64 / 8
  const Config q = base({"model.arch=llama", "model.head_dim=16", "model.hidden_size=72", "model.qk_norm=true"});
  EXPECT_EQ(q.model.head_dim, 16);
  EXPECT_TRUE(q.model.qk_norm);
  EXPECT_EQ(parse_config(to_yaml(q), "again.yaml", {}, 1).model, q.model);
  Config wide = q;
  wide.model.head_dim = 9;  // the parameters grow with the heads' width: Q, K, V and proj, and the QK-norms
  EXPECT_LT(estimated_parameters(wide.model), estimated_parameters(q.model));
  Config plain = q;
  plain.model.qk_norm = false;
  EXPECT_EQ(estimated_parameters(q.model) - estimated_parameters(plain.model), double(q.model.num_layers) * 2 * 16);
  EXPECT_CONTAINS(base_error({"model.arch=llama", "model.hidden_size=68"}), "model.num_heads: 8 does not divide");
  EXPECT_CONTAINS(base_error({"model.arch=llama", "model.head_dim=0"}), "model.head_dim");
  EXPECT_CONTAINS(base_error({"model.arch=llama", "model.head_dim=7"}),
                  "model.head_dim: rotary embeddings rotate pairs: the head dimension 7 must be even");
  EXPECT_CONTAINS(base_error({"model.head_dim=16"}), "model.head_dim: 16 with model.arch: gpt");
  EXPECT_EQ(base({"model.head_dim=8"}).model.head_dim, 8);  // gpt's own quotient is accepted
  EXPECT_CONTAINS(base_error({"model.qk_norm=true"}), "model.qk_norm: true with model.arch: gpt");
}

// model.sliding_window: a window of W tokens (0: none), past model.full_attention_layers layers (inert without a
// window, at most num_layers); written back as read.
TEST(ConfigRules, SlidingWindow) {
  const Config w = base({"model.arch=llama", "model.sliding_window=5", "model.full_attention_layers=1"});
  EXPECT_EQ(w.model.sliding_window, 5);
  EXPECT_EQ(w.model.window_of(0), 0);
  EXPECT_EQ(w.model.window_of(1), 5);
  EXPECT_EQ(parse_config(to_yaml(w), "again.yaml", {}, 1).model, w.model);
  EXPECT_EQ(base({"model.sliding_window=3"}).model.window_of(0), 3);  // gpt's attention takes a window too
  EXPECT_CONTAINS(base_error({"model.sliding_window=-1"}), "model.sliding_window");
  EXPECT_CONTAINS(base_error({"model.full_attention_layers=1"}),
                  "model.full_attention_layers: is set, but model.sliding_window is 0");
  EXPECT_CONTAINS(base_error({"model.sliding_window=4", "model.full_attention_layers=99"}),
                  "model.full_attention_layers: 99 is more than model.num_layers");
}

// model.rope_scaling: each type reads its own keys; a key of another type, a gpt model, a type's missing or bad
// parameter and a type not implemented are refused by name.
TEST(ConfigRules, RopeScaling) {
  const Config l3 = base({"model.arch=llama", "model.rope_scaling.type=llama3", "model.rope_scaling.factor=8",
                          "model.rope_scaling.original_max_position_embeddings=8192"});
  EXPECT_EQ(l3.model.rope_scaling, (RopeScaling{.type = RopeScalingType::llama3,
                                                .factor = 8,
                                                .low_freq_factor = 1,
                                                .high_freq_factor = 4,
                                                .original_max_position_embeddings = 8192}));
  EXPECT_FALSE(base({"model.arch=llama"}).model.rope_scaling.enabled());
  EXPECT_CONTAINS(base_error({"model.arch=llama", "model.rope_scaling.factor=8"}),
                  "model.rope_scaling.type is none (plain rotary embeddings)");
  EXPECT_CONTAINS(
      base_error({"model.arch=llama", "model.rope_scaling.type=yarn", "model.rope_scaling.factor=4",
                  "model.rope_scaling.original_max_position_embeddings=64", "model.rope_scaling.low_freq_factor=2"}),
      "model.rope_scaling.type is not llama3");
  EXPECT_CONTAINS(base_error({"model.arch=llama", "model.rope_scaling.type=linear", "model.rope_scaling.beta_fast=8"}),
                  "model.rope_scaling.type is not yarn");
  EXPECT_CONTAINS(base_error({"model.rope_scaling.type=linear", "model.rope_scaling.factor=2"}),
                  "model.rope_scaling.type: linear with model.arch: gpt");
  EXPECT_CONTAINS(base_error({"model.arch=llama", "model.rope_scaling.type=linear", "model.rope_scaling.factor=-2"}),
                  "model.rope_scaling: rope scaling linear: factor -2 must be positive");
  EXPECT_CONTAINS(base_error({"model.arch=llama", "model.rope_scaling.type=dynamic"}),
                  "dynamic is not implemented yet");
  // Written out and read back, a scaled model is the same.
  const Config again = parse_config(to_yaml(l3), "again.yaml", {}, 1);
  EXPECT_EQ(again.model.rope_scaling, l3.model.rope_scaling);
}

// A 0 that silently meant the default hid a forgotten value (issue 30, item 8): the default is the key left out,
// or auto, and a 0 is refused naming the key, the value and the rule.
TEST(ConfigRules, ZeroIsNotTheDefaultOfTheWidths) {
  EXPECT_EQ(base_error({"model.arch=llama", "model.num_query_groups=0"}),
            "t.yaml: --set model.num_query_groups=0: model.num_query_groups: 0 is not a valid value: leave the key "
            "out (or write auto) for the default (num_heads)");
  EXPECT_EQ(error_of(replace(kBase, "  num_heads: 8\n", "  num_heads: 8\n  ffn_hidden_size: 0\n")),
            "t.yaml:5:20: model.ffn_hidden_size: 0 is not a valid value: leave the key out (or write auto) for the "
            "default (4 * hidden_size for gpt, Megatron's SwiGLU width 8 * hidden_size / 3 rounded down to 64 for "
            "llama)");
  // auto, or the key left out, is the default.
  EXPECT_EQ(base({"model.ffn_hidden_size=auto"}).model.ffn_hidden_size, 256);
  EXPECT_EQ(base({"model.arch=llama", "model.ffn_hidden_size=auto"}).model.ffn_hidden_size, 128);
  const Config l = base({"model.arch=llama", "model.num_query_groups=auto"});
  EXPECT_EQ(l.model.kv_heads(), 8);
  // Written back as auto, which follows a later change of num_heads, and read back as written.
  EXPECT_CONTAINS(to_yaml(l), "  num_query_groups: auto\n");
  EXPECT_EQ(parse_config(to_yaml(l), l.source, {}, 1), l);
  EXPECT_EQ(parse_config(to_yaml(l), l.source, {"model.num_heads=4"}, 1).model.kv_heads(), 4);
}

TEST(ConfigRules, RuleErrorsPointAtTheKeyInTheFile) {
  EXPECT_EQ(error_of(replace(kBase, "  lr: 1.0e-3\n", "  lr: 1.0e-3\n  decay: stepwise\n")),
            "t.yaml:11:10: optimizer.decay: expected one of cosine, linear, constant, wsd, inverse_square_root, got "
            "'stepwise'");
}

// ---------------------------------------------------------------------------------------------- to_yaml

TEST(ConfigYaml, HasEverySectionAndTheDerivedValues) {
  const std::string y = to_yaml(base({"parallel.tensor=2"}, 4));
  for (const char* s :
       {"model:\n", "parallel:\n", "training:\n", "  loss_scale:\n", "optimizer:\n", "data:\n", "checkpoint:\n",
        "logging:\n", "derived:\n", "  padded_vocab_size: 512\n", "  data_parallel_size: 2\n", "  world_size: 4\n",
        "  num_microbatches: 1\n", "  tokens_per_iteration: 64\n", "  data: 2\n", "  betas: [0.9, 0.999]\n",
        "  train: []\n", "  layers_per_stage: []\n"})
    EXPECT_CONTAINS(y, s);
  EXPECT_LT(y.find("model:"), y.find("parallel:"));  // stable section order
  EXPECT_LT(y.find("logging:"), y.find("derived:"));
}

TEST(ConfigYaml, RoundTripsExactly) {
  const Config c =
      base({"optimizer.lr=0.00031415926535897931", "optimizer.min_lr=1e-7", "model.dropout=0.123456789",
            "model.init_std=0.00707", "training.loss_scale.initial=65536", "data.train=[a b, 'x: y', '#c']",
            "data.synthetic=true", "data.valid=[\"quote\\\"d\", 'back\\slash', '123', 'true', '~']",
            "logging.dir=runs/with space", "checkpoint.save_dir=", "parallel.pipeline=2",
            "parallel.layers_per_stage=[3, 1]", "training.precision=fp16", "data.split=[0.7, 0.2, 0.1]",
            "optimizer.decay=wsd", "optimizer.wsd_decay_style=1-sqrt", "optimizer.wsd_decay_fraction=0.125"},
           2);
  EXPECT_EQ(c.data.valid[0], "quote\"d");
  const Config back = parse_config(to_yaml(c), c.source, {}, c.parallel.world_size);
  EXPECT_EQ(back, c) << to_yaml(c);
  EXPECT_EQ(to_yaml(back), to_yaml(c));
}

TEST(ConfigYaml, RoundTripsWithOverridesOnTop) {
  const Config c = base({}, 1);
  const Config back = parse_config(to_yaml(c), "resolved.yaml", {"parallel.tensor=2", "parallel.data=1"}, 2);
  EXPECT_EQ(back.parallel.tensor, 2);
  EXPECT_EQ(back.model.padded_vocab_size, 512);
  EXPECT_EQ(back.model.num_layers, c.model.num_layers);
}

// ---------------------------------------------------------------------------------------------- configs/

// The world size a config file's parallel section asks for: tensor * pipeline * (data, or 1 when auto).
int64_t world_size_of(const std::string& path) {
  const YAML::Node parallel = YAML::LoadFile(path)["parallel"];
  auto get = [&](const char* key) -> int64_t {
    if (!parallel || !parallel[key] || parallel[key].Scalar() == "auto") return 1;
    return parallel[key].as<int64_t>();
  };
  return get("tensor") * get("pipeline") * get("data");
}

TEST(ConfigFiles, EveryFileInConfigsLoadsAndRoundTrips) {
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(mt::testing_util::source_root() / "configs"))
    if (e.path().extension() == ".yaml") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  EXPECT_GE(files.size(), 4u);
  for (const auto& f : files) {
    SCOPED_TRACE(f);
    const int64_t world = world_size_of(f);
    Config c;
    ASSERT_NO_THROW(c = load_config(f, {}, world));
    EXPECT_EQ(c.parallel.world_size, world);
    EXPECT_EQ(parse_config(to_yaml(c), f, {}, world), c);
  }
}

TEST(ConfigFiles, GptShapesAreThePapers) {
  const Config s = load_config(mt::testing_util::source_path("configs/gpt-124m.yaml"), {}, 1);
  EXPECT_EQ(s.model.padded_vocab_size, 50304);
  EXPECT_EQ(s.model.head_dim, 64);
  const Config xl = load_config(mt::testing_util::source_path("configs/gpt-1.3b.yaml"), {}, 8);
  EXPECT_EQ(xl.parallel.data, 2);
  EXPECT_EQ(xl.model.padded_vocab_size, 50432);
  EXPECT_EQ(xl.training.num_microbatches, 64);  // 512 / (4 * 2)
  const Config b8 = load_config(mt::testing_util::source_path("configs/gpt-8b.yaml"), {}, 8);
  EXPECT_EQ(b8.model.num_layers, 32);
  EXPECT_EQ(b8.model.hidden_size, 4096);
  EXPECT_EQ(b8.model.num_heads, 32);
  EXPECT_EQ(b8.model.seq_length, 4096);
  EXPECT_EQ(b8.parallel.tensor * b8.parallel.pipeline * b8.parallel.data, 8);
}

TEST(ConfigFiles, Llama3ShapeIsMetas) {
  const Config l = load_config(mt::testing_util::source_path("configs/llama3-8b.yaml"), {}, 8);
  EXPECT_EQ(l.model.arch, Arch::llama);
  EXPECT_EQ(l.model.num_layers, 32);
  EXPECT_EQ(l.model.hidden_size, 4096);
  EXPECT_EQ(l.model.num_heads, 32);
  EXPECT_EQ(l.model.num_query_groups, 8);
  EXPECT_EQ(l.model.ffn_hidden_size, 14336);
  EXPECT_EQ(l.model.padded_vocab_size, 128256);
  EXPECT_EQ(l.model.rotary_base, 500000);
  EXPECT_EQ(l.model.seq_length, 8192);
  EXPECT_FALSE(l.model.tie_embeddings);
  EXPECT_EQ(l.parallel.tensor * l.parallel.pipeline * l.parallel.data, 8);
  // Meta's count: 8.03B. Per layer 2*4096^2 (q, o) + 2*4096*1024 (k, v) + 3*4096*14336 (gate, up, down)
  // + 2*4096 (norms) = 218,112,000; 32 of them, the untied embedding and head 2*128256*4096, the final norm.
  EXPECT_EQ(estimated_parameters(l.model), 32.0 * 218112000 + 2.0 * 128256 * 4096 + 4096);
}

}  // namespace

// ------------------------------------------------------------------------------- hardening: huge values

// Sizes that overflow int64 once multiplied, or that no machine can hold, are refused before anything is
// allocated, naming the key (they used to segfault, end in a bare std::bad_alloc or pad the vocabulary to 0).
TEST(ConfigLimits, HugeSizesAreRefusedNamingTheKey) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"model.hidden_size=4611686018427387904", "model.hidden_size"},
      {"model.num_layers=9223372036854775807", "model.num_layers"},
      {"model.num_heads=4611686018427387904", "model.num_heads"},
      {"model.seq_length=4611686018427387904", "model.seq_length"},
      {"model.vocab_size=4611686018427387904", "model.vocab_size"},
      {"model.ffn_hidden_size=4611686018427387904", "model.ffn_hidden_size"},
      {"model.max_position_embeddings=4611686018427387904", "model.max_position_embeddings"},
      {"model.make_vocab_size_divisible_by=9223372036854775807", "model.make_vocab_size_divisible_by"},
      {"training.micro_batch_size=4611686018427387904", "training.micro_batch_size"},
      {"training.global_batch_size=4611686018427387904", "training.global_batch_size"},
      {"training.train_iters=9223372036854775807", "training.train_iters"},
      {"logging.eval_iters=9223372036854775807", "logging.eval_iters"},
      {"parallel.timeout_s=1e300", "parallel.timeout_s"},
      {"parallel.timeout_s=.inf", "parallel.timeout_s"},
      {"optimizer.lr=.inf", "optimizer.lr"},
      {"parallel.grad_bucket_size=9223372036854775807", "parallel.grad_bucket_size"},
  };
  for (const auto& [set, key] : cases) EXPECT_CONTAINS(base_error({set}), key) << set;
}

TEST(ConfigLimits, TensorsBeyondTwoToTheFortyEightBytesAreRefused) {
  // Each dimension is within its bound, but the attention scores (B, heads, S, S) are not.
  EXPECT_CONTAINS(base_error({"model.seq_length=16777216", "training.micro_batch_size=64"}), "attention scores");
  // The embedding (padded vocabulary, hidden) is 2^31 * 2^20 * 4 bytes.
  EXPECT_CONTAINS(base_error({"model.vocab_size=2147483000", "model.make_vocab_size_divisible_by=1",
                              "model.hidden_size=1048576", "model.num_heads=1"}),
                  "bytes");
  // Many layers of a wide model: the parameter state does not fit 2^48 bytes.
  EXPECT_CONTAINS(base_error({"model.num_layers=65536", "model.hidden_size=262144", "model.num_heads=1"}),
                  "model.num_layers");
}

TEST(ConfigLimits, PaddingMultipleNeverWrapsTheVocabulary) {
  // Used to be accepted as "vocabulary 257 padded to 0".
  EXPECT_CONTAINS(base_error({"model.make_vocab_size_divisible_by=1048576", "model.vocab_size=2147483647"}),
                  "model.make_vocab_size_divisible_by");
  EXPECT_EQ(base({"model.make_vocab_size_divisible_by=1048576"}).model.padded_vocab_size, 1048576);
}

TEST(ConfigLimits, ConfigFileMustBeARegularFileOfBoundedSize) {
  const std::string dir = ::testing::TempDir() + "/config_limits";
  std::filesystem::create_directories(dir);
  try {
    load_config("/dev/zero", {});
    ADD_FAILURE() << "/dev/zero accepted";
  } catch (const ConfigError& e) {
    EXPECT_CONTAINS(std::string(e.what()), "/dev/zero: is not a regular file");
  }
  const std::string big = dir + "/big.yaml";
  {
    std::ofstream out(big);
    out << kBase << "# " << std::string(17 << 20, 'x') << "\n";
  }
  try {
    load_config(big, {});
    ADD_FAILURE() << "a 17 MiB config accepted";
  } catch (const ConfigError& e) {
    EXPECT_CONTAINS(std::string(e.what()), "big.yaml: is larger than 16 MiB");
  }
  std::filesystem::remove_all(dir);
}

// ------------------------------------------------------------------------- hardening: the derived section

TEST(ConfigDerived, EditedOrUnknownDerivedValuesAreRefused) {
  const Config c = base();
  const std::string text = to_yaml(c);
  EXPECT_EQ(parse(text), c);  // the round trip still holds
  EXPECT_CONTAINS(error_of(replace(text, "padded_vocab_size: 384", "padded_vocab_size: 1000")),
                  "derived.padded_vocab_size: is 1000 here but");
  EXPECT_CONTAINS(error_of(replace(text, "padded_vocab_size: 384", "padded_vocabs: 384")),
                  "derived.padded_vocabs: unknown derived value");
  EXPECT_CONTAINS(base_error({"derived.padded_vocab_size=3"}), "derived values are computed");
  // head_dim is a model key now (written as auto while it is the quotient); a config written before lists it among
  // the derived values, where it is still read and checked.
  EXPECT_CONTAINS(text, "  head_dim: auto\n");
  const std::string old = replace(text, "padded_vocab_size: 384", "padded_vocab_size: 384\n  head_dim: 8");
  EXPECT_EQ(parse(old), c);
  EXPECT_CONTAINS(error_of(replace(old, "head_dim: 8", "head_dim: 9")), "derived.head_dim: is 9 here but");
  // A config saved by a 2-rank run reads on 1 rank (the launch-dependent values are not compared), and
  // overrides that change what the values derive from are allowed (eval reads checkpoints this way).
  const std::string two = replace(to_yaml(base({}, 2)), "  data: 2\n", "  data: auto\n");
  EXPECT_EQ(parse(two, {}, 1).parallel.data, 1);
  EXPECT_EQ(parse(text, {"model.num_heads=4"}).model.head_dim, 16);
}

// ------------------------------------------------------------------------- model.vocab_size: auto

namespace mt {
namespace {

// auto takes vocab_size from PREFIX.tokenizer.yaml beside the first data.train prefix (data prepare writes it).
TEST(ConfigVocabAuto, TakesTheFirstTrainPrefixsTokenizerVocabulary) {
  const auto dir = std::filesystem::temp_directory_path() / ("mt-vocab-auto-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string a = (dir / "a").string(), b = (dir / "b").string();
  std::ofstream(a + ".tokenizer.yaml")
      << "kind: sentencepiece\nfiles: {tokenizer_model: /x.model}\nvocab_size: 600\neod: 2\n";
  std::ofstream(b + ".tokenizer.yaml") << "kind: byte\nvocab_size: 257\neod: 256\n";
  const std::string text = replace(replace(kBase, "vocab_size: 257", "vocab_size: auto"), "  synthetic: true\n",
                                   "  train: [" + a + ", " + b + "]\n");
  const Config c = parse(text);
  EXPECT_EQ(c.model.vocab_size, 600);
  EXPECT_EQ(c.model.padded_vocab_size, 640);
  EXPECT_EQ(parse(text, {"model.vocab_size=1000"}).model.vocab_size, 1000);  // a number is used as it is
  EXPECT_EQ(base({"model.vocab_size=auto", "data.synthetic=false", "data.train=" + b}).model.vocab_size, 257);
  // Saved configs hold the resolved number.
  EXPECT_CONTAINS(to_yaml(c), "vocab_size: 600");
  // A weighted blend [w0, prefix0, ...]: the first dataset's sidecar, not the weight's.
  EXPECT_EQ(base({"model.vocab_size=auto", "data.synthetic=false", "data.train=[0.3, " + b + ", 0.7, " + a + "]"})
                .model.vocab_size,
            257);

  EXPECT_CONTAINS(base_error({"model.vocab_size=auto"}), "model.vocab_size: is 'auto' but data.train names no dataset");
  EXPECT_CONTAINS(base_error({"model.vocab_size=auto", "data.synthetic=false", "data.train=" + (dir / "c").string()}),
                  "c.tokenizer.yaml does not exist");
  std::ofstream(b + ".tokenizer.yaml") << "kind: byte\neod: 256\n";
  EXPECT_CONTAINS(base_error({"model.vocab_size=auto", "data.synthetic=false", "data.train=" + b}),
                  "has no positive vocab_size");
  EXPECT_CONTAINS(base_error({"model.vocab_size=automatic"}), "expected an integer or 'auto'");
  std::filesystem::remove_all(dir);
}

// Megatron's --data-path list syntax (core/data's blends read what this returns: test_data.cpp).
TEST(Blend, ConfigListsFollowMegatronsSyntax) {
  DataBlend b = parse_data_blend({"0.3", "a", "0.7", "b"});
  EXPECT_EQ(b.prefixes, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(b.weights, (std::vector<double>{0.3, 0.7}));
  b = parse_data_blend({"a", "b"});  // unweighted: today's concatenation
  EXPECT_EQ(b.prefixes, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(b.weights.empty());
  b = parse_data_blend({"3", "a", "x", "b"});  // not every other item a number: plain prefixes
  EXPECT_EQ(b.prefixes.size(), 4u);
  EXPECT_TRUE(b.weights.empty());
  b = parse_data_blend({"1", "a", "2"});  // odd count: plain prefixes
  EXPECT_TRUE(b.weights.empty());
  b = parse_data_blend({" 30 ", "a", "1e1", "b"});
  EXPECT_EQ(b.weights, (std::vector<double>{30, 10}));
}

}  // namespace
}  // namespace mt

TEST(ConfigRules, LossSpikeKeysAreCheckedNamingTheKey) {
  const Config d = base();
  EXPECT_EQ(d.training.loss_spike.action, SpikeAction::log);
  EXPECT_FALSE(d.logging.verbose_line);
  const Config c = base({"training.loss_spike={action: skip, window: 20, warmup_iters: 5, sigmas: 4, ratio: 1.5}",
                         "logging.verbose_line=true"});
  EXPECT_EQ(c.training.loss_spike.action, SpikeAction::skip);
  EXPECT_EQ(c.training.loss_spike.window, 20);
  EXPECT_EQ(c.training.loss_spike.warmup_iters, 5);
  EXPECT_EQ(c.training.loss_spike.sigmas, 4.0);
  EXPECT_EQ(c.training.loss_spike.ratio, 1.5);
  EXPECT_TRUE(c.logging.verbose_line);
  EXPECT_EQ(parse_config(to_yaml(c), c.source, {}, 1), c);  // written and read back
  EXPECT_CONTAINS(base_error({"training.loss_spike.action=halt"}), "training.loss_spike.action");
  EXPECT_CONTAINS(base_error({"training.loss_spike.window=0"}), "training.loss_spike.window: must be positive");
  EXPECT_CONTAINS(base_error({"training.loss_spike.warmup_iters=-1"}),
                  "training.loss_spike.warmup_iters: must be >= 0");
  EXPECT_CONTAINS(base_error({"training.loss_spike.sigmas=0"}), "training.loss_spike.sigmas: must be positive");
  EXPECT_CONTAINS(base_error({"training.loss_spike.ratio=0.9"}), "training.loss_spike.ratio: must be at least 1");
  EXPECT_CONTAINS(base_error({"training.loss_spike.windw=3"}),
                  "training.loss_spike.windw=3: unknown key (did you mean training.loss_spike.window?)");
}

TEST(ConfigRules, MoeKeysAreCheckedNamingTheKey) {
  const Config d = base();
  EXPECT_FALSE(d.model.moe.enabled());
  EXPECT_EQ(d.parallel.expert, 1);
  EXPECT_EQ(parse_config(to_yaml(d), d.source, {}, 1), d);  // a dense config reads back
  // ... without the MoE keys a dense model does not take (the reader would refuse them).
  EXPECT_EQ(to_yaml(d).find("top_k"), std::string::npos) << to_yaml(d);
  EXPECT_EQ(to_yaml(d).find("capacity_factor"), std::string::npos) << to_yaml(d);
  // A valid MoE config passes every rule and reads back; what the layers cannot do yet is refused naming the key.
  const std::vector<std::string> moe = {"model.moe.num_experts=8", "model.moe.top_k=2"};
  auto with = [&](std::vector<std::string> more, int64_t world = 1) {
    std::vector<std::string> all = moe;
    all.insert(all.end(), more.begin(), more.end());
    return base_error(all, world);
  };
  const Config c = base({"model.moe.num_experts=8", "model.moe.top_k=2", "model.moe.layer_pattern=[1, 0, 1, 0]",
                         "model.moe.score_function=sigmoid", "model.moe.ffn_hidden_size=64",
                         "model.moe.shared_expert_ffn_hidden_size=128", "model.moe.aux_loss_coeff=0.01",
                         "model.moe.z_loss_coeff=0.001", "model.moe.bias_update_rate=0.001"});
  EXPECT_TRUE(c.model.moe.enabled());
  EXPECT_TRUE(c.model.moe.is_moe_layer(2));
  EXPECT_FALSE(c.model.moe.is_moe_layer(3));
  EXPECT_EQ(parse_config(to_yaml(c), c.source, {}, 1), c);
  EXPECT_EQ(base({"model.moe.num_experts=8", "model.moe.top_k=2", "parallel.expert=4", "parallel.tensor=2"}, 16)
                .parallel.expert,
            4);
  // Parallel folding: the experts' TP degree divides the dense one, and EP x ETP divides TP x DP.
  const Config folded = base({"model.moe.num_experts=8", "model.moe.top_k=2", "parallel.tensor=2",
                              "parallel.expert_tensor=1", "parallel.expert=2"},
                             2);
  EXPECT_EQ(folded.parallel.expert_tensor, 1);
  EXPECT_EQ(parse_config(to_yaml(folded), folded.source, {}, 2), folded);
  EXPECT_CONTAINS(with({"parallel.tensor=2", "parallel.expert_tensor=4"}, 2),
                  "parallel.expert_tensor: 4 does not divide parallel.tensor=2");
  EXPECT_CONTAINS(with({"parallel.tensor=4", "parallel.expert_tensor=1", "parallel.expert=8"}, 4),
                  "parallel.expert: parallel.expert*expert_tensor = 8*1 = 8 does not divide parallel.tensor*data = "
                  "4*1 = 4");
  EXPECT_DOUBLE_EQ(base({"model.moe.num_experts=8", "model.moe.top_k=2", "model.moe.capacity_factor=1.25"})
                       .model.moe.capacity_factor,
                   1.25);
  EXPECT_CONTAINS(with({"model.moe.top_k=9"}),
                  "model.moe.top_k: 9 is more than model.moe.num_experts=8 (each token picks top_k distinct experts)");
  EXPECT_CONTAINS(with({"model.moe.top_k=0"}), "model.moe.top_k: must be positive");
  EXPECT_CONTAINS(base_error({"model.moe.num_experts=-2"}), "model.moe.num_experts: must be >= 0");
  EXPECT_CONTAINS(base_error({"model.moe.num_experts=2000"}), "model.moe.num_experts");
  EXPECT_CONTAINS(with({"model.moe.capacity_factor=0"}),
                  "model.moe.capacity_factor: 0 is not a valid value: leave the key out (or write none)");
  EXPECT_CONTAINS(with({"model.moe.capacity_factor=-1"}), "model.moe.capacity_factor: must be positive, got -1");
  EXPECT_CONTAINS(with({"model.moe.capacity_factor=lots"}), "model.moe.capacity_factor: expected a number or 'none'");
  EXPECT_CONTAINS(with({"model.moe.layer_freq=5"}), "model.moe.layer_freq: 5 is more than model.num_layers=4");
  EXPECT_CONTAINS(with({"model.moe.layer_pattern=[1, 0]"}),
                  "model.moe.layer_pattern: has 2 entries, expected one 0/1 per layer (model.num_layers=4)");
  EXPECT_CONTAINS(with({"model.moe.layer_pattern=[1, 0, 2, 0]"}),
                  "model.moe.layer_pattern[2]: expected 0 (dense) or 1");
  EXPECT_CONTAINS(with({"model.moe.layer_pattern=[0, 0, 0, 0]"}), "model.moe.layer_pattern: has no 1");
  EXPECT_CONTAINS(with({"model.moe.layer_pattern=[1, 1, 1, 1]", "model.moe.layer_freq=2"}),
                  "model.moe.layer_pattern: and model.moe.layer_freq are both set");
  EXPECT_CONTAINS(with({"model.moe.aux_loss_coeff=-0.01"}), "model.moe.aux_loss_coeff: must be >= 0");
  EXPECT_CONTAINS(with({"model.moe.score_function=relu"}),
                  "model.moe.score_function: expected one of softmax, sigmoid, got 'relu'");
  EXPECT_CONTAINS(with({"model.moe.ffn_hidden_size=0"}), "model.moe.ffn_hidden_size: 0 is not a valid value");
  EXPECT_CONTAINS(with({"parallel.expert=3"}, 3),
                  "parallel.expert: 3 does not divide model.moe.num_experts=8 (each expert-parallel rank holds an "
                  "equal share; valid: 1, 2, 4, 8)");
  EXPECT_CONTAINS(with({"parallel.expert=4"}, 2),
                  "parallel.expert: 4 does not divide parallel.data=2 (expert-parallel ranks are drawn from the "
                  "data-parallel ranks)");
  EXPECT_CONTAINS(with({"parallel.tensor=2", "parallel.expert_tensor=2", "model.moe.ffn_hidden_size=63"}, 2),
                  "parallel.expert_tensor: 2 does not divide model.moe.ffn_hidden_size=63");
  // A dense model takes no MoE key: a forgotten num_experts is not a silently dense run.
  EXPECT_CONTAINS(base_error({"model.moe.top_k=4"}),
                  "model.moe.top_k: is set, but model.moe.num_experts is 0 (a dense model): set num_experts");
  EXPECT_CONTAINS(base_error({"parallel.expert=2"}, 2), "parallel.expert: 2 needs mixture-of-experts layers");
  EXPECT_CONTAINS(base_error({"model.moe.numexperts=4"}), "unknown key (did you mean model.moe.num_experts?)");
}

// A key that means nothing in the config (config_keys.h: Key::inert) is refused when set, even at its default
// value, naming why; to_yaml leaves it out, and a config it wrote before it did (the inert keys at their defaults)
// still reads back.
TEST(ConfigRules, InertKeysAreRefusedWhenSet) {
  EXPECT_CONTAINS(base_error({"model.moe.top_k=2"}),
                  "model.moe.top_k: is set, but model.moe.num_experts is 0 (a dense model): set num_experts");
  EXPECT_CONTAINS(base_error({"model.moe.capacity_factor=none"}), "model.moe.capacity_factor: is set, but");
  EXPECT_CONTAINS(base_error({"training.fp8.recipe=current"}),
                  "training.fp8.recipe: is set, but training.fp8.format is none (no fp8 GEMMs)");
  EXPECT_CONTAINS(base_error({"training.fp8.amax_history_len=1024"}),
                  "training.fp8.amax_history_len: is set, but training.fp8.format is none");
  EXPECT_CONTAINS(base_error({"training.fp8.margin=1"}),
                  "training.fp8.margin: is set, but training.fp8.format is none");
  const std::vector<std::string> fp8 = {"training.precision=bf16", "training.fp8.format=e4m3"};
  auto with_fp8 = [&](const std::string& more) {
    std::vector<std::string> all = fp8;
    all.push_back(more);
    return all;
  };
  EXPECT_CONTAINS(base_error(with_fp8("training.fp8.amax_history_len=16")),
                  "training.fp8.amax_history_len: is set, but training.fp8.recipe is current (each tensor scaled by "
                  "its own amax, no history): set training.fp8.recipe: delayed");
  EXPECT_CONTAINS(base_error(with_fp8("training.fp8.amax_compute_algo=most_recent")),
                  "training.fp8.amax_compute_algo: is set, but training.fp8.recipe is current");
  EXPECT_EQ(base(with_fp8("training.fp8.margin=1")).training.fp8.margin, 1);  // margin scales current too
  std::vector<std::string> delayed = with_fp8("training.fp8.recipe=delayed");
  delayed.push_back("training.fp8.amax_history_len=16");
  const Config c = base(delayed);
  EXPECT_EQ(c.training.fp8.amax_history_len, 16);
  EXPECT_EQ(parse_config(to_yaml(c), c.source, {}, 1), c);
  // Written: current leaves the history keys out, no fp8 leaves every fp8 key but format out.
  const std::string current = to_yaml(base(fp8)), none = to_yaml(base());
  EXPECT_CONTAINS(current, "recipe: current");
  EXPECT_EQ(current.find("amax_history_len"), std::string::npos) << current;
  EXPECT_CONTAINS(none, "  fp8:\n    format: none\n  loss_spike:");
  // A config to_yaml wrote before it left inert keys out (it has the derived section) reads back; a value there
  // that is not the default is still refused.
  const std::string old_written =
      replace(none, "    format: none\n", "    format: none\n    recipe: current\n    amax_history_len: 1024\n");
  EXPECT_EQ(parse(old_written), base());
  EXPECT_CONTAINS(error_of(replace(old_written, "amax_history_len: 1024", "amax_history_len: 16")),
                  "training.fp8.amax_history_len: is set, but training.fp8.format is none");
  const std::string old_dense = replace(none, "    num_experts: 0\n", "    num_experts: 0\n    top_k: 2\n");
  EXPECT_EQ(parse(old_dense), base());
  EXPECT_CONTAINS(error_of(replace(old_dense, "top_k: 2", "top_k: 4")), "model.moe.top_k: is set, but");
}

// A LoRA target written as another framework's module name says which megatrain target it is.
TEST(ConfigRules, LoraTargetsOfOtherFrameworksNameOurs) {
  const std::vector<std::string> lora = {"finetune.lora.rank=4"};
  auto targets = [&](const std::string& list) {
    std::vector<std::string> all = lora;
    all.push_back("finetune.lora.targets=" + list);
    return base_error(all);
  };
  EXPECT_CONTAINS(targets("[q_proj, v_proj]"),
                  "finetune.lora.targets: 'q_proj' names a module of another framework (Hugging Face, Megatron-Core or "
                  "Meta's Llama); megatrain's target for it is qkv");
  for (const auto& [theirs, ours] :
       {std::pair{"k_proj", "qkv"}, std::pair{"o_proj", "proj"}, std::pair{"gate_proj", "fc1"},
        std::pair{"up_proj", "fc1"}, std::pair{"down_proj", "fc2"}, std::pair{"c_attn", "qkv"},
        std::pair{"c_fc", "fc1"}, std::pair{"linear_fc2", "fc2"}})
    EXPECT_CONTAINS(targets(fmt::format("[{}]", theirs)),
                    fmt::format("'{}' names a module of another framework (Hugging Face, Megatron-Core or Meta's "
                                "Llama); megatrain's target for it is {}",
                                theirs, ours));
  EXPECT_CONTAINS(targets("[qkv, attn]"), "finetune.lora.targets: expected one of qkv, proj, fc1, fc2, got 'attn'");
}

// LoRA composes with mixture-of-experts layers (adapters on the experts' linears); only the adapters' dropout is
// refused where an expert's linear has one (its rows are in expert order, as PEFT's fused-expert adapters refuse it).
TEST(ConfigRules, LoraOnExpertsTakesNoDropout) {
  const std::vector<std::string> moe = {"model.moe.num_experts=4", "finetune.lora.rank=4", "parallel.expert=2"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), moe.begin(), moe.end());
    return more;
  };
  EXPECT_EQ(base(with({}), 2).finetune.lora.rank, 4);
  EXPECT_EQ(base(with({"finetune.lora.targets=[qkv, proj]", "finetune.lora.dropout=0.1"}), 2).finetune.lora.dropout,
            0.1);
  for (const char* targets : {"[fc1]", "[fc2]", "[qkv, fc1, fc2]"})
    EXPECT_CONTAINS(
        base_error(with({fmt::format("finetune.lora.targets={}", targets), "finetune.lora.dropout=0.1"}), 2),
        "finetune.lora.dropout: must be 0 with adapters on a mixture of experts' linears (model.moe.num_experts=4 "
        "and finetune.lora.targets names fc1 or fc2), as PEFT's adapters on fused experts; got 0.1");
}

TEST(ConfigRules, OnSinkErrorIsWarnOrSaveAndStop) {
  EXPECT_EQ(base().logging.on_sink_error, SinkErrorAction::warn);
  const Config c = base({"logging.on_sink_error=save_and_stop"});
  EXPECT_EQ(c.logging.on_sink_error, SinkErrorAction::save_and_stop);
  EXPECT_EQ(parse_config(to_yaml(c), c.source, {}, 1), c);  // written and read back
  EXPECT_CONTAINS(base_error({"logging.on_sink_error=ignore"}),
                  "logging.on_sink_error: expected one of warn, save_and_stop, got 'ignore'");
}

// The planner's search derives thousands of configs from one parsed document: each parse is parse_config's, and
// none leaves its overrides in the document for the next.
TEST(ConfigDocument, EachParseIsParseConfigsAndLeavesTheDocumentAsItWas) {
  const ConfigDocument doc(kBase, "t.yaml");
  const std::vector<std::string> two = {"parallel.tensor=2", "parallel.sequence_parallel=true", "model.num_layers=8"};
  EXPECT_EQ(doc.parse(two, 2), parse(kBase, two, 2));
  EXPECT_EQ(doc.parse({}, 1), base());
  EXPECT_EQ(doc.parse({}, 1).model.num_layers, 4);
  EXPECT_EQ(doc.parse({"parallel.data=2"}, 2), base({"parallel.data=2"}, 2));
  try {
    doc.parse({"parallel.tensor=3"}, 3);
    ADD_FAILURE() << "TP 3 was accepted";
  } catch (const ConfigError& e) {
    EXPECT_CONTAINS(e.what(), "parallel.tensor");
  }
  EXPECT_THROW(ConfigDocument("model: [1, 2", "bad.yaml"), ConfigError);
}
