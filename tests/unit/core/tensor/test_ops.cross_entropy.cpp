// test_ops.cross_entropy.cpp: the CPU cross-entropy ops against a double reference and finite differences: vocabulary
// shards combine to the unsharded loss, padding columns are excluded.
// One of the sources of test_ops (tests/CMakeLists.txt); the shared references are in op_reference.h.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"
#include "tests/unit/core/tensor/op_reference.h"

namespace mt {
namespace {

using namespace mt::test;  // Vec, rand_vec, make, values, the references of op_reference.h

// ---- cross-entropy -------------------------------------------------------------------------------

Vec cross_entropy_ref(const Vec& logits, const std::vector<int32_t>& targets, int64_t N, int64_t V) {
  Vec loss(N);
  for (int64_t n = 0; n < N; ++n) {
    const double m = *std::max_element(logits.begin() + n * V, logits.begin() + (n + 1) * V);
    double sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(logits[n * V + v] - m);
    loss[n] = std::log(sum) + m - logits[n * V + targets[n]];
  }
  return loss;
}

TEST(CrossEntropy, LossMatchesDoubleAndBackwardMatchesFiniteDifferences) {
  const int64_t N = 5, V = 11;
  const std::vector<int32_t> targets = {0, 10, 3, 3, 7};
  const Vec logits = rand_vec(N * V, 42, -3, 3), dloss = rand_vec(N, 43);
  auto [losses, dlogits] = cross_entropy_all(make(logits, {N, V}), Tensor::from_ints(targets, {N}), make(dloss, {N}));
  EXPECT_CLOSE(values(losses), cross_entropy_ref(logits, targets, N, V), kFwdTol);
  auto f = [&](const Vec& l) { return cross_entropy_ref(l, targets, N, V); };
  EXPECT_CLOSE(values(dlogits), fd_grad(f, logits, dloss), kGradTol);
}

// Two vocabulary shards exchanging only row statistics (max of rowmax, sums of sumexp and target_logit)
// give the unsharded loss and, shard by shard, the unsharded dlogits.
TEST(CrossEntropy, VocabularyShardsCombineToTheUnshardedLoss) {
  const int64_t N = 6, V = 13, V0 = 7;
  const std::vector<int32_t> targets = {0, 12, 6, 7, 3, 9};  // on both sides of the shard boundary
  const Vec logits = rand_vec(N * V, 44, -4, 4), dl = rand_vec(N, 45);
  Tensor Logits = make(logits, {N, V}), Targets = Tensor::from_ints(targets, {N}), dloss = make(dl, {N});
  auto [want_loss, want_dlogits] = cross_entropy_all(Logits, Targets, dloss);

  const Tensor shard[2] = {take(Logits, 1, 0, V0), take(Logits, 1, V0, V)};
  const int64_t start[2] = {0, V0};
  Tensor rowmax[2], sumexp[2], tl[2];
  Tensor gmax = Tensor::empty({N}, DType::f32), gsum = Tensor::zeros({N}, DType::f32),
         gtl = Tensor::zeros({N}, DType::f32), losses = Tensor::empty({N}, DType::f32);
  for (int s = 0; s < 2; ++s) {
    rowmax[s] = Tensor::empty({N}, DType::f32);
    cross_entropy_rowmax(shard[s], rowmax[s]);
  }
  for (int64_t n = 0; n < N; ++n)
    gmax.data<float>()[n] = std::max(rowmax[0].data<float>()[n], rowmax[1].data<float>()[n]);
  for (int s = 0; s < 2; ++s) {
    sumexp[s] = Tensor::empty({N}, DType::f32);
    tl[s] = Tensor::empty({N}, DType::f32);
    cross_entropy_partials(shard[s], Targets, gmax, sumexp[s], tl[s], {.vocab_start = start[s]});
    add(gsum, sumexp[s], gsum);
    add(gtl, tl[s], gtl);
  }
  cross_entropy_loss(gmax, gsum, gtl, losses);
  EXPECT_CLOSE(values(losses), values(want_loss), 1e-6);
  Tensor d[2] = {Tensor::empty(shard[0].shape(), DType::f32), Tensor::empty(shard[1].shape(), DType::f32)};
  for (int s = 0; s < 2; ++s)
    cross_entropy_backward(shard[s], Targets, gmax, gsum, dloss, d[s], {.vocab_start = start[s]});
  EXPECT_CLOSE(concat(d[0], d[1], 1), values(want_dlogits), 1e-6);
}

// Vocabulary padding (columns >= vocab_size, here spread over two shards) is left out of the softmax:
// the loss equals that of the unpadded logits and the padding columns get zero gradient.
TEST(CrossEntropy, PaddingColumnsAreExcluded) {
  const int64_t N = 4, V = 9, Vpad = 12, V0 = 6;
  const std::vector<int32_t> targets = {0, 8, 5, 6};
  const Vec logits = rand_vec(N * Vpad, 48, -3, 3), dl = rand_vec(N, 49);
  Tensor Logits = make(logits, {N, Vpad}), Targets = Tensor::from_ints(targets, {N}), dloss = make(dl, {N});
  Vec real(N * V);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t v = 0; v < V; ++v) real[n * V + v] = logits[n * Vpad + v];
  auto [want_loss, want_dlogits] = cross_entropy_all(make(real, {N, V}), Targets, dloss);

  const Tensor shard[2] = {take(Logits, 1, 0, V0), take(Logits, 1, V0, Vpad)};
  Tensor rowmax[2], sumexp[2], tl[2], d[2];
  Tensor gmax = Tensor::empty({N}, DType::f32), gsum = Tensor::zeros({N}, DType::f32),
         gtl = Tensor::zeros({N}, DType::f32), losses = Tensor::empty({N}, DType::f32);
  for (int s = 0; s < 2; ++s) {
    rowmax[s] = Tensor::empty({N}, DType::f32);
    cross_entropy_rowmax(shard[s], rowmax[s], {.vocab_start = s * V0, .vocab_size = V});
  }
  for (int64_t n = 0; n < N; ++n)
    gmax.data<float>()[n] = std::max(rowmax[0].data<float>()[n], rowmax[1].data<float>()[n]);
  for (int s = 0; s < 2; ++s) {
    sumexp[s] = Tensor::empty({N}, DType::f32);
    tl[s] = Tensor::empty({N}, DType::f32);
    cross_entropy_partials(shard[s], Targets, gmax, sumexp[s], tl[s], {.vocab_start = s * V0, .vocab_size = V});
    add(gsum, sumexp[s], gsum);
    add(gtl, tl[s], gtl);
    d[s] = Tensor::empty(shard[s].shape(), DType::f32);
  }
  cross_entropy_loss(gmax, gsum, gtl, losses);
  EXPECT_CLOSE(values(losses), values(want_loss), 1e-6);
  for (int s = 0; s < 2; ++s)
    cross_entropy_backward(shard[s], Targets, gmax, gsum, dloss, d[s], {.vocab_start = s * V0, .vocab_size = V});
  const Vec got = concat(d[0], d[1], 1), want = values(want_dlogits);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t v = 0; v < Vpad; ++v)
      EXPECT_NEAR(got[n * Vpad + v], v < V ? want[n * V + v] : 0.0, 1e-6) << n << "," << v;
}

}  // namespace
}  // namespace mt
