#include "models/dense_mlp.h"

#include "core/base/rng.h"
#include "core/tensor/ops.h"

namespace mt {

struct DenseMlp::Saved : PartSaved {
  Tensor fc1;  // GELU: (B*T, F/tp) pre-activation (the GELU epilogue's aux); SwiGLU: (B*T, 2F/tp) gate and up
  Tensor act;  // (B*T, F/tp) GELU or SwiGLU output, fc2's input
  LinearPair::Saved lora;
};

DenseMlp::DenseMlp(const LayerSpec& spec, const ModelConfig& cfg, const PartOptions& opt)
    : opt_(opt), swiglu_(spec.mlp == MlpKind::swiglu), separate_act_backward_(swiglu_ || opt.lora.enabled()) {
  const int64_t C = cfg.hidden_size, F = cfg.ffn_hidden_size;
  linears_ = LinearPair(opt, {"mlp.fc1", "fc1", C, swiglu_ ? 2 * F : F, cfg.init_std, spec.bias},
                        {"mlp.fc2", "fc2", F, C, output_init_std(cfg), spec.bias});
}

Tensor DenseMlp::forward(const Tensor& x, PartState& state, const PartStep& step) const {
  Saved& s = state.as<Saved>();
  const int64_t B = step.samples, N = B * step.tokens;
  const LinearPair::Calls lora = linears_.lora_calls(s.lora, step);
  if (swiglu_) {
    s.fc1 = linears_.column.forward(x, B, nullptr, &lora.column);  // (N, 2F/tp)
    s.act = Tensor::empty({N, s.fc1.dim(1) / 2}, opt_.dtype, opt_.device);
    swiglu_forward(s.fc1, s.act);
  } else {
    s.act = linears_.column.forward(x, B, &s.fc1, &lora.column);  // (N, F/tp), the pre-activation kept in s.fc1
  }
  return linears_.row.forward(s.act, B, &lora.row);  // (Ns, C)
}

void DenseMlp::drop_selected(PartState& state) const {
  if (opt_.selective.mlp_act) state.as<Saved>().act = Tensor();
}

void DenseMlp::recompute_selected(PartState& state, const PartStep&) const {
  if (!opt_.selective.mlp_act) return;
  Saved& s = state.as<Saved>();
  if (swiglu_) {
    s.act = Tensor::empty({s.fc1.dim(0), s.fc1.dim(1) / 2}, opt_.dtype, opt_.device);
    swiglu_forward(s.fc1, s.act);
  } else {
    s.act = Tensor::empty(s.fc1.shape(), opt_.dtype, opt_.device);
    gelu_forward(s.fc1, s.act);  // what fc1's GELU epilogue computed (the same function on the CPU)
  }
}

Tensor DenseMlp::backward(const Tensor& dout, const Tensor& x, PartState& state, const PartStep& step) {
  Saved& s = state.as<Saved>();
  const int64_t B = step.samples;
  if (separate_act_backward_) {
    const LinearPair::Calls lora = linears_.lora_calls(s.lora, step);
    const Tensor dact = linears_.row.backward(dout, s.act, B, {.lora = &lora.row});  // (N, F/tp)
    Tensor dfc1 = Tensor::empty(s.fc1.shape(), opt_.dtype, opt_.device);
    if (swiglu_)
      swiglu_backward(s.fc1, dact, dfc1);
    else
      gelu_backward(s.fc1, dact, dfc1);
    return linears_.column.backward(dfc1, x, B, {.lora = &lora.column});
  }
  // dfc1 (N, F/tp) = (dout @ W2) * gelu'(fc1), and fc1's bias gradient (its column sums), from one epilogue.
  Tensor dfc1 = linears_.row.backward(
      dout, s.act, B, {.dx_epilogue = Epilogue::dgelu_bgrad, .aux = &s.fc1, .dbias = &linears_.column.bias()->grad});
  return linears_.column.backward(dfc1, x, B, {.bias_grad_done = true});
}

}  // namespace mt
