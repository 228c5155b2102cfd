// parallel_linear.h: the tensor-parallel linear layers of Megatron-LM (Shoeybi et al.; with sequence
// parallelism, Korthikanti et al.), each owning its weight, its bias, its GEMMs and the communication
// around them, so a transformer layer reads norm -> column-parallel -> attention -> row-parallel.
//
//   ColumnParallelLinear  y (N, out/t) = x W_r^T + b_r   rank r holds rows r of W (out, in) and of b
//     forward:  x all-gathered from sequence shards with SP, else passed as is ("f")
//     backward: dx reduce-scattered to sequence shards with SP, else all-reduced ("f" backward)
//   RowParallelLinear     y (Ns, out) = sum_r x_r W_r^T + b   rank r holds columns r of W, b is replicated
//     forward:  the partial products reduce-scattered with SP, else all-reduced ("g"); b added after it
//     backward: dy all-gathered from sequence shards with SP, else passed as is ("g" backward)
//
// x and y are row views (tokens x features) of B samples; "Ns" rows are this rank's sequence shard with
// sequence parallelism and all N rows otherwise. Weights are (out, in) as nn.Linear's; biases are optional
// (the Llama layers have none). Parameters are made on the host, as make_parameter_slice makes them: the
// same names, global shapes, slices and initial values in every layout.
//
// The GEMMs themselves compute by a recipe (gemm_recipe.h): plain in the activations' dtype, or fp8 once enabled.
//
// Overlap: ColumnParallelLinear::backward computes dx first, starts its reduction and computes dW while it
// travels (with SP, the all-gather of x travels while dx is computed). On NCCL the collectives run on the
// communicator's stream beside the GEMMs on the compute stream; on Gloo they complete when started, so the
// same calls compute the same values in the same order of arithmetic on every backend.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/tensor/ops.h"
#include "core/tensor/parameter.h"
#include "parallel/layers/fp8_linear.h"
#include "parallel/layers/gemm_recipe.h"
#include "parallel/layers/lora_linear.h"
#include "parallel/layers/sequence_parallel.h"
#include "parallel/layers/tensor_parallel.h"

namespace mt {

struct LinearOptions {
  std::string name;          // "layers.3.attn.qkv": the parameters are <name>.weight and <name>.bias
  int64_t in_features = 0;   // global
  int64_t out_features = 0;  // global
  bool bias = true;
  float init_std = 0.02f;  // the weight's normal init; a bias starts at zero
  DType dtype = DType::f32;
  uint64_t seed = 0;
};

class ColumnParallelLinear {
 public:
  ColumnParallelLinear() = default;
  // Owns weight (out/t, in) = rows [r*out/t, (r+1)*out/t) of <name>.weight and bias (out/t).
  ColumnParallelLinear(const LinearOptions& opt, const TensorParallel& tp);
  // Borrows `weight` (out/t, in), a parameter owned elsewhere that must outlive this layer (the LM head on
  // the tied word embeddings); no bias.
  ColumnParallelLinear(Parameter& weight, const TensorParallel& tp);

  // x (Ns, in) -> (N, out/t) = x_full W^T + b, the bias on the GEMM's epilogue. With `gelu_preact`:
  // GELU(x_full W^T + b), and *gelu_preact := the pre-activation (N, out/t), kept for backward (fc1).
  // With an adapter (add_lora), `lora` is this microbatch's use of it: its update joins the output (before the GELU).
  Tensor forward(const Tensor& x, int64_t B, Tensor* gelu_preact = nullptr, const LoraCall* lora = nullptr) const;

  struct BackwardOptions {
    // The bias gradient was accumulated already: the next row-parallel layer's input-gradient GEMM folded
    // it into its dgelu_bgrad epilogue (fc2 -> fc1).
    bool bias_grad_done = false;
    const LoraCall* lora = nullptr;  // the forward's, with an adapter
  };
  // dout (N, out/t) and the forward's input x (Ns, in) -> dx (Ns, in), summed over the group. Accumulates
  // the weight's gradient and the bias's.
  Tensor backward(const Tensor& dout, const Tensor& x, int64_t B, BackwardOptions opt);
  Tensor backward(const Tensor& dout, const Tensor& x, int64_t B) { return backward(dout, x, B, {}); }

