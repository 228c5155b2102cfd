// optimizer_ops.cpp: reductions over f32 gradient buffers (sum of squares, inf/NaN check) and the AdamW
// update on the CPU, with PyTorch's / Megatron's AdamW semantics (decoupled weight decay).
#include <cmath>

#include "core/cpu/ops_cpu.h"

namespace mt::cpu {

double sum_squares(const std::vector<Tensor>& xs) {
  double s = 0.0;
  for (const Tensor& x : xs) {
    const float* v = x.data<float>();
    const int64_t n = x.numel();
    for (int64_t i = 0; i < n; ++i) s += static_cast<double>(v[i]) * v[i];
  }
  return s;
}

bool has_inf_or_nan(const Tensor& x) {
  const float* v = x.data<float>();
  const int64_t n = x.numel();
  bool bad = false;
  for (int64_t i = 0; i < n; ++i) bad |= !std::isfinite(v[i]);  // no early exit: the loop vectorises
  return bad;
}

// g = grad * grad_scale; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= lr * (m / (1 - b1^step) / (sqrt(v / (1 - b2^step)) + eps) + wd * p), wd applied to the old p (torch).
void adamw_step(Tensor& master, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, const AdamWOptions& opt) {
  const int64_t n = master.numel();
  float* p = master.data<float>();
  const float* g_in = grad.data<float>();
  float* m = exp_avg.data<float>();
  float* v = exp_avg_sq.data<float>();
  const double step = static_cast<double>(opt.step);
  const float inv_bc1 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(opt.beta1), step)));
  const float inv_bc2 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(opt.beta2), step)));
  const float b1 = opt.beta1, b2 = opt.beta2, lr = opt.lr, eps = opt.eps, wd = opt.weight_decay;
  for (int64_t i = 0; i < n; ++i) {
    const float g = g_in[i] * opt.grad_scale;
    m[i] = b1 * m[i] + (1.f - b1) * g;
    v[i] = b2 * v[i] + (1.f - b2) * g * g;
    const float update = (m[i] * inv_bc1) / (std::sqrt(v[i] * inv_bc2) + eps);
    p[i] -= lr * (update + wd * p[i]);
  }
}

}  // namespace mt::cpu
