// gpt.h: the decoder-only language model on one rank, GPT-2/3 or Llama (model.arch): embeddings, transformer
// layers, final norm, LM head and the cross-entropy loss, each microbatch forward then backward, written out
// explicitly.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "core/config/config.h"
#include "core/tensor/parameter.h"
#include "core/tensor/tensor.h"
#include "models/transformer_layer.h"
#include "parallel/layers/parallel_linear.h"
#include "parallel/layers/vocab_parallel_embedding.h"

namespace mt {

// Which part of the model a pipeline stage (one model chunk) holds.
struct StageLayout {
  bool has_embedding = true;  // the first stage: token and position embeddings
  bool has_head = true;       // the last stage: final norm, LM head and loss
  int64_t layer_begin = 0;    // global indices [layer_begin, layer_end) of its transformer layers
  int64_t layer_end = -1;     // -1: num_layers
};

struct GptOptions {
  DType dtype = DType::f32;      // parameters and activations
  Device device = Device::cpu;   // where parameters, gradients and activations live
  uint64_t seed = 1234;          // keys initial weights and dropout masks
  bool recompute = false;        // full activation recomputation in every layer
  int64_t recompute_layers = 0;  // with recompute: only the first this many of this chunk's layers (0: all)
  // With recompute: Megatron's "uniform" method instead. This chunk's layers are cut into consecutive groups of
  // recompute_layers (>= 1; the last group may be smaller), each checkpointed as one: its forward keeps only the
  // group's input, and its backward runs the whole group's forward again before back-propagating its layers.
  bool recompute_uniform = false;
  SelectiveRecompute selective;  // else these tensors of every layer (training.recompute: selective)
  TensorParallel tp;             // this rank's tensor-parallel group (size 1: the whole model)
  ExpertParallel ep;             // this rank's expert-parallel group (MoE layers; size 1: every expert)
  ContextParallel cp;            // this rank's context-parallel group (size 1: whole sequences)
  StageLayout stage;             // the whole model by default
  // finetune.lora: adapters beside the layers' linears; with rank > 0 every other parameter is frozen (no gradient).
  LoraConfig lora;
};

class GptModel {
 public:
  GptModel(const ModelConfig& cfg, GptOptions opt);

  // tokens (B, T) and targets (B, T) i32 -> mean cross-entropy over the B*T tokens (a whole-model stage).
  // In training the activations are kept under microbatch id `mb` for backward().
  float forward(const Tensor& tokens, const Tensor& targets, int mb, const StepContext& ctx);
  // Backward of microbatch `mb` with d(objective)/d(mean loss) = dloss (loss scale / microbatches), a host
  // value: the loss-gradient seed is filled on the device. Parameter gradients accumulate.
  void backward(int mb, float dloss);

  // One pipeline stage. The first stage embeds `tokens`, the others start from `input` (B, T, C) (sequence
  // shards (B, T/tp, C) with SP). The last stage returns an empty tensor and sets *loss to the mean
  // cross-entropy against `targets`; the others return their output activation.
  Tensor forward_stage(const Tensor& input, const Tensor& tokens, const Tensor& targets, int mb, const StepContext& ctx,
                       float* loss);
  // As above, but the last stage adds its mean loss (rounded to f32, the value *loss would get) into
  // loss_sum (1) f64 on the model's device (core/tensor/ops.h accumulate_mean) without reading it: training waits
  // for the device once per step, not once per microbatch.
  Tensor forward_stage(const Tensor& input, const Tensor& tokens, const Tensor& targets, int mb, const StepContext& ctx,
                       Tensor& loss_sum);
  // Backward of one stage: `dout` is the gradient of its output (ignored on the last stage, which starts
  // from dloss). Returns the gradient of its input (empty on the first stage).
  Tensor backward_stage(int mb, const Tensor& dout, float dloss);
  const StageLayout& stage() const { return opt_.stage; }
  // Called during backward_stage each time some parameters' gradients for microbatch `mb` are complete
  // (after each layer, the head and the embedding), so their reduction can start early.
  using GradsReadyHook = std::function<void(int mb, const std::vector<Parameter*>& params)>;
  void set_grads_ready_hook(GradsReadyHook hook) { grads_ready_ = std::move(hook); }
  // Called during backward_stage before any gradient of these parameters is written for microbatch `mb` (before
  // each layer's backward, the head's and the embedding's), so their storage can be made then (ZeRO-2).
  void set_grads_needed_hook(GradsReadyHook hook) { grads_needed_ = std::move(hook); }

