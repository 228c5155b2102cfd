// dropout_mask.h: dropout keep scales for a run of columns, the SIMD form of rng.h's dropout_row_scales: the
// Philox blocks of a row are computed many at a time (structure of arrays, so the compiler vectorizes the rounds).
// Integer arithmetic only, so the scales are bit for bit those of dropout_row_scales / dropout_uniform.
#pragma once
#include <cstdint>

#include "core/base/rng.h"

namespace mt::cpu {

// keep[j] = the keep scale (0 or 1 / (1 - p)) of column col0 + j of dropout row r, j < n.
void dropout_keep_scales(const DropoutRow& r, uint64_t col0, int64_t n, float* keep);

}  // namespace mt::cpu
