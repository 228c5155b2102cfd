// attention.h: the self-attention part of a layer (models/block_part.h):
//
//   x (normalized) -> qkv (column-parallel) -> [QK-norm of each q and k head] -> [rotary embeddings on q and k]
//   -> causal attention (within spec.window's sliding window) -> proj (row-parallel)
//
// Multi-head and grouped-query attention alike: QKV holds this rank's query groups, per group
// [R queries | key | value] of head_dim each (LLAMA.md; GPT: one query per group), so a column block of the
// weight is whole groups. The attention runs over the whole local sequence: the one of this rank, or with context
// parallelism the ring's (or all-gather's) over the context ranks' chunks (parallel/layers/context_parallel.h). The
// rotary embeddings (spec.position rotary) see the tokens' positions: 0..T-1, the context chunks' global ones, or
// packed documents' (StepContext::positions), at the frequencies of model.rotary_base and model.rope_scaling (plain,
// linear, llama3 or yarn: core/base/rope_scaling.h), computed once here.
//
// Generation (decode): the fed tokens' keys and values join a cache of capacity x G x D per layer for each, in f32
// on the host (holding the compute dtype's values exactly). A feed from position 0 runs the training forward's
// causal attention op on the device; a feed after cached tokens runs a small attention on the host over the cache
// (query head h = g*R + r reads group g's keys and values, the window's last ones; softmax in fp32 as
// attention_forward's), its output
// rounded once to the compute dtype. On a GPU this copies the fed tokens' qkv to the host and the attention output
// back; the GEMMs stay on the device. attention_forward cannot take a query shorter than its keys, hence this path.
#pragma once
#include <memory>

#include "core/base/rope_scaling.h"
#include "core/config/config.h"
#include "models/block_part.h"
#include "models/layer_spec.h"
#include "models/qk_norm.h"

namespace mt {

class SelfAttention final : public BlockPart {
 public:
  // Parameters layers.<i>.attn.qkv.{weight,bias} ((H + 2G) D, C) and layers.<i>.attn.proj.{weight,bias} (C, H D),
  // qkv's bias with spec.qkv_bias, proj's with spec.bias; LoRA adapters beside the linears finetune.lora targets
  // (qkv, proj).
  SelfAttention(const LayerSpec& spec, const ModelConfig& cfg, const PartOptions& opt);

  Tensor forward(const Tensor& x, PartState& state, const PartStep& step) const override;
  Tensor backward(const Tensor& dout, const Tensor& x, PartState& state, const PartStep& step) override;
  void drop_selected(PartState& state) const override;  // core_attn: the attention output and its log-sum-exp
  void recompute_selected(PartState& state, const PartStep& step) const override;
  Tensor decode(const Tensor& x, PartState& cache, const DecodeStep& step) const override;

  std::vector<Parameter*> parameters() override;  // qkv's, proj's, then the QK-norm's
  void enable_fp8(const std::shared_ptr<Fp8Context>& ctx) override { linears_.enable_fp8(ctx); }
  void merge_lora() override { linears_.merge_lora(); }

 private:
  struct Saved;
  struct Cache;
  AttentionOptions attention_options(const StepContext& ctx) const;
  // The rotary embeddings' options (inverse: their backward) over a local sequence of T tokens.
  RopeOptions rope_options(bool inverse, int64_t T, const StepContext& ctx) const;
  // What every rotation of this part shares: its frequencies (rope_freqs_), positions left to the caller.
  RopeOptions rope_frequency_options() const;
  // s.att and s.att_lse from s.qkv: the local sequence's attention, or with context parallelism the ring's.
  void attend(Saved& s, const StepContext& ctx) const;
  // The attention output (n, H D) of the fed tokens from their (rotated) qkv (n, G, R + 2, D), caching their keys
  // and values at [position, position + n).
  Tensor cached_attention(const Tensor& qkv, Cache& cache, const DecodeStep& step) const;

  ModelConfig cfg_;
  PartOptions opt_;
  bool rotary_;
  bool qk_norm_;
  int64_t window_;              // the sliding window (0: none)
  QkNorm qk_;                   // with qk_norm_
  RopeFrequencies rope_freqs_;  // (D/2) and yarn's factor, when rotary_
  int64_t heads_;               // this rank's query heads
  int64_t groups_;              // this rank's query groups (key / value heads)
  uint64_t site_probs_;
  // qkv (column): C -> (H + 2G) D, weight ((H + 2G) D / tp, C), rows per group [R q | k | v]; proj (row): H D -> C,
  // weight (C, H D / tp), the input columns of this rank's heads.
  LinearPair linears_;
};

}  // namespace mt
