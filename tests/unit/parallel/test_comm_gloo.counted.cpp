// test_comm_gloo.counted.cpp: the byte counters of parallel/comm/comm_counted.h over Gloo, with threads as ranks (one
// process: the three ranks' bytes add up in one counter): each op counts what a bandwidth-optimal algorithm sends
// from a rank, and the wrapped communicator still computes what the inner one does.
#include <gtest/gtest.h>

#include <vector>

#include "parallel/comm/comm_counted.h"
#include "parallel/comm/thread_ranks.h"

namespace mt {
namespace {

int64_t moved(const std::string& kind, CommOp op) {
  const CommBytes all = comm_bytes_moved();
  auto it = all.find(kind);
  return it == all.end() ? 0 : it->second[static_cast<size_t>(op)];
}

TEST(CountedCommunicator, CountsWhatEachRankSendsPerOp) {
  constexpr int kRanks = 3;
  const std::string kind = "counted-test";
  auto store = make_hash_store();
  std::vector<std::vector<float>> sums(kRanks);
  run_ranks(kRanks, [&](int r) {
    auto comm = make_counted_communicator(join_gloo(store, "counted", first_ranks(kRanks), r), kind);
    Tensor t = Tensor::from_floats(std::vector<float>(12, static_cast<float>(r + 1)), {12});  // 48 bytes
    comm->all_reduce(t, ReduceOp::sum)->wait();
    sums[static_cast<size_t>(r)] = t.to_floats();
    Tensor block = Tensor::zeros({4}, DType::f32, Device::cpu);
    comm->reduce_scatter(t, block)->wait();
    comm->all_gather(block, t)->wait();
    Tensor d = Tensor::zeros({3}, DType::f64, Device::cpu);  // 24 bytes of doubles: apart, as scalars
    comm->all_reduce(d, ReduceOp::sum)->wait();
    auto alone = make_counted_communicator(make_self_communicator("self"), kind);  // a group of one moves nothing
    alone->all_reduce(t, ReduceOp::sum)->wait();
  });
  for (const auto& s : sums) EXPECT_EQ(s, std::vector<float>(12, 6.0f));
  // Per rank: all-reduce 2 (n - 1) / n of 48 bytes = 64; reduce-scatter and all-gather (n - 1) / n of 48 = 32;
  // the doubles 2 (n - 1) / n of 24 = 32.
  EXPECT_EQ(moved(kind, CommOp::all_reduce), kRanks * 64);
  EXPECT_EQ(moved(kind, CommOp::reduce_scatter), kRanks * 32);
  EXPECT_EQ(moved(kind, CommOp::all_gather), kRanks * 32);
  EXPECT_EQ(moved(kind, CommOp::scalars), kRanks * 32);
  EXPECT_EQ(moved(kind, CommOp::other), 0);
  EXPECT_EQ(name_of(CommOp::reduce_scatter), "reduce_scatter");
}

}  // namespace
}  // namespace mt