  // ZeRO-3 (parallel/sharding/sharded_parameters.h): the units whose parameters are gathered together, in forward order:
  // the embedding (first stage), each transformer layer, the final norm with the LM head (last stage; the tied
  // word embeddings are the head's weight there too).
  std::vector<std::vector<Parameter*>> units();
  // Called around each unit's computation with its parameters: begin before it reads them, end after its last
  // read; `next` is the unit that computes after it (-1: none in this call), which may be gathered meanwhile. The
  // embedding's backward reads no weights (it scatters into the gradients) and is not announced.
  enum class UnitEvent { forward_begin, forward_end, backward_begin, backward_end };
  using UnitHook = std::function<void(UnitEvent event, int unit, int next)>;
  void set_unit_hook(UnitHook hook) { unit_hook_ = std::move(hook); }

  // Every parameter, in a stable order (embedding, layers, final norm, head); with LoRA the frozen base included.
  const std::vector<Parameter*>& parameters() const { return params_; }
  const ModelConfig& config() const { return cfg_; }
  // This stage's mixture-of-experts MLPs, in layer order (none for a dense model).
  std::vector<MoeMlp*> moe_layers();
  // This stage's transformer layers, in order (fp8 wiring, app/train/fp8_state.cpp).
  std::vector<TransformerLayer*> layers();
  // Folds every layer's LoRA adapters into the weights (generation computes with the weights alone) and drops them
  // from parameters().
  void merge_lora();
  int64_t num_parameters() const;  // elements stored, vocabulary padding included
  // The model's parameters by role, for code that computes with them itself (generation's KV-cache decoder):
  // null where this stage does not hold the part (a pipeline stage) or the architecture has none (Llama's
  // position table). lm_head is the word embeddings' when tied. Weights are this rank's slices.
  struct Roles {
    const Parameter* word_embeddings = nullptr;      // (Vpad, C)
    const Parameter* position_embeddings = nullptr;  // (P, C), GPT only
    const Norm* final_norm = nullptr;
    const Parameter* lm_head = nullptr;  // (Vpad, C)
    std::vector<const TransformerLayer*> layers;
  };
  Roles roles() const;

 private:
  struct HeadActivations {
    StepContext ctx;
    Tensor tokens, targets;  // (B, T) i32
    Tensor final_in;         // (B, T, C) output of the last layer ((B, T/tp, C) with SP)
    Norm::Saved lnf;         // (B*T, C) final norm and its statistics; shard rows with SP (gathered
                             // again in backward)
    Tensor logits;           // (B*T, Vpad/tp) this rank's vocabulary shard
    Tensor rowmax, sumexp;   // (B*T) f32
  };
  // forward_stage with the loss read into *loss or accumulated into *loss_sum (one of them set).
  Tensor forward_impl(const Tensor& input, const Tensor& tokens, const Tensor& targets, int mb, const StepContext& ctx,
                      float* loss, Tensor* loss_sum);

