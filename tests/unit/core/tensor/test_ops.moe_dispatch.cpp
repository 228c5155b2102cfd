// test_ops.moe_dispatch.cpp: the mixture-of-experts token dispatch on the CPU (core/tensor/ops.h): rows grouped by
// expert in (token, choice) order, the permute and unpermute gathers against direct sums, the two being adjoint
// (so each is the other's backward), the gradient of the weights against central differences, dropped choices,
// token dropping with a capacity (the position and probs policies; decided over more tokens than a part dispatches,
// in a given token order, as context parallelism does), and the argument errors. The GPU against these: test_cuda_ops.moe_dispatch.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"
#include "tests/unit/core/tensor/op_reference.h"

namespace mt {
namespace {

using namespace mt::test;  // NOLINT(google-build-using-namespace): Vec, rand_vec, make, values

Tensor ids(const std::vector<int32_t>& v, Shape shape) { return Tensor::from_ints(v, std::move(shape)); }

std::vector<int32_t> ints(const Tensor& t) {
  const int32_t* p = t.data<int32_t>();
  return {p, p + t.numel()};
}

// Distinct experts per token, drawn from a seed.
std::vector<int32_t> choices(int64_t N, int64_t k, int32_t E, uint32_t seed) {
  std::vector<int32_t> out;
  std::vector<int32_t> all(static_cast<size_t>(E));
  for (int64_t n = 0; n < N; ++n) {
    std::iota(all.begin(), all.end(), 0);
    for (int64_t j = 0; j < k; ++j) {
      seed = seed * 1664525u + 1013904223u;
      const size_t pick = j + (seed >> 8) % static_cast<uint32_t>(E - j);
      std::swap(all[static_cast<size_t>(j)], all[pick]);
      out.push_back(all[static_cast<size_t>(j)]);
    }
  }
  return out;
}

TEST(MoeDispatch, RowsGroupByExpertInTokenOrder) {
  // 4 tokens, 2 choices each, 3 experts: (0,2) (1,0) (2,0) (0,1).
  const Tensor experts = ids({0, 2, 1, 0, 2, 0, 0, 1}, {4, 2});
  Tensor row_of = Tensor::empty({4, 2}, DType::i32), counts = Tensor::empty({3}, DType::i32);
  moe_dispatch_index(experts, row_of, counts);
  EXPECT_EQ(ints(counts), (std::vector<int32_t>{4, 2, 2}));
  // Expert 0 gets rows 0-3 for choices (0,0) (1,1) (2,1) (3,0); expert 1 rows 4-5: (1,0) (3,1); expert 2: (0,1) (2,0).
  EXPECT_EQ(ints(row_of), (std::vector<int32_t>{0, 6, 4, 1, 7, 2, 3, 5}));
}

TEST(MoeDispatch, PermuteAndUnpermuteAgainstDirectSums) {
  const int64_t N = 9, k = 3, C = 5;
  const int32_t E = 4;
  const Tensor experts = ids(choices(N, k, E, 11), {N, k});
  Tensor row_of = Tensor::empty({N, k}, DType::i32), counts = Tensor::empty({E}, DType::i32);
  moe_dispatch_index(experts, row_of, counts);
  const std::vector<int32_t> rows = ints(row_of);
  std::vector<int32_t> sorted = rows;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < N * k; ++i) EXPECT_EQ(sorted[static_cast<size_t>(i)], i) << "every row used once";

