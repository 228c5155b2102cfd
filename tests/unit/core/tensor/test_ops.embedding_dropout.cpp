// test_ops.embedding_dropout.cpp: the CPU token and position embeddings and dropout: lookups and their backward, vocabulary
// shards, and dropout masks that depend only on global coordinates.
// One of the sources of test_ops (tests/CMakeLists.txt); the shared references are in op_reference.h.
#include <gtest/gtest.h>

#include <cstdint>

#include "core/base/rng.h"
#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"
#include "tests/unit/core/tensor/op_reference.h"

namespace mt {
namespace {

using namespace mt::test;  // Vec, rand_vec, make, values, the references of op_reference.h

// ---- embeddings ----------------------------------------------------------------------------------

TEST(Embedding, LookupAndBackwardSumRepeatedTokens) {
  const int64_t B = 2, T = 4, V = 7, C = 3;
  const std::vector<int32_t> ids = {3, 0, 3, 6, 1, 3, 5, 0};  // 3 repeats: its gradient rows must sum
  const Vec table = rand_vec(V * C, 26), w = rand_vec(B * T * C, 27), prior = rand_vec(V * C, 28);
  auto f = [&](const Vec& tab) {
    Vec o(B * T * C);
    for (int64_t i = 0; i < B * T; ++i)
      for (int64_t c = 0; c < C; ++c) o[i * C + c] = tab[ids[i] * C + c];
    return o;
  };
  Tensor Ids = Tensor::from_ints(ids, {B, T}), out = Tensor::empty({B, T, C}, DType::f32);
  embedding_forward(Ids, make(table, {V, C}), out);
  EXPECT_EQ(values(out), f(table));
  Tensor dtable = make(prior, {V, C});
  embedding_backward(Ids, make(w, {B, T, C}), dtable);
  EXPECT_CLOSE(diff(values(dtable), prior), fd_grad(f, table, w), kGradTol);
}

TEST(Embedding, VocabularyShardsSumToTheFullLookup) {
  const int64_t B = 2, T = 5, V = 10, C = 4;
  const std::vector<int32_t> ids = {0, 9, 4, 5, 5, 1, 8, 2, 7, 3};
  const Vec table = rand_vec(V * C, 29), dout = rand_vec(B * T * C, 30);
  Tensor Ids = Tensor::from_ints(ids, {B, T}), Table = make(table, {V, C}), Dout = make(dout, {B, T, C});
  Tensor full = Tensor::empty({B, T, C}, DType::f32), dfull = Tensor::zeros({V, C}, DType::f32);
  embedding_forward(Ids, Table, full);
  embedding_backward(Ids, Dout, dfull);
  Vec sum(B * T * C, 0.0);
  for (int64_t start : {0, 6}) {  // shards of 6 and 4 rows
    const int64_t rows = start == 0 ? 6 : 4;
    Tensor part = Tensor::empty({B, T, C}, DType::f32), dpart = Tensor::zeros({rows, C}, DType::f32);
    embedding_forward(Ids, Table.slice(start, start + rows), part, {.vocab_start = start});
    embedding_backward(Ids, Dout, dpart, {.vocab_start = start});
    const Vec p = values(part);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += p[i];
    EXPECT_EQ(values(dpart), values(dfull.slice(start, start + rows)));
  }
  EXPECT_EQ(sum, values(full));
}

TEST(Embedding, PositionEmbeddingWithOffsetMatchesFiniteDifferences) {
  const int64_t B = 3, T = 4, C = 5, P = 9, off = 3;
  const Vec x = rand_vec(B * T * C, 31), wpe = rand_vec(P * C, 32), w = rand_vec(B * T * C, 33);
  const Vec prior = rand_vec(P * C, 34);
  auto f = [&](const Vec& pe) {
    Vec o(B * T * C);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t c = 0; c < C; ++c) o[(b * T + t) * C + c] = x[(b * T + t) * C + c] + pe[(off + t) * C + c];
    return o;
  };
  Tensor X = make(x, {B, T, C});
  position_embedding_add(X, make(wpe, {P, C}), {.position_offset = off});
  EXPECT_CLOSE(values(X), f(wpe), kFwdTol);
  Tensor dwpe = make(prior, {P, C});
  position_embedding_backward(make(w, {B, T, C}), dwpe, {.position_offset = off});
  EXPECT_CLOSE(diff(values(dwpe), prior), fd_grad(f, wpe, w), kGradTol);
}

// ---- dropout -------------------------------------------------------------------------------------

Vec dropout_ref(const Vec& x, int64_t B, int64_t T, int64_t C, const DropoutOptions& o) {
  Vec out(x.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        const int64_t i = (b * T + t) * C + c;
        const float u = dropout_uniform(o.seed, o.site, o.sample_offset + b, o.row_offset + t, o.col_offset + c);
        const bool keep = u >= o.p;
        out[i] = keep ? x[i] / (1.0 - o.p) : 0.0;
      }
  return out;
}

TEST(Dropout, ForwardMatchesMaskAndBackwardMatchesFiniteDifferences) {
  const int64_t B = 2, T = 16, C = 32;
  const DropoutOptions opt{.p = 0.3f,
                           .seed = 42,
                           .site = stream_id("layers.0.mlp.out"),
                           .sample_offset = 5,
                           .row_offset = 2,
                           .col_offset = 64};
  const Vec x = rand_vec(B * T * C, 35), w = rand_vec(B * T * C, 36);
  Tensor out = Tensor::empty({B, T, C}, DType::f32);
  dropout_forward(make(x, {B, T, C}), out, opt);
  const Vec got = values(out);
  EXPECT_CLOSE(got, dropout_ref(x, B, T, C, opt), kFwdTol);
  const double dropped = static_cast<double>(std::count(got.begin(), got.end(), 0.0)) / got.size();
  EXPECT_NEAR(dropped, 0.3, 0.05);
  Tensor dx = make(w, {B, T, C});
  dropout_backward(dx, dx, opt);  // in place, as the models call it
  EXPECT_CLOSE(values(dx), fd_grad([&](const Vec& v) { return dropout_ref(v, B, T, C, opt); }, x, w), kGradTol);

  Tensor copy = Tensor::empty({B, T, C}, DType::f32);
  dropout_forward(make(x, {B, T, C}), copy, {.p = 0.f});
  EXPECT_EQ(values(copy), x);
}

// A (B, T, C) tensor dropped whole equals its pieces dropped with offsets, cut along any dimension.
TEST(Dropout, MaskDependsOnlyOnGlobalCoordinates) {
  const int64_t B = 4, T = 6, C = 10;
  const DropoutOptions opt{.p = 0.5f, .seed = 3, .site = stream_id("embedding.dropout"), .sample_offset = 8};
  Tensor x = make(rand_vec(B * T * C, 37), {B, T, C}), whole = Tensor::empty({B, T, C}, DType::f32);
  dropout_forward(x, whole, opt);
  for (int dim = 0; dim < 3; ++dim) {
    const int64_t cut = dim == 2 ? 6 : x.dim(dim) / 2;  // column cut at 6: not a multiple of 4 (Philox block)
    Tensor lo = take(x, dim, 0, cut), hi = take(x, dim, cut, x.dim(dim));
    DropoutOptions hi_opt = opt;
    (dim == 0 ? hi_opt.sample_offset : dim == 1 ? hi_opt.row_offset : hi_opt.col_offset) += cut;
    Tensor lo_out = Tensor::empty(lo.shape(), DType::f32), hi_out = Tensor::empty(hi.shape(), DType::f32);
    dropout_forward(lo, lo_out, opt);
    dropout_forward(hi, hi_out, hi_opt);
    EXPECT_EQ(concat(lo_out, hi_out, dim), values(whole)) << "cut along dim " << dim;
  }
}

// Context parallelism: a rank holding chunks [2, 6) and [10, 14) of a 16-row sequence as one local tensor of 8 rows
// (split_at, split_position) draws the whole tensor's mask at those rows, in dropout and dropout_add alike.
TEST(Dropout, ChunkSplitRowsDrawTheWholeSequenceMask) {
  const int64_t B = 2, T = 16, C = 12;
  const DropoutOptions opt{.p = 0.4f, .seed = 9, .site = stream_id("layers.1.attn.out"), .sample_offset = 4};
  const Tensor x = make(rand_vec(B * T * C, 38), {B, T, C}), res = make(rand_vec(B * T * C, 39), {B, T, C});
  Tensor whole = Tensor::empty({B, T, C}, DType::f32), whole_add = Tensor::empty({B, T, C}, DType::f32);
  dropout_forward(x, whole, opt);
  dropout_add(x, res, whole_add, opt);
  auto local = [](const Tensor& t) {
    return make(concat(take(t, 1, 2, 6), take(t, 1, 10, 14), 1), {t.dim(0), 8, t.dim(2)});
  };
  DropoutOptions split = opt;
  split.row_offset = 2;
  split.split_at = 4;
  split.split_position = 10;
  Tensor got = Tensor::empty({B, 8, C}, DType::f32), got_add = Tensor::empty({B, 8, C}, DType::f32);
  dropout_forward(local(x), got, split);
  dropout_add(local(x), local(res), got_add, split);
  EXPECT_EQ(values(got), values(local(whole)));
  EXPECT_EQ(values(got_add), values(local(whole_add)));
  EXPECT_EQ(dropout_row(split, 3), 5);
  EXPECT_EQ(dropout_row(split, 4), 10);
  EXPECT_NE(values(got), values(take(whole, 1, 2, 10)));  // not the contiguous rows' mask
}

}  // namespace
}  // namespace mt
