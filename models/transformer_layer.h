// transformer_layer.h: one pre-norm decoder block, forward and backward written out op by op.
//
//   GPT:    x  -> LayerNorm -> qkv (column-parallel) -> causal attention -> proj (row-parallel) -> dropout + x = x2
//           x2 -> LayerNorm -> fc1 (column-parallel, GELU) -> fc2 (row-parallel) -> dropout + x2 = out
//   Llama:  x  -> RMSNorm -> qkv (column-parallel, no bias) -> rotary embeddings on q and k -> grouped-query
//           attention -> proj (row-parallel) -> dropout + x = x2
//           x2 -> RMSNorm -> fc1 (column-parallel: gate and up interleaved) -> SwiGLU -> fc2 (row-parallel)
//           -> dropout + x2 = out
// A mixture-of-experts layer (model.moe.is_moe_layer) has a MoeMlp (models/moe_mlp.h) in place of fc1 and fc2.
// The tensor-parallel linears (parallel/parallel_linear.h) own their weights, biases and communication:
// QKV holds this rank's query groups (its query heads and their key / value heads) and fc1 its ffn units,
// proj and fc2 sum their partial outputs over the group before their bias; norms are replicated. With sequence
// parallelism the norms, dropout and residuals run on this rank's sequence shard and the linears gather /
// reduce-scatter at their edges, so attention and the rotary embeddings always see whole sequences (positions
// 0..T-1 in every layout).
// Fusions (core/tensor/ops.h): the QKV and fc1 biases, fc1's GELU, fc1's dGELU with its bias gradient (on fc2's
// input-gradient GEMM) and the bias gradients of the weight-gradient GEMMs ride on GEMM epilogues; each
// residual add is one dropout_add. On the CPU all of it computes exactly what the separate ops computed.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/tensor/parameter.h"
#include "core/tensor/tensor.h"
#include "models/moe_mlp.h"
#include "models/norm.h"
#include "parallel/context_parallel.h"
#include "parallel/parallel_linear.h"
#include "parallel/tensor_parallel.h"

namespace mt {

// Per-microbatch facts every layer needs.
struct StepContext {
  int64_t sample_offset = 0;  // global index of the microbatch's first sample (keys dropout masks)
  bool training = true;       // false: no dropout, nothing kept for backward
  uint64_t seed = 0;
  // Supervised fine-tuning (data.loss_mask): each target's weight in the step's mean loss, (B * T) f32 on the
  // model's device, 0 where the loss mask is 0. Empty: every target weighs 1 / (B * T) of its microbatch.
  Tensor loss_weights;
  // Packed documents (data.sft_packing: pack): each input token's position within its document, (B, T) i32 on
  // the model's device (0 at every document start). Position ids (learned and rotary) are these, and a query
  // attends only to the keys of its own document (core/tensor/ops.h AttentionOptions::positions). Empty: positions
  // 0..T-1, one causal sequence per sample.
  Tensor positions;
};

// training.recompute: selective (core/config/config.h): what each layer drops after its forward and recomputes in
// its backward, from the tensors it keeps (the same ops on the same inputs and dropout keys: the same values).
struct SelectiveRecompute {
  bool core_attn = false;  // the attention output and its log-sum-exp, from qkv
  bool layernorm = false;  // both norms' outputs, from x and x2
  bool mlp_act = false;    // a dense MLP's activation, from fc1's output
  bool moe_act = false;    // a MoE layer's experts' and shared expert's activations
  bool any() const { return core_attn || layernorm || mlp_act || moe_act; }
  // From training.recompute_modules' names (the config rules checked them).
  static SelectiveRecompute of(const std::vector<std::string>& modules);
};

class TransformerLayer {
 public:
  // Parameters are made on the host; GptModel moves them to the model's device. Activations live on `device`.
  // `ep`: the expert-parallel group of a MoE layer.
  TransformerLayer(int64_t index, const ModelConfig& cfg, DType dtype, uint64_t seed, bool recompute,
                   TensorParallel tp = {}, Device device = Device::cpu, ExpertParallel ep = {},
                   SelectiveRecompute selective = {}, ContextParallel cp = {}, const LoraConfig& lora = {});

  // x (B, T, C) -> (B, T, C). In training, keeps what backward needs under microbatch id `mb`
  // (only x itself when recomputing).
  Tensor forward(const Tensor& x, int mb, const StepContext& ctx);
  // dout (B, T, C) -> dx (B, T, C); accumulates parameter gradients and drops microbatch `mb`'s activations.
  // dloss: d(objective)/d(the microbatch's loss), which a MoE layer's auxiliary losses join.
  Tensor backward(const Tensor& dout, int mb, float dloss = 1.f);

