// test_ops.attention.cpp: the CPU attention (one head per key/value and grouped-query) against a double reference
// and finite differences: head and group shards, half storage, shape errors and the call counts.
// One of the sources of test_ops (tests/CMakeLists.txt); the shared references are in op_reference.h.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <ostream>

#include "core/base/rng.h"
#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"
#include "tests/unit/core/tensor/op_reference.h"

namespace mt {
namespace {

using namespace mt::test;  // Vec, rand_vec, make, values, the references of op_reference.h

// ---- attention -----------------------------------------------------------------------------------

struct AttnRef {
  Vec out, lse;
};
// qkv (B, T, H, 3, D) -> out (B, T, H, D), lse (B, H, T); dropout mask and sliding window as documented in ops.h.
AttnRef attention_ref(const Vec& qkv, int64_t B, int64_t T, int64_t H, int64_t D, const AttentionOptions& o) {
  AttnRef r{Vec(B * T * H * D, 0.0), Vec(B * H * T)};
  auto at = [&](int64_t b, int64_t t, int64_t h, int64_t w, int64_t d) {  // w: 0 query, 1 key, 2 value
    return qkv[(((b * T + t) * H + h) * 3 + w) * D + d];
  };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const int64_t len = o.causal ? i + 1 : T, lo = o.window > 0 ? std::max<int64_t>(0, i - o.window + 1) : 0;
        Vec s(len, -std::numeric_limits<double>::infinity());
        for (int64_t j = lo; j < len; ++j) {
          s[j] = 0;
          for (int64_t d = 0; d < D; ++d) s[j] += at(b, i, h, 0, d) * at(b, j, h, 1, d) / std::sqrt(double(D));
        }
        const double m = *std::max_element(s.begin(), s.end());
        double sum = 0;
        for (double v : s) sum += std::exp(v - m);
        const double lse = m + std::log(sum);
        r.lse[(b * H + h) * T + i] = lse;
        for (int64_t j = lo; j < len; ++j) {
          double p = std::exp(s[j] - lse);
          if (o.dropout_p > 0)
            p = dropout_uniform(o.seed, o.site, o.sample_offset + b, (o.head_offset + h) * T + i, j) >= o.dropout_p
                    ? p / (1.0 - o.dropout_p)
                    : 0.0;
          for (int64_t d = 0; d < D; ++d) r.out[((b * T + i) * H + h) * D + d] += p * at(b, j, h, 2, d);
        }
      }
  return r;
}

struct AttnCase {
  bool causal;
  float dropout_p;
  int64_t window = 0;
};
class AttentionCases : public ::testing::TestWithParam<AttnCase> {};

TEST_P(AttentionCases, ForwardMatchesDoubleAndBackwardMatchesFiniteDifferences) {
  const int64_t B = 2, T = 6, H = 2, D = 4;
  const AttentionOptions opt{.causal = GetParam().causal,
                             .dropout_p = GetParam().dropout_p,
                             .seed = 9,
                             .site = stream_id("layers.1.attn.probs"),
                             .sample_offset = 3,
                             .head_offset = 2,
                             .window = GetParam().window};
  const Vec qkv = rand_vec(B * T * H * 3 * D, 38, -1.5, 1.5), w = rand_vec(B * T * H * D, 39);
  Tensor QKV = make(qkv, {B, T, H, 3, D}), out = Tensor::empty({B, T, H, D}, DType::f32);
  Tensor lse = Tensor::empty({B, H, T}, DType::f32), dqkv = Tensor::empty({B, T, H, 3, D}, DType::f32);
  attention_forward(QKV, out, lse, opt);
  const AttnRef ref = attention_ref(qkv, B, T, H, D, opt);
  EXPECT_CLOSE(values(out), ref.out, kFwdTol);
  EXPECT_CLOSE(values(lse), ref.lse, kFwdTol);
  attention_backward(QKV, out, lse, make(w, {B, T, H, D}), dqkv, opt);
  auto f = [&](const Vec& v) { return attention_ref(v, B, T, H, D, opt).out; };
  EXPECT_CLOSE(values(dqkv), fd_grad(f, qkv, w), kGradTol);
}

INSTANTIATE_TEST_SUITE_P(Attention, AttentionCases,
                         ::testing::Values(AttnCase{true, 0.f}, AttnCase{true, 0.25f}, AttnCase{false, 0.f},
                                           AttnCase{false, 0.25f}, AttnCase{true, 0.f, 1}, AttnCase{true, 0.f, 3},
                                           AttnCase{true, 0.25f, 4}),
                         [](const auto& info) {
                           return std::string(info.param.causal ? "Causal" : "Full") +
                                  (info.param.dropout_p > 0 ? "WithDropout" : "NoDropout") +
                                  (info.param.window > 0 ? "Window" + std::to_string(info.param.window) : "");
                         });

// Heads split over two "tensor-parallel ranks" with head_offset give the whole computation's out, lse and
// dqkv exactly (the dropout mask is keyed by the global head).
TEST(Attention, HeadShardsWithHeadOffsetEqualTheWhole) {
  const int64_t B = 2, T = 5, H = 4, D = 3;
  const AttentionOptions opt{.dropout_p = 0.2f, .seed = 1, .site = 77, .sample_offset = 6};
  Tensor qkv = make(rand_vec(B * T * H * 3 * D, 40), {B, T, H, 3, D});
  Tensor dout = make(rand_vec(B * T * H * D, 41), {B, T, H, D});
  auto run = [&](const Tensor& q, const Tensor& d, int64_t head_offset) {
    const int64_t h = q.dim(2);
    AttentionOptions o = opt;
    o.head_offset = head_offset;
    std::vector<Tensor> r = {Tensor::empty({B, T, h * D}, DType::f32), Tensor::empty({B, h, T}, DType::f32),
                             Tensor::empty(q.shape(), DType::f32)};
    attention_forward(q, r[0], r[1], o);  // out as the (B, T, H * D) view the models use
    attention_backward(q, r[0], r[1], d.view({B, T, h * D}), r[2], o);
    r[0] = r[0].view({B, T, h, D});
    return r;
  };
  const std::vector<Tensor> whole = run(qkv, dout, 0);
  const std::vector<Tensor> lo = run(take(qkv, 2, 0, 1), take(dout, 2, 0, 1), 0);
  const std::vector<Tensor> hi = run(take(qkv, 2, 1, H), take(dout, 2, 1, H), 1);
  EXPECT_EQ(concat(lo[0], hi[0], 2), values(whole[0]));
  EXPECT_EQ(concat(lo[1], hi[1], 1), values(whole[1]));
  EXPECT_EQ(concat(lo[2], hi[2], 2), values(whole[2]));
}

// ---- grouped-query attention ----
// qkv (B, T, G, R + 2, D) expanded to the one-head-per-key layout (B, T, H = G R, 3, D): head h = g R + r gets
// query slot r of group g and the group's key and value. The straightforward reference of grouped-query
// attention is attention on this expansion.
Vec expand_groups(const Vec& qkv, int64_t B, int64_t T, int64_t G, int64_t R, int64_t D) {
  Vec e(B * T * G * R * 3 * D);
  for (int64_t bt = 0; bt < B * T; ++bt)
    for (int64_t g = 0; g < G; ++g)
      for (int64_t r = 0; r < R; ++r)
        for (int64_t w = 0; w < 3; ++w) {  // query, key, value
          const int64_t slot = w == 0 ? r : R + w - 1;
          for (int64_t d = 0; d < D; ++d)
            e[(((bt * G + g) * R + r) * 3 + w) * D + d] = qkv[((bt * G + g) * (R + 2) + slot) * D + d];
        }
  return e;
}

// The gradient of the grouped qkv from that of its expansion: each query slot takes its head's query gradient,
// the group's key and value take the sums of their R heads' gradients in the order r = 0..R-1 (in F: double
// for references, float to replay the op's fp32 sums).
template <class F>
std::vector<F> collapse_groups(const Vec& dexp, int64_t B, int64_t T, int64_t G, int64_t R, int64_t D) {
  const int64_t BT = B * T;
  std::vector<F> d(BT * G * (R + 2) * D, F(0));
  for (int64_t bt = 0; bt < BT; ++bt)
    for (int64_t g = 0; g < G; ++g)
      for (int64_t r = 0; r < R; ++r)
        for (int64_t w = 0; w < 3; ++w) {
          const int64_t slot = w == 0 ? r : R + w - 1;
          for (int64_t dd = 0; dd < D; ++dd) {
            F& to = d[((bt * G + g) * (R + 2) + slot) * D + dd];
            const F x = static_cast<F>(dexp[(((bt * G + g) * R + r) * 3 + w) * D + dd]);
            to = (w == 0 || r == 0) ? x : to + x;  // the first head's copied (no 0 + x), as the op does
          }
        }
  return d;
}

struct GqaCase {
  int64_t G, R;
  float dropout_p;
};
class GroupedQueryAttention : public ::testing::TestWithParam<GqaCase> {};

// The op on qkv (B, T, G, R + 2, D) against the double reference on the expansion: out and lse directly, dqkv
// against the expansion's finite-difference gradients collapsed (dk, dv: summed over the group's heads).
TEST_P(GroupedQueryAttention, MatchesTheExpandedReference) {
  const auto [G, R, p] = GetParam();
  const int64_t B = 2, T = 5, D = 4, H = G * R;
  const AttentionOptions opt{.dropout_p = p, .seed = 4, .site = 17, .sample_offset = 1, .head_offset = 3};
  const Vec qkv = rand_vec(B * T * G * (R + 2) * D, 42, -1.5, 1.5), w = rand_vec(B * T * H * D, 43);
  const Vec qkv_e = expand_groups(qkv, B, T, G, R, D);
  Tensor QKV = make(qkv, {B, T, G, R + 2, D}), out = Tensor::empty({B, T, H, D}, DType::f32);
  Tensor lse = Tensor::empty({B, H, T}, DType::f32), dqkv = Tensor::empty({B, T, G, R + 2, D}, DType::f32);
  attention_forward(QKV, out, lse, opt);
  const AttnRef ref = attention_ref(qkv_e, B, T, H, D, opt);
  EXPECT_CLOSE(values(out), ref.out, kFwdTol);
  EXPECT_CLOSE(values(lse), ref.lse, kFwdTol);
  attention_backward(QKV, out, lse, make(w, {B, T, H, D}), dqkv, opt);
  auto f = [&](const Vec& v) { return attention_ref(v, B, T, H, D, opt).out; };
  EXPECT_CLOSE(values(dqkv), collapse_groups<double>(fd_grad(f, qkv_e, w), B, T, G, R, D), kGradTol);
}

// Bit for bit: each query head of the grouped op computes exactly what the one-head-per-key op (R = 1, GPT's
// layout) computes on the expansion, and the group's dk, dv are the fp32 sums of those heads' gradients in
// the order r = 0..R-1. With R = 1 the expansion is the input itself: the old layout and arithmetic.
TEST_P(GroupedQueryAttention, EqualsTheOneHeadPerKeyOpOnTheExpansion) {
  const auto [G, R, p] = GetParam();
  const int64_t B = 2, T = 70, D = 8, H = G * R;  // T > 64: two row blocks
  const AttentionOptions opt{.dropout_p = p, .seed = 5, .site = 23, .sample_offset = 2, .head_offset = 1};
  const Vec qkv = rand_vec(B * T * G * (R + 2) * D, 44, -2, 2), w = rand_vec(B * T * H * D, 45);
  auto run = [&](const Tensor& q) {
    std::vector<Tensor> r = {Tensor::empty({B, T, H, D}, DType::f32), Tensor::empty({B, H, T}, DType::f32),
                             Tensor::empty(q.shape(), DType::f32)};
    attention_forward(q, r[0], r[1], opt);
    attention_backward(q, r[0], r[1], make(w, {B, T, H, D}), r[2], opt);
    return r;
  };
  const std::vector<Tensor> grouped = run(make(qkv, {B, T, G, R + 2, D}));
  const std::vector<Tensor> expanded = run(make(expand_groups(qkv, B, T, G, R, D), {B, T, H, 3, D}));
  EXPECT_EQ(values(grouped[0]), values(expanded[0]));
  EXPECT_EQ(values(grouped[1]), values(expanded[1]));
  const std::vector<float> want = collapse_groups<float>(values(expanded[2]), B, T, G, R, D);
  EXPECT_EQ(grouped[2].to_floats(), want);
}

INSTANTIATE_TEST_SUITE_P(Attention, GroupedQueryAttention,
                         ::testing::Values(GqaCase{2, 1, 0.f}, GqaCase{2, 2, 0.f}, GqaCase{2, 4, 0.f},
                                           GqaCase{1, 2, 0.f}, GqaCase{1, 4, 0.f}, GqaCase{1, 1, 0.25f},
                                           GqaCase{2, 2, 0.25f}, GqaCase{1, 4, 0.25f}),
                         [](const auto& info) {
                           return "G" + std::to_string(info.param.G) + "R" + std::to_string(info.param.R) +
                                  (info.param.dropout_p > 0 ? "WithDropout" : "NoDropout");
                         });

// Groups split over two "tensor-parallel ranks" (head_offset = the first rank's query heads) give the whole
// computation's out, lse and dqkv exactly.
TEST(Attention, GroupShardsWithHeadOffsetEqualTheWhole) {
  const int64_t B = 2, T = 5, G = 4, R = 2, D = 3, H = G * R;
  const AttentionOptions opt{.dropout_p = 0.2f, .seed = 1, .site = 78, .sample_offset = 6};
  Tensor qkv = make(rand_vec(B * T * G * (R + 2) * D, 46), {B, T, G, R + 2, D});
  Tensor dout = make(rand_vec(B * T * H * D, 47), {B, T, H, D});
  auto run = [&](const Tensor& q, const Tensor& d, int64_t head_offset) {
    const int64_t h = q.dim(2) * R;
    AttentionOptions o = opt;
    o.head_offset = head_offset;
    std::vector<Tensor> r = {Tensor::empty({B, T, h * D}, DType::f32), Tensor::empty({B, h, T}, DType::f32),
                             Tensor::empty(q.shape(), DType::f32)};
    attention_forward(q, r[0], r[1], o);
    attention_backward(q, r[0], r[1], d.view({B, T, h * D}), r[2], o);
    r[0] = r[0].view({B, T, h, D});
    return r;
  };
  const std::vector<Tensor> whole = run(qkv, dout, 0);
  const std::vector<Tensor> lo = run(take(qkv, 2, 0, 1), take(dout, 2, 0, R), 0);
  const std::vector<Tensor> hi = run(take(qkv, 2, 1, G), take(dout, 2, R, H), R);
  EXPECT_EQ(concat(lo[0], hi[0], 2), values(whole[0]));
  EXPECT_EQ(concat(lo[1], hi[1], 1), values(whole[1]));
  EXPECT_EQ(concat(lo[2], hi[2], 2), values(whole[2]));
}

// bf16 / fp16 storage: the fp32 op on the same values, rounded once (dk, dv summed over the group in fp32).
TEST(Attention, GroupedHalfStorageIsTheFp32OpRoundedOnce) {
  const int64_t B = 2, T = 4, G = 2, R = 3, D = 4, H = G * R;
  const Vec qkv = rand_vec(B * T * G * (R + 2) * D, 48, -2, 2), w = rand_vec(B * T * H * D, 49);
  const AttentionOptions opt{.dropout_p = 0.1f, .seed = 2, .site = 3};
  for (DType dt : {DType::bf16, DType::f16}) {
    auto run = [&](DType io, const Vec& in, const Vec& dout) {
      std::vector<Tensor> r = {Tensor::empty({B, T, H, D}, io), Tensor::empty({B, H, T}, DType::f32),
                               Tensor::empty({B, T, G, R + 2, D}, io)};
      const Tensor q = make(in, {B, T, G, R + 2, D}, io);
      attention_forward(q, r[0], r[1], opt);
      attention_backward(q, r[0], r[1], make(dout, {B, T, H, D}, io), r[2], opt);
      return r;
    };
    const std::vector<Tensor> got = run(dt, qkv, w), ref = run(DType::f32, rounded(qkv, dt), rounded(w, dt));
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_EQ(values(got[i]), rounded(values(ref[i]), got[i].dtype())) << "output " << i << " in " << dtype_name(dt);
  }
}

TEST(Attention, GroupedShapeErrorsNameTheShapes) {
  auto f32 = [](Shape s) { return Tensor::zeros(std::move(s), DType::f32); };
  Tensor qkv = f32({1, 4, 2, 4, 8}), out = f32({1, 4, 4, 8}), lse = f32({1, 4, 4});  // G 2, R 2: H 4
  Tensor out_g = f32({1, 4, 2, 8}), lse_g = f32({1, 2, 4}), qkv_r0 = f32({1, 4, 2, 2, 8}), qkv4 = f32({1, 4, 8, 8});
  expect_invalid([&] { attention_forward(qkv, out_g, lse, {}); },
                 "attention_forward: out: expected shape [1, 4, 4, 8] (B, T, H = G * R, D) or its view [1, 4, 32] "
                 "for qkv [1, 4, 2, 4, 8], got [1, 4, 2, 8]");
  expect_invalid([&] { attention_forward(qkv, out, lse_g, {}); },
                 "attention_forward: lse: expected shape [1, 4, 4] (B, H = G * R, T) for qkv [1, 4, 2, 4, 8], got "
                 "[1, 2, 4]");
  expect_invalid([&] { attention_forward(qkv_r0, out, lse, {}); },
                 "attention_forward: qkv: expected shape (B, T, G, R + 2, D) with R >= 1");
  expect_invalid([&] { attention_forward(qkv4, out, lse, {}); },
                 "attention_forward: qkv: expected a 5-D tensor (B, T, G, R + 2, D)");
  Tensor dqkv = f32({1, 4, 2, 3, 8});
  expect_invalid([&] { attention_backward(qkv, out, lse, out, dqkv, {}); },
                 "attention_backward: dqkv: expected shape [1, 4, 2, 4, 8]");
  Tensor view = out.view({1, 4, 32});
  attention_forward(qkv, view, lse, {});  // the (B, T, H * D) view is accepted
  expect_invalid([&] { attention_forward(qkv, out, lse, {.window = -1}); },
                 "attention_forward: window: must be >= 0, and > 0 only with causal attention, got -1");
  expect_invalid([&] { attention_backward(qkv, out, lse, out, dqkv, {.causal = false, .window = 4}); },
                 "attention_backward: window: must be >= 0, and > 0 only with causal attention, got 4");
  Tensor kv = f32({1, 4, 2, 2, 8}), bout = f32({1, 4, 4, 8});
  expect_invalid([&] { attention_block_forward(qkv, kv, bout, lse, {.causal = false, .window = 2}); },
                 "attention_block_forward: window: must be >= 0, and > 0 only with causal attention, got 2");
}

// Every attention call is counted by the implementation that ran it (the log and metrics.jsonl report the
// counts): on the CPU each forward and each backward counts one CPU call, and a call refused by its checks none.
TEST(Attention, CallsAreCountedByImplementation) {
  auto f32 = [](Shape s) { return Tensor::zeros(std::move(s), DType::f32); };
  Tensor qkv = f32({1, 4, 2, 3, 8}), out = f32({1, 4, 2, 8}), lse = f32({1, 2, 4}), dqkv = f32({1, 4, 2, 3, 8});
  const AttentionCalls before = attention_calls();
  attention_forward(qkv, out, lse, {});
  attention_backward(qkv, out, lse, out, dqkv, {});
  attention_forward(qkv, out, lse, {});
  Tensor bad_lse = f32({1, 3, 4});
  EXPECT_THROW(attention_forward(qkv, out, bad_lse, {}), std::invalid_argument);
  const AttentionCalls after = attention_calls();
  EXPECT_EQ(after.cpu - before.cpu, 3);
  EXPECT_EQ(after.cudnn - before.cudnn, 0);
  EXPECT_EQ(after.kernel - before.kernel, 0);
}
// ---- end grouped-query attention ----

}  // namespace
}  // namespace mt
