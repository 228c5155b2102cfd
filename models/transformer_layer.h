// transformer_layer.h: one pre-norm decoder block, composed of parts (models/block_part.h) that its spec
// (models/layer_spec.h) chooses once:
//
//   x2  = x  + dropout(attention(norm1(x)))      the attention part: SelfAttention (models/attention.h)
//   out = x2 + dropout(mlp(norm2(x2)))           the MLP part: DenseMlp (GELU or SwiGLU) or MoeBlock (experts)
//
// The layer runs its branches the same way whatever their parts: the norm (LayerNorm or RMSNorm, replicated over
// tensor parallelism), the part, then the residual add with its dropout fused (dropout_add). With sequence
// parallelism the norms, dropout and residuals run on this rank's sequence shard and the parts' linears gather /
// reduce-scatter at their edges, so attention and the rotary embeddings always see whole sequences. Backward runs
// the branches in reverse; full recomputation keeps only x and runs the forward again in backward, selective
// recomputation lets the norms and each part drop and remake what training.recompute_modules names.
// Generation's KV-cache decoder (models/kv_cache_decoder.h) runs the same norms and parts (decode) on the fed
// tokens.
#pragma once
#include <map>
#include <memory>
#include <vector>

#include "core/config/config.h"
#include "core/tensor/parameter.h"
#include "core/tensor/tensor.h"
#include "models/block_part.h"
#include "models/layer_spec.h"
#include "models/moe_mlp.h"
#include "models/norm.h"

namespace mt {

class TransformerLayer {
 public:
  // Layer opt.layer of the model `cfg`: parameters are made on the host (GptModel moves them to the model's
  // device), activations live on opt.device. `recompute`: full activation recomputation.
  TransformerLayer(const ModelConfig& cfg, const PartOptions& opt, bool recompute);

  // x (B, T, C) -> (B, T, C) ((B, T/tp, C) sequence shards with SP). In training, keeps what backward needs under
  // microbatch id `mb` (only x itself when recomputing).
  Tensor forward(const Tensor& x, int mb, const StepContext& ctx);
  // dout (B, T, C) -> dx (B, T, C); accumulates parameter gradients and drops microbatch `mb`'s activations.
  // dloss: d(objective)/d(the microbatch's loss), which a MoE layer's auxiliary losses join.
  Tensor backward(const Tensor& dout, int mb, float dloss = 1.f);
  // Uniform recomputation (models/gpt.cpp checkpoints a group of consecutive layers as one unit; the layer is built
  // with recompute false): a training forward that keeps nothing, the group keeping only its own input; and in
  // backward the same forward again (the same inputs and dropout keys: the same values), keeping everything
  // backward(mb) needs.
  Tensor forward_unkept(const Tensor& x, const StepContext& ctx);
  Tensor forward_again(const Tensor& x, int mb, const StepContext& ctx);

  // Generation (tensor-parallel size 1): x (n, C), the rows of the fed tokens at positions [step.position,
  // step.position + n) of one sequence -> (n, C). `cache` (the attention's keys and values) persists over the feeds.
  struct DecodeCache {
    std::vector<PartState> parts;
  };
  Tensor decode(const Tensor& x, DecodeCache& cache, const DecodeStep& step) const;

  // ln1, the attention's, ln2, the MLP's (each linear's weight, bias, adapters).
  std::vector<Parameter*> parameters();
  int64_t index() const { return opt_.layer; }
  MoeMlp* moe();  // a MoE layer's MLP; null for a dense layer
  // From now on the attention's and a dense MLP's linears take fp8 inputs scaled by `ctx` (parallel/layers/fp8_linear.h).
  void enable_fp8(const std::shared_ptr<Fp8Context>& ctx);
  // Folds the LoRA adapters into their linears' weights (W += scale B A) and drops them (generation).
  void merge_lora();

 private:
  // A residual branch: in + dropout(part(norm(in))), the dropout keyed by `site`.
  struct Branch {
    Norm norm;
    std::unique_ptr<BlockPart> part;
    uint64_t site = 0;
  };
  struct BranchSaved {
    Tensor in;      // (B, T, C) the branch's input; (B, T/tp, C) sequence shards with SP
    Norm::Saved n;  // (B*T, C) rows and their statistics; shard rows with SP (gathered again by the part)
    PartState part;
  };
  struct Activations {
    StepContext ctx;
    std::vector<BranchSaved> branches;  // branches[0].in is the layer's input x
  };
  // The activations of a forward of x under ctx, its input only so far.
  static Activations starting(const Tensor& x, const StepContext& ctx);
  // Runs the branches on a.branches[0].in, filling the activations; returns the output. `record`: a training
  // forward (a MoE part counts its routing), not the recomputation in backward.
  Tensor run(Activations& a, bool keep, bool record);
  // The step of microbatch activations `a` with (B, Ts, C) inputs.
  PartStep part_step(const Activations& a, bool record, float dloss) const;
  // The dropout before a residual add: this rank's rows (its sequence shard of a local sequence of T tokens, at the
  // context chunks' global positions); none outside training.
  DropoutOptions residual_dropout(const StepContext& ctx, uint64_t site, int64_t T) const;
  // Selective recomputation: drops the chosen tensors after forward, recomputes them at the start of backward.
  void drop_selected(Activations& a) const;
  void recompute_selected(Activations& a);

  ModelConfig cfg_;
  PartOptions opt_;
  bool recompute_;
  std::vector<Branch> branches_;  // attention, MLP
  std::map<int, Activations> saved_;
};

}  // namespace mt