  std::vector<Parameter*> parameters();
  // The layer's parameters by role, for code that computes with them itself (generation's KV-cache decoder).
  // Biases are null for Llama, fc1 and fc2 for a MoE layer. Weights are this rank's slices (whole with
  // tensor-parallel size 1).
  struct Roles {
    const Norm *ln1, *ln2;
    const Parameter *qkv_w, *qkv_b, *proj_w, *proj_b, *fc1_w, *fc1_b, *fc2_w, *fc2_b;
    const MoeMlp* moe;  // a MoE layer's MLP (its forward is the training one); null for a dense layer
  };
  Roles roles() const {
    if (moe_)
      return {&ln1_, &ln2_, &qkv_.weight(), qkv_.bias(), &proj_.weight(), proj_.bias(), {}, {}, {}, {}, moe_.get()};
    return {&ln1_,          &ln2_,       &qkv_.weight(), qkv_.bias(), &proj_.weight(), proj_.bias(),
            &fc1_.weight(), fc1_.bias(), &fc2_.weight(), fc2_.bias(), nullptr};
  }
  int64_t index() const { return index_; }
  MoeMlp* moe() { return moe_.get(); }  // null for a dense layer
  // From now on the GEMMs of QKV, the attention projection and a dense MLP's fc1 and fc2 take fp8 inputs scaled by
  // `ctx` (parallel/fp8_linear.h), which each registers with under its name; a MoE layer's experts stay bf16.
  void enable_fp8(const std::shared_ptr<Fp8Context>& ctx);
  // Folds the LoRA adapters into their linears' weights (W += scale B A) and drops them (generation).
  void merge_lora() {
    qkv_.merge_lora();
    proj_.merge_lora();
    fc1_.merge_lora();
    fc2_.merge_lora();
  }

 private:
  struct Activations {
    StepContext ctx;
    Tensor x;             // (B, T, C) layer input; (B, T/tp, C) sequence shards with SP
    Norm::Saved n1;       // (B*T, C) rows and their statistics; shard rows with SP (gathered again in backward)
    Tensor qkv;           // (B, T, G/tp, R+2, D): this rank's query groups (after the rotary embeddings for Llama)
    Tensor att, att_lse;  // (B, T, H/tp * D), (B, H/tp, T)
    Tensor x2;            // (B, T, C) residual after attention
    Norm::Saved n2;
    Tensor fc1;         // GPT: (B*T, F/tp) pre-activation (the GELU epilogue's aux); Llama: (B*T, 2F/tp) gate and up
    Tensor act;         // (B*T, F/tp) GELU or SwiGLU output, fc2's input
    MoeMlp::Saved moe;  // a MoE layer's in place of fc1 and act
    LoraSaved lora_qkv, lora_proj, lora_fc1, lora_fc2;  // the adapters' h (finetune.lora)
  };
  // This microbatch's use of an adapter (its saved h and dropout keys).
  LoraCall lora_call(LoraSaved& saved, uint64_t site, const StepContext& ctx, int64_t T) const;
  // Runs the block on a.x, filling the activations; returns the output. `record`: a MoE layer counts its routing
  // (training's forward, not the recomputation in backward).
  Tensor run(Activations& a, bool keep, bool record);
  // The attention's options, and the dropout before a residual add (masks keyed by global coordinates,
  // T the full sequence length): none outside training.
  AttentionOptions attention_options(const StepContext& ctx) const;
  // Llama's rotary embeddings (inverse: their backward), at ctx.positions when it has them.
  RopeOptions rope_options(bool inverse, int64_t T, const StepContext& ctx) const;
  // Attention over the local sequence: the whole sequence's, or with context parallelism the ring's (or all-gather's).
  void attend(Activations& a) const;
  DropoutOptions residual_dropout(const StepContext& ctx, uint64_t site, int64_t T) const;
  // Selective recomputation: drops the chosen tensors after forward, recomputes them at the start of backward.
  void drop_selected(Activations& a) const;
  void recompute_selected(Activations& a);

  int64_t index_;
  ModelConfig cfg_;
  DType dtype_;
  Device device_;
  bool recompute_;
  SelectiveRecompute selective_;
  TensorParallel tp_;
  ContextParallel cp_;
  int64_t heads_;   // this rank's query heads
  int64_t groups_;  // this rank's query groups (key / value heads)
  uint64_t site_attn_probs_, site_attn_out_, site_mlp_out_;
  uint64_t site_lora_qkv_ = 0, site_lora_proj_ = 0, site_lora_fc1_ = 0, site_lora_fc2_ = 0;
  LoraConfig lora_;              // finetune.lora (rank 0: no adapters)
  Norm ln1_;                     // (C)
  ColumnParallelLinear qkv_;     // C -> (H + 2G) D: weight ((H + 2G) D / tp, C), rows per group [R q | k | v]
  RowParallelLinear proj_;       // H D -> C: weight (C, H D / tp), the input columns of this rank's heads
  Norm ln2_;                     // (C)
  ColumnParallelLinear fc1_;     // GPT: C -> F, GELU on its epilogue; Llama: C -> 2F, rows (2f, 2f+1) = (gate, up)
  RowParallelLinear fc2_;        // F -> C: weight (C, F/tp)
  std::unique_ptr<MoeMlp> moe_;  // in place of fc1 and fc2 in a MoE layer
  std::map<int, Activations> saved_;
};

}  // namespace mt
