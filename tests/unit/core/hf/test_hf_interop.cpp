// test_hf_interop.cpp: the Hugging Face export and import (GPT2LMHeadModel, LlamaForCausalLM): export -> import
// gives back every tensor exactly, Llama's q/k/v and gate/up rows land where LLAMA.md puts them, the safetensors
// reader, and every refusal of `ckpt import` naming the file and the key.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <limits>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tests/unit/file_text.h"
#include "core/checkpoint/checkpoint.h"
#include "core/hf/hf_export.h"
#include "core/hf/hf_import.h"
#include "core/hf/safetensors.h"
#include "core/config/config.h"
#include "tests/unit/temp_dir.h"
#include "tests/unit/core/checkpoint/checkpoint_fixture.h"
#include "tests/unit/core/hf/hf_tiny_model.h"

namespace fs = std::filesystem;
using namespace mt;
using json = nlohmann::json;

namespace {

using testing_util::slurp;
using testing_util::spit;

using ckpt_test::error_of;

using hf_test::TinyModel;

// Imports `hf` with our padding and requires every tensor back: the first V rows of the vocabulary tables equal,
// their padding rows zero, everything else identical (bf16 exports: the bf16 rounding is exact here).
void expect_round_trip(const TinyModel& m, const std::string& hf) {
  HfModelShape s = read_hf_config(hf);
  EXPECT_EQ(s.arch, m.llama ? HfArch::llama : HfArch::gpt);
  EXPECT_EQ(s.groups, m.G);
  EXPECT_EQ(s.ffn, m.F);
  EXPECT_EQ(s.tied, m.tied);
  EXPECT_EQ(s.layernorm_eps, 1e-6);
  s.padded_vocab = m.Vpad;
  const auto got = read_hf_weights(hf, s);
  ASSERT_EQ(got.size(), m.params.size());
  for (const auto& [name, t] : got) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(m.params.count(name));
    ASSERT_EQ(t.shape(), m.params.at(name).first);
    std::vector<float> want = m.v(name);
    if (name == "embedding.word_embeddings.weight" || name == "lm_head.weight")
      std::fill(want.begin() + m.V * m.C, want.end(), 0.f);
    EXPECT_EQ(t.to_floats(), want);
  }
}

class HfInterop : public ::testing::Test {
 protected:
  testing_util::TempDir tmp_{"mt_hf"};
  std::string path(const std::string& name) const { return tmp_ / name; }
};

TEST_F(HfInterop, GptExportImportRoundTripsEveryTensor) {
  for (bool tied : {true, false})
    for (DType dtype : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(fmt::format("tied={} dtype={}", tied, dtype_name(dtype)));
      TinyModel m(false, tied);
      const std::string name = fmt::format("gpt_{}_{}", tied, dtype_name(dtype));
      export_hf(CheckpointReader(m.save(path(name + "_ckpt"))), path(name), dtype);
      expect_round_trip(m, path(name));
    }
}

