// test_cuda_ops.cross_entropy.cpp: the CUDA cross-entropy ops against the CPU reference: vocabulary shards with padding, a
// shard of only padding, odd row lengths and misaligned views.
// One of the sources of test_cuda_ops (tests/CMakeLists.txt); each test skips where no GPU can run it, and
// cuda_op_checks.h says how the GPU is compared with the CPU.
#include <gtest/gtest.h>

#include <limits>

#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"
#include "tests/unit/core/cuda/cuda_op_checks.h"

namespace mt {
namespace {

using namespace mt::test;  // Vec, rand_vec, make, values, Both, CudaOps, the checks of cuda_op_checks.h

// ---- cross-entropy -------------------------------------------------------------------------------

struct CeCase {
  int64_t N, vocab_start, V, vocab_size;  // a shard of V columns from vocab_start; vocab_size -1: no padding
  int32_t target_hi;                      // targets uniform in [0, target_hi)
};

// The four ops on one vocabulary shard, each device using its own row statistics.
TEST_F(CudaOps, CrossEntropyOpsWithVocabStartAndPadding) {
  // Columns [512, 1536) of a vocabulary of 1500 padded to 1536 (36 padding columns, targets on both sides of
  // the shard), and a small unpadded shard whose targets partly lie in other shards.
  for (const CeCase& c : {CeCase{37, 512, 1024, 1500, 1500}, CeCase{6, 0, 37, -1, 50}}) {
    const int64_t N = c.N, V = c.V;
    const CrossEntropyOptions opt{.vocab_start = c.vocab_start, .vocab_size = c.vocab_size};
    const Both targets = both_ints(rand_ids(N, 400, 0, c.target_hi), {N});
    for (DType dt : kFloatTypes) {
      const std::string what = str(" N=", N, " V=", V, " vocab_start=", c.vocab_start, " ", dtype_name(dt));
      const Both logits = both(rand_vec(N * V, 401, -5, 5), {N, V}, dt);
      const Both dloss = both(rand_vec(N, 402), {N}, DType::f32);
      Both rowmax = poisoned({N}, DType::f32), sumexp = poisoned({N}, DType::f32), tl = poisoned({N}, DType::f32);
      Both losses = poisoned({N}, DType::f32), dlogits = poisoned({N, V}, dt);
      for (auto d : kDevices) {
        cross_entropy_rowmax(logits.*d, rowmax.*d, opt);
        cross_entropy_partials(logits.*d, targets.*d, rowmax.*d, sumexp.*d, tl.*d, opt);
        cross_entropy_loss(rowmax.*d, sumexp.*d, tl.*d, losses.*d);
        cross_entropy_backward(logits.*d, targets.*d, rowmax.*d, sumexp.*d, dloss.*d, dlogits.*d, opt);
      }
      expect_exact(rowmax, "cross_entropy_rowmax" + what);  // a max is exact
      expect_match(sumexp, tol_for(dt), "cross_entropy_partials sumexp" + what);
      expect_exact(tl, "cross_entropy_partials target_logit" + what);  // a copy is exact
      expect_match(losses, tol_for(dt), "cross_entropy_loss" + what);
      expect_match(dlogits, tol_for(dt), "cross_entropy_backward" + what);
    }
  }
}

// A shard holding only padding: rowmax -inf, and (given the global row statistics) sumexp and target_logit 0
// and a zero gradient.
TEST_F(CudaOps, CrossEntropyShardOfOnlyPadding) {
  const int64_t N = 5, V = 36;
  const CrossEntropyOptions opt{.vocab_start = 1500, .vocab_size = 1500};
  const Both targets = both_ints({0, 1499, 700, 3, 1000}, {N});
  for (DType dt : kFloatTypes) {
    const Both logits = both(rand_vec(N * V, 410, -5, 5), {N, V}, dt);
    const Both gmax = both(rand_vec(N, 411, 4, 5), {N}, DType::f32);  // the row statistics of the other shards
    const Both gsum = both(rand_vec(N, 412, 1, 30), {N}, DType::f32);
    const Both dloss = both(rand_vec(N, 413), {N}, DType::f32);
    Both rowmax = poisoned({N}, DType::f32), sumexp = poisoned({N}, DType::f32), tl = poisoned({N}, DType::f32);
    Both dlogits = poisoned({N, V}, dt);
    for (auto d : kDevices) {
      cross_entropy_rowmax(logits.*d, rowmax.*d, opt);
      cross_entropy_partials(logits.*d, targets.*d, gmax.*d, sumexp.*d, tl.*d, opt);
      cross_entropy_backward(logits.*d, targets.*d, gmax.*d, gsum.*d, dloss.*d, dlogits.*d, opt);
    }
    const std::string what = str(" (padding only) ", dtype_name(dt));
    for (double m : values(rowmax.gpu)) EXPECT_EQ(m, -std::numeric_limits<double>::infinity()) << "rowmax" << what;
    expect_exact(rowmax, "cross_entropy_rowmax" + what);
    expect_exact(sumexp, "cross_entropy_partials sumexp" + what);
    expect_exact(tl, "cross_entropy_partials target_logit" + what);
    expect_exact(dlogits, "cross_entropy_backward" + what);
  }
}

// Cross-entropy over row lengths around the vector width, with and without padding columns (real columns not
// a multiple of the width), logits and dlogits aligned or not. Given the same row statistics, dlogits is the
// same bits in both forms.
TEST_F(CudaOps, CrossEntropyOnOddRowsPaddingAndMisalignedViews) {
  for (int64_t V : kRowLengths)
    for (int64_t vocab_size : {int64_t{-1}, V - 3})
      for (int64_t N : {1, 7})
        for (DType dt : kFloatTypes) {
          const CrossEntropyOptions opt{.vocab_start = 0, .vocab_size = vocab_size};
          const std::string size = str(" N=", N, " V=", V, " vocab_size=", vocab_size, " ", dtype_name(dt));
          const Both targets = both_ints(rand_ids(N, 1480, 0, static_cast<int32_t>(V)), {N});
          const Vec lv = rand_vec(N * V, 1481, -5, 5);
          const Both dloss = both(rand_vec(N, 1482), {N}, DType::f32);
          std::vector<Tensor> maxes, grads;
          for (int64_t off : kViewOffsets) {
            const std::string what = str(size, " at offset ", off);
            const Both logits = both_at(lv, {N, V}, dt, off);
            Both rowmax = poisoned({N}, DType::f32), sumexp = poisoned({N}, DType::f32);
            Both tl = poisoned({N}, DType::f32), losses = poisoned({N}, DType::f32);
            Both dlogits = poisoned_at({N, V}, dt, off);
            for (auto dev : kDevices) {
              cross_entropy_rowmax(logits.*dev, rowmax.*dev, opt);
              cross_entropy_partials(logits.*dev, targets.*dev, rowmax.*dev, sumexp.*dev, tl.*dev, opt);
              cross_entropy_loss(rowmax.*dev, sumexp.*dev, tl.*dev, losses.*dev);
            }
            // The backward from the CPU's statistics on both devices.
            const Tensor cpu_max = rowmax.cpu, cpu_sum = sumexp.cpu;
            cross_entropy_backward(logits.cpu, targets.cpu, cpu_max, cpu_sum, dloss.cpu, dlogits.cpu, opt);
            cross_entropy_backward(logits.gpu, targets.gpu, cpu_max.to(Device::cuda), cpu_sum.to(Device::cuda),
                                   dloss.gpu, dlogits.gpu, opt);
            expect_exact(rowmax, "cross_entropy_rowmax" + what);
            expect_match(sumexp, tol_for(dt), "cross_entropy_partials sumexp" + what);
            expect_exact(tl, "cross_entropy_partials target_logit" + what);
            expect_match(losses, tol_for(dt), "cross_entropy_loss" + what);
            expect_match(dlogits, tol_for(dt), "cross_entropy_backward" + what);
            maxes.push_back(rowmax.gpu);
            grads.push_back(dlogits.gpu);
          }
          expect_same_bits(maxes, "cross_entropy_rowmax" + size);
          expect_same_bits(grads, "cross_entropy_backward" + size);
        }
}

}  // namespace
}  // namespace mt