  ModelConfig cfg_;
  GptOptions opt_;
  uint64_t site_embedding_;
  VocabParallelEmbedding wte_;  // (Vpad/tp, C) token embedding shard, also the LM head's weight when tied (on
                                // a last stage without the embedding: a tied copy, see Parameter)
  Parameter wpe_;               // (P, C) learned position embedding (GPT; Llama rotates q and k instead)
  bool has_position_table() const { return cfg_.arch == Arch::gpt; }
  // The position rows of tokens [offset, offset + len) of a local sequence of T tokens (its sequence-parallel shard;
  // with context parallelism the local sequence is two chunks at their global positions; with packed documents,
  // ctx.positions' columns [offset, offset + len), the context chunks' own).
  EmbeddingOptions position_options(int64_t T, int64_t offset, int64_t len, const StepContext& ctx) const {
    if (ctx.positions.defined()) return {.position_offset = offset, .positions = ctx.positions};
    const SequencePositions p = opt_.cp.positions(T, offset, len);
    return {.position_offset = p.position_offset, .split_at = p.split_at, .split_position = p.split_position};
  }
  // The embedding dropout of tokens [offset, offset + len) of a local sequence of T tokens (rows at their global
  // positions, context chunks included).
  DropoutOptions embedding_dropout(float p, int64_t T, int64_t offset, int64_t len, const StepContext& ctx) const {
    return opt_.cp.with_rows({.p = p, .seed = ctx.seed, .site = site_embedding_, .sample_offset = ctx.sample_offset}, T,
                             offset, len);
  }
  std::vector<std::unique_ptr<TransformerLayer>> layers_;
  Norm lnf_;                   // (C) final LayerNorm (GPT) or RMSNorm (Llama)
  ColumnParallelLinear head_;  // C -> Vpad, no bias: weight (Vpad/tp, C) lm_head, or wte's borrowed when tied
  std::vector<Parameter*> params_;
  int64_t vocab_start_ = 0, vocab_local_ = 0;  // this rank's rows of the padded vocabulary
  std::map<int, HeadActivations> saved_;
  std::map<int, std::pair<StepContext, Tensor>> embedded_;
  // Uniform recomputation: the layers per group (0: not uniform), and each group's input under (the group's first
  // layer index in this chunk, microbatch): the context and the (B, T, C) activation ((B, T/tp, C) with SP).
  int64_t group_layers_ = 0;
  std::map<std::pair<size_t, int>, std::pair<StepContext, Tensor>> group_inputs_;
  size_t group_first(size_t i) const {
    return i / static_cast<size_t>(group_layers_) * static_cast<size_t>(group_layers_);
  }
  bool group_last(size_t i) const {
    return group_layers_ > 0 && (i + 1 == layers_.size() || (i + 1) % static_cast<size_t>(group_layers_) == 0);
  }
  // The unit that computes after the backward of layer i (i = layers_.size(): after the head's), -1 for none: layer
  // i - 1's backward, or under uniform recomputation, when i starts a group (or is the head), the first layer of
  // the group before, whose forward runs again first.
  int unit_after_backward(size_t i) const {
    if (i == 0) return -1;
    if (group_layers_ == 0) return layer_unit(i - 1);
    const bool starts_group = i == layers_.size() || group_first(i) == i;
    return layer_unit(starts_group ? group_first(i - 1) : i - 1);
  }
  // Uniform recomputation in backward: the group ending with layer `last` runs its layers before `last` forward again
  // from the group's saved input of microbatch `mb`, keeping their activations; returns the context and last's input.
  std::pair<StepContext, Tensor> rerun_group(size_t last, int mb);
  GradsReadyHook grads_ready_;
  GradsReadyHook grads_needed_;
  UnitHook unit_hook_;
  // Unit indices (see units()): layer i of this chunk's, the head's.
  int layer_unit(size_t i) const { return (opt_.stage.has_embedding ? 1 : 0) + static_cast<int>(i); }
  int head_unit() const { return layer_unit(layers_.size()); }
  void unit_event(UnitEvent e, int unit, int next) const {
    if (unit_hook_) unit_hook_(e, unit, next);
  }  // first stage: (context, tokens) per microbatch
};

// Megatron's model FLOPs of one training iteration over `tokens` tokens (forward + backward, no
// recomputation counted): 3 x (GEMM flops per token + causal attention + logits), with grouped-query
// attention's narrower key / value projections and SwiGLU's three MLP GEMMs for Llama; a MoE layer counts the
// active experts (top_k), the shared expert and the router.
double model_flops_per_iteration(const ModelConfig& cfg, int64_t tokens);

}  // namespace mt
