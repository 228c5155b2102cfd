#include "models/moe_block.h"

namespace mt {

MoeBlock::MoeBlock(const ModelConfig& cfg, const PartOptions& opt)
    : drop_act_(opt.selective.moe_act), moe_(cfg, opt.name("mlp"), opt.dtype, output_init_std(cfg), opt.seed,
                                             opt.device, opt.tp, opt.ep, opt.cp, opt.lora) {}

Tensor MoeBlock::forward(const Tensor& x, PartState& state, const PartStep& step) const {
  return moe_.forward(x, state.as<Saved>().moe, {.samples = step.samples, .record = step.record});
}

Tensor MoeBlock::backward(const Tensor& dout, const Tensor&, PartState& state, const PartStep& step) {
  return moe_.backward(dout, state.as<Saved>().moe, {.samples = step.samples, .dloss = step.dloss});
}

void MoeBlock::drop_selected(PartState& state) const {
  if (drop_act_) moe_.drop_activations(state.as<Saved>().moe);
}

void MoeBlock::recompute_selected(PartState& state, const PartStep&) const {
  if (drop_act_) moe_.recompute_activations(state.as<Saved>().moe);
}

}  // namespace mt
