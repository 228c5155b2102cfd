// model_shapes.h: what the planner's memory and time models need to know of an architecture, on one
// tensor-parallel rank: the widths of a layer's GEMMs, which tensors carry biases, what the norms and the MLP
// keep for backward, and the parameters in the model's order. One table for GPT and Llama (models/
// transformer_layer.cpp, models/gpt.cpp, models/norm.cpp): the models that read it have no per-arch branches
// beyond the MLP's activation (GELU on fc1's epilogue or a separate SwiGLU).
#pragma once
#include <cstdint>
#include <vector>

#include "core/config/config.h"

namespace mt::plan {

struct ModelShapes {
  double C = 1;               // hidden
  double D = 1;               // head_dim
  double Ht = 1;              // this rank's query heads: num_heads / tp
  double Gt = 1;              // this rank's key/value heads (query groups): kv_heads / tp; GPT: Ht
  double Ct = 1;              // Ht * D: the attention output's columns, proj's input
  double qkv = 3;             // QKV's output columns (Ht + 2 Gt) * D: per group its R query heads, a key and a value
  double Ft = 1;              // ffn_hidden_size / tp: fc2's input columns
  double fc1 = 1;             // fc1's output columns: Ft (GPT), 2 Ft (Llama: gate and up interleaved, one GEMM)
  double Vt = 1;              // padded vocabulary rows / tp
  double P = 0;               // position table rows (GPT: max_position_embeddings; Llama: none, rotary embeddings)
  bool linear_bias = true;    // QKV, proj, fc1, fc2 with biases (GPT) or without (Llama)
  bool layernorm = true;      // LayerNorm: a bias and a saved mean beside rstd (GPT); RMSNorm: weight and rstd
  bool gelu_epilogue = true;  // GPT: GELU on fc1's epilogue, the pre-activation kept; Llama: a separate SwiGLU
  bool rotary = false;        // Llama: rotary embeddings on q and k (in place), and their inverse on dq, dk
  bool tie_embeddings = true;

  // Elements of one norm's parameters (weight, and LayerNorm's bias), and the f32 values per row it keeps.
  double norm_parameters() const { return layernorm ? 2 * C : C; }
  double norm_stats() const { return layernorm ? 2 : 1; }
  // One layer's parameters in TransformerLayer::parameters() order (ln1, qkv, proj, ln2, fc1, fc2; each
  // linear's weight then its bias): the gradient buffer's buckets follow this order.
  std::vector<double> layer_parameters() const;
  double layer_parameter_count() const;
  // Weight elements of one layer's four GEMMs on this rank (qkv, proj, fc1, fc2): 2 FLOPs each per token.
  double layer_gemm_weights() const { return (qkv + fc1) * C + C * (Ct + Ft); }
};

// The shapes of `m` on one of `tp` tensor-parallel ranks (rank 0: ranks differ by no more than a padding row).
ModelShapes model_shapes(const ModelConfig& m, int64_t tp);

}  // namespace mt::plan
