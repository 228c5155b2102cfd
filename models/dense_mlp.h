// dense_mlp.h: the dense MLP part of a layer (models/block_part.h):
//
//   GELU:   x (normalized) -> fc1 (column-parallel, GELU on its GEMM's epilogue) -> fc2 (row-parallel)
//   SwiGLU: x (normalized) -> fc1 (column-parallel: gate and up interleaved) -> SwiGLU -> fc2 (row-parallel)
//
// fc1 holds this rank's ffn units (for SwiGLU its rows (2f, 2f+1) are unit f's (gate, up), so every row block
// holds whole pairs); fc2 sums its partial outputs over the group before its bias. Backward of GELU without
// adapters rides on GEMM epilogues: fc2's input-gradient GEMM gives dGELU and fc1's bias gradient in one pass.
#pragma once
#include <memory>

#include "core/config/config.h"
#include "models/block_part.h"
#include "models/layer_spec.h"

namespace mt {

class DenseMlp final : public BlockPart {
 public:
  // Parameters layers.<i>.mlp.fc1.{weight,bias} (F or 2F, C) and layers.<i>.mlp.fc2.{weight,bias} (C, F), the
  // biases with spec.bias; spec.mlp gelu or swiglu. LoRA adapters beside the linears finetune.lora targets.
  DenseMlp(const LayerSpec& spec, const ModelConfig& cfg, const PartOptions& opt);

  Tensor forward(const Tensor& x, PartState& state, const PartStep& step) const override;
  Tensor backward(const Tensor& dout, const Tensor& x, PartState& state, const PartStep& step) override;
  void drop_selected(PartState& state) const override;  // mlp_act: the activation, fc2's input
  void recompute_selected(PartState& state, const PartStep& step) const override;

  std::vector<Parameter*> parameters() override { return linears_.parameters(); }  // fc1's, then fc2's
  void enable_fp8(const std::shared_ptr<Fp8Context>& ctx) override { linears_.enable_fp8(ctx); }
  void merge_lora() override { linears_.merge_lora(); }

 private:
  struct Saved;
  PartOptions opt_;
  bool swiglu_;
  // The activation's backward as an op of its own, not on fc2's epilogue: SwiGLU, or any MLP with adapters (fc2's
  // adds to dact first, and fc1's bias is frozen).
  bool separate_act_backward_;
  // fc1 (column): GELU C -> F, GELU on its epilogue; SwiGLU C -> 2F, rows (2f, 2f+1) = (gate, up). fc2 (row):
  // F -> C, weight (C, F/tp).
  LinearPair linears_;
};

}  // namespace mt
