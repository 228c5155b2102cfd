// layernorm.cpp: LayerNorm over the last dimension on the CPU. Row statistics in double (two passes,
// biased variance), saved as f32 mean and rstd; the output and the backward use those saved f32 values.
#include <cmath>
#include <vector>

#include "core/cpu/float_io.h"
#include "core/cpu/ops_cpu.h"

namespace mt::cpu {

void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& out, Tensor& mean,
                       Tensor& rstd, const LayerNormOptions& opt) {
  const int64_t N = x.dim(0), C = x.dim(1);
  std::vector<float> w(C), b(C), row(C);  // (C) each
  load_f32(weight, 0, C, w.data());
  load_f32(bias, 0, C, b.data());
  float* mean_out = mean.data<float>();  // (N)
  float* rstd_out = rstd.data<float>();  // (N)
  for (int64_t n = 0; n < N; ++n) {
    load_f32(x, n * C, C, row.data());
    double sum = 0.0;
    for (int64_t c = 0; c < C; ++c) sum += row[c];
    const double mu = sum / static_cast<double>(C);
    double sq = 0.0;
    for (int64_t c = 0; c < C; ++c) {
      const double d = row[c] - mu;
      sq += d * d;
    }
    const double var = sq / static_cast<double>(C);
    const float m = static_cast<float>(mu);
    const float s = static_cast<float>(1.0 / std::sqrt(var + static_cast<double>(opt.eps)));
    for (int64_t c = 0; c < C; ++c) row[c] = (row[c] - m) * s * w[c] + b[c];
    store_f32(row.data(), C, out, n * C);
    mean_out[n] = m;
    rstd_out[n] = s;
  }
}

// With xhat = (x - mean) * rstd and g = dout * weight:
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  dweight += sum_n dout * xhat,  dbias += sum_n dout.
void layernorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, Tensor& dx, Tensor& dweight, Tensor& dbias) {
  const int64_t N = x.dim(0), C = x.dim(1);
  std::vector<float> w(C), xhat(C), d(C);      // (C) each
  std::vector<double> dw(C, 0.0), db(C, 0.0);  // (C) each, summed over rows
  load_f32(weight, 0, C, w.data());
  const float* mean_in = mean.data<float>();  // (N)
  const float* rstd_in = rstd.data<float>();  // (N)
  for (int64_t n = 0; n < N; ++n) {
    load_f32(x, n * C, C, xhat.data());
    load_f32(dout, n * C, C, d.data());
    const float m = mean_in[n], s = rstd_in[n];
    double sum_g = 0.0, sum_gx = 0.0;
    for (int64_t c = 0; c < C; ++c) {
      xhat[c] = (xhat[c] - m) * s;
      const float g = d[c] * w[c];
      sum_g += g;
      sum_gx += static_cast<double>(g) * xhat[c];
      dw[c] += static_cast<double>(d[c]) * xhat[c];
      db[c] += d[c];
    }
    const float mean_g = static_cast<float>(sum_g / static_cast<double>(C));
    const float mean_gx = static_cast<float>(sum_gx / static_cast<double>(C));
    for (int64_t c = 0; c < C; ++c) d[c] = s * (d[c] * w[c] - mean_g - xhat[c] * mean_gx);
    store_f32(d.data(), C, dx, n * C);
  }
  float* dweight_out = dweight.data<float>();  // (C)
  float* dbias_out = dbias.data<float>();      // (C)
  for (int64_t c = 0; c < C; ++c) {
    dweight_out[c] += static_cast<float>(dw[c]);
    dbias_out[c] += static_cast<float>(db[c]);
  }
}

}  // namespace mt::cpu
