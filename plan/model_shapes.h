// model_shapes.h: what the planner's memory and time models need to know of an architecture, on one
// tensor-parallel rank: the widths of a layer's GEMMs, which tensors carry biases, what the norms and the MLP
// keep for backward, and the parameters in the model's order. One table for GPT and Llama (models/
// transformer_layer.cpp, models/gpt.cpp, models/norm.cpp): the models that read it have no per-arch branches
// beyond the MLP's activation (GELU on fc1's epilogue or a separate SwiGLU). A mixture-of-experts layer
// (model.moe.is_moe_layer, models/moe_mlp.h) has a router and experts in place of fc1 and fc2, so what a layer
// holds depends on its (global, 0-based) index.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/config/config.h"

namespace mt::plan {

// A MoE layer's MLP on one tensor-parallel rank (models/moe_mlp.h): the router (E, C) replicated, each expert this
// rank holds (E / EP of them with expert parallelism, split over the experts' own ETP ranks) and the shared expert
// split like the dense MLP (fc1's rows, fc2's columns, over TP), no biases. With parallel folding (ETP < TP) each of
// the TP / ETP folds of a tensor-parallel group dispatches 1 / folds of its choices.
struct MoeShapes {
  double E = 0;              // experts (0: a dense model)
  double El = 0;             // experts this rank holds: E / EP
  double ep = 1;             // expert-parallel size (parallel.expert)
  double folds = 1;          // parallel folding: TP / ETP (1: the experts split over the tensor-parallel group)
  double k = 0;              // top_k: experts per token
  double Ft = 0;             // an expert's ffn width / ETP: its fc2's input columns
  double fc1 = 0;            // an expert's fc1 rows / ETP: Ft (GPT), 2 Ft (Llama: gate and up)
  double Fst = 0;            // the shared expert's width / tp (0: none)
  double sfc1 = 0;           // the shared expert's fc1 rows / tp
  bool keep_logits = false;  // the router's (N, E) f32 logits kept for the aux and z losses' gradients
  double imbalance = 1;      // expert parallelism: rows this rank's experts receive over the balanced share (bound)
  bool shared() const { return Fst > 0; }
  // The experts' grid differs from the dense one (EP > 1 or folding): their own gradient buffer and optimizer.
  bool apart() const { return ep > 1 || folds > 1; }
};

// The expert-parallel routing the planner assumes (MoeShapes::imbalance) and where it comes from: a run's measured
// factor (`plan --moe-imbalance`, model.moe.plan_imbalance) or the capacity factor (which drops rows beyond it; it
// holds per microbatch, so with CP times CP over the context ranks in an EP group where those are fewer),
// whichever is lower, never above the worst dropless routing (every choice of the EP group on one rank's experts:
// EP x min(top_k, E / EP) / top_k); else balanced routing (1), which the source then says is not a bound. Factor 1
// without expert parallelism (a rank's experts see all its rows).
struct MoeImbalance {
  double factor = 1;
  std::string source;
};
// cp: the context-parallel size; folds: tensor / expert_tensor (parallel folding), so ep / folds context x data ranks.
MoeImbalance moe_imbalance(const MoeConfig& moe, int64_t ep, int64_t cp = 1, int64_t folds = 1);

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
  bool qkv_bias = true;       // QKV with a bias (GPT, or model.qkv_bias)
  bool layernorm = true;      // LayerNorm: a bias and a saved mean beside rstd (GPT); RMSNorm: weight and rstd
  bool gelu_epilogue = true;  // GPT: GELU on fc1's epilogue, the pre-activation kept; Llama: a separate SwiGLU
  bool rotary = false;        // Llama: rotary embeddings on q and k (in place), and their inverse on dq, dk
  bool qk_norm = false;       // Qwen3: q and k heads RMS-normalized, through slot-major copies of qkv
  double attention_work = 1;  // sliding windows: the attention's work against causal attention's, over the layers
  bool tie_embeddings = true;
  MoeShapes moe;                 // the MoE layers' MLP (moe.E == 0: a dense model)
  std::vector<bool> moe_layers;  // (num_layers) whether each layer is MoE; empty for a dense model

  bool is_moe(int64_t layer) const {
    return layer >= 0 && static_cast<size_t>(layer) < moe_layers.size() && moe_layers[static_cast<size_t>(layer)];
  }
  // How many of the layers [begin, begin + n) are MoE.
  int64_t moe_count(int64_t begin, int64_t n) const;
  // Elements of one norm's parameters (weight, and LayerNorm's bias), and the f32 values per row it keeps.
  double norm_parameters() const { return layernorm ? 2 * C : C; }
  double norm_stats() const { return layernorm ? 2 : 1; }
  // Layer `layer`'s parameters in TransformerLayer::parameters() order (ln1, qkv, proj, ln2, then fc1, fc2 or a
  // MoE layer's MoeMlp::parameters(): the router, each of this rank's experts' fc1 and fc2, the shared expert's;
  // each linear's weight then its bias): the gradient buffer's buckets follow this order. With `experts`, the
  // experts' go there instead (expert parallelism: app/train/trainer.cpp gives them a gradient buffer of their own).
  std::vector<double> layer_parameters(int64_t layer, std::vector<double>* experts = nullptr) const;
  double layer_parameter_count(int64_t layer) const;
  // Weight elements of layer `layer`'s GEMMs on this rank that one token passes through (qkv, proj, and fc1,
  // fc2; a MoE layer's router, top_k experts and the shared expert): 2 FLOPs each per token.
  double layer_gemm_weights(int64_t layer) const;
};

// The shapes of `m` on one of `tp` tensor-parallel ranks (rank 0: ranks differ by no more than a padding row) and
// of `ep` expert-parallel ranks.
// `etp`: the experts' tensor-parallel size (0: tp).
ModelShapes model_shapes(const ModelConfig& m, int64_t tp, int64_t ep = 1, int64_t etp = 0);

// The whole model's parameters (tensor-parallel size 1, the padded vocabulary): every one, or with `active` those
// one token passes through (a MoE layer's router, its top_k experts and the shared expert; Mixtral 8x7B: 46.7B
// total, 12.9B active).
double model_parameters(const ModelConfig& m, bool active);

}  // namespace mt::plan
