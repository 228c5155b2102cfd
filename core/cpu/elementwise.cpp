// elementwise.cpp: add, scale_, GELU (tanh approximation, vec_math.h's sigmoid form) and the bias add of a linear
// layer with its backward, on the CPU. Values go through fp32 chunks: load, compute in fp32, round once on store.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/cpu/float_io.h"
#include "core/cpu/ops_cpu.h"
#include "core/cpu/vec_math.h"

namespace mt::cpu {

void add_bias(Tensor& x, const Tensor& bias) {
  const int64_t N = x.dim(0), C = x.dim(1);
  std::vector<float> b(C);    // (C)
  std::vector<float> row(C);  // (C)
  load_f32(bias, 0, C, b.data());
  for (int64_t n = 0; n < N; ++n) {
    load_f32(x, n * C, C, row.data());
    for (int64_t c = 0; c < C; ++c) row[c] += b[c];
    store_f32(row.data(), C, x, n * C);
  }
}

void bias_backward(const Tensor& dout, Tensor& dbias) {
  const int64_t N = dout.dim(0), C = dout.dim(1);
  std::vector<double> acc(C, 0.0);  // (C)
  std::vector<float> row(C);        // (C)
  for (int64_t n = 0; n < N; ++n) {
    load_f32(dout, n * C, C, row.data());
    for (int64_t c = 0; c < C; ++c) acc[c] += row[c];
  }
  float* db = dbias.data<float>();
  for (int64_t c = 0; c < C; ++c) db[c] += static_cast<float>(acc[c]);
}

void add(const Tensor& a, const Tensor& b, Tensor& out) {
  float va[kChunk], vb[kChunk];
  const int64_t n = out.numel();
  for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
    const int64_t len = std::min(kChunk, n - i0);
    load_f32(a, i0, len, va);
    load_f32(b, i0, len, vb);
    for (int64_t i = 0; i < len; ++i) va[i] += vb[i];
    store_f32(va, len, out, i0);
  }
}

void scale_(Tensor& x, float s) {
  float v[kChunk];
  const int64_t n = x.numel();
  for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
    const int64_t len = std::min(kChunk, n - i0);
    load_f32(x, i0, len, v);
    for (int64_t i = 0; i < len; ++i) v[i] *= s;
    store_f32(v, len, x, i0);
  }
}

void gelu_forward(const Tensor& x, Tensor& out) {
  float v[kChunk];
  const int64_t n = out.numel();
  for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
    const int64_t len = std::min(kChunk, n - i0);
    load_f32(x, i0, len, v);
    gelu_tanh(v, len, v);
    store_f32(v, len, out, i0);
  }
}

void gelu_backward(const Tensor& x, const Tensor& dout, Tensor& dx) {
  float vx[kChunk], vd[kChunk];
  const int64_t n = dx.numel();
  for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
    const int64_t len = std::min(kChunk, n - i0);
    load_f32(x, i0, len, vx);
    load_f32(dout, i0, len, vd);
    gelu_tanh_backward(vx, len, vd);
    store_f32(vd, len, dx, i0);
  }
}

}  // namespace mt::cpu
