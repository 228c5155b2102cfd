#include "models/norm.h"

#include "core/tensor/ops.h"

namespace mt {

Norm::Norm(const std::string& name, int64_t C, NormKind kind, float eps, DType dtype, uint64_t seed)
    : kind_(kind), eps_(eps) {
  weight_ = make_parameter(name + ".weight", {C}, dtype, Init::ones, 0, seed);
  if (kind == NormKind::layernorm) bias_ = make_parameter(name + ".bias", {C}, dtype, Init::zeros, 0, seed);
}

const Tensor& Norm::forward(const Tensor& x, Saved& s) const {
  const int64_t N = x.dim(0), C = x.dim(1);
  s.out = Tensor::empty({N, C}, x.dtype(), x.device());
  s.rstd = Tensor::empty({N}, DType::f32, x.device());
  if (kind_ == NormKind::rmsnorm) {
    rmsnorm_forward(x, weight_.value, s.out, s.rstd, {.eps = eps_});
  } else {
    s.mean = Tensor::empty({N}, DType::f32, x.device());
    layernorm_forward(x, weight_.value, bias_.value, s.out, s.mean, s.rstd, {.eps = eps_});
  }
  return s.out;
}

Tensor Norm::backward(const Tensor& dout, const Tensor& x, const Saved& s) {
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  // A frozen norm (LoRA) has no gradient storage: its (C) sums go to a scratch that is dropped.
  auto grad_of = [&](Parameter& p) {
    return p.frozen ? Tensor::zeros(p.value.shape(), DType::f32, x.device(), MemKind::workspace) : p.grad;
  };
  Tensor dw = grad_of(weight_);
  if (kind_ == NormKind::rmsnorm) {
    rmsnorm_backward(dout, x, weight_.value, s.rstd, dx, dw);
  } else {
    Tensor db = grad_of(bias_);
    layernorm_backward(dout, x, weight_.value, s.mean, s.rstd, dx, dw, db);
  }
  return dx;
}

void Norm::mark_sequence_parallel() {
  for (Parameter* p : parameters()) p->grad_sums.tensor = true;
}

std::vector<Parameter*> Norm::parameters() {
  if (kind_ == NormKind::rmsnorm) return {&weight_};
  return {&weight_, &bias_};
}

}  // namespace mt
