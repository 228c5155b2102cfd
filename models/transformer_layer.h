// transformer_layer.h: one pre-LN GPT block, forward and backward written out op by op.
//
//   x -> ln1 -> qkv GEMM -> causal attention -> proj GEMM -> dropout -> + x = x2
//   x2 -> ln2 -> fc1 GEMM -> GELU -> fc2 GEMM -> dropout -> + x2 = out
#pragma once
#include <map>
#include <vector>

#include "core/config/config.h"
#include "core/tensor.h"
#include "core/parameter.h"

namespace mt {

// Per-microbatch facts every layer needs.
struct StepContext {
  int64_t sample_offset = 0;  // global index of the microbatch's first sample (keys dropout masks)
  bool training = true;       // false: no dropout, nothing kept for backward
  uint64_t seed = 0;
};

class TransformerLayer {
 public:
  TransformerLayer(int64_t index, const ModelConfig& cfg, DType dtype, uint64_t seed, bool recompute);

  // x (B, T, C) -> (B, T, C). In training, keeps what backward needs under microbatch id `mb`
  // (only x itself when recomputing).
  Tensor forward(const Tensor& x, int mb, const StepContext& ctx);
  // dout (B, T, C) -> dx (B, T, C); accumulates parameter gradients and drops microbatch `mb`'s activations.
  Tensor backward(const Tensor& dout, int mb);

  std::vector<Parameter*> parameters();

 private:
  struct Activations {
    StepContext ctx;
    Tensor x;                 // (B, T, C) layer input
    Tensor ln1, ln1_mean, ln1_rstd;  // (B*T, C), (B*T), (B*T)
    Tensor qkv;               // (B, T, H, 3, D)
    Tensor att, att_lse;      // (B, T, C), (B, H, T)
    Tensor x2;                // (B, T, C) residual after attention
    Tensor ln2, ln2_mean, ln2_rstd;
    Tensor fc1;               // (B*T, F) pre-activation
    Tensor gelu;              // (B*T, F)
  };
  // Runs the block on a.x, filling the activations; returns the output.
  Tensor run(Activations& a, bool keep);

  int64_t index_;
  ModelConfig cfg_;
  DType dtype_;
  bool recompute_;
  uint64_t site_attn_probs_, site_attn_out_, site_mlp_out_;
  Parameter ln1_w_, ln1_b_;   // (C)
  Parameter qkv_w_, qkv_b_;   // (3C, C), (3C): rows per head [q | k | v]
  Parameter proj_w_, proj_b_; // (C, C), (C)
  Parameter ln2_w_, ln2_b_;   // (C)
  Parameter fc1_w_, fc1_b_;   // (F, C), (F)
  Parameter fc2_w_, fc2_b_;   // (C, F), (C)
  std::map<int, Activations> saved_;
};

// out (N, out_features) = x (N, in) @ w^T (w is (out, in)) + b
void linear_forward(const Tensor& x, const Parameter& w, const Parameter& b, Tensor& out);
// Accumulates w.grad and b.grad; writes dx (N, in) when dx is defined.
void linear_backward(const Tensor& dout, const Tensor& x, Parameter& w, Parameter& b, Tensor* dx);

}  // namespace mt