  Parameter& weight() { return borrowed_ ? *borrowed_ : weight_; }
  const Parameter& weight() const { return borrowed_ ? *borrowed_ : weight_; }
  Parameter* bias() { return has_bias_ ? &bias_ : nullptr; }
  const Parameter* bias() const { return has_bias_ ? &bias_ : nullptr; }
  // The parameters it owns: weight then bias (none when the weight is borrowed).
  std::vector<Parameter*> parameters();
  // The recipe its GEMMs compute by (gemm_recipe.h); plain by default.
  void set_recipe(std::shared_ptr<const GemmRecipe> recipe) { recipe_ = std::move(recipe); }
  // From now on its GEMMs take fp8 inputs scaled by `link`'s context (fp8_linear.h): the fp8 recipe with a
  // column-parallel linear's sharding (x whole, dY this rank's columns).
  void enable_fp8(Fp8Link link) { set_recipe(fp8_recipe(std::move(link), tp_, {.x = false, .dy = true})); }
  // A low-rank adapter beside it (parallel/layers/lora_linear.h; its parameters join parameters()). A frozen weight or bias
  // (Parameter::frozen) gets no gradient: its weight-gradient GEMM is skipped.
  void add_lora(const LoraOptions& opt) { lora_ = std::make_shared<LoraAdapter>(opt, LoraSide::column, tp_); }
  const LoraAdapter* lora() const { return lora_.get(); }
  // Folds the adapter into the weight (W += scale B A) and drops it.
  void merge_lora() {
    if (lora_) lora_->merge_into(weight().value);
    lora_.reset();
  }

 private:
  std::shared_ptr<const GemmRecipe> recipe_ = plain_recipe();
  std::shared_ptr<LoraAdapter> lora_;
  TensorParallel tp_;
  Parameter weight_;               // (out/t, in) unless borrowed
  Parameter bias_;                 // (out/t)
  Parameter* borrowed_ = nullptr;  // the weight when it lives elsewhere
  bool has_bias_ = false;
};

class RowParallelLinear {
 public:
  RowParallelLinear() = default;
  // Owns weight (out, in/t) = columns [r*in/t, (r+1)*in/t) of <name>.weight and the whole bias (out).
  RowParallelLinear(const LinearOptions& opt, const TensorParallel& tp);

  // x (N, in/t) -> (Ns, out) = the sum over the group of x W^T, then + b (once, after the reduction).
  Tensor forward(const Tensor& x, int64_t B, const LoraCall* lora = nullptr) const;

  struct BackwardOptions {
    // An epilogue for the input-gradient GEMM dx = dout W (core/tensor/ops.h): dgelu_bgrad with `aux` the GELU
    // pre-activation of the column-parallel layer before and `dbias` that layer's bias gradient gives
    // d(pre-activation) and its bias gradient in one GEMM (fc2 -> fc1).
    Epilogue dx_epilogue = Epilogue::none;
    Tensor* aux = nullptr;
    Tensor* dbias = nullptr;
    const LoraCall* lora = nullptr;  // the forward's, with an adapter (then no dx epilogue)
  };
  // dout (Ns, out) and the forward's input x (N, in/t) -> dx (N, in/t). Accumulates the weight's gradient
  // and the bias's.
  Tensor backward(const Tensor& dout, const Tensor& x, int64_t B, BackwardOptions opt);
  Tensor backward(const Tensor& dout, const Tensor& x, int64_t B) { return backward(dout, x, B, {}); }

  Parameter& weight() { return weight_; }
  const Parameter& weight() const { return weight_; }
  Parameter* bias() { return has_bias_ ? &bias_ : nullptr; }
  const Parameter* bias() const { return has_bias_ ? &bias_ : nullptr; }
  std::vector<Parameter*> parameters();  // weight then bias
  void set_recipe(std::shared_ptr<const GemmRecipe> recipe) { recipe_ = std::move(recipe); }
  // As ColumnParallelLinear's, with a row-parallel linear's sharding (x this rank's columns, dY whole).
  void enable_fp8(Fp8Link link) { set_recipe(fp8_recipe(std::move(link), tp_, {.x = true, .dy = false})); }
  void add_lora(const LoraOptions& opt) { lora_ = std::make_shared<LoraAdapter>(opt, LoraSide::row, tp_); }
  const LoraAdapter* lora() const { return lora_.get(); }
  void merge_lora() {  // as ColumnParallelLinear's
    if (lora_) lora_->merge_into(weight_.value);
    lora_.reset();
  }

 private:
  std::shared_ptr<const GemmRecipe> recipe_ = plain_recipe();
  std::shared_ptr<LoraAdapter> lora_;
  TensorParallel tp_;
  Parameter weight_;  // (out, in/t)
  Parameter bias_;    // (out), replicated
  bool has_bias_ = false;
};

}  // namespace mt
