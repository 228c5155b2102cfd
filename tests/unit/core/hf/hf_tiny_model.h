// hf_tiny_model.h: a synthetic checkpoint of a tiny GPT or Llama with every element distinct, for the Hugging Face
// interop tests of core/hf and of `megatrain ckpt import` (tests/unit/app/cli).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/checkpoint/checkpoint.h"
#include "core/tensor/tensor.h"

namespace mt::hf_test {

// A synthetic checkpoint with every element distinct (exact in fp32 and bf16: small integers times 1/8).
struct TinyModel {
  bool llama = false, tied = false;
  int64_t L = 2, C = 16, H = 4, G = 2, F = 24, V = 11, Vpad = 16, P = 6;
  std::map<std::string, std::pair<Shape, std::vector<float>>> params;  // our names, without "model."

  TinyModel(bool llama_, bool tied_) : llama(llama_), tied(tied_) {
    if (!llama) G = H, F = 4 * C;
    const int64_t D = C / H;
    float base = 0;
    auto add = [&](const std::string& name, Shape s) {
      std::vector<float> v(static_cast<size_t>(shape_numel(s)));
      for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((static_cast<int64_t>(base) + i) % 251) / 8.f;
      base += 97;
      params[name] = {s, v};
    };
    add("embedding.word_embeddings.weight", {Vpad, C});
    if (!llama) add("embedding.position_embeddings.weight", {P, C});
    for (int64_t i = 0; i < L; ++i) {
      const std::string p = fmt::format("layers.{}.", i);
      add(p + "ln1.weight", {C});
      add(p + "attn.qkv.weight", {(H + 2 * G) * D, C});
      add(p + "attn.proj.weight", {C, H * D});
      add(p + "ln2.weight", {C});
      add(p + "mlp.fc1.weight", {llama ? 2 * F : F, C});
      add(p + "mlp.fc2.weight", {C, F});
      if (!llama)
        for (auto [n, s] : std::vector<std::pair<std::string, Shape>>{{"ln1.bias", {C}},
                                                                      {"attn.qkv.bias", {3 * C}},
                                                                      {"attn.proj.bias", {C}},
                                                                      {"ln2.bias", {C}},
                                                                      {"mlp.fc1.bias", {F}},
                                                                      {"mlp.fc2.bias", {C}}})
          add(p + n, s);
    }
    add("final_ln.weight", {C});
    if (!llama) add("final_ln.bias", {C});
    if (!tied) add("lm_head.weight", {Vpad, C});
  }

  std::string config() const {
    std::string m = fmt::format(
        "model:\n  arch: {}\n  num_layers: {}\n  hidden_size: {}\n  num_heads: {}\n  ffn_hidden_size: {}\n"
        "  seq_length: {}\n  max_position_embeddings: {}\n  vocab_size: {}\n  tie_embeddings: {}\n"
        "  dropout: 0.1\n  attention_dropout: 0.05\n  layernorm_eps: 1.0e-06\n  init_std: 0.02\n",
        llama ? "llama" : "gpt", L, C, H, F, P, P, V, tied ? "true" : "false");
    if (llama) m += fmt::format("  num_query_groups: {}\n  rotary_base: 5000\n", G);
    return m + "training:\n  seed: 1\n";
  }

  std::string save(const std::string& save_dir) const {
    std::vector<TensorSlice> ts;
    for (const auto& [name, p] : params)
      ts.push_back({"model." + name, p.first, {}, Tensor::from_floats(p.second, p.first)});
    CheckpointState st;
    st.iteration = 7;
    st.config_yaml = config();
    return save_checkpoint(save_dir, st, ts, 0);
  }
  const std::vector<float>& v(const std::string& name) const { return params.at(name).second; }
};

}  // namespace mt::hf_test
