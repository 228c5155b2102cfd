// test_ckpt_commands.cpp: `megatrain ckpt inspect / export` as a user runs them, and the data tokenizer a
// checkpoint carries into the Hugging Face export.
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

#include "app/cli/commands.h"
#include "app/train/checkpointing.h"
#include "core/tokenizer/tokenizer_sidecar.h"
#include "core/hf/hf_export.h"
#include "core/hf/hf_tokenizer_export.h"
#include "core/hf/safetensors.h"
#include "tests/unit/core/hf/hf_export_checks.h"
#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/checkpoint_writer.h"
#include "core/checkpoint/save_dir.h"
#include "tests/unit/core/checkpoint/checkpoint_fixture.h"
#include "tests/unit/file_text.h"
#include "tests/unit/app/cli/cli_run.h"

namespace fs = std::filesystem;
using namespace mt;
using namespace mt::ckpt_test;

namespace {

using cli_test::run_cli;
using testing_util::slurp;
using testing_util::spit;

TEST_F(CheckpointTest, CliInspectsVerifiesAndExports) {
  TinyGpt m(false);
  m.save(save_);
  ::testing::internal::CaptureStdout();
  run_cli("ckpt inspect " + save_ + " --verify");
  std::string text = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(text.find("iteration: 42"), std::string::npos) << text;
  EXPECT_NE(text.find("model.layers.0.attn.qkv.weight"), std::string::npos) << text;
  EXPECT_NE(text.find("[24, 8]"), std::string::npos) << text;
  EXPECT_NE(text.find("2 slices"), std::string::npos) << text;
  EXPECT_NE(text.find("verify: OK"), std::string::npos) << text;

  ::testing::internal::CaptureStdout();
  run_cli("ckpt export " + save_ + "/iter_0000042 --format hf --output " + root_ + "/hf --dtype bf16");
  text = ::testing::internal::GetCapturedStdout();
  SafetensorsFile f = read_safetensors(root_ + "/hf/model.safetensors");
  EXPECT_EQ(f.header["transformer.h.0.attn.c_attn.weight"]["dtype"].str, "BF16");
  check_export(m, f, DType::bf16);
  EXPECT_NE(slurp(root_ + "/hf/config.json").find("\"torch_dtype\": \"bfloat16\""), std::string::npos);

  // Corrupt one byte: inspect --verify fails, naming the tensor.
  std::string bin = save_ + "/iter_0000042/rank_00000.bin";
  std::string bytes = slurp(bin);
  bytes[bytes.size() - 3] ^= 0x40;
  spit(bin, bytes);
  ::testing::internal::CaptureStdout();
  std::string msg = error_of([&] { run_cli("ckpt inspect " + save_ + " --verify"); });
  ::testing::internal::GetCapturedStdout();
  EXPECT_NE(msg.find("checksum mismatch in tensor"), std::string::npos) << msg;
  EXPECT_NE(error_of([&] { run_cli("ckpt inspect " + root_ + "/empty_nothing"); }).find("no checkpoint"),
            std::string::npos);
  EXPECT_THROW(run_cli("ckpt export " + save_ + " --format onnx --output " + root_ + "/x"), CLI::ValidationError);
}

// A checkpoint records its data's tokenizer sidecar as tokenizer.yaml, and the HF export turns a byte sidecar
// into tokenizer.json (id i = byte i, eod 256 the special <|endoftext|>) and configs whose eos id is the eod.
TEST_F(CheckpointTest, HfExportCarriesTheDataTokenizer) {
  TinyGpt m(false);
  m.save(save_);
  const std::string ckpt_dir = save_ + "/iter_0000042";
  const std::string prefix = root_ + "/data";
  spit(tokenizer_sidecar_path(prefix), "kind: byte\nfiles: {}\nvocab_size: 257\neod: 256\n");
  app::write_checkpoint_tokenizer(ckpt_dir, {prefix});
  EXPECT_EQ(slurp(ckpt_dir + "/tokenizer.yaml"), slurp(tokenizer_sidecar_path(prefix)));
  app::write_checkpoint_tokenizer(root_, {root_ + "/no_sidecar"});  // no sidecar: nothing written
  EXPECT_FALSE(fs::exists(root_ + "/tokenizer.yaml"));

  // The tiny model's 11 ids cannot hold the byte tokenizer's 257: the CLI refuses.
  std::string msg = error_of([&] { run_cli("ckpt export " + ckpt_dir + " --format hf --output " + root_ + "/x"); });
  EXPECT_NE(msg.find("the tokenizer has 257 ids but the model's vocab_size is 11"), std::string::npos) << msg;

  const std::string out = root_ + "/hf";
  CheckpointReader r(ckpt_dir);
  export_hf_gpt2(r, out, DType::f32, HfSpecialIds{256, 256});
  const auto sidecar = read_tokenizer_sidecar_file(ckpt_dir + "/tokenizer.yaml");
  ASSERT_TRUE(sidecar.has_value());
  export_hf_tokenizer(*sidecar, out, 6);
  using nlohmann::json;
  const json tok = json::parse(slurp(out + "/tokenizer.json"));
  ASSERT_EQ(tok["model"]["vocab"].size(), 256u);
  EXPECT_EQ(tok["model"]["vocab"]["a"], 'a');
  EXPECT_EQ(tok["model"]["vocab"]["\xC4\xA0"], 32);  // GPT-2's byte-level 'Ġ' is the space byte
  EXPECT_EQ(tok["model"]["vocab"]["\xC4\x80"], 0);
  EXPECT_TRUE(tok["model"]["merges"].empty());
  EXPECT_EQ(tok["pre_tokenizer"]["use_regex"], false);
  EXPECT_EQ(tok["added_tokens"][0]["id"], 256);
  EXPECT_EQ(tok["added_tokens"][0]["content"], "<|endoftext|>");
  const json cfg = json::parse(slurp(out + "/tokenizer_config.json"));
  EXPECT_EQ(cfg["tokenizer_class"], "PreTrainedTokenizerFast");
  EXPECT_EQ(cfg["eos_token"], "<|endoftext|>");
  EXPECT_EQ(cfg["model_max_length"], 6);
  EXPECT_EQ(json::parse(slurp(out + "/special_tokens_map.json"))["eos_token"], "<|endoftext|>");
  for (const char* file : {"/generation_config.json", "/config.json"}) {
    const json j = json::parse(slurp(out + file));
    EXPECT_EQ(j["eos_token_id"], 256) << file;
    EXPECT_EQ(j["bos_token_id"], 256) << file;
  }
}

// Without a tokenizer record the data's end-of-document id is unknown: config.json states bos/eos as null (it wrote
// vocab_size - 1, an id that meant nothing) and a warning says how to state them; --eos-id (with --bos-id) states
// them, checked against the vocabulary, and is refused beside a tokenizer, whose ids the export states (issue 30,
// item 9).
TEST_F(CheckpointTest, HfExportWithoutATokenizerStatesNoIdsUnlessGiven) {
  TinyGpt m(true);
  const std::string ckpt_dir = m.save(save_);
  using nlohmann::json;
  auto export_ids = [&](const std::string& name, const std::string& flags, std::string* out = nullptr) {
    ::testing::internal::CaptureStdout();
    run_cli("ckpt export " + ckpt_dir + " --output " + root_ + "/" + name + flags);
    const std::string text = ::testing::internal::GetCapturedStdout();
    if (out) *out = text;
    const json cfg = json::parse(slurp(root_ + "/" + name + "/config.json"));
    return cfg.at("bos_token_id").dump() + " " + cfg.at("eos_token_id").dump();
  };
  std::string text;
  EXPECT_EQ(export_ids("none", "", &text), "null null");
  EXPECT_NE(text.find(ckpt_dir + ": no tokenizer.yaml, so the end-of-document id of its data is unknown: config.json "
                                 "states bos_token_id and eos_token_id as null; pass --eos-id N"),
            std::string::npos)
      << text;
  EXPECT_EQ(export_ids("eos", " --eos-id 10"), "10 10");
  EXPECT_EQ(export_ids("both", " --eos-id 0 --bos-id 7"), "7 0");

  auto error = [&](const std::string& flags) {
    try {
      run_cli("ckpt export " + ckpt_dir + " --output " + root_ + "/bad" + flags);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error(" --eos-id 11"), "--eos-id 11: not an id of the model, whose vocab_size is 11 (ids 0 to 10)");
  EXPECT_EQ(error(" --eos-id 3 --bos-id 11"),
            "--bos-id 11: not an id of the model, whose vocab_size is 11 (ids 0 to 10)");
  EXPECT_EQ(error(" --bos-id 3"), "--bos-id 3: needs --eos-id as well");
  EXPECT_EQ(error(" --eos-id -1"), "--eos-id: -1 is less than 0");
  const std::string sidecar = root_ + "/data.tokenizer.yaml";
  spit(sidecar, "kind: byte\nfiles: {}\nvocab_size: 257\neod: 256\n");
  EXPECT_EQ(error(" --eos-id 3 --tokenizer-sidecar " + sidecar),
            "--eos-id / --bos-id: the export states the ids of the tokenizer (" + sidecar +
                ": byte, eod 256); the options are for a checkpoint that records none");
  EXPECT_FALSE(fs::exists(root_ + "/bad"));
}

}  // namespace