  const Vec xv = rand_vec(N * C, 1), pv = rand_vec(N * k, 2, 0.1, 1.0), yv = rand_vec(N * k * C, 3);
  const Tensor x = make(xv, {N, C}), probs = make(pv, {N, k}), y = make(yv, {N * k, C});
  Tensor xp = Tensor::empty({N * k, C}, DType::f32), out = Tensor::empty({N, C}, DType::f32);
  moe_permute(x, row_of, &probs, xp);
  moe_unpermute(y, row_of, &probs, out);
  const Vec got_p = values(xp), got_u = values(out);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) {
      double sum = 0;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t r = rows[static_cast<size_t>(n * k + j)];
        EXPECT_NEAR(got_p[static_cast<size_t>(r * C + c)], pv[n * k + j] * xv[n * C + c], 1e-6);
        sum += pv[n * k + j] * yv[r * C + c];
      }
      EXPECT_NEAR(got_u[static_cast<size_t>(n * C + c)], sum, 1e-6);
    }
  // Without weights: copies and plain sums.
  moe_permute(x, row_of, nullptr, xp);
  const Vec copies = values(xp);
  for (int64_t i = 0; i < N * k; ++i)
    for (int64_t c = 0; c < C; ++c)
      EXPECT_EQ(copies[static_cast<size_t>(rows[static_cast<size_t>(i)] * C + c)],
                static_cast<float>(xv[(i / k) * C + c]));
}

TEST(MoeDispatch, PermuteIsTheAdjointOfUnpermuteAndTheProbsGradientIsExact) {
  const int64_t N = 6, k = 2, C = 4;
  const int32_t E = 5;
  const Tensor experts = ids(choices(N, k, E, 5), {N, k});
  Tensor row_of = Tensor::empty({N, k}, DType::i32), counts = Tensor::empty({E}, DType::i32);
  moe_dispatch_index(experts, row_of, counts);
  const Vec pv = rand_vec(N * k, 7, 0.1, 1.0), yv = rand_vec(N * k * C, 8), dv = rand_vec(N * C, 9);
  const Tensor probs = make(pv, {N, k}), y = make(yv, {N * k, C}), dout = make(dv, {N, C});
  // <unpermute(y), dout> == <y, permute(dout)>: the gradient of y is moe_permute(dout, row_of, probs).
  Tensor u = Tensor::empty({N, C}, DType::f32), g = Tensor::empty({N * k, C}, DType::f32);
  moe_unpermute(y, row_of, &probs, u);
  moe_permute(dout, row_of, &probs, g);
  double lhs = 0, rhs = 0;
  const Vec uv = values(u), gv = values(g);
  for (size_t i = 0; i < uv.size(); ++i) lhs += uv[i] * dv[i];
  for (size_t i = 0; i < gv.size(); ++i) rhs += yv[i] * gv[i];
  EXPECT_NEAR(lhs, rhs, 1e-5 * std::max(1.0, std::abs(lhs)));
  // dprobs against central differences of <unpermute(y; probs), dout>.
  Tensor dprobs = Tensor::empty({N, k}, DType::f32);
  moe_unpermute_backward_probs(dout, y, row_of, dprobs);
  const Vec fd = fd_grad(
      [&](const Vec& p) {
        Tensor o = Tensor::empty({N, C}, DType::f32);
        const Tensor pt = make(p, {N, k});
        moe_unpermute(y, row_of, &pt, o);
        return values(o);
      },
      pv, dv, 1e-3);
  EXPECT_LT(max_rel_err(values(dprobs), fd), 1e-3);
}

TEST(MoeDispatch, DroppedChoicesAreSkipped) {
  const Tensor row_of = ids({1, -1, -1, 0}, {2, 2});  // token 0 keeps choice 0 (row 1), token 1 choice 1 (row 0)
  const Tensor x = make({1, 2, 3, 4}, {2, 2}), probs = make({0.5, 0.25, 0.75, 2.0}, {2, 2});
  Tensor xp = make({9, 9, 9, 9}, {2, 2});
  moe_permute(x, row_of, &probs, xp);
  EXPECT_EQ(values(xp), (Vec{6, 8, 0.5, 1}));  // row 0 = 2 * x[1], row 1 = 0.5 * x[0]
  Tensor out = Tensor::empty({2, 2}, DType::f32);
  moe_unpermute(xp, row_of, &probs, out);
  EXPECT_EQ(values(out), (Vec{0.25, 0.5, 12, 16}));
  Tensor dprobs = make({7, 7, 7, 7}, {2, 2});
  moe_unpermute_backward_probs(x, xp, row_of, dprobs);
  EXPECT_EQ(values(dprobs), (Vec{1 * 0.5 + 2 * 1, 0, 0, 3 * 6 + 4 * 8}));
}

