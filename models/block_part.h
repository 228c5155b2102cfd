// block_part.h: the contract of a transformer block's parts. A layer (models/transformer_layer.h) is a list of
// residual branches, each `x + dropout(part(norm(x)))`; a part is the attention or the MLP of the branch, one
// class per kind (models/layer_spec.h chooses them once per layer): it owns its linears and computes its
// branch forward and backward, keeps what its backward needs in its own state, and runs the same code for
// generation's KV-cached decode. A new kind of attention or MLP is a new part; the layer does not change.
//
// Also here: the per-microbatch facts every part needs (StepContext), selective recomputation's choice, and the
// options every part is built from.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/tensor/parameter.h"
#include "core/tensor/tensor.h"
#include "parallel/layers/context_parallel.h"
#include "parallel/layers/expert_parallel.h"
#include "parallel/layers/fp8_linear.h"
#include "parallel/layers/lora_linear.h"
#include "parallel/layers/parallel_linear.h"
#include "parallel/layers/tensor_parallel.h"

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
  // the model's device (0 at every document start); with context parallelism this rank's chunks of them (B, T/C).
  // Position ids (learned and rotary) are these, and a query attends only to the keys of its own document
  // (core/tensor/ops.h AttentionOptions::positions, AttentionBlockOptions::positions). Empty: positions 0..T-1, one
  // causal sequence per sample.
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

// What every part of a layer is built from: the layer's place in the model and this rank's groups.
struct PartOptions {
  int64_t layer = 0;         // the layer's global index: parameters and dropout sites are named "layers.<layer>...."
  DType dtype = DType::f32;  // parameters and activations
  uint64_t seed = 0;         // initial values and dropout keys
  Device device = Device::cpu;
  TensorParallel tp;   // the linears' group (sequence parallelism with it)
  ExpertParallel ep;   // a MoE part's expert-parallel group
  ContextParallel cp;  // the attention's context-parallel group
  LoraConfig lora;     // finetune.lora: adapters beside the linears it targets (rank 0: none)
  SelectiveRecompute selective;
  // "layers.<layer>.<s>", the global name of something of this layer.
  std::string name(const char* s) const;
};

// Megatron's scaled init for the projections that feed the residual stream: init_std / sqrt(2 num_layers).
float output_init_std(const ModelConfig& cfg);

// One microbatch's pass through a part.
struct PartStep {
  const StepContext* ctx = nullptr;
  int64_t samples = 1;  // B
  int64_t tokens = 1;   // T, the whole local sequence (the part's input rows are B*T, or shards with SP)
  bool record = false;  // forward: a training forward, not a recomputation (MoE counts its routing)
  float dloss = 1.f;    // backward: d(objective)/d(the microbatch's loss), which auxiliary losses join
};

// Generation's feed: the fed tokens sit at positions [position, position + n) of one sequence; a part's cache
// (attention's keys and values) holds `capacity` tokens.
struct DecodeStep {
  int64_t position = 0;
  int64_t capacity = 0;
};

// A part's state of one microbatch (what its forward keeps for backward) or of one generation (its cache): each
// part stores its own type, derived from PartSaved.
struct PartSaved {
  virtual ~PartSaved() = default;
};
class PartState {
 public:
  // The part's state as its type S, made empty on first use.
  template <class S>
  S& as() {
    if (!p_) p_ = std::make_unique<S>();
    return static_cast<S&>(*p_);
  }
  void reset() { p_.reset(); }

 private:
  std::unique_ptr<PartSaved> p_;
};

class BlockPart {
 public:
  virtual ~BlockPart() = default;
  // x: the branch's normalized input (B*T rows, this rank's sequence shard with SP) -> the branch's output (the
  // same rows), before its residual dropout. Keeps what backward needs in `state`.
  virtual Tensor forward(const Tensor& x, PartState& state, const PartStep& step) const = 0;
  // dout (the output's rows) and the forward's input x -> dx; accumulates the parameters' gradients.
  virtual Tensor backward(const Tensor& dout, const Tensor& x, PartState& state, const PartStep& step) = 0;
  // Selective recomputation: drops its chosen tensors from `state` after forward, makes them again before backward.
  virtual void drop_selected(PartState&) const {}
  virtual void recompute_selected(PartState&, const PartStep&) const {}
  // Generation (tensor-parallel size 1): x (n, C), the normalized rows of the fed tokens -> (n, C). `cache`
  // persists over the feeds of one sequence. The default is the inference forward.
  virtual Tensor decode(const Tensor& x, PartState& cache, const DecodeStep& step) const;

  virtual std::vector<Parameter*> parameters() = 0;
  // From now on its linears' GEMMs take fp8 inputs scaled by `ctx` (parallel/layers/fp8_linear.h), registered under
  // their names in order; a part without fp8 linears ignores it.
  virtual void enable_fp8(const std::shared_ptr<Fp8Context>&) {}
  // Folds its LoRA adapters into their linears' weights and drops them (generation).
  virtual void merge_lora() {}
};

// Megatron's pair of linears in a part: a column-parallel one (qkv, fc1) and the row-parallel one after it (proj,
// fc2), each with a LoRA adapter when finetune.lora targets it and fp8 GEMMs once enabled.
class LinearPair {
 public:
  struct Linear {
    const char* name;    // "attn.qkv": parameters layers.<i>.attn.qkv.weight, .bias
    const char* target;  // its finetune.lora.targets name: "qkv"
    int64_t in, out;     // global features
    float init_std;
    bool bias;
  };
  LinearPair() = default;
  LinearPair(const PartOptions& opt, const Linear& column, const Linear& row);

  // This microbatch's use of the adapters (their saved h and dropout keys): the linears' GEMM inputs hold whole
  // local sequences of step.tokens tokens, rows at the context chunks' global positions.
  struct Saved {
    LoraSaved column, row;
  };
  struct Calls {
    LoraCall column, row;
  };
  Calls lora_calls(Saved& saved, const PartStep& step) const;

  std::vector<Parameter*> parameters();  // the column linear's, then the row linear's
  // Registers both linears with `ctx` under their names (TransformerEngine's per-module scaling state).
  void enable_fp8(const std::shared_ptr<Fp8Context>& ctx);
  void merge_lora() {
    column.merge_lora();
    row.merge_lora();
  }

  ColumnParallelLinear column;
  RowParallelLinear row;

 private:
  PartOptions opt_;
  std::string column_name_, row_name_;       // "layers.<i>.attn.qkv": their weights' names less ".weight"
  uint64_t site_column_ = 0, site_row_ = 0;  // the adapters' dropout keys
};

}  // namespace mt
