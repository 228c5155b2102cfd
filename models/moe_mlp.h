// moe_mlp.h: a mixture-of-experts MLP (model.moe) on one rank, built from the op layer's MoE ops: the router
// (fp32 logits of a bias-free linear C -> E, then moe_router_forward: top_k experts and their weights), the
// token dispatch (moe_dispatch_index, moe_permute: each expert's tokens a contiguous row slice), each expert's
// MLP as GEMMs on its slice (the architecture's own: GELU for gpt, SwiGLU for llama; no biases), and the weighted
// sum back per token (moe_unpermute); backward the same way in reverse. Parameters are named by global expert
// index (<prefix>.router.weight, <prefix>.experts.<e>.fc1.weight, <prefix>.experts.<e>.fc2.weight), so a later
// expert-parallel layout holds a subset of the same names. With model.moe.shared_expert_ffn_hidden_size, a shared
// expert (DeepSeek's, ungated: <prefix>.shared_expert.fc1/fc2.weight) that every token passes adds its output.
//
// Not yet here (issue 25): the auxiliary and z losses and the expert bias update, capacity (dropping), tensor and
// expert parallelism; the class refuses configs that need them.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/tensor/parameter.h"
#include "core/tensor/tensor.h"

namespace mt {

class MoeMlp {
 public:
  // cfg.moe.enabled(); `prefix` e.g. "layers.3.mlp"; values in `dtype`, initialised from `seed` (fc2 with
  // `output_init_std`, Megatron's scaled init of output projections, the others with cfg.init_std).
  MoeMlp(const ModelConfig& cfg, const std::string& prefix, DType dtype, float output_init_std, uint64_t seed,
         Device device = Device::cpu);

  // What forward keeps for backward.
  struct Saved {
    Tensor x;                       // (N, C) the input
    Tensor scores, experts, probs;  // (N, E) f32, (N, k) i32, (N, k) f32
    Tensor row_of;                  // (N, k) i32
    std::vector<int64_t> counts;    // (E) choices per expert, on the host
    Tensor xp, h, act, y;           // (N*k, C), (N*k, F or 2F), (N*k, F), (N*k, C): the permuted rows
    Tensor shared_h, shared_act;    // the shared expert's (N, Fs or 2Fs) and (N, Fs); undefined without one
  };
  // x (N, C) -> (N, C).
  Tensor forward(const Tensor& x, Saved& s) const;
  // dout (N, C) -> dx (N, C); accumulates every parameter's gradient.
  Tensor backward(const Tensor& dout, const Saved& s);

  // The router's weight, fc1 and fc2 of each expert in expert order, then the shared expert's fc1 and fc2.
  std::vector<Parameter*> parameters();
  Parameter& router() { return router_; }
  Parameter& fc1(int64_t e) { return fc1_.at(static_cast<size_t>(e)); }
  Parameter& fc2(int64_t e) { return fc2_.at(static_cast<size_t>(e)); }
  bool has_shared_expert() const { return shared_fc1_.value.defined(); }
  Parameter& shared_fc1() { return shared_fc1_; }
  Parameter& shared_fc2() { return shared_fc2_; }

 private:
  ModelConfig cfg_;
  DType dtype_;
  Device device_;
  Parameter router_;                   // (E, C)
  std::vector<Parameter> fc1_;         // per expert (F, C), or (2F, C) gate and up interleaved for llama
  std::vector<Parameter> fc2_;         // per expert (C, F)
  Parameter shared_fc1_, shared_fc2_;  // (Fs or 2Fs, C), (C, Fs); undefined without a shared expert
};

}  // namespace mt
