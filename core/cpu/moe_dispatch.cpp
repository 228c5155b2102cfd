// moe_dispatch.cpp: the mixture-of-experts token dispatch on the CPU (core/tensor/ops.h): a counting sort of the
// choices by expert, stable in (token, choice) order, and the row gathers and scatters around the experts' MLPs.
// Row indices are read as given: the entry points checked the shapes; a row index outside [0, R) (or below -1)
// is an error here.
#include <stdexcept>
#include <string>
#include <vector>

#include "core/cpu/float_io.h"
#include "core/cpu/ops_cpu.h"

namespace mt::cpu {

namespace {

// The row of choice i, -1 when it was dropped; throws on a row outside the permuted tensor.
int64_t row_at(const int32_t* row_of, int64_t i, int64_t R, const char* op) {
  const int64_t r = row_of[i];
  if (r < -1 || r >= R)
    throw std::invalid_argument(std::string(op) + ": row_of holds row " + std::to_string(r) + ", outside [-1, " +
                                std::to_string(R) + ")");
  return r;
}

}  // namespace

void moe_dispatch_index(const Tensor& experts, Tensor& row_of, Tensor& counts) {
  const int64_t n = experts.numel(), E = counts.dim(0);
  const int32_t* e = experts.data<int32_t>();
  int32_t* rows = row_of.data<int32_t>();
  int32_t* cnt = counts.data<int32_t>();
  std::vector<int64_t> next(static_cast<size_t>(E), 0);
  for (int64_t i = 0; i < n; ++i) {
    if (e[i] < 0 || e[i] >= E)
      throw std::invalid_argument("moe_dispatch_index: experts holds expert " + std::to_string(e[i]) + " at choice " +
                                  std::to_string(i) + ", outside [0, " + std::to_string(E) + ")");
    ++next[static_cast<size_t>(e[i])];
  }
  int64_t offset = 0;  // counts, then each expert's first row
  for (int64_t x = 0; x < E; ++x) {
    cnt[x] = static_cast<int32_t>(next[static_cast<size_t>(x)]);
    next[static_cast<size_t>(x)] = offset;
    offset += cnt[x];
  }
  for (int64_t i = 0; i < n; ++i) rows[i] = static_cast<int32_t>(next[static_cast<size_t>(e[i])]++);
}

void moe_permute(const Tensor& x, const Tensor& row_of, const Tensor* probs, Tensor& out) {
  const int64_t N = x.dim(0), C = x.dim(1), k = row_of.dim(1), R = out.dim(0);
  const int32_t* rows = row_of.data<int32_t>();
  const float* w = probs ? probs->data<float>() : nullptr;
  std::vector<float> src(static_cast<size_t>(C)), dst(static_cast<size_t>(C));
  for (int64_t n = 0; n < N; ++n) {
    load_f32(x, n * C, C, src.data());
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = row_at(rows, n * k + j, R, "moe_permute");
      if (r < 0) continue;
      const float s = w ? w[n * k + j] : 1.f;
      for (int64_t c = 0; c < C; ++c) dst[c] = s * src[c];
      store_f32(dst.data(), C, out, r * C);
    }
  }
}

void moe_unpermute(const Tensor& y, const Tensor& row_of, const Tensor* probs, Tensor& out) {
  const int64_t N = out.dim(0), C = out.dim(1), k = row_of.dim(1), R = y.dim(0);
  const int32_t* rows = row_of.data<int32_t>();
  const float* w = probs ? probs->data<float>() : nullptr;
  std::vector<float> acc(static_cast<size_t>(C)), row(static_cast<size_t>(C));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t c = 0; c < C; ++c) acc[c] = 0.f;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = row_at(rows, n * k + j, R, "moe_unpermute");
      if (r < 0) continue;
      const float s = w ? w[n * k + j] : 1.f;
      load_f32(y, r * C, C, row.data());
      for (int64_t c = 0; c < C; ++c) {
        const float p = s * row[c];  // two roundings, as the GPU (no fused multiply-add)
        acc[c] += p;
      }
    }
    store_f32(acc.data(), C, out, n * C);
  }
}

void moe_unpermute_backward_probs(const Tensor& dout, const Tensor& y, const Tensor& row_of, Tensor& dprobs) {
  const int64_t N = dout.dim(0), C = dout.dim(1), k = row_of.dim(1), R = y.dim(0);
  const int32_t* rows = row_of.data<int32_t>();
  float* dp = dprobs.data<float>();
  std::vector<float> d(static_cast<size_t>(C)), row(static_cast<size_t>(C));
  for (int64_t n = 0; n < N; ++n) {
    load_f32(dout, n * C, C, d.data());
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = row_at(rows, n * k + j, R, "moe_unpermute_backward_probs");
      double acc = 0;
      if (r >= 0) {
        load_f32(y, r * C, C, row.data());
        for (int64_t c = 0; c < C; ++c) acc += static_cast<double>(d[c]) * row[c];
      }
      dp[n * k + j] = static_cast<float>(acc);
    }
  }
}

}  // namespace mt::cpu
