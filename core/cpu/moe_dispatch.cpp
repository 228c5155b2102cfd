// moe_dispatch.cpp: the mixture-of-experts token dispatch on the CPU (core/tensor/ops.h): the choices grouped by
// expert in (token, choice) order, with a capacity the first ones or those of the highest weight kept (decided over
// every token given, rows written for a part of them), and the row gathers and scatters around the experts' MLPs.
// Row indices are read as given: the entry points checked the shapes; a row index outside [0, R) (or below -1)
// is an error here.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
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

// A weight's place in the drop order as an unsigned key, larger for a larger weight: the float's bits made
// monotone (sign flipped for >= 0, all flipped below), -0 as 0, a NaN 0 (below every number). The GPU keeps the same
// key (core/cuda/moe_dispatch.cu).
uint32_t weight_rank(float w) {
  if (std::isnan(w)) return 0;
  if (w == 0.f) w = 0.f;
  const auto bits = std::bit_cast<uint32_t>(w);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

}  // namespace

void moe_dispatch_index(const Tensor& experts, Tensor& row_of, Tensor& counts, const MoeCapacityOptions& cap) {
  const int64_t n = experts.numel(), k = experts.dim(1), E = counts.dim(0);
  const int32_t* e = experts.data<int32_t>();
  int32_t* rows = row_of.data<int32_t>();
  int32_t* cnt = counts.data<int32_t>();
  for (int64_t i = 0; i < n; ++i)
    if (e[i] < 0 || e[i] >= E)
      throw std::invalid_argument("moe_dispatch_index: experts holds expert " + std::to_string(e[i]) + " at choice " +
                                  std::to_string(i) + ", outside [0, " + std::to_string(E) + ")");
  // Each choice's place in one rank's (n, j) order: (order[n], j) with an order, else i itself.
  std::vector<int64_t> place(static_cast<size_t>(n));
  if (cap.order) {
    const int32_t* o = cap.order->data<int32_t>();
    const int64_t N = experts.dim(0);
    std::vector<char> seen(static_cast<size_t>(N), 0);
    for (int64_t t = 0; t < N; ++t) {
      if (o[t] < 0 || o[t] >= N || seen[static_cast<size_t>(o[t])])
        throw std::invalid_argument("moe_dispatch_index: order is not a permutation of [0, " + std::to_string(N) +
                                    "): token " + std::to_string(t) + " holds " + std::to_string(o[t]));
      seen[static_cast<size_t>(o[t])] = 1;
    }
    for (int64_t i = 0; i < n; ++i) place[static_cast<size_t>(i)] = o[i / k] * k + i % k;
  } else {
    for (int64_t i = 0; i < n; ++i) place[static_cast<size_t>(i)] = i;
  }
  std::vector<char> kept(static_cast<size_t>(n), 1);
  if (cap.capacity > 0) {
    std::vector<std::vector<int64_t>> of_expert(static_cast<size_t>(E));  // each expert's choices, all tokens
    for (int64_t i = 0; i < n; ++i) of_expert[static_cast<size_t>(e[i])].push_back(i);
    const float* w = cap.probs ? cap.probs->data<float>() : nullptr;
    for (std::vector<int64_t>& order : of_expert) {
      if (static_cast<int64_t>(order.size()) <= cap.capacity) continue;
      // By weight, highest first, then by place: a total order, so the kept set is unique.
      std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
        const uint32_t ka = w ? weight_rank(w[a]) : 0, kb = w ? weight_rank(w[b]) : 0;
        return ka != kb ? ka > kb : place[static_cast<size_t>(a)] < place[static_cast<size_t>(b)];
      });
      for (size_t r = static_cast<size_t>(cap.capacity); r < order.size(); ++r) kept[static_cast<size_t>(order[r])] = 0;
    }
  }
  // The part's rows: expert-major, within an expert in (n, j) order.
  const int64_t first = cap.part_begin * k, P = row_of.numel();
  std::vector<std::vector<int64_t>> of_expert(static_cast<size_t>(E));
  for (int64_t i = first; i < first + P; ++i) of_expert[static_cast<size_t>(e[i])].push_back(i);
  int32_t row = 0;
  for (int64_t x = 0; x < E; ++x) {
    int32_t kept_here = 0;
    for (int64_t i : of_expert[static_cast<size_t>(x)]) {
      if (kept[static_cast<size_t>(i)]) {
        rows[i - first] = row++;
        ++kept_here;
      } else {
        rows[i - first] = -1;
      }
    }
    cnt[x] = kept_here;
  }
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
