#include "core/optimizer.h"

#include <cmath>

#include "core/ops.h"

namespace mt {

double clip_coefficient(double grad_norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  const double coeff = max_norm / (grad_norm + 1e-6);
  return coeff < 1.0 ? coeff : 1.0;
}

AdamW::AdamW(std::vector<Parameter*> params, AdamWConfig cfg) : cfg_(cfg) {
  for (Parameter* p : params) {
    Slot s{.param = p};
    if (p->value.dtype() == DType::f32) {
      s.master = p->value;
    } else {
      s.master = Tensor::empty(p->value.shape(), DType::f32, p->value.device(), MemKind::optimizer);
      s.master.copy_from(p->value);
    }
    s.exp_avg = Tensor::zeros(p->value.shape(), DType::f32, p->value.device(), MemKind::optimizer);
    s.exp_avg_sq = Tensor::zeros(p->value.shape(), DType::f32, p->value.device(), MemKind::optimizer);
    slots_.push_back(std::move(s));
  }
}

void AdamW::zero_grads() {
  for (Slot& s : slots_) s.param->grad.zero_();
}

void AdamW::sync_values_from_master() {
  for (Slot& s : slots_)
    if (s.master.raw() != s.param->value.raw()) s.param->value.copy_from(s.master);
}

StepResult AdamW::step(double lr, double loss_scale) {
  StepResult r;
  double sumsq = 0;
  for (Slot& s : slots_)
    if (!s.param->tied_copy && (s.param->tensor_parallel || cfg_.count_replicas)) sumsq += sum_squares(s.param->grad);
  if (cfg_.sum_across_ranks) sumsq = cfg_.sum_across_ranks(sumsq);
  const double inv_scale = 1.0 / loss_scale;
  r.grad_norm = std::sqrt(sumsq) * inv_scale;
  r.found_inf = !std::isfinite(r.grad_norm);
  if (r.found_inf) return r;

  const double clip = clip_coefficient(r.grad_norm, cfg_.grad_clip);
  ++steps_;
  for (Slot& s : slots_) {
    AdamWOptions o{.lr = static_cast<float>(lr), .beta1 = static_cast<float>(cfg_.beta1),
                   .beta2 = static_cast<float>(cfg_.beta2), .eps = static_cast<float>(cfg_.eps),
                   .weight_decay = s.param->weight_decay ? static_cast<float>(cfg_.weight_decay) : 0.f,
                   .step = steps_, .grad_scale = static_cast<float>(inv_scale * clip)};
    adamw_step(s.master, s.param->grad, s.exp_avg, s.exp_avg_sq, o);
  }
  sync_values_from_master();
  return r;
}

}  // namespace mt