TEST_F(HfInterop, LlamaExportWritesLlamaNamesAndConfig) {
  TinyModel m(true, false);  // G = 2 groups of R = 2 query heads, D = 4
  export_hf(CheckpointReader(m.save(path("ckpt"))), path("hf"));
  SafetensorsReader r(path("hf/model.safetensors"));
  EXPECT_EQ(r.tensors().size(), 3 + 9 * static_cast<size_t>(m.L));  // embed, norm, lm_head
  EXPECT_FALSE(r.has("model.embed_tokens.bias"));
  const int64_t C = m.C, D = 4, R = 2;
  auto rows_of = [&](const std::string& hf, const std::string& ours, auto our_row) {
    SCOPED_TRACE(hf);
    const Tensor t = r.read(hf);
    const std::vector<float> got = t.to_floats(), &w = m.v(ours);
    for (int64_t i = 0; i < t.dim(0); ++i)
      for (int64_t c = 0; c < C; ++c) ASSERT_EQ(got[i * C + c], w[our_row(i) * C + c]) << "row " << i;
  };
  // Our qkv rows per group g: R query heads (head h = g*R + r), then k, then v (LLAMA.md).
  rows_of("model.layers.1.self_attn.q_proj.weight", "layers.1.attn.qkv.weight",
          [&](int64_t i) { return ((i / D / R) * (R + 2) + (i / D) % R) * D + i % D; });
  rows_of("model.layers.1.self_attn.k_proj.weight", "layers.1.attn.qkv.weight",
          [&](int64_t i) { return ((i / D) * (R + 2) + R) * D + i % D; });
  rows_of("model.layers.1.self_attn.v_proj.weight", "layers.1.attn.qkv.weight",
          [&](int64_t i) { return ((i / D) * (R + 2) + R + 1) * D + i % D; });
  rows_of("model.layers.0.mlp.gate_proj.weight", "layers.0.mlp.fc1.weight", [](int64_t i) { return 2 * i; });
  rows_of("model.layers.0.mlp.up_proj.weight", "layers.0.mlp.fc1.weight", [](int64_t i) { return 2 * i + 1; });
  rows_of("model.embed_tokens.weight", "embedding.word_embeddings.weight", [](int64_t i) { return i; });
  rows_of("lm_head.weight", "lm_head.weight", [](int64_t i) { return i; });
  EXPECT_EQ(r.entry("model.embed_tokens.weight").shape, (Shape{m.V, C}));  // padding dropped
  EXPECT_EQ(r.entry("model.layers.0.self_attn.o_proj.weight").shape, (Shape{C, C}));
  EXPECT_EQ(r.entry("model.layers.0.mlp.down_proj.weight").shape, (Shape{C, m.F}));
  EXPECT_TRUE(r.has("model.norm.weight") && r.has("model.layers.0.input_layernorm.weight") &&
              r.has("model.layers.0.post_attention_layernorm.weight"));

  const json cfg = json::parse(slurp(path("hf/config.json")));
  EXPECT_EQ(cfg["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(cfg["model_type"], "llama");
  EXPECT_EQ(cfg["hidden_size"], 16);
  EXPECT_EQ(cfg["intermediate_size"], 24);
  EXPECT_EQ(cfg["num_hidden_layers"], 2);
  EXPECT_EQ(cfg["num_attention_heads"], 4);
  EXPECT_EQ(cfg["num_key_value_heads"], 2);
  EXPECT_EQ(cfg["head_dim"], 4);
  EXPECT_EQ(cfg["rms_norm_eps"], 1e-6);
  EXPECT_EQ(cfg["rope_theta"], 5000);
  EXPECT_TRUE(cfg["rope_scaling"].is_null());
  EXPECT_EQ(cfg["max_position_embeddings"], 6);
  EXPECT_EQ(cfg["vocab_size"], 11);
  EXPECT_EQ(cfg["tie_word_embeddings"], false);
  EXPECT_EQ(cfg["attention_bias"], false);
  EXPECT_EQ(cfg["mlp_bias"], false);
  EXPECT_EQ(cfg["hidden_act"], "silu");
  EXPECT_TRUE(cfg["eos_token_id"].is_null());  // no ids given: unknown, not vocab_size - 1
  EXPECT_EQ(cfg["torch_dtype"], "float32");
}

TEST_F(HfInterop, LlamaExportImportRoundTripsEveryTensor) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    TinyModel m(true, tied);
    const std::string name = tied ? "tied" : "untied";
    export_hf(CheckpointReader(m.save(path(name + "_ckpt"))), path(name), DType::bf16);
    expect_round_trip(m, path(name));
    EXPECT_EQ(read_hf_config(path(name)).rotary_base, 5000);
  }
  const std::string y = hf_model_yaml(read_hf_config(path("untied"), {.seq_length = 4, .dropout = 0.25}));
  EXPECT_NE(y.find("arch: llama\n"), std::string::npos) << y;
  EXPECT_NE(y.find("num_query_groups: 2\n"), std::string::npos) << y;
  EXPECT_NE(y.find("rotary_base: 5000\n"), std::string::npos) << y;
  EXPECT_NE(y.find("ffn_hidden_size: 24\n"), std::string::npos) << y;
  EXPECT_NE(y.find("seq_length: 4\n"), std::string::npos) << y;
  EXPECT_NE(y.find("max_position_embeddings: 6\n"), std::string::npos) << y;
  EXPECT_NE(y.find("dropout: 0.25\n"), std::string::npos) << y;
  EXPECT_NE(y.find("tie_embeddings: false\n"), std::string::npos) << y;
}

