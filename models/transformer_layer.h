// transformer_layer.h: one pre-LN GPT block, forward and backward written out op by op.
//
//   x  -> ln1 -> qkv (column-parallel) -> causal attention -> proj (row-parallel) -> dropout + x  = x2
//   x2 -> ln2 -> fc1 (column-parallel, GELU) -> fc2 (row-parallel) -> dropout + x2 = out
// The tensor-parallel linears (parallel/parallel_linear.h) own their weights, biases and communication:
// QKV and fc1 hold this rank's heads / ffn columns, proj and fc2 sum their partial outputs over the group
// before their bias; norms are replicated. With sequence parallelism the norms, dropout and residuals run on
// this rank's sequence shard and the linears gather / reduce-scatter at their edges.
// Fusions (core/ops.h): the QKV and fc1 biases, fc1's GELU, fc1's dGELU with its bias gradient (on fc2's
// input-gradient GEMM) and the bias gradients of the weight-gradient GEMMs ride on GEMM epilogues; each
// residual add is one dropout_add. On the CPU all of it computes exactly what the separate ops computed.
#pragma once
#include <map>
#include <vector>

#include "core/config/config.h"
#include "core/parameter.h"
#include "core/tensor.h"
#include "parallel/parallel_linear.h"
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
  // The attention's options, and the dropout before a residual add (masks keyed by global coordinates,
  // T the full sequence length): none outside training.
  AttentionOptions attention_options(const StepContext& ctx) const;
  DropoutOptions residual_dropout(const StepContext& ctx, uint64_t site, int64_t T) const;

  int64_t index_;
  ModelConfig cfg_;
  DType dtype_;
  Device device_;
  bool recompute_;
  TensorParallel tp_;
  int64_t heads_;  // this rank's heads
  uint64_t site_attn_probs_, site_attn_out_, site_mlp_out_;
  Parameter ln1_w_, ln1_b_;   // (C)
  ColumnParallelLinear qkv_;  // C -> 3C: weight (3C/tp, C), rows per head [q | k | v], this rank's heads
  RowParallelLinear proj_;    // C -> C: weight (C, C/tp), the input columns of this rank's heads
  Parameter ln2_w_, ln2_b_;   // (C)
  ColumnParallelLinear fc1_;  // C -> F: weight (F/tp, C), GELU on its epilogue
  RowParallelLinear fc2_;     // F -> C: weight (C, F/tp)
  std::map<int, Activations> saved_;
};

}  // namespace mt