TEST(MoeDispatch, BadArgumentsNameTheOpAndTheArgument) {
  Tensor row_of = Tensor::empty({2, 2}, DType::i32), counts = Tensor::empty({3}, DType::i32);
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] {
              moe_dispatch_index(ids({0, 3, 1, 2}, {2, 2}), row_of, counts);
            }).find("moe_dispatch_index: experts holds expert 3 at choice 1, outside [0, 3)"),
            std::string::npos);
  EXPECT_NE(message([&] {
              moe_dispatch_index(ids({0, 1}, {1, 2}), row_of, counts);
            }).find("moe_dispatch_index: row_of"),
            std::string::npos);
  const Tensor x = make({1, 2, 3, 4}, {2, 2});
  Tensor out = Tensor::empty({4, 2}, DType::f32);
  const Tensor bf = Tensor::empty({4, 2}, DType::bf16);
  Tensor bad_out = bf;
  EXPECT_NE(message([&] { moe_permute(x, row_of, nullptr, bad_out); }).find("moe_permute: out: expected fp32 rows"),
            std::string::npos);
  const Tensor short_rows = ids({0, 1}, {1, 2});
  EXPECT_NE(message([&] { moe_permute(x, short_rows, nullptr, out); }).find("moe_permute: row_of: expected 2 rows"),
            std::string::npos);
  const Tensor probs_bf = Tensor::empty({2, 2}, DType::bf16);
  EXPECT_NE(message([&] {
              moe_permute(x, ids({0, 1, 2, 3}, {2, 2}), &probs_bf, out);
            }).find("moe_permute: probs"),
            std::string::npos);
  EXPECT_NE(message([&] {
              moe_permute(x, ids({0, 1, 2, 9}, {2, 2}), nullptr, out);
            }).find("moe_permute: row_of holds row 9, outside [-1, 4)"),
            std::string::npos);
  Tensor u = Tensor::empty({2, 2}, DType::f32);
  EXPECT_NE(message([&] {
              moe_unpermute(bf, ids({0, 1, 2, 3}, {2, 2}), nullptr, u);
            }).find("moe_unpermute: out"),
            std::string::npos);
  Tensor dprobs = Tensor::empty({2, 2}, DType::f32);
  EXPECT_NE(message([&] {
              moe_unpermute_backward_probs(x, bf, ids({0, 1, 2, 3}, {2, 2}), dprobs);
            }).find("moe_unpermute_backward_probs: y"),
            std::string::npos);
}

// ---- token dropping (a capacity) ----

struct Dispatch {
  std::vector<int32_t> rows, counts;
};

Dispatch dispatch(const Tensor& experts, int32_t E, const MoeCapacityOptions& cap) {
  Tensor row_of = Tensor::empty(experts.shape(), DType::i32), counts = Tensor::empty({E}, DType::i32);
  moe_dispatch_index(experts, row_of, counts, cap);
  return {ints(row_of), ints(counts)};
}

TEST(MoeDispatchCapacity, CapacityZeroIsTheDroplessOp) {
  const int64_t N = 40, k = 3;
  const int32_t E = 6;
  const Tensor experts = ids(choices(N, k, E, 21), {N, k});
  const Tensor probs = make(rand_vec(N * k, 4, 0.0, 1.0), {N, k});
  Tensor row_of = Tensor::empty({N, k}, DType::i32), counts = Tensor::empty({E}, DType::i32);
  moe_dispatch_index(experts, row_of, counts);
  const Dispatch position = dispatch(experts, E, {}), weighted = dispatch(experts, E, {.capacity = 0, .probs = &probs});
  EXPECT_EQ(position.rows, ints(row_of));
  EXPECT_EQ(position.counts, ints(counts));
  EXPECT_EQ(weighted.rows, ints(row_of));
  EXPECT_EQ(weighted.counts, ints(counts));
}

