// test_ops.attention_context.cpp: context-parallel attention's blocks (core/tensor/ops.h) against the whole
// attention: a sequence cut into 2C chunks, "rank" r holding chunks r and 2C-1-r, each rank's queries run against
// every rank's keys and values block by block and merged by log-sum-exp must give attention_forward's output and
// lse at those positions; the blocks' backward shares, summed over ranks, attention_backward's dqkv. Grouped-query
// (R = 2) and GPT's layout (R = 1), with and without dropout on the probabilities (the blocks' masks keyed by global
// positions, so they draw attention_forward's mask), with sliding windows and packed documents (each block row's
// document from its position within it); plus the merge's corner (a row that sees no key), packed positions' rotary
// and learned embeddings on a rank's chunks, and the argument checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"
#include "tests/unit/core/tensor/op_reference.h"

namespace mt {
namespace {

using namespace mt::test;  // NOLINT(google-build-using-namespace): Vec, rand_vec, make, values, take, concat

// Positions of a rank's local sequence of 2c tokens (chunks r and 2C-1-r of c tokens each).
SequencePositions chunk_positions(int r, int C, int64_t c) {
  return {.position_offset = r * c, .split_at = c, .split_position = (2 * C - 1 - r) * c};
}

// Rows of rank r's local sequence out of a (B, T, ...) tensor: chunks r and 2C-1-r along dimension 1.
Tensor local_of(const Tensor& t, int r, int C) {
  const int64_t c = t.dim(1) / (2 * C);
  Shape s = t.shape();
  s[1] = 2 * c;
  return make(concat(take(t, 1, r * c, (r + 1) * c), take(t, 1, (2 * C - 1 - r) * c, (2 * C - r) * c), 1), s);
}

// Packed documents' positions (B, T) i32: each sample's documents of 1 to `longest` tokens (lengths drawn from a
// small LCG), the first of sample b b + 1 tokens long (the sample's first token is at position 0, as packing gives).
Tensor document_positions(int64_t B, int64_t T, int64_t longest) {
  Tensor pos = Tensor::empty({B, T}, DType::i32);
  int32_t* p = pos.data<int32_t>();
  uint32_t state = 7;
  for (int64_t b = 0; b < B; ++b) {
    int64_t at = 0, left = b + 1;  // position within the document, tokens left in it
    for (int64_t t = 0; t < T; ++t) {
      if (left == 0) {
        state = state * 1103515245u + 12345u;
        at = 0;
        left = 1 + static_cast<int64_t>((state >> 16) % static_cast<uint32_t>(longest));
      }
      p[b * T + t] = static_cast<int32_t>(at++);
      --left;
    }
  }
  return pos;
}

// Rank r's columns (chunks r and 2C-1-r) of positions (B, T) i32.
Tensor local_positions(const Tensor& pos, int r, int C) {
  const int64_t B = pos.dim(0), T = pos.dim(1), c = T / (2 * C);
  Tensor local = Tensor::empty({B, 2 * c}, DType::i32);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < 2 * c; ++t) {
      const int64_t g = t < c ? r * c + t : (2 * C - 1 - r) * c + t - c;
      local.data<int32_t>()[b * 2 * c + t] = pos.data<int32_t>()[b * T + g];
    }
  return local;
}

struct Case {
  int64_t B, T, G, R, D;
  int C;
  float p = 0.f;       // attention dropout
  int64_t window = 0;  // sliding window (0: none)
  int64_t doc = 0;     // packed documents of at most doc tokens (0: one sequence a sample)
};

class AttentionBlocks : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionBlocks, MergedBlocksEqualWholeAttention) {
  const Case k = GetParam();
  const int64_t H = k.G * k.R, c = k.T / (2 * k.C);
  const Tensor qkv = make(rand_vec(k.B * k.T * k.G * (k.R + 2) * k.D, 11), {k.B, k.T, k.G, k.R + 2, k.D});
  const Tensor dout = make(rand_vec(k.B * k.T * H * k.D, 12), {k.B, k.T, H, k.D});
  Tensor out = Tensor::empty({k.B, k.T, H, k.D}, DType::f32), lse = Tensor::empty({k.B, H, k.T}, DType::f32);
  const AttentionOptions whole{.causal = true,
                               .dropout_p = k.p,
                               .seed = 17,
                               .site = 5,
                               .sample_offset = 3,
                               .head_offset = 2,
                               .positions = k.doc > 0 ? document_positions(k.B, k.T, k.doc) : Tensor(),
                               .window = k.window};
  attention_forward(qkv, out, lse, whole);
  Tensor dqkv = Tensor::empty(qkv.shape(), DType::f32);
  attention_backward(qkv, out, lse, dout, dqkv, whole);
  // Rank r's queries against context rank src's keys, the dropout keys those of the whole attention.
  auto block = [&](int r, int src) {
    return AttentionBlockOptions{.q = chunk_positions(r, k.C, c),
                                 .k = chunk_positions(src, k.C, c),
                                 .dropout_p = k.p,
                                 .seed = whole.seed,
                                 .site = whole.site,
                                 .sample_offset = whole.sample_offset,
                                 .head_offset = whole.head_offset,
                                 .seq_length = k.T,
                                 .window = k.window,
                                 .positions = k.doc > 0 ? local_positions(whole.positions, r, k.C) : Tensor()};
  };