// Rotary scaling reads from transformers 5.x's rope_parameters and 4.x's rope_scaling alike, each type's keys as
// transformers reads them (yarn: beta_fast and beta_slow default to 32 and 1, a missing original context is
// max_position_embeddings), into model.rope_scaling.
TEST_F(HfInterop, RopeScalingImportsFromEitherKey) {
  TinyModel m(true, false);
  export_hf(CheckpointReader(m.save(path("rope_ckpt"))), path("rope"), DType::f32);
  const std::string file = path("rope/config.json");
  json cfg = json::parse(slurp(file));
  cfg.erase("rope_theta");
  cfg["rope_scaling"] = nullptr;
  cfg["rope_parameters"] = {{"rope_type", "llama3"},   {"rope_theta", 7000.0},
                            {"factor", 8.0},           {"low_freq_factor", 1.0},
                            {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 4}};
  spit(file, cfg.dump(2));
  const HfModelShape l3 = read_hf_config(path("rope"));
  EXPECT_EQ(l3.rotary_base, 7000);
  EXPECT_EQ(l3.rope_scaling, (RopeScaling{.type = RopeScalingType::llama3,
                                          .factor = 8,
                                          .low_freq_factor = 1,
                                          .high_freq_factor = 4,
                                          .original_max_position_embeddings = 4}));
  const std::string y = hf_model_yaml(l3);
  EXPECT_NE(y.find("  rope_scaling:\n    type: llama3\n    factor: 8\n    low_freq_factor: 1\n"), std::string::npos)
      << y;
  cfg.erase("rope_parameters");
  cfg["rope_theta"] = 6000.0;
  cfg["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}, {"beta_fast", nullptr}};  // 4.x's older "type" key
  spit(file, cfg.dump(2));
  const HfModelShape yarn = read_hf_config(path("rope"));
  EXPECT_EQ(yarn.rotary_base, 6000);
  EXPECT_EQ(yarn.rope_scaling, (RopeScaling{.type = RopeScalingType::yarn,
                                            .factor = 4,
                                            .original_max_position_embeddings = yarn.positions,
                                            .beta_fast = 32,
                                            .beta_slow = 1}));
}

// ---- refusals --------------------------------------------------------------------------------------------

class HfImportRefusal : public HfInterop {
 protected:
  void SetUp() override {
    TinyModel m(true, false);
    export_hf(CheckpointReader(m.save(path("ckpt"))), path("llama"));
    TinyModel g(false, true);
    export_hf(CheckpointReader(g.save(path("gckpt"))), path("gpt"));
  }
  // Edits the llama (or gpt) config.json and returns the import's error.
  std::string config_error(const std::string& which, const std::function<void(json&)>& edit) {
    json cfg = json::parse(slurp(path(which + "/config.json")));
    edit(cfg);
    spit(path(which + "/config.json"), cfg.dump(2));
    return error_of([&] { read_hf_config(path(which)); });
  }
  void expect_names(const std::string& msg, const std::string& key) {
    EXPECT_NE(msg.find("config.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find(key), std::string::npos) << msg;
  }
  std::vector<std::pair<std::string, Tensor>> weights(const std::string& which) {
    HfModelShape s = read_hf_config(path(which));
    s.padded_vocab = 16;
    return read_hf_weights(path(which), s);
  }
};

TEST_F(HfImportRefusal, ConfigKeysWeDoNotComputeAreNamed) {
  expect_names(config_error("llama", [](json& c) { c["architectures"] = {"GemmaForCausalLM"}; }), "architectures");
  expect_names(config_error("llama",
                            [](json& c) {
                              c["architectures"] = {"LlamaForCausalLM"};
                              c.erase("rope_scaling");
                              c["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
                            }),
               "rope_scaling");
  expect_names(config_error("llama",
                            [](json& c) {
                              c["rope_scaling"] = nullptr;
                              c["rope_parameters"] = {{"rope_type", "longrope"}, {"rope_theta", 5000}};
                            }),
               "rope_parameters");
  expect_names(config_error("llama",
                            [](json& c) {
                              c["rope_parameters"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"rope_theta", 5000}};
                            }),
               "rope_parameters: low_freq_factor is missing");
  expect_names(config_error("llama",
                            [](json& c) {
                              c.erase("rope_parameters");
                              c["attention_bias"] = true;
                            }),
               "attention_bias");
  expect_names(config_error("llama",
                            [](json& c) {
                              c["attention_bias"] = false;
                              c["mlp_bias"] = true;
                            }),
               "mlp_bias");
  expect_names(config_error("llama",
                            [](json& c) {
                              c["mlp_bias"] = false;
                              c["head_dim"] = 5;  // another width is Qwen3's (and Llama's) to give, an odd one no
                            }),
               "head_dim = 5: rotary embeddings rotate pairs");
  expect_names(config_error("llama",
                            [](json& c) {
                              c["head_dim"] = 4;
                              c["hidden_act"] = "gelu";
                            }),
               "hidden_act");
  expect_names(config_error("llama",
                            [](json& c) {
                              c["hidden_act"] = "silu";
                              c["num_key_value_heads"] = 3;
                            }),
               "num_key_value_heads");
  expect_names(config_error("llama",
                            [](json& c) {
                              c["num_key_value_heads"] = 2;
                              c.erase("hidden_size");
                            }),
               "hidden_size is missing");
  expect_names(config_error("gpt", [](json& c) { c["activation_function"] = "relu"; }), "activation_function");
  expect_names(config_error("gpt",
                            [](json& c) {
                              c["activation_function"] = "gelu_new";
                              c["scale_attn_by_inverse_layer_idx"] = true;
                            }),
               "scale_attn_by_inverse_layer_idx");
  expect_names(config_error("gpt",
                            [](json& c) {
                              c["scale_attn_by_inverse_layer_idx"] = false;
                              c.erase("architectures");
                            }),
               "architectures");
  {  // valid again but for the option
    json c = json::parse(slurp(path("llama/config.json")));
    c["hidden_size"] = 16;
    spit(path("llama/config.json"), c.dump());
  }
  const std::string msg = error_of([&] { read_hf_config(path("llama"), {.seq_length = 7}); });
  EXPECT_NE(msg.find("--seq-length 7"), std::string::npos) << msg;
  fs::remove(path("llama/config.json"));
  EXPECT_NE(error_of([&] { read_hf_config(path("llama")); }).find("config.json: cannot read it"), std::string::npos);
}

TEST_F(HfImportRefusal, TensorsMissingUnexpectedOrMisshapenAreNamed) {
  SafetensorsReader r(path("llama/model.safetensors"));
  auto rewrite = [&](const std::function<void(std::vector<std::pair<std::string, Tensor>>&)>& edit) {
    std::vector<std::pair<std::string, Tensor>> ts;
    for (const auto& [name, e] : r.tensors()) ts.emplace_back(name, r.read(name));
    edit(ts);
    write_safetensors(path("llama/model.safetensors"), ts, DType::f32);
  };
  EXPECT_EQ(weights("llama").size(), 3 + 6u * 2);  // qkv and fc1 gathered from three and two HF tensors
  rewrite([](auto& ts) { std::erase_if(ts, [](auto& t) { return t.first == "model.layers.1.mlp.up_proj.weight"; }); });
  std::string msg = error_of([&] { weights("llama"); });
  EXPECT_NE(msg.find("has no tensor model.layers.1.mlp.up_proj.weight"), std::string::npos) << msg;
  rewrite([&](auto& ts) { ts.emplace_back("model.layers.0.self_attn.q_proj.bias", Tensor::zeros({16}, DType::f32)); });
  msg = error_of([&] { weights("llama"); });
  EXPECT_NE(msg.find("no place for: model.layers.0.self_attn.q_proj.bias"), std::string::npos) << msg;
  rewrite([&](auto& ts) {
    for (auto& t : ts)
      if (t.first == "model.norm.weight") t.second = Tensor::zeros({15}, DType::f32);
  });
  msg = error_of([&] { weights("llama"); });
  EXPECT_NE(msg.find("tensor model.norm.weight has shape [15]"), std::string::npos) << msg;

  // Tied GPT-2: an lm_head.weight equal to the embedding is accepted, another one refused.
  SafetensorsReader g(path("gpt/model.safetensors"));
  std::vector<std::pair<std::string, Tensor>> ts;
  for (const auto& [name, e] : g.tensors()) ts.emplace_back(name, g.read(name));
  ts.emplace_back("lm_head.weight", g.read("transformer.wte.weight"));
  ts.emplace_back("transformer.h.0.attn.masked_bias", Tensor::zeros({1}, DType::f32));  // an old saved buffer
  write_safetensors(path("gpt/model.safetensors"), ts, DType::f32);
  EXPECT_NO_THROW(weights("gpt"));
  ts[ts.size() - 2].second = Tensor::zeros(ts[ts.size() - 2].second.shape(), DType::f32);
  write_safetensors(path("gpt/model.safetensors"), ts, DType::f32);
  msg = error_of([&] { weights("gpt"); });
  EXPECT_NE(msg.find("lm_head.weight differs from transformer.wte.weight"), std::string::npos) << msg;

  fs::remove(path("gpt/model.safetensors"));
  msg = error_of([&] { weights("gpt"); });
  EXPECT_NE(msg.find("neither model.safetensors nor model.safetensors.index.json"), std::string::npos) << msg;
}

TEST_F(HfImportRefusal, ShardedWeightsAreRead) {
  SafetensorsReader r(path("llama/model.safetensors"));
  std::vector<std::pair<std::string, Tensor>> a, b;
  json map;
  for (const auto& [name, e] : r.tensors()) {
    const bool first = name.find("layers.1.") == std::string::npos;
    (first ? a : b).emplace_back(name, r.read(name));
    map[name] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  const auto all = weights("llama");
  write_safetensors(path("llama/model-00001-of-00002.safetensors"), a, DType::bf16);
  write_safetensors(path("llama/model-00002-of-00002.safetensors"), b, DType::f16);
  spit(path("llama/model.safetensors.index.json"), json{{"metadata", json::object()}, {"weight_map", map}}.dump());
  fs::remove(path("llama/model.safetensors"));
  const auto sharded = weights("llama");
  ASSERT_EQ(sharded.size(), all.size());
  for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(sharded[i].second.to_floats(), all[i].second.to_floats());
}

// A weight with inf or NaN would make every loss NaN: the import refuses it, naming the file, the tensor (its HF name),
// how many values are not finite and the first one's index, and writes no checkpoint (issue 30, item 5).
TEST_F(HfImportRefusal, NonFiniteWeightsAreNamed) {
  auto poison = [&](const std::string& which, const std::string& name, DType dtype,
                    const std::vector<std::pair<int64_t, float>>& bad) {
    SafetensorsReader r(path(which + "/model.safetensors"));
    std::vector<std::pair<std::string, Tensor>> ts;
    for (const auto& [n, e] : r.tensors()) ts.emplace_back(n, r.read(n));
    for (auto& [n, t] : ts) {
      if (n != name) continue;
      std::vector<float> v = t.to_floats();
      for (auto [i, x] : bad) v.at(static_cast<size_t>(i)) = x;
      t = Tensor::from_floats(v, t.shape());
    }
    write_safetensors(path(which + "/model.safetensors"), ts, dtype);
    return r.entry(name).shape;
  };
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const Shape up = poison("llama", "model.layers.1.mlp.up_proj.weight", DType::f32, {{7, inf}, {5, nan}, {9, -inf}});
  std::string msg = error_of([&] { weights("llama"); });
  EXPECT_EQ(msg, fmt::format("{}: tensor model.layers.1.mlp.up_proj.weight: 3 of {} values are not finite (the "
                             "first, nan, at index 5): megatrain imports only finite weights",
                             path("llama/model.safetensors"), shape_numel(up)))
      << msg;
  // In an F16 file too (an overflow there is an inf). That `ckpt import` writes nothing: test_ckpt_import.
  const Shape fc = poison("gpt", "transformer.h.0.mlp.c_fc.bias", DType::f16, {{3, -inf}});
  msg = error_of([&] { weights("gpt"); });
  EXPECT_NE(msg.find(fmt::format("tensor transformer.h.0.mlp.c_fc.bias: 1 of {} values is not finite (the first, "
                                 "-inf, at index 3)",
                                 shape_numel(fc))),
            std::string::npos)
      << msg;
}

TEST_F(HfImportRefusal, SafetensorsReaderRefusesBadFiles) {
  auto file = [&](const std::string& header, size_t data_bytes) {
    std::string s(8, '\0');
    for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
    spit(path("x.safetensors"), s + header + std::string(data_bytes, '\0'));
    return error_of([&] { SafetensorsReader r(path("x.safetensors")); });
  };
  EXPECT_NE(
      file(R"({"w":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}})", 16).find("w: dtype F64 is not supported"),
      std::string::npos);
  EXPECT_NE(file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", 16).find("do not hold shape [2]"),
            std::string::npos);
  EXPECT_NE(file(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8).find("outside the 8 data bytes"),
            std::string::npos);
  EXPECT_NE(file("{not json", 0).find("not JSON"), std::string::npos);
  spit(path("y.safetensors"), "abc");
  EXPECT_NE(error_of([&] { SafetensorsReader r(path("y.safetensors")); }).find("y.safetensors: not a safetensors file"),
            std::string::npos);
}

}  // namespace
