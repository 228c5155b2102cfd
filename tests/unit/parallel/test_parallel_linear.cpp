// test_parallel_linear.cpp: the tensor-parallel layers of parallel/ (ColumnParallelLinear, RowParallelLinear,
// VocabParallelEmbedding and the sequence-parallel collectives under them) over 2 ranks, threads of one
// process on Gloo, against the same layer unsplit on one rank: forward outputs, input gradients and
// parameter gradients, with and without sequence parallelism and bias. Values whose arithmetic is the same on
// both sides (a rank's block of a GEMM output, gathers, weight gradients) must be equal; sums the group adds
// in another order (a row-parallel output, a column-parallel input gradient) within a few fp32 ulps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor/ops.h"
#include "parallel/comm/communicator.h"
#include "parallel/layers/parallel_linear.h"
#include "parallel/layers/sequence_parallel.h"
#include "parallel/comm/thread_ranks.h"
#include "parallel/layers/vocab_parallel_embedding.h"
#include "tests/unit/op_test_util.h"
#include "tests/unit/parallel/tp_test_util.h"

namespace mt {
namespace {

using namespace mt::test;  // Vec, rand_vec, make, values

using namespace mt::tp_test;  // kRanks, B, T, run_tp, the slicing and the comparisons

LinearOptions linear_options(const char* name, int64_t in, int64_t out, bool bias) {
  return {.name = name, .in_features = in, .out_features = out, .bias = bias, .init_std = 0.5f, .seed = 7};
}

// Gives a layer's bias the values `b` (global) at its slice: zeros would not show a bias added twice.
void set_bias(Parameter* bias, const Tensor& global, int64_t begin) {
  if (!bias) return;
  const int64_t n = bias->value.numel();
  bias->value.copy_from(rows(global.view({global.numel(), 1}), begin, n).view({n}));
}

struct LinearCase {
  bool sequence_parallel;
  bool bias;
};
class ParallelLinear : public ::testing::TestWithParam<LinearCase> {};

TEST_P(ParallelLinear, ColumnParallelEqualsOneUnsplitLinear) {
  const auto [sp, bias] = GetParam();
  constexpr int64_t in = 8, out = 6, out_r = out / kRanks;
  const Tensor x = make(rand_vec(N * in, 1), {N, in});     // (N, in) every position
  const Tensor dy = make(rand_vec(N * out, 2), {N, out});  // (N, out)
  const Tensor b = make(rand_vec(out, 3), {out});          // (out)
  // The reference: one rank, no group.
  ColumnParallelLinear ref(linear_options("col", in, out, bias), TensorParallel{});
  set_bias(ref.bias(), b, 0);
  const Tensor y_ref = ref.forward(x, B);
  const Tensor dx_ref = ref.backward(dy, x, B);
  run_tp(sp, [&](const TensorParallel& tp) {
    ColumnParallelLinear layer(linear_options("col", in, out, bias), tp);
    const std::string where = "rank " + std::to_string(tp.rank);
    expect_equal(layer.weight().value, rows(ref.weight().value, tp.rank * out_r, out_r), where + " initial weight");
    set_bias(layer.bias(), b, tp.rank * out_r);
    const Tensor x_held = held_rows(x, tp);
    const Tensor y = layer.forward(x_held, B);  // (N, out/t)
    expect_close(y, columns(y_ref, tp.rank * out_r, out_r), where + " y", 1);
    const Tensor dx = layer.backward(columns(dy, tp.rank * out_r, out_r), x_held, B);  // (Ns, in), summed
    expect_close(dx, held_rows(dx_ref, tp), where + " dx");
    expect_close(layer.weight().grad, rows(ref.weight().grad, tp.rank * out_r, out_r), where + " dW", 1);
    if (bias) expect_close(layer.bias()->grad, rows(ref.bias()->grad, tp.rank * out_r, out_r), where + " db", 1);
  });
}

TEST_P(ParallelLinear, RowParallelEqualsOneUnsplitLinear) {
  const auto [sp, bias] = GetParam();
  constexpr int64_t in = 8, out = 6, in_r = in / kRanks;
  const Tensor x = make(rand_vec(N * in, 4), {N, in});
  const Tensor dy = make(rand_vec(N * out, 5), {N, out});
  const Tensor b = make(rand_vec(out, 6), {out});
  RowParallelLinear ref(linear_options("row", in, out, bias), TensorParallel{});
  set_bias(ref.bias(), b, 0);
  const Tensor y_ref = ref.forward(x, B);
  const Tensor dx_ref = ref.backward(dy, x, B);
  run_tp(sp, [&](const TensorParallel& tp) {
    RowParallelLinear layer(linear_options("row", in, out, bias), tp);
    const std::string where = "rank " + std::to_string(tp.rank);
    expect_equal(layer.weight().value, columns(ref.weight().value, tp.rank * in_r, in_r), where + " initial weight");
    set_bias(layer.bias(), b, 0);
    const Tensor x_r = columns(x, tp.rank * in_r, in_r);  // (N, in/t)
    const Tensor y = layer.forward(x_r, B);               // (Ns, out): the bias added once
    expect_close(y, held_rows(y_ref, tp), where + " y");
    const Tensor dx = layer.backward(held_rows(dy, tp), x_r, B);  // (N, in/t)
    expect_close(dx, columns(dx_ref, tp.rank * in_r, in_r), where + " dx", 1);
    expect_close(layer.weight().grad, columns(ref.weight().grad, tp.rank * in_r, in_r), where + " dW", 1);
    if (bias) expect_close(layer.bias()->grad, ref.bias()->grad, where + " db", 1);
  });
}

INSTANTIATE_TEST_SUITE_P(Layouts, ParallelLinear,
                         ::testing::Values(LinearCase{false, true}, LinearCase{true, true}, LinearCase{false, false},
                                           LinearCase{true, false}),
                         [](const auto& info) {
                           return std::string(info.param.sequence_parallel ? "SequenceParallel" : "TensorParallel") +
                                  (info.param.bias ? "Bias" : "NoBias");
                         });

// The MLP's fusions: fc1 = column-parallel with GELU on its epilogue, fc2 = row-parallel whose input-gradient
// GEMM carries fc1's dGELU and bias gradient.
TEST(ParallelLinearMlp, GeluEpiloguesMatchOneRank) {
  constexpr int64_t C = 4, F = 8, F_r = F / kRanks;
  const Tensor x = make(rand_vec(N * C, 11), {N, C});
  const Tensor dy = make(rand_vec(N * C, 12), {N, C});
  const Tensor b1 = make(rand_vec(F, 13), {F});
  const auto mlp = mlp_forward_backward;
  ColumnParallelLinear ref1(linear_options("fc1", C, F, true), TensorParallel{});
  RowParallelLinear ref2(linear_options("fc2", F, C, true), TensorParallel{});
  set_bias(ref1.bias(), b1, 0);
  const auto [y_ref, dx_ref] = mlp(ref1, ref2, x, dy);
  for (bool sp : {false, true})
    run_tp(sp, [&](const TensorParallel& tp) {
      ColumnParallelLinear fc1(linear_options("fc1", C, F, true), tp);
      RowParallelLinear fc2(linear_options("fc2", F, C, true), tp);
      set_bias(fc1.bias(), b1, tp.rank * F_r);
      const std::string where = (sp ? "SP rank " : "TP rank ") + std::to_string(tp.rank);
      const auto [y, dx] = mlp(fc1, fc2, held_rows(x, tp), held_rows(dy, tp));
      expect_close(y, held_rows(y_ref, tp), where + " y");
      expect_close(dx, held_rows(dx_ref, tp), where + " dx");
      expect_close(fc1.bias()->grad, rows(ref1.bias()->grad, tp.rank * F_r, F_r), where + " fc1 db", 1);
      expect_close(fc1.weight().grad, rows(ref1.weight().grad, tp.rank * F_r, F_r), where + " fc1 dW", 1);
    });
}

TEST(ParallelLinearHead, BorrowedWeightIsReadAndItsGradientAccumulated) {
  constexpr int64_t C = 4, V = 6;
  Parameter table = make_parameter_slice("table.weight", {.global = {V, C}, .start = {0, 0}, .local = {V, C}},
                                         DType::f32, Init::normal, 1, 3);
  ColumnParallelLinear head(table, TensorParallel{});
  EXPECT_TRUE(head.parameters().empty());  // the owner lists it
  const Tensor x = make(rand_vec(N * C, 21), {N, C});
  const Tensor y = head.forward(x, B);
  Tensor want = Tensor::empty({N, V}, DType::f32);
  gemm(x, table.value, want, {.trans_b = true});
  expect_equal(y, want, "logits");
  head.backward(make(rand_vec(N * V, 22), {N, V}), x, B);
  EXPECT_NE(table.grad.to_floats(), std::vector<float>(V * C, 0.f));
}

// ---- the sequence-parallel collectives ----

TEST(SequenceParallel, GatherThenReductionRoundTrips) {
  constexpr int64_t C = 3;
  const Tensor full = make(rand_vec(N * C, 31), {N, C});  // (B*T, C)
  run_tp(true, [&](const TensorParallel& tp) {
    const Tensor shard = shard_rows(full, tp.rank);
    SequenceGather gather(shard, B, tp);
    const Tensor gathered = gather.wait();
    expect_equal(gathered, full, "gathered");
    expect_equal(gather.wait(), full, "a second wait");
    // Every rank contributes full: its shard of the sum is twice its shard of full, exactly.
    Tensor partial = gathered.clone();
    const Tensor summed = SequenceReduction(partial, B, tp).wait();
    Tensor twice = shard.clone();
    scale_(twice, 2.f);
    expect_equal(summed, twice, "reduce-scattered");
  });
}

TEST(SequenceParallel, WithoutSequenceParallelismRowsStayAndSumsAreAllReduced) {
  constexpr int64_t C = 3;
  const Tensor full = make(rand_vec(N * C, 32), {N, C});
  run_tp(false, [&](const TensorParallel& tp) {
    EXPECT_EQ(sequence_to_full(full, B, tp).raw(), full.raw());  // nothing moves
    Tensor partial = full.clone();
    const Tensor summed = sequence_shard_sum(partial, B, tp);
    EXPECT_EQ(summed.raw(), partial.raw());  // in place
    Tensor twice = full.clone();
    scale_(twice, 2.f);
    expect_equal(summed, twice, "all-reduced");
  });
}

TEST(VocabParallelEmbedding, LooksUpAndScattersLikeOneRank) {
  constexpr int64_t V = 8, C = 3;
  const EmbeddingTableOptions opt{.name = "wte", .num_embeddings = V, .embedding_dim = C, .init_std = 1, .seed = 5};
  const Tensor tokens = Tensor::from_ints(std::vector<int32_t>{0, 7, 3, 4, 4, 1, 6, 2}, {B, T});
  const Tensor dy = make(rand_vec(N * C, 41), {B, T, C});
  VocabParallelEmbedding ref(opt, TensorParallel{});
  const Tensor y_ref = ref.forward(tokens).view({N, C});
  ref.backward(tokens, dy);
  for (bool sp : {false, true})
    run_tp(sp, [&](const TensorParallel& tp) {
      VocabParallelEmbedding emb(opt, tp);
      const Tensor y = emb.forward(tokens);  // (B, Ts, C): each row from the rank holding its token
      expect_equal(y.view({y.numel() / C, C}), held_rows(y_ref, tp), "embedded rows");
      const Tensor dy_held = held_rows(dy.view({N, C}), tp);
      emb.backward(tokens, dy_held.view({B, dy_held.dim(0) / B, C}));
      expect_equal(emb.weight().grad, rows(ref.weight().grad, emb.vocab_start(), V / kRanks), "table gradient");
    });
}

// ---- the block transpose under the collectives ----

TEST(TransposeBlocks, SwapsTheLeadingDimensionsOfBlocks) {
  // x (2, 3, 2): x[p, q, l] = 10p + q + 0.5l
  std::vector<float> v;
  for (int p = 0; p < 2; ++p)
    for (int q = 0; q < 3; ++q)
      for (int l = 0; l < 2; ++l) v.push_back(10.f * p + q + 0.5f * l);
  for (DType dt : {DType::f32, DType::bf16}) {
    const Tensor x = Tensor::from_floats(v, {2, 3, 2}, dt);
    Tensor out = Tensor::empty({3, 2, 2}, dt);
    transpose_blocks(x, out);
    const std::vector<float> got = out.to_floats();
    for (int q = 0; q < 3; ++q)
      for (int p = 0; p < 2; ++p)
        for (int l = 0; l < 2; ++l) EXPECT_EQ(got[(q * 2 + p) * 2 + l], 10.f * p + q + 0.5f * l);
  }
}

TEST(TransposeBlocks, RejectsAMismatchedOutput) {
  const Tensor x = Tensor::zeros({2, 3, 4}, DType::f32);
  Tensor wrong = Tensor::zeros({2, 3, 4}, DType::f32);
  EXPECT_THROW(transpose_blocks(x, wrong), std::invalid_argument);
  Tensor other_dtype = Tensor::zeros({3, 2, 4}, DType::bf16);
  EXPECT_THROW(transpose_blocks(x, other_dtype), std::invalid_argument);
}

}  // namespace
}  // namespace mt