TEST(MoeDispatchCapacity, PositionPolicyKeepsEachExpertsFirstChoices) {
  // 4 tokens, 2 choices, 3 experts: (0,2) (1,0) (2,0) (0,1). Expert 0's choices in (n, j) order: (0,0) (1,1) (2,1)
  // (3,0); expert 1: (1,0) (3,1); expert 2: (0,1) (2,0).
  const Tensor experts = ids({0, 2, 1, 0, 2, 0, 0, 1}, {4, 2});
  const Dispatch two = dispatch(experts, 3, {.capacity = 2});
  EXPECT_EQ(two.counts, (std::vector<int32_t>{2, 2, 2}));
  // Expert 0 keeps (0,0) (1,1) as rows 0-1 and drops (2,1) (3,0); expert 1 rows 2-3, expert 2 rows 4-5.
  EXPECT_EQ(two.rows, (std::vector<int32_t>{0, 4, 2, 1, 5, -1, -1, 3}));
  const Dispatch one = dispatch(experts, 3, {.capacity = 1});
  EXPECT_EQ(one.counts, (std::vector<int32_t>{1, 1, 1}));
  EXPECT_EQ(one.rows, (std::vector<int32_t>{0, 2, 1, -1, -1, -1, -1, -1}));
  // A capacity no expert reaches keeps everything: the dropless rows.
  const Dispatch all = dispatch(experts, 3, {.capacity = 4});
  EXPECT_EQ(all.counts, (std::vector<int32_t>{4, 2, 2}));
  EXPECT_EQ(all.rows, (std::vector<int32_t>{0, 6, 4, 1, 7, 2, 3, 5}));
}

TEST(MoeDispatchCapacity, ProbsPolicyKeepsTheHeaviestInTokenOrderAndTiesKeepTheFirst) {
  const Tensor experts = ids({0, 2, 1, 0, 2, 0, 0, 1}, {4, 2});
  // Expert 0's weights: (0,0) 0.1, (1,1) 0.4, (2,1) 0.3, (3,0) 0.9; expert 1: (1,0) 0.5, (3,1) 0.5 (a tie);
  // expert 2: (0,1) 0.2, (2,0) 0.7.
  const Tensor probs = make({0.1, 0.2, 0.5, 0.4, 0.7, 0.3, 0.9, 0.5}, {4, 2});
  const Dispatch two = dispatch(experts, 3, {.capacity = 2, .probs = &probs});
  EXPECT_EQ(two.counts, (std::vector<int32_t>{2, 2, 2}));
  // Expert 0 keeps (1,1) and (3,0), in token order rows 0 and 1 (not weight order); the rest as position's.
  EXPECT_EQ(two.rows, (std::vector<int32_t>{-1, 4, 2, 0, 5, -1, 1, 3}));
  const Dispatch one = dispatch(experts, 3, {.capacity = 1, .probs = &probs});
  EXPECT_EQ(one.counts, (std::vector<int32_t>{1, 1, 1}));
  // Expert 0 keeps (3,0); expert 1's tie keeps the lower (1,0); expert 2 keeps (2,0).
  EXPECT_EQ(one.rows, (std::vector<int32_t>{-1, -1, 1, -1, 2, -1, 0, -1}));
  // All weights equal: the probs policy is the position policy.
  const Tensor flat = make(Vec(8, 0.25), {4, 2});
  EXPECT_EQ(dispatch(experts, 3, {.capacity = 1, .probs = &flat}).rows, dispatch(experts, 3, {.capacity = 1}).rows);
  // -0 ties with 0: expert 1's choices (1,0) and (3,1) keep the first whichever of the two zeros it holds.
  for (const double first : {0.0, -0.0}) {
    const Tensor zeros = make({1, 1, first, 1, 1, 1, 1, -first}, {4, 2});
    const Dispatch z = dispatch(experts, 3, {.capacity = 1, .probs = &zeros});
    EXPECT_EQ(z.rows[2], 1) << "(1,0) holds " << first;
    EXPECT_EQ(z.rows[7], -1);
  }
  // A NaN ranks below every number, -inf included.
  const Tensor nan = make({std::nan(""), 1, -INFINITY, 1, 1, -INFINITY, 1, 1}, {4, 2});
  const Dispatch n1 = dispatch(experts, 3, {.capacity = 2, .probs = &nan});
  // Expert 0: (0,0) NaN, (1,1) 1, (2,1) -inf, (3,0) 1: keeps (1,1) and (3,0). Expert 1: (1,0) -inf, (3,1) 1: both.
  EXPECT_EQ(n1.rows, (std::vector<int32_t>{-1, 4, 2, 0, 5, -1, 1, 3}));
}

