// moe_block.h: a mixture-of-experts MLP (models/moe_mlp.h) as a layer's MLP part (models/block_part.h): the
// router, the experts and the shared expert in place of a dense MLP's fc1 and fc2.
#pragma once
#include "models/block_part.h"
#include "models/moe_mlp.h"

namespace mt {

class MoeBlock final : public BlockPart {
 public:
  // Parameters under layers.<i>.mlp (MoeMlp's names), with adapters on the experts' and the shared expert's fc1 and
  // fc2 when finetune.lora targets them (the router stays frozen).
  MoeBlock(const ModelConfig& cfg, const PartOptions& opt);

  Tensor forward(const Tensor& x, PartState& state, const PartStep& step) const override;
  Tensor backward(const Tensor& dout, const Tensor& x, PartState& state, const PartStep& step) override;
  void drop_selected(PartState& state) const override;  // moe_act: the experts' and shared expert's activations
  void recompute_selected(PartState& state, const PartStep& step) const override;
  std::vector<Parameter*> parameters() override { return moe_.parameters(); }
  void merge_lora() override { moe_.merge_lora(); }

  MoeMlp& mlp() { return moe_; }

 private:
  struct Saved : PartSaved {
    MoeMlp::Saved moe;
  };
  bool drop_act_;
  MoeMlp moe_;
};

}  // namespace mt
