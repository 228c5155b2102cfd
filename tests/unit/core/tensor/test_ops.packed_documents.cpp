// test_ops.packed_documents.cpp: packed documents (data.sft_packing: pack) on the CPU ops: attention, RoPE and the
// learned position table with AttentionOptions / RopeOptions / EmbeddingOptions::positions give each document what
// it gets alone (its own sample, positions from 0), and positions 0..T-1 give exactly the un-reset results.
// One of the sources of test_ops (tests/CMakeLists.txt).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"
#include "tests/unit/core/tensor/op_reference.h"

namespace mt {
namespace {

using namespace mt::test;  // NOLINT(google-build-using-namespace)

// Position ids (B, T) i32 of samples whose documents have the given lengths (each sample's lengths sum to T).
Tensor positions_of(const std::vector<std::vector<int64_t>>& docs, int64_t T) {
  Tensor p = Tensor::empty({static_cast<int64_t>(docs.size()), T}, DType::i32);
  int32_t* v = p.data<int32_t>();
  for (size_t b = 0; b < docs.size(); ++b) {
    int64_t t = 0;
    for (int64_t len : docs[b])
      for (int64_t k = 0; k < len; ++k) v[static_cast<int64_t>(b) * T + t++] = static_cast<int32_t>(k);
    EXPECT_EQ(t, T) << "the test's documents must fill sample " << b;
  }
  return p;
}

// Rows [t0, t0 + len) of sample b of a (B, T, ...) tensor, as its own (1, len, ...) tensor.
Tensor rows_of(const Tensor& x, int64_t b, int64_t t0, int64_t len) {
  return take(take(x, 0, b, b + 1), 1, t0, t0 + len);
}

// Row range [t0, t0 + len) of sample b of the values of a (B, T, inner) tensor.
Vec value_rows(const Tensor& x, int64_t b, int64_t t0, int64_t len) { return values(rows_of(x, b, t0, len)); }

// Tokens [t0, t0 + len) of sample b of lse (B, H, T), as (1, H, len).
Vec lse_rows(const Tensor& lse, int64_t b, int64_t t0, int64_t len) {
  return values(take(take(lse, 0, b, b + 1), 2, t0, t0 + len));
}

void expect_near(const Vec& got, const Vec& want, double tol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << what << " element " << i;
}

const std::vector<std::vector<int64_t>> kDocs = {{5, 7}, {3, 1, 8}};  // two samples of T = 12

// Grouped-query attention (G = 2 groups of R = 2 heads) over packed documents: every document's out, lse and
// dqkv equal those of attention over that document alone (its own sample of its length), with a sliding window too
// (the window of each document's own).
class PackedWindow : public ::testing::TestWithParam<int64_t> {};
TEST_P(PackedWindow, AttentionOfEachDocumentEqualsItAlone) {
  const int64_t B = 2, T = 12, G = 2, R = 2, H = G * R, D = 4, window = GetParam();
  const Tensor qkv = make(rand_vec(B * T * G * (R + 2) * D, 51, -1.5, 1.5), {B, T, G, R + 2, D});
  const Tensor dout = make(rand_vec(B * T * H * D, 52), {B, T, H, D});
  AttentionOptions opt{.positions = positions_of(kDocs, T), .window = window};
  Tensor out = Tensor::empty({B, T, H, D}, DType::f32), lse = Tensor::empty({B, H, T}, DType::f32);
  Tensor dqkv = Tensor::empty(qkv.shape(), DType::f32);
  attention_forward(qkv, out, lse, opt);
  attention_backward(qkv, out, lse, dout, dqkv, opt);
  for (int64_t b = 0; b < B; ++b) {
    int64_t t0 = 0;
    for (int64_t len : kDocs[static_cast<size_t>(b)]) {
      const Tensor q1 = rows_of(qkv, b, t0, len), d1 = rows_of(dout, b, t0, len);
      Tensor o1 = Tensor::empty({1, len, H, D}, DType::f32), l1 = Tensor::empty({1, H, len}, DType::f32);
      Tensor dq1 = Tensor::empty(q1.shape(), DType::f32);
      attention_forward(q1, o1, l1, {.window = window});
      attention_backward(q1, o1, l1, d1, dq1, {.window = window});
      expect_near(value_rows(out, b, t0, len), values(o1), 1e-6, "out");
      expect_near(lse_rows(lse, b, t0, len), values(l1), 1e-6, "lse");
      expect_near(value_rows(dqkv, b, t0, len), values(dq1), 1e-6, "dqkv");
      t0 += len;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Windows, PackedWindow, ::testing::Values(0, 1, 3, 6));

// Positions 0..T-1 (one document a sample) are the un-reset attention bit for bit, with dropout too.
TEST(PackedDocuments, OneDocumentPerSampleIsTheUnresetAttentionExactly) {
  const int64_t B = 2, T = 70, G = 1, R = 2, H = G * R, D = 8;  // T > one row block of the CPU attention
  const Tensor qkv = make(rand_vec(B * T * G * (R + 2) * D, 53, -1.5, 1.5), {B, T, G, R + 2, D});
  const Tensor dout = make(rand_vec(B * T * H * D, 54), {B, T, H, D});
  auto run = [&](AttentionOptions o) {
    o.dropout_p = 0.2f;
    o.seed = 3;
    o.site = 11;
    std::vector<Tensor> r = {Tensor::empty({B, T, H, D}, DType::f32), Tensor::empty({B, H, T}, DType::f32),
                             Tensor::empty(qkv.shape(), DType::f32)};
    attention_forward(qkv, r[0], r[1], o);
    attention_backward(qkv, r[0], r[1], dout, r[2], o);
    return r;
  };
  const std::vector<Tensor> plain = run({}), packed = run({.positions = positions_of({{T}, {T}}, T)});
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(values(packed[i]), values(plain[i])) << "tensor " << i;
}

// A document after another in the same sample sees none of it: changing the first document's keys and values
// leaves the second's out unchanged (exactly), while without positions it changes.
TEST(PackedDocuments, AttentionDoesNotCrossADocumentBoundary) {
  const int64_t T = 12, H = 2, D = 4;
  Vec a = rand_vec(T * H * 3 * D, 55), b = a;
  for (int64_t t = 0; t < 5; ++t)  // the first document (tokens 0..4): new keys and values
    for (int64_t i = 0; i < H * 3 * D; ++i)
      if ((i / D) % 3 != 0) b[t * H * 3 * D + i] += 0.5;
  auto second_doc_out = [&](const Vec& v, const AttentionOptions& o) {
    Tensor out = Tensor::empty({1, T, H, D}, DType::f32), lse = Tensor::empty({1, H, T}, DType::f32);
    attention_forward(make(v, {1, T, H, 3, D}), out, lse, o);
    return value_rows(out, 0, 5, T - 5);
  };
  const AttentionOptions packed{.positions = positions_of({{5, 7}}, T)};
  EXPECT_EQ(second_doc_out(a, packed), second_doc_out(b, packed));
  EXPECT_NE(second_doc_out(a, {}), second_doc_out(b, {}));
}

// RoPE rotates each token at its position within its document: each document equals it rotated alone.
TEST(PackedDocuments, RopeOfEachDocumentEqualsItAlone) {
  const int64_t B = 2, T = 12, G = 2, R = 2, D = 6;
  const Tensor qkv = make(rand_vec(B * T * G * (R + 2) * D, 56), {B, T, G, R + 2, D});
  for (bool inverse : {false, true}) {
    Tensor packed = make(values(qkv), qkv.shape());
    rope_(packed, {.inverse = inverse, .positions = positions_of(kDocs, T)});
    for (int64_t b = 0; b < B; ++b) {
      int64_t t0 = 0;
      for (int64_t len : kDocs[static_cast<size_t>(b)]) {
        Tensor alone = rows_of(qkv, b, t0, len);
        rope_(alone, {.inverse = inverse});
        EXPECT_EQ(value_rows(packed, b, t0, len), values(alone)) << "sample " << b << " token " << t0;
        t0 += len;
      }
    }
  }
}

// The learned position table: token (b, t) of a sequence shard [offset, offset + len) adds row
// positions[b, offset + t]; the backward adds each token's gradient to its own row.
TEST(PackedDocuments, PositionTableRowsAreEachTokensDocumentPosition) {
  const int64_t B = 2, T = 12, C = 3, P = 16, offset = 4, len = 6;
  const Tensor pos = positions_of(kDocs, T);
  const Vec wpe = rand_vec(P * C, 57), x = rand_vec(B * len * C, 58);
  Tensor X = make(x, {B, len, C}), dW = Tensor::zeros({P, C}, DType::f32);
  position_embedding_add(X, make(wpe, {P, C}), {.position_offset = offset, .positions = pos});
  position_embedding_backward(make(x, {B, len, C}), dW, {.position_offset = offset, .positions = pos});
  Vec want = x, dw(P * C, 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < len; ++t) {
      const int64_t p = pos.data<int32_t>()[b * T + offset + t];
      for (int64_t c = 0; c < C; ++c) {
        want[(b * len + t) * C + c] = static_cast<float>(x[(b * len + t) * C + c] + wpe[p * C + c]);
        dw[p * C + c] += x[(b * len + t) * C + c];
      }
    }
  EXPECT_EQ(values(X), want);
  expect_near(values(dW), dw, 1e-6, "dwpe");
}

// Bad positions are refused naming the tensor: a wrong shape, a position past its token (it would see keys
// before its sample), and a row outside the table.
TEST(PackedDocuments, BadPositionsAreRefused) {
  const int64_t T = 4, H = 1, D = 2;
  const Tensor qkv = make(rand_vec(T * H * 3 * D, 59), {1, T, H, 3, D});
  Tensor out = Tensor::empty({1, T, H, D}, DType::f32), lse = Tensor::empty({1, H, T}, DType::f32);
  expect_invalid([&] { attention_forward(qkv, out, lse, {.positions = positions_of({{2}}, 2)}); }, "positions");
  Tensor bad = positions_of({{4}}, T);
  bad.data<int32_t>()[1] = 2;  // token 1 at position 2
  expect_invalid([&] { attention_forward(qkv, out, lse, {.positions = bad}); }, "positions[0, 1] = 2");
  expect_invalid([&] { attention_forward(qkv, out, lse, {.causal = false, .positions = positions_of({{4}}, T)}); },
                 "causal");
  Tensor q2 = make(values(qkv), qkv.shape());
  expect_invalid([&] { rope_(q2, {.position_offset = 1, .positions = positions_of({{4}}, T)}); }, "position_offset");
  Tensor x = make(rand_vec(T * 2, 60), {1, T, 2});
  Tensor far = positions_of({{4}}, T);
  far.data<int32_t>()[3] = 7;  // past the table's 4 rows
  expect_invalid(
      [&] {
        position_embedding_add(x, make(rand_vec(T * 2, 61), {T, 2}), {.positions = far});
      },
      "positions[0, 3] = 7");
}

}  // namespace
}  // namespace mt
