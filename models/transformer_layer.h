// transformer_layer.h: one pre-LN GPT block, forward and backward written out op by op.
//
//   x -> ln1 -> qkv GEMM -> causal attention -> proj GEMM -> dropout -> + x = x2
//   x2 -> ln2 -> fc1 GEMM -> GELU -> fc2 GEMM -> dropout -> + x2 = out
// With tensor parallelism QKV and fc1 are column-parallel (this rank's heads / ffn columns), proj and fc2
// row-parallel (partial sums reduced over the group before their bias); norms and biases after a reduction
// are replicated.
// Fusions (core/ops.h): the QKV and fc1 biases, fc1's GELU, fc1's dGELU with its bias gradient and the bias
// gradients of the weight-gradient GEMMs ride on GEMM epilogues; proj's and fc2's biases are added after the
// row-parallel reduction, so they stay separate; each residual add is one dropout_add. On the CPU all of it
// computes exactly what the separate ops computed.
#pragma once
#include <map>
#include <vector>

#include "core/config/config.h"
#include "core/tensor.h"
#include "core/parameter.h"
#include "parallel/tensor_parallel.h"

namespace mt {

// Per-microbatch facts every layer needs.
struct StepContext {
  int64_t sample_offset = 0;  // global index of the microbatch's first sample (keys dropout masks)
  bool training = true;       // false: no dropout, nothing kept for backward
  uint64_t seed = 0;
};

class TransformerLayer {
 public:
  // Parameters are made on the host; GptModel moves them to the model's device. Activations live on `device`.
  TransformerLayer(int64_t index, const ModelConfig& cfg, DType dtype, uint64_t seed, bool recompute,
                   TensorParallel tp = {}, Device device = Device::cpu);

  // x (B, T, C) -> (B, T, C). In training, keeps what backward needs under microbatch id `mb`
  // (only x itself when recomputing).
  Tensor forward(const Tensor& x, int mb, const StepContext& ctx);
  // dout (B, T, C) -> dx (B, T, C); accumulates parameter gradients and drops microbatch `mb`'s activations.
  Tensor backward(const Tensor& dout, int mb);

  std::vector<Parameter*> parameters();

 private:
  struct Activations {
    StepContext ctx;
    Tensor x;                        // (B, T, C) layer input; (B, T/tp, C) sequence shards with SP
    Tensor ln1, ln1_mean, ln1_rstd;  // (B*T, C), (B*T), (B*T); shard rows with SP (gathered again in backward)
    Tensor qkv;                      // (B, T, H/tp, 3, D)
    Tensor att, att_lse;             // (B, T, C/tp), (B, H/tp, T)
    Tensor x2;                       // (B, T, C) residual after attention
    Tensor ln2, ln2_mean, ln2_rstd;
    Tensor fc1;   // (B*T, F/tp) pre-activation (the GELU epilogue's aux)
    Tensor gelu;  // (B*T, F/tp)
  };
  // Runs the block on a.x, filling the activations; returns the output.
  Tensor run(Activations& a, bool keep);

  int64_t index_;
  ModelConfig cfg_;
  DType dtype_;
  Device device_;
  bool recompute_;
  TensorParallel tp_;
  int64_t heads_, ffn_;  // this rank's heads and ffn columns
  uint64_t site_attn_probs_, site_attn_out_, site_mlp_out_;
  Parameter ln1_w_, ln1_b_;    // (C)
  Parameter qkv_w_, qkv_b_;    // (3C/tp, C), (3C/tp): rows per head [q | k | v], this rank's heads
  Parameter proj_w_, proj_b_;  // (C, C/tp), (C)
  Parameter ln2_w_, ln2_b_;    // (C)
  Parameter fc1_w_, fc1_b_;    // (F/tp, C), (F/tp)
  Parameter fc2_w_, fc2_b_;    // (C, F/tp), (C)
  std::map<int, Activations> saved_;
};

// out (N, out_features) = x (N, in) @ w^T (w is (out, in)) + b (no bias when b is null)
void linear_forward(const Tensor& x, const Parameter& w, const Parameter* b, Tensor& out);
// Accumulates w.grad and b.grad (when b is not null); writes dx (N, in) when dx is not null.
void linear_backward(const Tensor& dout, const Tensor& x, Parameter& w, Parameter* b, Tensor* dx);

}  // namespace mt