  std::vector<Tensor> local(k.C), kv(k.C), dq(k.C), dkv(k.C), outs(k.C), lses(k.C);
  for (int r = 0; r < k.C; ++r) {
    local[r] = local_of(qkv, r, k.C);
    kv[r] = Tensor::empty({k.B, 2 * c, k.G, 2, k.D}, DType::f32);
    attention_kv_pack(local[r], kv[r]);
    dq[r] = Tensor::zeros({k.B, 2 * c, H, k.D}, DType::f32);
    dkv[r] = Tensor::zeros(kv[r].shape(), DType::f32);
  }
  for (int r = 0; r < k.C; ++r) {
    // Forward: the own block first (every row sees its diagonal), then the others merged in.
    outs[r] = Tensor::empty({k.B, 2 * c, H, k.D}, DType::f32);
    lses[r] = Tensor::empty({k.B, H, 2 * c}, DType::f32);
    Tensor part = Tensor::empty(outs[r].shape(), DType::f32), part_lse = Tensor::empty(lses[r].shape(), DType::f32);
    for (int s = 0; s < k.C; ++s) {
      const int src = (r - s + k.C) % k.C;
      const AttentionBlockOptions opt = block(r, src);
      if (s == 0) {
        attention_block_forward(local[r], kv[src], outs[r], lses[r], opt);
      } else {
        attention_block_forward(local[r], kv[src], part, part_lse, opt);
        attention_merge(outs[r], lses[r], part, part_lse);
      }
    }
    EXPECT_LE(max_rel_err(values(outs[r]), values(local_of(out, r, k.C))), kFwdTol) << "out of rank " << r;
    // lse (B, H, T): its local rows are along dimension 2; compare through a (B, T, H) transpose-free view per head.
    for (int64_t b = 0; b < k.B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = 0; t < 2 * c; ++t) {
          const int64_t g = t < c ? r * c + t : (2 * k.C - 1 - r) * c + t - c;  // global position
          EXPECT_NEAR(values(lses[r])[(b * H + h) * 2 * c + t], values(lse)[(b * H + h) * k.T + g], 1e-5);
        }
    // Backward: every block's share, the keys' and values' gradients to the block's owner.
    for (int src = 0; src < k.C; ++src)
      attention_block_backward(local[r], kv[src], outs[r], lses[r], local_of(dout, r, k.C), dq[r], dkv[src],
                               block(r, src));
  }
  for (int r = 0; r < k.C; ++r) {
    Tensor got = Tensor::empty(local[r].shape(), DType::f32);
    attention_qkv_grad(dq[r], dkv[r], got);
    EXPECT_LE(max_rel_err(values(got), values(local_of(dqkv, r, k.C))), kGradTol) << "dqkv of rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, AttentionBlocks,
                         ::testing::Values(Case{2, 16, 2, 2, 8, 2},        // grouped-query, CP = 2
                                           Case{1, 32, 3, 1, 4, 4},        // GPT's layout (R = 1), CP = 4
                                           Case{2, 24, 1, 4, 8, 3},        // multi-query, CP = 3
                                           Case{1, 256, 2, 1, 8, 2},       // row blocks of 64 across chunk edges
                                           Case{2, 16, 2, 2, 8, 2, 0.3f},  // the same with dropout: one mask
                                           Case{1, 32, 3, 1, 4, 4, 0.5f}, Case{1, 256, 2, 1, 8, 2, 0.2f},
                                           // sliding windows: inside a chunk, across chunks, past row blocks (the
                                           // far chunks' blocks then wholly invisible)
                                           Case{2, 16, 2, 2, 8, 2, 0.f, 3}, Case{1, 32, 3, 1, 4, 4, 0.3f, 6},
                                           Case{1, 256, 2, 1, 8, 2, 0.2f, 70}, Case{1, 256, 2, 1, 8, 2, 0.f, 1},
                                           // packed documents (attention reset at each start): shorter and longer
                                           // than a chunk, with dropout, with a window, past row blocks
                                           Case{2, 16, 2, 2, 8, 2, 0.f, 0, 3}, Case{2, 32, 3, 1, 4, 4, 0.3f, 0, 11},
                                           Case{2, 24, 1, 4, 8, 3, 0.f, 5, 9}, Case{1, 256, 2, 1, 8, 2, 0.2f, 0, 90},
                                           Case{1, 256, 2, 1, 8, 2, 0.f, 40, 150}));

// A block that a row cannot see (a later chunk's keys) leaves it out 0 and lse -inf; merging it changes nothing.
TEST(AttentionBlocks, InvisibleBlockMergesToNothing) {
  const Tensor qkv = make(rand_vec(1 * 4 * 1 * 3 * 4, 3), {1, 4, 1, 3, 4});
  Tensor kv = Tensor::empty({1, 4, 1, 2, 4}, DType::f32);
  attention_kv_pack(qkv, kv);
  Tensor out = Tensor::empty({1, 4, 1, 4}, DType::f32), lse = Tensor::empty({1, 1, 4}, DType::f32);
  attention_block_forward(qkv, kv, out, lse, {.q = {.position_offset = 0}, .k = {.position_offset = 0}});
  Tensor later = Tensor::empty(out.shape(), DType::f32), later_lse = Tensor::empty(lse.shape(), DType::f32);
  attention_block_forward(qkv, kv, later, later_lse, {.q = {.position_offset = 0}, .k = {.position_offset = 4}});
  for (float v : values(later_lse)) EXPECT_EQ(v, -std::numeric_limits<float>::infinity());
  for (float v : values(later)) EXPECT_EQ(v, 0.f);
  const Vec before = values(out), before_lse = values(lse);
  attention_merge(out, lse, later, later_lse);
  EXPECT_EQ(values(out), before);
  EXPECT_EQ(values(lse), before_lse);
}

// A rank's two chunks get the rotary angles and position rows of their global positions (split_at /
// split_position): the same values as the whole sequence's at those positions.
TEST(AttentionBlocks, RopeAndPositionRowsAtChunkPositions) {
  const int64_t B = 2, T = 24, G = 2, S = 4, D = 8, C = 3, c = T / (2 * C), P = 32, E = 16;
  const Tensor qkv = make(rand_vec(B * T * G * S * D, 21), {B, T, G, S, D});
  Tensor whole = qkv.clone();
  rope_(whole, {.theta = 10000.f});
  const Tensor wpe = make(rand_vec(P * E, 22), {P, E});
  const Tensor x = make(rand_vec(B * T * E, 23), {B, T, E});
  Tensor x_whole = x.clone();
  position_embedding_add(x_whole, wpe, {});
  for (int r = 0; r < C; ++r) {
    const SequencePositions p = chunk_positions(r, C, c);
    Tensor local = local_of(qkv, r, C);
    rope_(local, {.theta = 10000.f,
                  .position_offset = p.position_offset,
                  .split_at = p.split_at,
                  .split_position = p.split_position});
    EXPECT_EQ(values(local), values(local_of(whole, r, C))) << "rope of rank " << r;
    Tensor xl = local_of(x, r, C);
    const EmbeddingOptions eo{
        .position_offset = p.position_offset, .split_at = p.split_at, .split_position = p.split_position};
    position_embedding_add(xl, wpe, eo);
    EXPECT_EQ(values(xl), values(local_of(x_whole, r, C))) << "position rows of rank " << r;
    // The backward scatters each column's sum into its global row.
    Tensor dwpe = Tensor::zeros({P, E}, DType::f32);
    position_embedding_backward(xl, dwpe, eo);
    const Vec got = values(dwpe), xv = values(xl);
    for (int64_t t = 0; t < 2 * c; ++t) {
      const int64_t g = position_at(eo, t);
      for (int64_t e = 0; e < E; ++e)
        EXPECT_NEAR(got[g * E + e], xv[t * E + e] + xv[(2 * c + t) * E + e], 1e-6) << "row " << g;
    }
  }
}

// Packed documents: a rank's chunks of the positions (B, T) rotate and position its tokens as the whole sequence's,
// though they reach past its 2c rows (position_rows = T).
TEST(AttentionBlocks, RopeAndPositionRowsOfPackedChunks) {
  const int64_t B = 2, T = 24, G = 2, S = 4, D = 8, C = 3, c = T / (2 * C), P = 32, E = 16;
  const Tensor pos = document_positions(B, T, 20);
  bool reached_past = false;  // some rank holds a position past its 2c rows
  const Tensor qkv = make(rand_vec(B * T * G * S * D, 31), {B, T, G, S, D});
  Tensor whole = qkv.clone();
  rope_(whole, {.theta = 10000.f, .positions = pos});
  const Tensor wpe = make(rand_vec(P * E, 32), {P, E});
  const Tensor x = make(rand_vec(B * T * E, 33), {B, T, E});
  Tensor x_whole = x.clone();
  position_embedding_add(x_whole, wpe, {.positions = pos});
  for (int r = 0; r < C; ++r) {
    const Tensor lp = local_positions(pos, r, C);
    Tensor local = local_of(qkv, r, C);
    int32_t highest = 0;
    for (int64_t i = 0; i < lp.numel(); ++i) highest = std::max(highest, lp.data<int32_t>()[i]);
    if (highest >= 2 * c) {  // past the local rows: the table must hold the whole sequence's positions
      reached_past = true;
      expect_invalid([&] { rope_(local, {.theta = 10000.f, .positions = lp}); }, "lies outside [0, 8)");
    }
    rope_(local, {.theta = 10000.f, .positions = lp, .position_rows = T});
    EXPECT_EQ(values(local), values(local_of(whole, r, C))) << "rope of rank " << r;
    Tensor xl = local_of(x, r, C);
    position_embedding_add(xl, wpe, {.positions = lp});
    EXPECT_EQ(values(xl), values(local_of(x_whole, r, C))) << "position rows of rank " << r;
  }
  EXPECT_TRUE(reached_past) << "no rank's positions reach past its rows: the case tests nothing";
}

TEST(AttentionBlocks, ArgumentErrorsNameTheTensor) {
  const Tensor qkv = Tensor::zeros({1, 4, 2, 3, 4}, DType::f32);
  Tensor kv = Tensor::zeros({1, 4, 1, 2, 4}, DType::f32);  // one group, qkv has two
  expect_invalid([&] { attention_kv_pack(qkv, kv); }, "attention_kv_pack: kv");
  Tensor good_kv = Tensor::zeros({1, 4, 2, 2, 4}, DType::f32);
  Tensor out = Tensor::zeros({1, 4, 2, 4}, DType::bf16), lse = Tensor::zeros({1, 2, 4}, DType::f32);
  expect_invalid([&] { attention_block_forward(qkv, good_kv, out, lse, {}); }, "attention_block_forward: out");
  Tensor o = Tensor::zeros({1, 4, 2, 4}, DType::f32);
  expect_invalid([&] { attention_block_forward(qkv, good_kv, o, lse, {.q = {.position_offset = -1}}); }, "positions");
  Tensor wrong = Tensor::zeros({1, 3}, DType::i32);  // a row short of qkv's 4
  expect_invalid([&] { attention_block_forward(qkv, good_kv, o, lse, {.positions = wrong}); },
                 "attention_block_forward: positions");
  Tensor fine = Tensor::zeros({1, 4}, DType::i32);
  expect_invalid([&] { attention_block_forward(qkv, good_kv, o, lse, {.causal = false, .positions = fine}); },
                 "causal");
  Tensor l2 = Tensor::zeros({1, 2, 5}, DType::f32);
  expect_invalid([&] { attention_merge(o, lse, o, l2); }, "attention_merge: lse_b");
}

}  // namespace
}  // namespace mt
