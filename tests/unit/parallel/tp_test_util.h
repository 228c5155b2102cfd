// tp_test_util.h: the two-rank tensor-parallel harness of the parallel layer tests (test_parallel_linear.cpp,
// test_fp8_linear.cpp): ranks as threads of one process on Gloo, the host matrix slicing that gives a rank its part
// of an unsplit reference, and the comparisons.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor/tensor.h"
#include "parallel/comm/communicator.h"
#include "parallel/layers/parallel_linear.h"
#include "parallel/layers/tensor_parallel.h"
#include "parallel/comm/thread_ranks.h"

namespace mt::tp_test {

constexpr int kRanks = 2;
constexpr int64_t B = 2, T = 4, Ts = T / kRanks, N = B * T, Ns = B * Ts;

// Runs fn(tp) on kRanks threads, each a rank of one Gloo tensor-parallel group; rethrows the first failure.
inline void run_tp(bool sequence_parallel, const std::function<void(const TensorParallel&)>& fn) {
  auto store = make_hash_store();
  run_ranks(kRanks, [&](int r) {
    auto comm = join_gloo(store, "tp", first_ranks(kRanks), r);
    fn(TensorParallel{.comm = comm.get(), .rank = r, .size = kRanks, .sequence_parallel = sequence_parallel});
  });
}

// Host matrix helpers on (rows, cols) tensors.
inline Tensor columns(const Tensor& m, int64_t begin, int64_t count) {
  const std::vector<float> v = m.to_floats();
  const int64_t R = m.dim(0), Cn = m.dim(1);
  std::vector<float> out;
  for (int64_t i = 0; i < R; ++i)
    for (int64_t j = begin; j < begin + count; ++j) out.push_back(v[i * Cn + j]);
  return Tensor::from_floats(out, {R, count});
}
inline Tensor rows(const Tensor& m, int64_t begin, int64_t count) { return m.slice(begin, begin + count).clone(); }
// Rank r's sequence shard of (B*T, C) rows: positions [r*Ts, (r+1)*Ts) of every sample.
inline Tensor shard_rows(const Tensor& m, int r) {
  const std::vector<float> v = m.to_floats();
  const int64_t Cn = m.dim(1);
  std::vector<float> out;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = r * Ts; t < (r + 1) * Ts; ++t)
      for (int64_t c = 0; c < Cn; ++c) out.push_back(v[(b * T + t) * Cn + c]);
  return Tensor::from_floats(out, {Ns, Cn});
}
// The rows a rank holds outside the tensor-parallel regions: its shard with SP, else all of them.
inline Tensor held_rows(const Tensor& m, const TensorParallel& tp) {
  return tp.sequence_parallel ? shard_rows(m, tp.rank) : m.clone();
}

// got == want element for element.
inline void expect_equal(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const std::vector<float> g = got.to_floats(), w = want.to_floats();
  for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(g[i], w[i]) << what << " element " << i;
}
// got == want within `ulps` units in the last place of fp32 at want's largest magnitude: sums in another
// order differ by rounding errors of that size, however small an element is after cancellation.
inline void expect_close(const Tensor& got, const Tensor& want, const std::string& what, double ulps = 4) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const std::vector<float> g = got.to_floats(), w = want.to_floats();
  double scale = 0;
  for (float x : w) scale = std::max(scale, std::abs(double{x}));
  for (size_t i = 0; i < g.size(); ++i)
    ASSERT_LE(std::abs(double{g[i]} - double{w[i]}), ulps * scale * 0x1p-23) << what << " element " << i;
}

// The MLP's fusions: fc1 column-parallel with GELU on its epilogue, fc2 row-parallel whose input-gradient GEMM
// carries fc1's dGELU and bias gradient. Forward and backward of x_held and dy_held; returns (y, dx).
inline std::pair<Tensor, Tensor> mlp_forward_backward(ColumnParallelLinear& fc1, RowParallelLinear& fc2,
                                                      const Tensor& x_held, const Tensor& dy_held) {
  Tensor pre;
  const Tensor h = fc1.forward(x_held, B, &pre);
  const Tensor y = fc2.forward(h, B);
  const Tensor dh =
      fc2.backward(dy_held, h, B, {.dx_epilogue = Epilogue::dgelu_bgrad, .aux = &pre, .dbias = &fc1.bias()->grad});
  const Tensor dx = fc1.backward(dh, x_held, B, {.bias_grad_done = true});
  return {y, dx};
}

}  // namespace mt::tp_test
