// rope.cpp: rotary position embedding on the CPU, in place on the query and key slots of a
// (B, T, G, R + 2, D) qkv activation (core/tensor/ops.h gives the exact numerics). A (T, D/2) table of fp32 cos and
// sin is computed once per call; each token's query and key vectors are rotated by it in fp32 and rounded once
// on store. The value slots are neither read nor written.
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/cpu/float_io.h"
#include "core/cpu/ops_cpu.h"

namespace mt::cpu {

void rope_(Tensor& qkv, const RopeOptions& opt) {
  const int64_t B = qkv.dim(0), T = qkv.dim(1), G = qkv.dim(2), S = qkv.dim(3), D = qkv.dim(4);
  const int64_t half = D / 2, rotated = (S - 1) * D;  // slots 0..R of a group: R queries and the key
  if (B * T * G == 0) return;

  // inv_freq_i (rope_frequencies, or the options'); a = float(p) * inv_freq_i in fp32; cos and sin of that fp32
  // angle in double, rounded, times attention_factor in fp32. inverse: sin(-a) = -sin(a).
  const std::vector<float> inv_freq = rope_inv_freq(opt, D);  // (D/2)
  const float scale = opt.attention_factor;
  // Packed documents' positions lie in [0, rows): T, or the whole sequence's length for a context rank's chunks.
  const int64_t rows = opt.positions.defined() && opt.position_rows > 0 ? opt.position_rows : T;
  std::vector<float> cos_t(rows * half), sin_t(rows * half);  // (rows, D/2) each
  for (int64_t t = 0; t < rows; ++t) {
    const float p = static_cast<float>(position_at(opt, t));
    for (int64_t i = 0; i < half; ++i) {
      const double a = static_cast<double>(p * inv_freq[i]);
      const float s = static_cast<float>(std::sin(a));
      cos_t[t * half + i] = static_cast<float>(std::cos(a)) * scale;  // exact for the plain factor 1
      sin_t[t * half + i] = (opt.inverse ? -s : s) * scale;
    }
  }

  // Packed documents: token (b, t) takes the table's row positions[b, t] (the table's row p is position p then,
  // as position_offset and split_at are 0).
  const int32_t* pos = opt.positions.defined() ? opt.positions.data<int32_t>() : nullptr;
  if (pos)
    for (int64_t i = 0; i < B * T; ++i)
      if (pos[i] < 0 || pos[i] >= rows)
        throw std::invalid_argument("rope_: positions[" + std::to_string(i / T) + ", " + std::to_string(i % T) +
                                    "] = " + std::to_string(pos[i]) + " lies outside [0, " + std::to_string(rows) +
                                    ")");
  std::vector<float> v(rotated);  // (R + 1, D): one group's queries and key
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t row = pos ? pos[b * T + t] : t;
      const float* c = cos_t.data() + row * half;
      const float* s = sin_t.data() + row * half;
      for (int64_t g = 0; g < G; ++g) {
        const int64_t begin = ((b * T + t) * G + g) * S * D;
        load_f32(qkv, begin, rotated, v.data());
        for (int64_t k = 0; k < rotated; k += D) {
          float* x = v.data() + k;
          for (int64_t i = 0; i < half; ++i) {
            const float x0 = x[i], x1 = x[i + half];
            x[i] = x0 * c[i] - x1 * s[i];
            x[i + half] = x1 * c[i] + x0 * s[i];
          }
        }
        store_f32(v.data(), rotated, qkv, begin);
      }
    }
}

}  // namespace mt::cpu
