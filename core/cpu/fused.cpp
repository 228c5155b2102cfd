// fused.cpp: the fused residual + dropout op on the CPU, out = residual + dropout(x). It computes exactly
// what dropout_forward followed by add computes: the dropped value is rounded to the storage dtype (as
// dropout_forward stores it), then added to the residual in fp32 and rounded again (as add stores it).
#include <vector>

#include "core/cpu/dropout_mask.h"
#include "core/cpu/float_io.h"
#include "core/cpu/ops_cpu.h"

namespace mt::cpu {

void dropout_add(const Tensor& x, const Tensor& residual, Tensor& out, const DropoutOptions& opt) {
  const int64_t B = x.dim(0), T = x.dim(1), C = x.dim(2);
  const DType dt = x.dtype();
  std::vector<float> row(C), res(C), keep(C);  // (C)
  for (int64_t b = 0; b < B; ++b) {
    const uint64_t sample = static_cast<uint64_t>(opt.sample_offset + b);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t at = (b * T + t) * C;
      load_f32(x, at, C, row.data());
      load_f32(residual, at, C, res.data());
      if (opt.p != 0.f) {  // p == 0: dropout_forward copies, so the values are x's (already in dtype)
        dropout_keep_scales({.seed = opt.seed,
                             .site = opt.site,
                             .sample = sample,
                             .row = static_cast<uint64_t>(dropout_row(opt, t)),
                             .p = opt.p},
                            static_cast<uint64_t>(opt.col_offset), C, keep.data());
        // As core/cpu/dropout.cpp (a dropped inf -> 0), rounded as dropout_forward's store rounds.
        for (int64_t c = 0; c < C; ++c) row[c] = round_to(dt, keep[c] != 0.f ? row[c] * keep[c] : 0.f);
      }
      for (int64_t c = 0; c < C; ++c) row[c] = res[c] + row[c];
      store_f32(row.data(), C, out, at);
    }
  }
}

}  // namespace mt::cpu
