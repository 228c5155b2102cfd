// test_hf_export.cpp: the safetensors writer and the Hugging Face GPT-2 export of a checkpoint.
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

#include "core/hf/hf_export.h"
#include "core/hf/safetensors.h"
#include "tests/unit/core/hf/hf_export_checks.h"
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

// ---- safetensors ---------------------------------------------------------------------------------------

TEST_F(CheckpointTest, SafetensorsWriterLaysOutHeaderAndData) {
  std::vector<SafetensorsSpec> specs = {
      {"a.weight", DType::f32, {2, 3}}, {"b", DType::bf16, {5}}, {"c\"q", DType::f16, {1, 3}}};
  std::string path = root_ + "/x.safetensors";
  {
    SafetensorsWriter w(path, specs, {{"format", "pt"}});
    w.write(make({2, 3}, DType::f32, 1.f));
    w.write(make({5}, DType::f32, 2.f));  // converted to bf16 on the way
    w.write(make({1, 3}, DType::f16, -1.f));
    w.finish();
  }
  SafetensorsFile f = read_safetensors(path);
  EXPECT_EQ(f.header["__metadata__"]["format"].str, "pt");
  EXPECT_EQ(f.header["a.weight"]["dtype"].str, "F32");
  EXPECT_EQ(f.shape("a.weight"), (Shape{2, 3}));
  EXPECT_EQ(f.header["a.weight"]["data_offsets"].ints(), (std::vector<int64_t>{0, 24}));
  EXPECT_EQ(f.header["b"]["dtype"].str, "BF16");
  EXPECT_EQ(f.header["b"]["data_offsets"].ints(), (std::vector<int64_t>{24, 34}));
  EXPECT_EQ(f.header["c\"q"]["dtype"].str, "F16");
  EXPECT_EQ(f.data.size(), 40u);
  EXPECT_EQ(f.floats("a.weight"), iota(6, 1.f));
  EXPECT_EQ(f.floats("b"), iota(5, 2.f));
  EXPECT_EQ(f.floats("c\"q"), iota(3, -1.f));
  Tensor a = make({2, 3}, DType::f32, 1.f);
  EXPECT_EQ(std::memcmp(f.data.data(), a.raw(), 24), 0);

  // An unfinished writer leaves nothing behind; a wrong shape is refused.
  {
    SafetensorsWriter w(root_ + "/y.safetensors", specs);
    EXPECT_THROW(w.write(make({3, 2}, DType::f32, 0.f)), CheckpointError);
  }
  EXPECT_FALSE(fs::exists(root_ + "/y.safetensors"));
  EXPECT_FALSE(fs::exists(root_ + "/y.safetensors.tmp"));
}

// ---- Hugging Face export -------------------------------------------------------------------------------

TEST_F(CheckpointTest, HfExportDeinterleavesTransposesAndDropsPadding) {
  for (bool tied : {true, false}) {
    TinyGpt m(tied);
    std::string dir = m.save(save_);
    std::string out = root_ + (tied ? "/hf_tied" : "/hf_untied");
    export_hf_gpt2(CheckpointReader(dir), out);
    SafetensorsFile f = read_safetensors(out + "/model.safetensors");
    EXPECT_EQ(f.header["transformer.wte.weight"]["dtype"].str, "F32");
    check_export(m, f, DType::f32);

    JsonParser p{slurp(out + "/config.json")};
    Json cfg = p.value();
    EXPECT_EQ(cfg["model_type"].str, "gpt2");
    EXPECT_EQ(cfg["architectures"].items.at(0).str, "GPT2LMHeadModel");
    EXPECT_EQ(cfg["vocab_size"].num, 11);
    EXPECT_EQ(cfg["n_positions"].num, 6);
    EXPECT_EQ(cfg["n_embd"].num, 8);
    EXPECT_EQ(cfg["n_layer"].num, 2);
    EXPECT_EQ(cfg["n_head"].num, 2);
    EXPECT_EQ(cfg["n_inner"].num, 32);  // ffn_hidden_size 0 means 4 * hidden
    EXPECT_EQ(cfg["activation_function"].str, "gelu_new");
    EXPECT_EQ(cfg["layer_norm_epsilon"].num, 1e-5);
    EXPECT_EQ(cfg["resid_pdrop"].num, 0.1);
    EXPECT_EQ(cfg["attn_pdrop"].num, 0.05);
    EXPECT_EQ(cfg["initializer_range"].num, 0.02);
    EXPECT_EQ(cfg["bos_token_id"].kind, Json::null);  // no ids given: unknown, not vocab_size - 1
    EXPECT_EQ(cfg["eos_token_id"].kind, Json::null);
    EXPECT_EQ(
        slurp(out + "/config.json").find(tied ? "\"tie_word_embeddings\": true" : "\"tie_word_embeddings\": false") !=
            std::string::npos,
        true);
  }
}

TEST_F(CheckpointTest, HfExportRefusesAnIncompleteCheckpointBeforeWriting) {
  TinyGpt m(true);
  m.params.erase("model.layers.1.mlp.fc2.bias");
  std::string dir = m.save(save_);
  std::string out = root_ + "/hf";
  std::string msg = error_of([&] { export_hf_gpt2(CheckpointReader(dir), out); });
  EXPECT_NE(msg.find("model.layers.1.mlp.fc2.bias"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(out + "/model.safetensors"));
  EXPECT_FALSE(fs::exists(out + "/config.json"));
}

}  // namespace
