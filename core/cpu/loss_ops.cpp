// loss_ops.cpp: the loss head's small device-side helpers on the CPU: the mean loss accumulated into an f64
// scalar (so the trainer reads losses once per logging interval) and a fill (the loss-gradient seed).
#include <algorithm>

#include "core/cpu/float_io.h"
#include "core/cpu/ops_cpu.h"

namespace mt::cpu {

// The order of the host reading it replaces (GptModel::forward_stage): a double sum in element order, the
// mean in double, rounded to f32, then added in double.
void accumulate_mean(const Tensor& x, Tensor& sum) {
  const float* v = x.data<float>();
  const int64_t n = x.numel();
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += v[i];
  sum.data<double>()[0] += static_cast<double>(static_cast<float>(s / static_cast<double>(n)));
}

// Element order, each product rounded to f32, summed in double.
void accumulate_weighted_sum(const Tensor& x, const Tensor& w, Tensor& sum) {
  const float* v = x.data<float>();
  const float* wt = w.data<float>();
  double s = 0.0;
  for (int64_t i = 0; i < x.numel(); ++i) s += static_cast<double>(v[i] * wt[i]);
  sum.data<double>()[0] += s;
}

void fill_(Tensor& x, float v) {
  constexpr int64_t kRun = 1024;
  float run[kRun];
  for (float& r : run) r = v;
  for (int64_t at = 0; at < x.numel(); at += kRun) store_f32(run, std::min(kRun, x.numel() - at), x, at);
}

}  // namespace mt::cpu
