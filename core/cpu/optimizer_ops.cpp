// optimizer_ops.cpp: the reduction over f32 gradient buffers (sum of squares and inf/NaN check, grad_stats) and
// the AdamW update on the CPU, with PyTorch's / Megatron's AdamW semantics (decoupled weight decay).
#include <cmath>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "core/cpu/ops_cpu.h"

namespace mt::cpu {

namespace {

// The per-step constants of the AdamW update, computed once per step in the same way for every tensor.
struct AdamWConsts {
  float b1, b2, lr, eps, grad_scale;
  float inv_bc1, inv_bc2;  // 1 / (1 - beta^step), in double, rounded
};

AdamWConsts adamw_consts(const AdamWOptions& opt) {
  const double step = static_cast<double>(opt.step);
  return AdamWConsts{.b1 = opt.beta1,
                     .b2 = opt.beta2,
                     .lr = opt.lr,
                     .eps = opt.eps,
                     .grad_scale = opt.grad_scale,
                     .inv_bc1 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(opt.beta1), step))),
                     .inv_bc2 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(opt.beta2), step)))};
}

// g = grad * grad_scale; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= lr * (m / (1 - b1^step) / (sqrt(v / (1 - b2^step)) + eps) + wd * p), wd applied to the old p (torch).
// The reference order of float operations: core/cuda/optimizer_ops.cu repeats it with rounded intrinsics.
// Four elements at a time with SSE2, the rest one at a time with the same operations (IEEE mul, add, div and sqrt
// round the same in a lane as in scalar code), so every element gets the same bits wherever it sits. (A plain
// loop does not vectorize: std::sqrt may set errno.)
void adamw_update(float* p, const float* g_in, float* m, float* v, int64_t n, const AdamWConsts& c, float wd) {
  const float b1 = c.b1, b2 = c.b2, lr = c.lr, eps = c.eps, inv_bc1 = c.inv_bc1, inv_bc2 = c.inv_bc2;
  const float one_b1 = 1.f - b1, one_b2 = 1.f - b2;
  int64_t i = 0;
#if defined(__SSE2__)
  const __m128 vb1 = _mm_set1_ps(b1), vb2 = _mm_set1_ps(b2), vlr = _mm_set1_ps(lr), veps = _mm_set1_ps(eps);
  const __m128 vbc1 = _mm_set1_ps(inv_bc1), vbc2 = _mm_set1_ps(inv_bc2), vwd = _mm_set1_ps(wd);
  const __m128 vone_b1 = _mm_set1_ps(one_b1), vone_b2 = _mm_set1_ps(one_b2), vgs = _mm_set1_ps(c.grad_scale);
  for (; i + 4 <= n; i += 4) {
    const __m128 g = _mm_mul_ps(_mm_loadu_ps(g_in + i), vgs);
    const __m128 mi = _mm_add_ps(_mm_mul_ps(vb1, _mm_loadu_ps(m + i)), _mm_mul_ps(vone_b1, g));
    const __m128 vi = _mm_add_ps(_mm_mul_ps(vb2, _mm_loadu_ps(v + i)), _mm_mul_ps(_mm_mul_ps(vone_b2, g), g));
    _mm_storeu_ps(m + i, mi);
    _mm_storeu_ps(v + i, vi);
    const __m128 update = _mm_div_ps(_mm_mul_ps(mi, vbc1), _mm_add_ps(_mm_sqrt_ps(_mm_mul_ps(vi, vbc2)), veps));
    const __m128 pi = _mm_loadu_ps(p + i);
    _mm_storeu_ps(p + i, _mm_sub_ps(pi, _mm_mul_ps(vlr, _mm_add_ps(update, _mm_mul_ps(vwd, pi)))));
  }
#endif
  for (; i < n; ++i) {
    const float g = g_in[i] * c.grad_scale;
    m[i] = b1 * m[i] + one_b1 * g;
    v[i] = b2 * v[i] + one_b2 * g * g;
    const float update = (m[i] * inv_bc1) / (std::sqrt(v[i] * inv_bc2) + eps);
    p[i] -= lr * (update + wd * p[i]);
  }
}

}  // namespace

void adamw_step(Tensor& master, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, const AdamWOptions& opt) {
  adamw_update(master.data<float>(), grad.data<float>(), exp_avg.data<float>(), exp_avg_sq.data<float>(),
               master.numel(), adamw_consts(opt), opt.weight_decay);
}

// ---- fused step ops --------------------------------------------------------------------------------

// One loop over all elements for both results; the sum in buffer order, in double (the reference order that
// sum_squares and has_inf_or_nan in core/tensor/ops.cpp report too).
void grad_stats(const std::vector<Tensor>& xs, Tensor& stats) {
  double s = 0.0;
  bool bad = false;
  for (const Tensor& x : xs) {
    const float* v = x.data<float>();
    const int64_t n = x.numel();
    for (int64_t i = 0; i < n; ++i) {
      s += static_cast<double>(v[i]) * v[i];
      bad |= !std::isfinite(v[i]);
    }
  }
  double* out = stats.data<double>();
  out[0] = s;
  out[1] = bad ? 1.0 : 0.0;
}

// The same update as adamw_step per tensor; the value is cast from the master right after its tensor (the
// host has no launches to save, so this is the per-parameter loop, kept as the reference).
void adamw_multi_step(const std::vector<AdamWTensors>& ts, const AdamWOptions& opt) {
  const AdamWConsts c = adamw_consts(opt);
  for (const AdamWTensors& t : ts) {
    adamw_update(t.master.data<float>(), t.grad.data<float>(), t.exp_avg.data<float>(), t.exp_avg_sq.data<float>(),
                 t.master.numel(), c, t.decay ? opt.weight_decay : 0.f);
    if (t.value.defined() && t.value.raw() != t.master.raw()) {
      Tensor value = t.value;
      value.copy_from(t.master);
    }
  }
}

}  // namespace mt::cpu
