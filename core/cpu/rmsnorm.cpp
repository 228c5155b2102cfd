// rmsnorm.cpp: RMSNorm over the last dimension on the CPU (Llama's norm: no mean subtraction, no bias).
// The row's mean square in double, saved as an f32 rstd; the output and the backward use that saved f32
// value, as core/cpu/layernorm.cpp does with its statistics.
#include <cmath>
#include <vector>

#include "core/cpu/float_io.h"
#include "core/cpu/ops_cpu.h"

namespace mt::cpu {

void rmsnorm_forward(const Tensor& x, const Tensor& weight, Tensor& out, Tensor& rstd, const RmsNormOptions& opt) {
  const int64_t N = x.dim(0), C = x.dim(1);
  std::vector<float> w(C), row(C);  // (C) each
  load_f32(weight, 0, C, w.data());
  float* rstd_out = rstd.data<float>();  // (N)
  for (int64_t n = 0; n < N; ++n) {
    load_f32(x, n * C, C, row.data());
    double sq = 0.0;
    for (int64_t c = 0; c < C; ++c) sq += static_cast<double>(row[c]) * row[c];
    const double ms = sq / static_cast<double>(C);
    const float s = static_cast<float>(1.0 / std::sqrt(ms + static_cast<double>(opt.eps)));
    for (int64_t c = 0; c < C; ++c) row[c] = row[c] * s * w[c];
    store_f32(row.data(), C, out, n * C);
    rstd_out[n] = s;
  }
}

// y = x * r * w with r = 1 / sqrt(mean(x^2) + eps), so dr/dx_c = -r^3 x_c / C. With xhat = x * r and
// g = dout * w: dx = r * g - x r^3 mean(g * x) = r * (g - xhat * mean(g * xhat)), dweight += sum_n dout * xhat.
void rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& rstd, Tensor& dx,
                      Tensor& dweight) {
  const int64_t N = x.dim(0), C = x.dim(1);
  std::vector<float> w(C), xhat(C), d(C);  // (C) each
  std::vector<double> dw(C, 0.0);          // (C), summed over rows in row order
  load_f32(weight, 0, C, w.data());
  const float* rstd_in = rstd.data<float>();  // (N)
  for (int64_t n = 0; n < N; ++n) {
    load_f32(x, n * C, C, xhat.data());
    load_f32(dout, n * C, C, d.data());
    const float s = rstd_in[n];
    double sum_gx = 0.0;
    for (int64_t c = 0; c < C; ++c) {
      xhat[c] = xhat[c] * s;
      const float g = d[c] * w[c];
      sum_gx += static_cast<double>(g) * xhat[c];
      dw[c] += static_cast<double>(d[c]) * xhat[c];
    }
    const float mean_gx = static_cast<float>(sum_gx / static_cast<double>(C));
    for (int64_t c = 0; c < C; ++c) d[c] = s * (d[c] * w[c] - xhat[c] * mean_gx);
    store_f32(d.data(), C, dx, n * C);
  }
  float* dweight_out = dweight.data<float>();  // (C)
  for (int64_t c = 0; c < C; ++c) dweight_out[c] += static_cast<float>(dw[c]);
}

}  // namespace mt::cpu
