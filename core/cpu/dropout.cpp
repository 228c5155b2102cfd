// dropout.cpp: dropout keyed by global coordinates on the CPU. Element (b, t, c) is kept when
// dropout_uniform(seed, site, sample_offset + b, dropout_row(opt, t), col_offset + c) >= p and then scaled by
// 1 / (1 - p); the backward regenerates the same mask, so forward and backward are the same map.
#include <vector>

#include "core/cpu/dropout_mask.h"
#include "core/cpu/float_io.h"
#include "core/cpu/ops_cpu.h"

namespace mt::cpu {

namespace {

// out = mask(x) / (1 - p) over a (B, T, C) tensor; out may alias x.
void apply_mask(const Tensor& x, Tensor& out, const DropoutOptions& opt) {
  const int64_t B = x.dim(0), T = x.dim(1), C = x.dim(2);
  if (opt.p == 0.f) {
    if (out.raw() != x.raw()) out.copy_from(x);
    return;
  }
  std::vector<float> row(C), keep(C);  // (C)
  for (int64_t b = 0; b < B; ++b) {
    const uint64_t sample = static_cast<uint64_t>(opt.sample_offset + b);
    for (int64_t t = 0; t < T; ++t) {
      const uint64_t grow = static_cast<uint64_t>(dropout_row(opt, t));
      const int64_t at = (b * T + t) * C;
      load_f32(x, at, C, row.data());
      dropout_keep_scales({.seed = opt.seed, .site = opt.site, .sample = sample, .row = grow, .p = opt.p},
                          static_cast<uint64_t>(opt.col_offset), C, keep.data());
      for (int64_t c = 0; c < C; ++c) row[c] = keep[c] != 0.f ? row[c] * keep[c] : 0.f;  // dropped inf -> 0
      store_f32(row.data(), C, out, at);
    }
  }
}

}  // namespace

void dropout_forward(const Tensor& x, Tensor& out, const DropoutOptions& opt) { apply_mask(x, out, opt); }

void dropout_backward(const Tensor& dout, Tensor& dx, const DropoutOptions& opt) { apply_mask(dout, dx, opt); }

}  // namespace mt::cpu
