// test_cuda_ops.embedding_dropout.cpp: the CUDA embeddings and dropout against the CPU reference: vocabulary shards, a
// deterministic backward, and the CPU's dropout mask on every form, dropout_add included.
// One of the sources of test_cuda_ops (tests/CMakeLists.txt); each test skips where no GPU can run it, and
// cuda_op_checks.h says how the GPU is compared with the CPU.
#include <gtest/gtest.h>

#include "core/base/rng.h"
#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"
#include "tests/unit/core/cuda/cuda_op_checks.h"

namespace mt {
namespace {

using namespace mt::test;  // Vec, rand_vec, make, values, Both, CudaOps, the checks of cuda_op_checks.h

// ---- embeddings ----------------------------------------------------------------------------------

// A shard of rows [5, 14) of a 20-token vocabulary: ids below, inside and above it, many repeated.
TEST_F(CudaOps, EmbeddingForwardAndBackwardWithVocabStart) {
  const int64_t B = 4, T = 33, V = 9, C = 48, start = 5;
  const Both ids = both_ints(rand_ids(B * T, 350, 0, 20), {B, T});
  const EmbeddingOptions opt{.vocab_start = start};
  for (DType dt : kFloatTypes) {
    const Both table = both(rand_vec(V * C, 351), {V, C}, dt), dout = both(rand_vec(B * T * C, 352), {B, T, C}, dt);
    Both out = poisoned({B, T, C}, dt);
    Both dtable = both(rand_vec(V * C, 353, -2, 2), {V, C}, DType::f32);
    for (auto d : kDevices) {
      embedding_forward(ids.*d, table.*d, out.*d, opt);
      embedding_backward(ids.*d, dout.*d, dtable.*d, opt);
    }
    expect_exact(out, str("embedding_forward ", dtype_name(dt)));  // a copy of rows or zeros: exact
    expect_match(dtable, tol_for(dt), str("embedding_backward ", dtype_name(dt)));
  }
}

// Many tokens hitting few rows: the backward must give the same bytes every run (no float atomics).
TEST_F(CudaOps, EmbeddingBackwardIsDeterministic) {
  const int64_t B = 8, T = 256, V = 16, C = 64, start = 4;
  const Tensor ids = Tensor::from_ints(rand_ids(B * T, 360, 0, 24), {B, T}).to(Device::cuda);
  const Vec prior = rand_vec(V * C, 361, -3, 3);
  for (DType dt : kFloatTypes) {
    const Tensor dout = make(rand_vec(B * T * C, 362, -100, 100), {B, T, C}, dt).to(Device::cuda);
    std::vector<unsigned char> runs[2];
    for (auto& run : runs) {
      Tensor dtable = make(prior, {V, C}).to(Device::cuda);
      embedding_backward(ids, dout, dtable, {.vocab_start = start});
      run = bytes_of(dtable);
    }
    EXPECT_TRUE(runs[0] == runs[1]) << "embedding_backward differs between two identical runs, " << dtype_name(dt);
  }
}

TEST_F(CudaOps, PositionEmbeddingWithOffset) {
  const int64_t B = 3, T = 37, C = 40, P = 64;
  const EmbeddingOptions opt{.position_offset = 5};
  for (DType dt : kFloatTypes) {
    Both x = both(rand_vec(B * T * C, 370), {B, T, C}, dt);
    const Both wpe = both(rand_vec(P * C, 371), {P, C}, dt), dout = both(rand_vec(B * T * C, 372), {B, T, C}, dt);
    Both dwpe = both(rand_vec(P * C, 373), {P, C}, DType::f32);
    for (auto d : kDevices) {
      position_embedding_add(x.*d, wpe.*d, opt);
      position_embedding_backward(dout.*d, dwpe.*d, opt);
    }
    expect_match(x, tol_for(dt), str("position_embedding_add ", dtype_name(dt)));
    expect_match(dwpe, tol_for(dt), str("position_embedding_backward ", dtype_name(dt)));
  }
}

// ---- dropout -------------------------------------------------------------------------------------

// The same elements are dropped on both devices (zeros where the CPU has zeros, and only there).
void expect_same_mask(const Both& t, const std::string& what) {
  const Vec g = values(t.gpu), c = values(t.cpu);
  ASSERT_EQ(g.size(), c.size());
  int64_t bad = 0;
  for (size_t i = 0; i < g.size(); ++i) bad += (g[i] == 0.0) != (c[i] == 0.0);
  EXPECT_EQ(bad, 0) << what << ": dropped elements differ";
}

TEST_F(CudaOps, DropoutForwardAndBackwardDrawTheCpuMask) {
  const int64_t B = 2, T = 37, C = 70;  // C and col_offset not multiples of 4 (one Philox block serves 4 columns)
  for (float p : {0.1f, 0.5f}) {
    const DropoutOptions opt{.p = p,
                             .seed = 1234,
                             .site = stream_id("layers.0.mlp.out"),
                             .sample_offset = 3,
                             .row_offset = 11,
                             .col_offset = 6};
    for (DType dt : kFloatTypes) {
      const std::string what = str(" p=", p, " ", dtype_name(dt));
      const Both x = both(rand_vec(B * T * C, 380, 0.25, 2), {B, T, C}, dt);  // nonzero: zeros mark the mask
      const Both dout = both(rand_vec(B * T * C, 381, -2, -0.25), {B, T, C}, dt);
      Both out = poisoned({B, T, C}, dt), dx = poisoned({B, T, C}, dt);
      Both dx_inplace = both(values(dout.cpu), {B, T, C}, dt);
      for (auto d : kDevices) {
        dropout_forward(x.*d, out.*d, opt);
        dropout_backward(dout.*d, dx.*d, opt);
        dropout_backward(dx_inplace.*d, dx_inplace.*d, opt);  // in place, as the models call it
      }
      expect_same_mask(out, "dropout_forward" + what);
      expect_same_mask(dx, "dropout_backward" + what);
      expect_match(out, tol_for(dt), "dropout_forward" + what);
      expect_match(dx, tol_for(dt), "dropout_backward" + what);
      expect_match(dx_inplace, tol_for(dt), "dropout_backward in place" + what);
      if (dt == DType::f32) {
        expect_exact(out, "dropout_forward" + what);
        expect_exact(dx, "dropout_backward" + what);
        expect_exact(dx_inplace, "dropout_backward in place" + what);
      }
    }
  }
}

TEST_F(CudaOps, DropoutAddMatchesTheCpu) {
  const int64_t B = 2, T = 37, C = 70;  // C and col_offset not multiples of 4, as the dropout test
  for (float p : {0.f, 0.1f, 0.5f}) {
    const DropoutOptions opt{.p = p,
                             .seed = 1234,
                             .site = stream_id("layers.0.attn.out"),
                             .sample_offset = 3,
                             .row_offset = 11,
                             .col_offset = 6};
    for (DType dt : kFloatTypes) {
      const std::string what = str(" p=", p, " ", dtype_name(dt));
      const Both x = both(rand_vec(B * T * C, 990, -2, 2), {B, T, C}, dt);
      const Both residual = both(rand_vec(B * T * C, 991, -2, 2), {B, T, C}, dt);
      Both out = poisoned({B, T, C}, dt);
      Both inplace = both(values(residual.cpu), {B, T, C}, dt);  // out aliasing the residual
      for (auto d : kDevices) {
        dropout_add(x.*d, residual.*d, out.*d, opt);
        dropout_add(x.*d, inplace.*d, inplace.*d, opt);
      }
      expect_match(out, tol_for(dt), "dropout_add" + what);
      expect_match(inplace, tol_for(dt), "dropout_add in place" + what);
      // Same mask and the CPU's double rounding: equal element for element in every dtype.
      expect_exact(out, "dropout_add" + what);
      expect_exact(inplace, "dropout_add in place" + what);
    }
  }
}

// Context parallelism's two chunks in one local tensor (split_at, split_position): the CPU's rows, fp32 exactly.
TEST_F(CudaOps, DropoutAtChunkSplitRowsMatchesTheCpu) {
  const int64_t B = 2, T = 12, C = 64;  // rows 0..5 at positions 3.., rows 6..11 at 30..
  const DropoutOptions opt{.p = 0.3f,
                           .seed = 99,
                           .site = stream_id("layers.0.mlp.out"),
                           .sample_offset = 1,
                           .row_offset = 3,
                           .split_at = 6,
                           .split_position = 30};
  for (DType dt : kFloatTypes) {
    const std::string what = str(" split rows ", dtype_name(dt));
    const Both x = both(rand_vec(B * T * C, 382, 0.25, 2), {B, T, C}, dt);
    const Both residual = both(rand_vec(B * T * C, 383, -2, 2), {B, T, C}, dt);
    Both out = poisoned({B, T, C}, dt), added = poisoned({B, T, C}, dt);
    for (auto d : kDevices) {
      dropout_forward(x.*d, out.*d, opt);
      dropout_add(x.*d, residual.*d, added.*d, opt);
    }
    expect_same_mask(out, "dropout_forward" + what);
    expect_exact(added, "dropout_add" + what);
    if (dt == DType::f32) expect_exact(out, "dropout_forward" + what);
  }
}

// Dropout and dropout_add: the CPU's mask in both forms (vectors need col_offset a multiple of four as well),
// fp32 dropout and every dtype of dropout_add exact, and the two GPU forms the same bits.
TEST_F(CudaOps, DropoutOnOddRowsColumnOffsetsAndMisalignedViews) {
  const int64_t B = 2, T = 3;
  for (int64_t C : kRowLengths)
    for (int64_t col_offset : {0, 6, 8})
      for (DType dt : kFloatTypes) {
        const DropoutOptions opt{.p = 0.3f,
                                 .seed = 77,
                                 .site = stream_id("layers.1.mlp.out"),
                                 .sample_offset = 5,
                                 .row_offset = 2,
                                 .col_offset = col_offset};
        const std::string size = str(" C=", C, " col_offset=", col_offset, " ", dtype_name(dt));
        const Vec xv = rand_vec(B * T * C, 1460, 0.25, 2), rv = rand_vec(B * T * C, 1461, -2, 2);
        std::vector<Tensor> outs, inplaces, adds, add_inplaces;
        for (int64_t off : kViewOffsets) {
          const std::string what = str(size, " at offset ", off);
          const Both x = both_at(xv, {B, T, C}, dt, off), residual = both_at(rv, {B, T, C}, dt, off);
          Both out = poisoned_at({B, T, C}, dt, off), inplace = both_at(xv, {B, T, C}, dt, off);
          Both sum = poisoned_at({B, T, C}, dt, off), sum_inplace = both_at(rv, {B, T, C}, dt, off);
          for (auto dev : kDevices) {
            dropout_forward(x.*dev, out.*dev, opt);
            dropout_backward(inplace.*dev, inplace.*dev, opt);
            dropout_add(x.*dev, residual.*dev, sum.*dev, opt);
            dropout_add(x.*dev, sum_inplace.*dev, sum_inplace.*dev, opt);  // out aliasing the residual
          }
          expect_same_mask(out, "dropout_forward" + what);
          expect_same_mask(inplace, "dropout_backward in place" + what);
          expect_match(out, tol_for(dt), "dropout_forward" + what);
          if (dt == DType::f32) {
            expect_exact(out, "dropout_forward" + what);
            expect_exact(inplace, "dropout_backward in place" + what);
          }
          expect_exact(sum, "dropout_add" + what);
          expect_exact(sum_inplace, "dropout_add in place" + what);
          outs.push_back(out.gpu);
          inplaces.push_back(inplace.gpu);
          adds.push_back(sum.gpu);
          add_inplaces.push_back(sum_inplace.gpu);
        }
        expect_same_bits(outs, "dropout_forward" + size);
        expect_same_bits(inplaces, "dropout_backward in place" + size);
        expect_same_bits(adds, "dropout_add" + size);
        expect_same_bits(add_inplaces, "dropout_add in place" + size);
      }
}

// More rows than gridDim.y holds (65535): both dropout forms stride over the rows beyond it.
TEST_F(CudaOps, DropoutOverMoreRowsThanGridY) {
  const int64_t B = 1, T = 65537, C = 8;
  const DropoutOptions opt{.p = 0.5f, .seed = 3, .site = stream_id("layers.0.attn.out"), .row_offset = 1};
  for (DType dt : {DType::f32, DType::bf16})
    for (int64_t off : kViewOffsets) {
      const std::string what = str(" ", B, "x", T, "x", C, " ", dtype_name(dt), " at offset ", off);
      const Vec xv = rand_vec(B * T * C, 1470, 0.25, 2);
      const Both x = both_at(xv, {B, T, C}, dt, off), residual = both_at(xv, {B, T, C}, dt, off);
      Both out = poisoned_at({B, T, C}, dt, off), sum = poisoned_at({B, T, C}, dt, off);
      for (auto dev : kDevices) {
        dropout_forward(x.*dev, out.*dev, opt);
        dropout_add(x.*dev, residual.*dev, sum.*dev, opt);
      }
      expect_same_mask(out, "dropout_forward" + what);
      expect_exact(sum, "dropout_add" + what);
    }
}

}  // namespace
}  // namespace mt