TEST(MoeDispatchCapacity, KeptRowsAreConsistentOnRandomChoices) {
  for (const int64_t capacity : {1, 2, 5, 9, 1000}) {
    for (const bool weighted : {false, true}) {
      const int64_t N = 57, k = 3;
      const int32_t E = 7;
      const Tensor experts = ids(choices(N, k, E, 3), {N, k});
      const Vec pv = rand_vec(N * k, 6, 0.0, 1.0);
      const Tensor probs = make(pv, {N, k});
      const Dispatch d = dispatch(experts, E, {.capacity = capacity, .probs = weighted ? &probs : nullptr});
      const std::vector<int32_t> e = ints(experts);
      const int64_t kept = std::count_if(d.rows.begin(), d.rows.end(), [](int32_t r) { return r >= 0; });
      EXPECT_EQ(std::accumulate(d.counts.begin(), d.counts.end(), int64_t{0}), kept);
      // Each expert keeps min(its choices, capacity), its rows contiguous after the earlier experts', in (n, j) order,
      // and with the probs policy every kept weight is at least every dropped one of that expert.
      int32_t next = 0;
      for (int32_t x = 0; x < E; ++x) {
        const int64_t all = std::count(e.begin(), e.end(), x);
        EXPECT_EQ(d.counts[static_cast<size_t>(x)], std::min(all, capacity));
        double lightest_kept = 2, heaviest_dropped = -1;
        int64_t seen = 0;
        for (size_t i = 0; i < e.size(); ++i) {
          if (e[i] != x) continue;
          const bool keep = d.rows[i] >= 0;
          if (keep) {
            EXPECT_EQ(d.rows[i], next++);
          }
          if (!weighted) {
            EXPECT_EQ(keep, seen < capacity);
          }
          if (keep) lightest_kept = std::min(lightest_kept, pv[i]);
          if (!keep) heaviest_dropped = std::max(heaviest_dropped, pv[i]);
          ++seen;
        }
        if (weighted) {
          EXPECT_GE(lightest_kept, heaviest_dropped) << "expert " << x << " capacity " << capacity;
        }
      }
    }
  }
}

TEST(MoeDispatchCapacity, DroppedChoicesAddNothing) {
  const int64_t N = 12, k = 2, C = 3;
  const int32_t E = 3;
  const Tensor experts = ids(choices(N, k, E, 9), {N, k});
  const Vec pv = rand_vec(N * k, 2, 0.1, 1.0), xv = rand_vec(N * C, 5);
  const Tensor probs = make(pv, {N, k}), x = make(xv, {N, C});
  const Dispatch d = dispatch(experts, E, {.capacity = 3, .probs = &probs});
  const int64_t R = std::accumulate(d.counts.begin(), d.counts.end(), int64_t{0});
  ASSERT_EQ(R, 9);
  const Tensor row_of = ids(d.rows, {N, k});
  Tensor xp = Tensor::empty({R, C}, DType::f32), out = Tensor::empty({N, C}, DType::f32);
  moe_permute(x, row_of, &probs, xp);
  moe_unpermute(xp, row_of, &probs, out);  // sum over kept j of w^2 x
  const Vec got = values(out);
  for (int64_t n = 0; n < N; ++n) {
    double w2 = 0;
    for (int64_t j = 0; j < k; ++j)
      if (d.rows[static_cast<size_t>(n * k + j)] >= 0) w2 += pv[n * k + j] * pv[n * k + j];
    for (int64_t c = 0; c < C; ++c) EXPECT_NEAR(got[static_cast<size_t>(n * C + c)], w2 * xv[n * C + c], 1e-6);
  }
  Tensor dprobs = Tensor::empty({N, k}, DType::f32);
  moe_unpermute_backward_probs(x, xp, row_of, dprobs);
  const Vec dp = values(dprobs);
  for (size_t i = 0; i < d.rows.size(); ++i)
    if (d.rows[i] < 0) {
      EXPECT_EQ(dp[i], 0.0) << "dropped choice " << i;
    }
}

