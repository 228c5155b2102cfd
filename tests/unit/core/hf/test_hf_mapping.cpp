// test_hf_mapping.cpp: the Hugging Face name and layout table for the mixtures of experts (Mixtral, Qwen2-MoE):
// which tensors each family has, where the experts' gate and up rows come from, and the two rules only Qwen2-MoE
// needs (zeros for what we lack, the shared expert's down_proj doubled).
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "core/checkpoint/checkpoint.h"
#include "core/hf/hf_mapping.h"

using namespace mt;

namespace {

HfModelShape tiny_moe(HfArch arch) {
  HfModelShape s{.arch = arch,
                 .num_layers = 2,
                 .hidden = 4,
                 .heads = 2,
                 .groups = 1,
                 .ffn = 6,
                 .vocab = 5,
                 .padded_vocab = 8,
                 .positions = 8};
  s.tied = false;
  s.moe = {.experts = 3,
           .top_k = 2,
           .ffn = 2,
           .shared_ffn = arch == HfArch::qwen2_moe ? 4 : 0,
           .layer_pattern = arch == HfArch::qwen2_moe ? std::vector<int64_t>{0, 1} : std::vector<int64_t>{1, 1}};
  return s;
}

std::map<std::string, HfMapping> by_name(const HfModelShape& s) {
  std::map<std::string, HfMapping> m;
  for (const HfMapping& x : hf_mappings(s)) m.emplace(x.hf_name, x);
  return m;
}

TEST(HfMappingMoe, MixtralNamesEveryExpertOfEveryLayer) {
  const auto m = by_name(tiny_moe(HfArch::mixtral));
  for (int layer : {0, 1}) {
    const std::string p = "model.layers." + std::to_string(layer) + ".block_sparse_moe.";
    ASSERT_TRUE(m.count(p + "gate.weight"));
    EXPECT_EQ(m.at(p + "gate.weight").ours, "layers." + std::to_string(layer) + ".mlp.router.weight");
    for (int e = 0; e < 3; ++e)
      for (const char* w : {"w1", "w2", "w3"})
        EXPECT_TRUE(m.count(p + "experts." + std::to_string(e) + "." + w + ".weight")) << p << e << w;
    EXPECT_FALSE(m.count("model.layers." + std::to_string(layer) + ".mlp.gate_proj.weight"));
  }
  // w1 is the gate (our even fc1 rows), w3 the up (odd rows), w2 the down.
  const HfMapping& w1 = m.at("model.layers.1.block_sparse_moe.experts.2.w1.weight");
  EXPECT_EQ(w1.ours, "layers.1.mlp.experts.2.fc1.weight");
  EXPECT_EQ(w1.rows, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(m.at("model.layers.1.block_sparse_moe.experts.2.w3.weight").rows, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(m.at("model.layers.1.block_sparse_moe.experts.2.w2.weight").hf_shape, (Shape{4, 2}));
  EXPECT_FALSE(m.count("model.layers.0.self_attn.q_proj.bias"));
}

TEST(HfMappingMoe, Qwen2MoeHasDenseLayersSharedExpertsAndZeros) {
  const auto m = by_name(tiny_moe(HfArch::qwen2_moe));
  EXPECT_TRUE(m.count("model.layers.0.mlp.gate_proj.weight"));  // layer 0 dense
  EXPECT_FALSE(m.count("model.layers.0.mlp.gate.weight"));
  EXPECT_EQ(m.at("model.layers.1.mlp.experts.0.up_proj.weight").rows, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(m.at("model.layers.1.mlp.shared_expert.gate_proj.weight").hf_shape, (Shape{4, 4}));
  EXPECT_EQ(m.at("model.layers.1.mlp.shared_expert.down_proj.weight").scale, 2.f);
  EXPECT_TRUE(m.at("model.layers.1.mlp.shared_expert_gate.weight").ours.empty());
  EXPECT_TRUE(m.at("model.layers.0.self_attn.k_proj.bias").ours.empty());
  EXPECT_EQ(m.at("model.layers.0.self_attn.k_proj.bias").hf_shape, (Shape{2}));
}

TEST(HfMappingMoe, SharedExpertDownProjDoublesAndComesBackExactly) {
  const auto m = by_name(tiny_moe(HfArch::qwen2_moe));
  const HfMapping& down = m.at("model.layers.1.mlp.shared_expert.down_proj.weight");
  std::vector<float> v(16);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.1f * static_cast<float>(i) - 0.7f;
  const Tensor ours = Tensor::from_floats(v, {4, 4});
  const Tensor hf = to_hf(ours, down);
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(hf.to_floats()[i], 2 * v[i]);
  Tensor back = Tensor::zeros({4, 4}, DType::f32);
  from_hf(hf, down, back);
  EXPECT_EQ(back.to_floats(), v);
}

TEST(HfMappingMoe, ZeroTensorsExportAsZerosAndRefuseAnythingElse) {
  const auto m = by_name(tiny_moe(HfArch::qwen2_moe));
  const HfMapping& gate = m.at("model.layers.1.mlp.shared_expert_gate.weight");
  const Tensor z = to_hf(Tensor(), gate);
  EXPECT_EQ(z.shape(), (Shape{1, 4}));
  EXPECT_EQ(z.to_floats(), std::vector<float>(4, 0.f));
  Tensor none;
  EXPECT_NO_THROW(from_hf(z, gate, none));
  const std::vector<float> g{0.f, 0.5f, 0.f, 0.f};
  const Tensor gated = Tensor::from_floats(g, {1, 4});
  try {
    from_hf(gated, gate, none);
    FAIL() << "a nonzero shared_expert_gate was accepted";
  } catch (const CheckpointError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("model.layers.1.mlp.shared_expert_gate.weight is not all zeros"), std::string::npos) << msg;
    EXPECT_NE(msg.find("ungated"), std::string::npos) << msg;
  }
}

}  // namespace
