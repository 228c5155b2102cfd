// swiglu.cpp: the SwiGLU activation of Llama's MLP on the CPU, on interleaved (gate, up) column pairs.
// fp32 throughout, with vec_math.h's exp_f32 (the same IEEE operations wherever an element sits), rounded once
// on store. Rows go through fp32 buffers: load, compute, store.
#include <algorithm>
#include <vector>

#include "core/cpu/float_io.h"
#include "core/cpu/ops_cpu.h"
#include "core/cpu/vec_math.h"

namespace mt::cpu {

namespace {

// sigmoid(g) and exp(-g). -g is capped at 80 (g below -80) so that e stays finite and e * s (= 1 - s) stays a
// number: there s is below 2e-35 either way.
inline void sigmoid_parts(float g, float& s, float& e) {
  const float a = -g;
  e = exp_f32(select_f32(a > 80.f, 80.f, a));
  s = 1.f / (1.f + e);
}

// Rows of x (N, 2F) per batch: enough pairs to fill about kChunk fp32 values of output.
int64_t rows_per_batch(int64_t F) { return std::max<int64_t>(1, kChunk / std::max<int64_t>(F, 1)); }

}  // namespace

// out[n, f] = silu(x[n, 2f]) * x[n, 2f + 1], silu(g) = g * sigmoid(g).
void swiglu_forward(const Tensor& x, Tensor& out) {
  const int64_t N = x.dim(0), F = x.dim(1) / 2;
  const int64_t rows = rows_per_batch(F);
  std::vector<float> in(rows * 2 * F), y(rows * F);  // (rows, 2F), (rows, F)
  for (int64_t n0 = 0; n0 < N; n0 += rows) {
    const int64_t len = std::min(rows, N - n0) * F;  // pairs in this batch
    load_f32(x, n0 * 2 * F, 2 * len, in.data());
    for (int64_t i = 0; i < len; ++i) {
      const float g = in[2 * i], u = in[2 * i + 1];
      float s, e;
      sigmoid_parts(g, s, e);
      y[i] = g * s * u;
    }
    store_f32(y.data(), len, out, n0 * F);
  }
}

// With s = sigmoid(g): silu'(g) = s + g s (1 - s), 1 - s = e s;
// dgate = dout * up * silu'(g), dup = dout * silu(g).
void swiglu_backward(const Tensor& x, const Tensor& dout, Tensor& dx) {
  const int64_t N = x.dim(0), F = x.dim(1) / 2;
  const int64_t rows = rows_per_batch(F);
  std::vector<float> in(rows * 2 * F), d(rows * F);  // (rows, 2F), (rows, F)
  for (int64_t n0 = 0; n0 < N; n0 += rows) {
    const int64_t len = std::min(rows, N - n0) * F;
    load_f32(x, n0 * 2 * F, 2 * len, in.data());
    load_f32(dout, n0 * F, len, d.data());
    for (int64_t i = 0; i < len; ++i) {
      const float g = in[2 * i], u = in[2 * i + 1];
      float s, e;
      sigmoid_parts(g, s, e);
      const float dsilu = s + g * s * (e * s);
      in[2 * i] = d[i] * u * dsilu;
      in[2 * i + 1] = d[i] * (g * s);
    }
    store_f32(in.data(), 2 * len, dx, n0 * 2 * F);
  }
}

}  // namespace mt::cpu