TEST(MoeDispatchCapacity, BadArgumentsNameTheOpAndTheArgument) {
  const Tensor experts = ids({0, 1, 1, 0}, {2, 2});
  Tensor row_of = Tensor::empty({2, 2}, DType::i32), counts = Tensor::empty({2}, DType::i32);
  auto message = [&](const MoeCapacityOptions& cap) {
    try {
      moe_dispatch_index(experts, row_of, counts, cap);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({.capacity = -1}).find("moe_dispatch_index: capacity"), std::string::npos)
      << message({.capacity = -1});
  const Tensor short_probs = make({0.5, 0.5}, {1, 2});
  EXPECT_NE(message({.capacity = 1, .probs = &short_probs}).find("moe_dispatch_index: probs"), std::string::npos)
      << message({.capacity = 1, .probs = &short_probs});
  const Tensor bf_probs = Tensor::empty({2, 2}, DType::bf16);
  EXPECT_NE(message({.capacity = 1, .probs = &bf_probs}).find("moe_dispatch_index: probs"), std::string::npos);
}

TEST(MoeDispatchCapacity, EveryChoiceOfAnOverfullExpertPastTheCapacityIsDropped) {
  // 6 tokens all choosing expert 1 (k = 1), none expert 0 or 2: capacity 1 drops all but one, by either policy.
  const Tensor experts = ids({1, 1, 1, 1, 1, 1}, {6, 1});
  const Tensor probs = make({0.1, 0.2, 0.6, 0.3, 0.6, 0.0}, {6, 1});
  const Dispatch position = dispatch(experts, 3, {.capacity = 1});
  EXPECT_EQ(position.counts, (std::vector<int32_t>{0, 1, 0}));
  EXPECT_EQ(position.rows, (std::vector<int32_t>{0, -1, -1, -1, -1, -1}));
  const Dispatch weighted = dispatch(experts, 3, {.capacity = 1, .probs = &probs});
  EXPECT_EQ(weighted.counts, (std::vector<int32_t>{0, 1, 0}));
  EXPECT_EQ(weighted.rows, (std::vector<int32_t>{-1, -1, 0, -1, -1, -1}));  // 0.6 twice: the first
  // No choices at all: nothing kept, nothing counted.
  Tensor none_rows = Tensor::empty({0, 2}, DType::i32), none_counts = ids({5, 5}, {2});
  moe_dispatch_index(ids({}, {0, 2}), none_rows, none_counts, {.capacity = 1});
  EXPECT_EQ(ints(none_counts), (std::vector<int32_t>{0, 0}));
}

// Context parallelism: the tokens arrive in another order (each rank's chunks) and each rank dispatches its part.
// Deciding over every token in their one-rank order, each part keeps exactly the one-rank dispatch's choices of its
// tokens, numbered as a dispatch of the part alone; ties (few weight levels, or the position policy) go by the order.
TEST(MoeDispatchCapacity, APartKeepsWhatTheWholeKeepsInTheGivenOrder) {
  const int64_t N = 48, k = 2, parts = 3, P = N / parts;
  const int32_t E = 4;
  // order: a fixed permutation (token g sits at one-rank place order[g]).
  std::vector<int32_t> order(static_cast<size_t>(N));
  for (int64_t g = 0; g < N; ++g) order[static_cast<size_t>(g)] = static_cast<int32_t>((g * 7 + 5) % N);
  const std::vector<int32_t> e = choices(N, k, E, 9);
  const Vec w = rand_vec(N * k, 11, 0.0, 1.0);
  for (const bool weighted : {false, true}) {
    for (const int levels : {0, 2}) {
      Vec wl = w;
      if (levels > 0)
        for (double& v : wl) v = std::floor(v * levels) / levels;
      // The one-rank tensors: token g's choices at row order[g].
      std::vector<int32_t> one_e(e.size());
      Vec one_w(wl.size());
      for (int64_t g = 0; g < N; ++g)
        for (int64_t j = 0; j < k; ++j) {
          one_e[static_cast<size_t>(order[static_cast<size_t>(g)] * k + j)] = e[static_cast<size_t>(g * k + j)];
          one_w[static_cast<size_t>(order[static_cast<size_t>(g)] * k + j)] = wl[static_cast<size_t>(g * k + j)];
        }
      const Tensor one_probs = make(one_w, {N, k}), probs = make(wl, {N, k}), ord = ids(order, {N});
      for (const int64_t capacity : {int64_t{3}, int64_t{12}, int64_t{40}}) {
        const std::string what = (weighted ? "probs" : "position") + std::string(" levels ") + std::to_string(levels) +
                                 " capacity " + std::to_string(capacity);
        const Dispatch one =
            dispatch(ids(one_e, {N, k}), E, {.capacity = capacity, .probs = weighted ? &one_probs : nullptr});
        std::vector<int32_t> summed(static_cast<size_t>(E), 0);
        for (int64_t part = 0; part < parts; ++part) {
          Tensor row_of = Tensor::empty({P, k}, DType::i32), counts = Tensor::empty({E}, DType::i32);
          moe_dispatch_index(
              ids(e, {N, k}), row_of, counts,
              {.capacity = capacity, .probs = weighted ? &probs : nullptr, .order = &ord, .part_begin = part * P});
          // Expected: the one-rank verdict of each of the part's choices, numbered expert-major in (n, j) order.
          std::vector<int32_t> want(static_cast<size_t>(P * k), -1), want_counts(static_cast<size_t>(E), 0);
          int32_t row = 0;
          for (int32_t x = 0; x < E; ++x)
            for (int64_t i = 0; i < P * k; ++i) {
              const int64_t g = part * P + i / k, at = order[static_cast<size_t>(g)] * k + i % k;
              if (e[static_cast<size_t>(part * P * k + i)] != x || one.rows[static_cast<size_t>(at)] < 0) continue;
              want[static_cast<size_t>(i)] = row++;
              ++want_counts[static_cast<size_t>(x)];
            }
          EXPECT_EQ(ints(row_of), want) << what << " part " << part;
          EXPECT_EQ(ints(counts), want_counts) << what << " part " << part;
          for (int32_t x = 0; x < E; ++x) summed[static_cast<size_t>(x)] += ints(counts)[static_cast<size_t>(x)];
        }
        EXPECT_EQ(summed, one.counts) << what;
      }
    }
  }
}

TEST(MoeDispatchCapacity, APartOrAnOrderOfTheWrongShapeIsAnError) {
  const Tensor experts = ids({0, 1, 1, 0, 0, 1}, {3, 2});
  Tensor counts = Tensor::empty({2}, DType::i32);
  auto message = [&](Tensor row_of, const MoeCapacityOptions& cap) {
    try {
      moe_dispatch_index(experts, row_of, counts, cap);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(
      message(Tensor::empty({2, 2}, DType::i32), {.capacity = 1, .part_begin = 2})
          .find("moe_dispatch_index: row_of: expected the choices of tokens [2, 2 + P) of experts [3, 2], got [2, 2]"),
      std::string::npos);
  const Tensor short_order = ids({0, 1}, {2}), repeated = ids({0, 1, 1}, {3});
  EXPECT_NE(message(Tensor::empty({1, 2}, DType::i32), {.capacity = 1, .order = &short_order})
                .find("moe_dispatch_index: order"),
            std::string::npos);
  EXPECT_NE(message(Tensor::empty({1, 2}, DType::i32), {.capacity = 1, .order = &repeated})
                .find("moe_dispatch_index: order is not a permutation of [0, 3): token 2 holds 1"),
            std::string::npos);
}

}  // namespace
}  // namespace mt
