// test_comm_gloo.cpp: the Gloo communicator with threads as ranks (each thread its own communicator, one
// shared store: in-process, or a TCP store with a client per rank), checked against serial references.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "parallel/comm/communicator.h"
#include "parallel/comm/thread_ranks.h"

namespace mt {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A Gloo communicator with this file's default timeout (10 s: the tests that wait for a timeout set their own).
// Threads share a host, so small collectives go through shared memory unless `shared_memory` is false.
std::unique_ptr<Communicator> join(std::shared_ptr<Store> store, const std::string& name, std::vector<int> members,
                                   int global_rank, Millis timeout = 10s, bool shared_memory = true) {
  return join_gloo(std::move(store), name, std::move(members), global_rank, timeout, shared_memory);
}

// Values that differ per rank and element; sums of a few of them are exact in fp32.
std::vector<float> rank_values(int rank, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>((i * 37 + rank * 11) % 301) + 0.25f * rank - 100.f;
  return v;
}

// The values rank r holds once stored in dtype t.
std::vector<float> stored(int rank, int64_t n, DType t) {
  return Tensor::from_floats(rank_values(rank, n), {n}, t).to_floats();
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

TEST(CommGloo, AllReduceSumAndMaxMatchSerialReferenceForWorldSizes1To4) {
  for (int world : {1, 2, 3, 4}) {
    auto store = make_hash_store();
    run_ranks(world, [&](int r) {
      auto comm = join(store, "world", first_ranks(world), r);
      EXPECT_EQ(comm->rank(), r);
      EXPECT_EQ(comm->size(), world);
      // 300000 floats spans several of Gloo's 1 MiB segments.
      for (int64_t n : {int64_t{1}, int64_t{1001}, int64_t{300000}})
        for (DType t : {DType::f32, DType::bf16, DType::f16})
          for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
            if (n == 300000 && t != DType::f32) continue;
            Tensor x = Tensor::from_floats(rank_values(r, n), {n}, t);
            comm->all_reduce(x, op)->wait();
            std::vector<float> got = x.to_floats();
            std::vector<std::vector<float>> inputs;
            for (int q = 0; q < world; ++q) inputs.push_back(stored(q, n, t));
            for (int64_t i = 0; i < n; ++i) {
              float ref = inputs[0][i];  // fp32 reduction, rounded once to the storage dtype
              for (int q = 1; q < world; ++q)
                ref = op == ReduceOp::sum ? ref + inputs[q][i] : std::max(ref, inputs[q][i]);
              ASSERT_EQ(got[i], round_to(t, ref))
                  << "world " << world << " " << dtype_name(t) << " element " << i << " rank " << r;
            }
          }
    });
  }
}

TEST(CommGloo, AllReduceBf16RoundsTheFp32SumOnce) {
  // 1 + 3 * 2^-8 = 1.01171875 lies halfway between the bf16 values 1.0078125 and 1.015625 and rounds to the
  // even 1.015625; adding in bf16 from rank 0 on would round 1 + 2^-8 back to 1 at every step.
  auto store = make_hash_store();
  run_ranks(4, [&](int r) {
    auto comm = join(store, "world", first_ranks(4), r);
    float v = r == 0 ? 1.f : 1.f / 256.f;  // bf16-exact inputs
    Tensor x = Tensor::from_floats(std::vector<float>{v, -v}, {2}, DType::bf16);
    comm->all_reduce(x, ReduceOp::sum)->wait();
    EXPECT_EQ(x.to_floats(), (std::vector<float>{1.015625f, -1.015625f}));
  });
}

TEST(CommGloo, ReduceScatterMatchesSerialReference) {
  for (int world : {2, 3, 4}) {
    auto store = make_hash_store();
    const int64_t m = 257;  // elements per block
    run_ranks(world, [&](int r) {
      auto comm = join(store, "dp", first_ranks(world), r);
      for (DType t : {DType::f32, DType::bf16}) {
        Tensor in = Tensor::from_floats(rank_values(r, world * m), {world * m}, t);
        Tensor out = Tensor::zeros({m}, t);
        comm->reduce_scatter(in, out)->wait();
        std::vector<float> got = out.to_floats();
        for (int64_t i = 0; i < m; ++i) {
          float ref = 0.f;
          for (int q = 0; q < world; ++q) ref += stored(q, world * m, t)[r * m + i];
          ASSERT_EQ(got[i], round_to(t, ref)) << "world " << world << " " << dtype_name(t) << " rank " << r;
        }
        EXPECT_EQ(in.to_floats(), stored(r, world * m, t)) << "the input must be left untouched";
      }
    });
  }
}

// Each element is summed in rank order, ((x_0 + x_1) + x_2) + x_3, whatever block it falls in, so cutting a
// buffer into blocks differently (per gradient bucket) cannot change a sum. Values whose sums round, so that
// another order would show; the output may be the input's own block (in place, as the gradient buffer does).
TEST(CommGloo, ReduceScatterSumsEveryElementInRankOrder) {
  for (int world : {2, 3, 4}) {
    auto store = make_hash_store();
    const int64_t m = 101;
    auto value = [](int rank, int64_t i) {
      return static_cast<float>(std::sin(0.37 * static_cast<double>(i) + rank) * std::pow(10.0, (i + rank) % 7 - 3));
    };
    run_ranks(world, [&](int r) {
      auto comm = join(store, "dp", first_ranks(world), r);
      Tensor in = Tensor::empty({world * m}, DType::f32);
      for (int64_t i = 0; i < world * m; ++i) in.data<float>()[i] = value(r, i);
      Tensor out = in.slice(r * m, (r + 1) * m);
      comm->reduce_scatter(in, out)->wait();
      for (int64_t i = 0; i < m; ++i) {
        float ref = value(0, r * m + i);
        for (int q = 1; q < world; ++q) ref += value(q, r * m + i);
        ASSERT_EQ(out.data<float>()[i], ref) << "world " << world << " rank " << r << " element " << i;
      }
    });
  }
}

// Small all-reduces exchange whole buffers in one round and sum them in rank order (comm_gloo.cpp
// direct_all_reduce): on every rank exactly ((x_0 + x_1) + x_2) + ..., whose rounding a ring's order would change.
TEST(CommGloo, SmallAllReduceSumsInRankOrderOnEveryRank) {
  for (int world : {2, 3, 4}) {
    auto store = make_hash_store();
    const int64_t n = 4096;  // 16 KiB: the one-round path
    auto value = [](int rank, int64_t i) {
      return static_cast<float>(std::sin(0.37 * static_cast<double>(i) + rank) * std::pow(10.0, (i + rank) % 7 - 3));
    };
    run_ranks(world, [&](int r) {
      auto comm = join(store, "tp", first_ranks(world), r);
      Tensor x = Tensor::empty({n}, DType::f32);
      for (int64_t i = 0; i < n; ++i) x.data<float>()[i] = value(r, i);
      comm->all_reduce(x, ReduceOp::sum)->wait();
      for (int64_t i = 0; i < n; ++i) {
        float ref = value(0, i);
        for (int q = 1; q < world; ++q) ref += value(q, i);
        ASSERT_EQ(x.data<float>()[i], ref) << "world " << world << " rank " << r << " element " << i;
      }
    });
  }
}

TEST(CommGloo, AllGatherConcatenatesBlocksInRankOrder) {
  for (int world : {2, 4}) {
    auto store = make_hash_store();
    run_ranks(world, [&](int r) {
      auto comm = join(store, "sp", first_ranks(world), r);
      // 131: one round of whole blocks; 20000 (80 KB a block): Gloo's ring.
      for (int64_t n : {int64_t{131}, int64_t{20000}})
        for (DType t : {DType::f32, DType::bf16}) {
          Tensor in = Tensor::from_floats(rank_values(r, n), {n}, t);
          Tensor out = Tensor::zeros({world, n}, t);
          comm->all_gather(in, out)->wait();
          std::vector<float> got = out.to_floats();
          for (int q = 0; q < world; ++q) {
            std::vector<float> block(got.begin() + q * n, got.begin() + (q + 1) * n);
            ASSERT_EQ(block, stored(q, n, t)) << "block " << q << " world " << world << " rank " << r;
          }
        }
    });
  }
}

TEST(CommGloo, BroadcastFromNonZeroRoot) {
  auto store = make_hash_store();
  run_ranks(4, [&](int r) {
    auto comm = join(store, "pp", first_ranks(4), r);
    Tensor x = Tensor::from_floats(rank_values(r, 500), {500}, DType::bf16);
    comm->broadcast(x, 2)->wait();
    EXPECT_EQ(x.to_floats(), stored(2, 500, DType::bf16));
    Tensor ids = Tensor::from_ints(std::vector<int32_t>{r, r + 10}, {2});
    comm->broadcast(ids, 3)->wait();
    EXPECT_EQ(ids.data<int32_t>()[0], 3);
    EXPECT_EQ(ids.data<int32_t>()[1], 13);
  });
}

TEST(CommGloo, SendRecvRingPostedBeforeWaitDoesNotDeadlock) {
  // 8 MiB per message: far more than socket buffers hold, so a send only completes once the peer's recv is
  // posted; every rank posts send then recv and only then waits, as a pipeline stage does.
  const int world = 4;
  const int64_t n = 2 << 20;
  auto store = make_hash_store();
  run_ranks(world, [&](int r) {
    auto comm = join(store, "pp", first_ranks(world), r);
    Tensor out = Tensor::from_floats(rank_values(r, n), {n});
    Tensor in = Tensor::zeros({n}, DType::f32);
    auto send = comm->send(out, (r + 1) % world, 5);
    auto recv = comm->recv(in, (r + world - 1) % world, 5);
    send->wait();
    recv->wait();
    EXPECT_EQ(in.to_floats(), rank_values((r + world - 1) % world, n));
  });
}

TEST(CommGloo, SendRecvPairExchangeMatchesByTag) {
  auto store = make_hash_store();
  run_ranks(2, [&](int r) {
    auto comm = join(store, "pp", {0, 1}, r);
    int peer = 1 - r;
    Tensor a = Tensor::from_floats(std::vector<float>{10.f * r + 1, 10.f * r + 2}, {2}, DType::bf16);
    Tensor b = Tensor::from_floats(std::vector<float>{10.f * r + 3}, {1}, DType::bf16);
    Tensor got_a = Tensor::zeros({2}, DType::bf16), got_b = Tensor::zeros({1}, DType::bf16);
    // Both ranks send first; the receives are posted in the other tag order.
    auto sa = comm->send(a, peer, 1);
    auto sb = comm->send(b, peer, 2);
    auto rb = comm->recv(got_b, peer, 2);
    auto ra = comm->recv(got_a, peer, 1);
    rb->wait();
    ra->wait();
    sa->wait();
    sb->wait();
    EXPECT_EQ(got_a.to_floats(), (std::vector<float>{10.f * peer + 1, 10.f * peer + 2}));
    EXPECT_EQ(got_b.to_floats(), (std::vector<float>{10.f * peer + 3}));
  });
}

TEST(CommGloo, SeveralGroupsOfOneWorldRunConcurrently) {
  // World 4 as tp pairs {0,1},{2,3}, dp pairs {0,2},{1,3}, a second communicator of the same tp group (as
  // for overlapped traffic) and the world group, all through one store.
  auto store = make_hash_store();
  run_ranks(4, [&](int r) {
    std::vector<int> tp_members = r < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3};
    std::vector<int> dp_members = r % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3};
    std::string tp_name = r < 2 ? "tp[0,1]" : "tp[2,3]";
    std::string dp_name = r % 2 == 0 ? "dp[0,2]" : "dp[1,3]";
    auto tp = join(store, tp_name, tp_members, r);
    auto dp = join(store, dp_name, dp_members, r);
    auto tp2 = join(store, tp_name, tp_members, r);
    auto world = join(store, "world", first_ranks(4), r);
    EXPECT_EQ(tp->rank(), r % 2);
    EXPECT_EQ(dp->rank(), r / 2);
    for (int iter = 0; iter < 20; ++iter) {
      Tensor a = Tensor::from_floats(std::vector<float>{float(r + iter)}, {1});
      Tensor b = Tensor::from_floats(std::vector<float>{float(100 * r)}, {1});
      Tensor c = Tensor::from_floats(std::vector<float>{float(r)}, {1});
      tp->all_reduce(a, ReduceOp::sum)->wait();
      dp->all_reduce(b, ReduceOp::max)->wait();
      tp2->all_reduce(c, ReduceOp::max)->wait();
      EXPECT_EQ(a.item(), float(tp_members[0] + tp_members[1] + 2 * iter));
      EXPECT_EQ(b.item(), float(100 * dp_members[1]));
      EXPECT_EQ(c.item(), float(tp_members[1]));
    }
    world->barrier();
  });
}

TEST(CommGloo, RendezvousThroughTcpStoreWithAClientPerRank) {
  // The production path: rank 0 serves the store, every rank is a client of it under a run prefix.
  TcpStoreServer server("127.0.0.1", 0);
  run_ranks(3, [&](int r) {
    auto store = make_prefix_store("run", connect_tcp_store("127.0.0.1", server.port(), 5s));
    auto world = join(store, "world", first_ranks(3), r);
    auto pair = r < 2 ? join(store, "pp[0,1]", {0, 1}, r) : nullptr;
    Tensor x = Tensor::from_floats(std::vector<float>{float(r + 1)}, {1});
    world->all_reduce(x, ReduceOp::sum)->wait();
    EXPECT_EQ(x.item(), 6.f);
    if (pair) {
      Tensor out = Tensor::from_floats(std::vector<float>{float(10 + r)}, {1});
      Tensor in = Tensor::zeros({1}, DType::f32);
      auto s = pair->send(out, 1 - r, 0);
      auto q = pair->recv(in, 1 - r, 0);
      s->wait();
      q->wait();
      EXPECT_EQ(in.item(), float(11 - r));
    }
    world->barrier();
  });
}

TEST(CommGloo, BarrierWaitsForEveryRank) {
  auto store = make_hash_store();
  std::atomic<int> arrived{0};
  run_ranks(3, [&](int r) {
    auto comm = join(store, "world", first_ranks(3), r);
    std::this_thread::sleep_for(std::chrono::milliseconds(60 * r));
    arrived.fetch_add(1);
    comm->barrier();
    EXPECT_EQ(arrived.load(), 3) << "rank " << r << " left the barrier early";
  });
}

TEST(CommGloo, RecvFromSilentPeerTimesOutNamingGroupAndPeer) {
  auto store = make_hash_store();
  std::promise<void> finished;
  std::shared_future<void> rank0_done = finished.get_future().share();
  run_ranks(2, [&](int r) {
    auto comm = join(store, "tp[4,5]", {4, 5}, 4 + r, 500ms);
    if (r == 1) {  // stays connected but never sends
      rank0_done.wait();
      return;
    }
    Tensor x = Tensor::zeros({16}, DType::f32);
    auto t0 = Clock::now();
    try {
      comm->recv(x, 1, 0)->wait();
      ADD_FAILURE() << "recv from a silent peer returned";
    } catch (const CommError& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find("tp[4,5]"), std::string::npos) << msg;
      EXPECT_NE(msg.find("recv from rank 1 (global 5)"), std::string::npos) << msg;
      EXPECT_NE(msg.find("timed out after 0.5 s on rank 0 (global 4)"), std::string::npos) << msg;
    }
    EXPECT_LT(seconds_since(t0), 2.0);
    // The communicator is broken now (Gloo closes its pairs on a timeout): later ops fail, never hang.
    auto t1 = Clock::now();
    Tensor y = Tensor::zeros({4}, DType::f32);
    try {
      comm->all_reduce(y, ReduceOp::sum)->wait();
      ADD_FAILURE() << "all_reduce on a broken communicator returned";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("unusable after an earlier failure: tp[4,5]: recv from rank 1"),
                std::string::npos)
          << e.what();
    }
    EXPECT_LT(seconds_since(t1), 1.0);
    finished.set_value();
  });
}

TEST(CommGloo, PeerThatExitsFailsPendingRecvAtOnce) {
  auto store = make_hash_store();
  run_ranks(2, [&](int r) {
    auto comm = join(store, "pp[0,1]", {0, 1}, r, 5000ms);
    if (r == 1) {  // closes its connections without sending
      std::this_thread::sleep_for(100ms);
      comm.reset();
      return;
    }
    Tensor x = Tensor::zeros({16}, DType::f32);
    auto t0 = Clock::now();
    try {
      comm->recv(x, 1, 0)->wait();
      ADD_FAILURE() << "recv from an exited peer returned";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("pp[0,1]: recv from rank 1 (global 1) failed on rank 0"), std::string::npos)
          << e.what();
    }
    EXPECT_LT(seconds_since(t0), 2.0) << "the 5 s timeout must not be needed";
  });
}

TEST(CommGloo, CollectiveWithAbsentPeerTimesOut) {
  auto store = make_hash_store();
  std::promise<void> finished;
  std::shared_future<void> rank0_done = finished.get_future().share();
  run_ranks(2, [&](int r) {
    auto comm = join(store, "dp[0,1]", {0, 1}, r, 500ms);
    if (r == 1) {
      rank0_done.wait();
      return;
    }
    Tensor x = Tensor::zeros({1000}, DType::f32);
    auto t0 = Clock::now();
    try {
      comm->all_reduce(x, ReduceOp::sum)->wait();
      ADD_FAILURE() << "all_reduce without the peer returned";
    } catch (const CommError& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find("dp[0,1]: all_reduce timed out after 0.5 s on rank 0 (global 0)"), std::string::npos) << msg;
    }
    EXPECT_LT(seconds_since(t0), 2.0);
    finished.set_value();
  });
}

TEST(CommGloo, RankThatNeverJoinsFailsTheRendezvousWithinTheTimeout) {
  auto store = make_hash_store();
  run_ranks(2, [&](int r) {  // global ranks 0 and 1 join; 2 never does
    auto t0 = Clock::now();
    try {
      join(store, "tp[0,1,2]", {0, 1, 2}, r, 500ms);
      ADD_FAILURE() << "rendezvous without rank 2 returned on rank " << r;
    } catch (const CommError& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find("tp[0,1,2]: rendezvous timed out after 0.5 s"), std::string::npos) << msg;
      EXPECT_NE(msg.find("rank(s) [2] (global [2]) never joined"), std::string::npos) << msg;
    }
    EXPECT_LT(seconds_since(t0), 2.0);
  });
}

TEST(CommGloo, MisuseIsReportedWithGroupAndRank) {
  auto store = make_hash_store();
  try {
    join(store, "tp[0,1]", {0, 1}, 3);
    ADD_FAILURE() << "a non-member joined";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("tp[0,1]: rank 3 is not a member"), std::string::npos) << e.what();
  }
  EXPECT_THROW(join(store, "tp[1,0]", {1, 0}, 0), CommError);
  run_ranks(2, [&](int r) {
    auto comm = join(store, "tp[0,1]", {0, 1}, r);
    Tensor x = Tensor::zeros({4}, DType::f32);
    Tensor bad = Tensor::zeros({3}, DType::f32);
    EXPECT_THROW(comm->send(x, r, 0), CommError);  // to itself
    EXPECT_THROW(comm->recv(x, 2, 0), CommError);  // outside the group
    EXPECT_THROW(comm->send(x, 1 - r, -1), CommError);
    EXPECT_THROW(comm->broadcast(x, 2), CommError);
    EXPECT_THROW(comm->reduce_scatter(x, bad), CommError);
    EXPECT_THROW(comm->all_gather(bad, x), CommError);
    Tensor ids = Tensor::from_ints(std::vector<int32_t>{1, 2}, {2});
    try {
      comm->all_reduce(ids, ReduceOp::sum);
      ADD_FAILURE() << "all_reduce of i32 accepted";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("tp[0,1]: all_reduce on rank " + std::to_string(r)), std::string::npos)
          << e.what();
    }
    comm->barrier();  // misuse never reached the wire: the group still works
  });
}

}  // namespace
}  // namespace mt

namespace mt {

// Ranks that disagree on a collective's size break Gloo's protocol (over TCP) inside its transport thread, where
// nothing can catch the gloo::EnforceNotMet: the process must end with an error naming the Gloo failure (exit 1), not
// abort with a core dump.
TEST(CommGlooDeathTest, ATransportThreadFailureEndsWithAnErrorNotAnAbort) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        auto store = make_hash_store();
        run_ranks(2, [&](int r) {
          auto comm = join(store, "mismatch", first_ranks(2), r, 5s, /*shared_memory=*/false);
          // rank 1 sends more than rank 0 posted.
          Tensor t = Tensor::zeros({r == 0 ? int64_t(4) : int64_t(4096)}, DType::f32);
          comm->all_reduce(t, ReduceOp::sum)->wait();
        });
        std::exit(0);  // a run where the sizes did not trip Gloo fails the test (exit 0, not 1)
      },
      ::testing::ExitedWithCode(1), "Gloo transport failed in its background thread");
}

}  // namespace mt

// Host sums that every rank must agree on (losses, grad-norm partials) travel as doubles: nothing is rounded to
// f32 on the way (1 + 1e-12 has no f32 neighbour that close), and every rank gets the same bits.
namespace mt {
TEST(CommGloo, SumDoublesKeepsDoublePrecision) {
  constexpr int kWorld = 3;
  auto store = make_hash_store();
  std::vector<std::vector<double>> got(kWorld);
  run_ranks(kWorld, [&](int r) {
    auto comm = join_gloo(store, "sums", first_ranks(kWorld), r);
    got[static_cast<size_t>(r)] = sum_doubles(*comm, {1.0 + 1e-12 * r, -0.1 * r, 1e308});
  });
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(got[static_cast<size_t>(r)], got[0]) << "rank " << r;
    ASSERT_EQ(got[static_cast<size_t>(r)].size(), 3u);
  }
  EXPECT_NEAR(got[0][0], 3.0 + 3e-12, 1e-15);  // an f32 exchange would give exactly 3
  EXPECT_NEAR(got[0][1], -0.3, 1e-16);
  EXPECT_TRUE(std::isinf(got[0][2]));  // 3e308 is past the largest double
}
}  // namespace mt

// all_to_all: the MoE token exchange. Rank `from` sends rank `to` rows_between(from, to) rows of `hidden`
// elements; some pairs send nothing (rank 0 keeps nothing for itself, and beyond two ranks nobody sends its
// next rank anything), so empty blocks sit between full ones on both sides.
namespace mt {
namespace {

int64_t rows_between(int from, int to, int world) {
  if (world > 1 && from == 0 && to == 0) return 0;
  if (world > 2 && to == (from + 1) % world) return 0;
  return 1 + (from * 3 + to * 5) % 4;
}

std::vector<int64_t> send_counts_of(int r, int world, int64_t hidden) {
  std::vector<int64_t> counts;
  for (int q = 0; q < world; ++q) counts.push_back(rows_between(r, q, world) * hidden);
  return counts;
}

std::vector<int64_t> recv_counts_of(int r, int world, int64_t hidden) {
  std::vector<int64_t> counts;
  for (int q = 0; q < world; ++q) counts.push_back(rows_between(q, r, world) * hidden);
  return counts;
}

// The n values rank `from` sends rank `to`: different for every pair, integers so i32 carries them too.
std::vector<float> block_values(int from, int to, int64_t n) {
  std::vector<float> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(static_cast<float>((from * 31 + to * 7 + i * 3) % 97 - 40));
  return v;
}

Tensor tensor_of(const std::vector<float>& v, DType t) {
  const auto n = static_cast<int64_t>(v.size());
  if (t != DType::i32) return Tensor::from_floats(v, {n}, t);
  std::vector<int32_t> ints(v.begin(), v.end());
  return Tensor::from_ints(ints, {n});
}

// in: this rank's blocks for every rank, then `spare` elements of 99 that must not be sent.
Tensor dispatch_input(int r, int world, int64_t hidden, int64_t spare, DType t) {
  std::vector<float> v;
  for (int q = 0; q < world; ++q) {
    std::vector<float> block = block_values(r, q, rows_between(r, q, world) * hidden);
    v.insert(v.end(), block.begin(), block.end());
  }
  v.insert(v.end(), static_cast<size_t>(spare), 99.f);
  return tensor_of(v, t);
}

// What rank r must hold after the exchange: the blocks from every rank in rank order, then the untouched spare
// elements of the output (-1).
std::vector<float> dispatch_expected(int r, int world, int64_t hidden, int64_t spare) {
  std::vector<float> v;
  for (int q = 0; q < world; ++q) {
    std::vector<float> block = block_values(q, r, rows_between(q, r, world) * hidden);
    v.insert(v.end(), block.begin(), block.end());
  }
  v.insert(v.end(), static_cast<size_t>(spare), -1.f);
  return v;
}

int64_t total(const std::vector<int64_t>& counts) {
  int64_t s = 0;
  for (int64_t c : counts) s += c;
  return s;
}

TEST(CommGloo, AllToAllMovesUnevenBlocksIncludingEmptyOnesInRankOrder) {
  const int64_t hidden = 3;
  for (int world : {1, 2, 3, 4}) {
    auto store = make_hash_store();
    run_ranks(world, [&](int r) {
      auto comm = join(store, "ep", first_ranks(world), r);
      const std::vector<int64_t> send = send_counts_of(r, world, hidden), recv = recv_counts_of(r, world, hidden);
      for (DType t : {DType::f32, DType::bf16, DType::f16, DType::i32}) {
        Tensor in = dispatch_input(r, world, hidden, /*spare=*/5, t);
        Tensor out = tensor_of(std::vector<float>(static_cast<size_t>(total(recv) + 7), -1.f), t);
        comm->all_to_all(in, send, out, recv)->wait();
        ASSERT_EQ(out.to_floats(), dispatch_expected(r, world, hidden, 7))
            << "world " << world << " " << dtype_name(t) << " rank " << r;
      }
      // Nothing to send or receive anywhere: completes at once on every rank.
      Tensor none = Tensor::zeros({2}, DType::f32);
      const std::vector<int64_t> zeros(static_cast<size_t>(world), 0);
      comm->all_to_all(none, zeros, none, zeros)->wait();
      comm->barrier();
    });
  }
}

// Dispatch and combine: the tokens go out with the counts exchange_counts gives and come back with the send and
// receive counts swapped, unchanged.
TEST(CommGloo, AllToAllThereAndBackIsTheIdentity) {
  constexpr int kWorld = 4;
  auto store = make_hash_store();
  run_ranks(kWorld, [&](int r) {
    auto comm = join(store, "ep", first_ranks(kWorld), r);
    for (int64_t hidden : {int64_t{8}, int64_t{40000}}) {  // blocks up to 640 KB in bf16
      const std::vector<int64_t> send = send_counts_of(r, kWorld, hidden);
      const std::vector<int64_t> recv = exchange_counts(*comm, send);
      ASSERT_EQ(recv, recv_counts_of(r, kWorld, hidden));
      Tensor tokens = Tensor::from_floats(rank_values(r, total(send)), {total(send) / hidden, hidden}, DType::bf16);
      Tensor there = Tensor::empty({total(recv) / hidden, hidden}, DType::bf16);
      comm->all_to_all(tokens, send, there, recv)->wait();
      Tensor back = Tensor::zeros({total(send) / hidden, hidden}, DType::bf16);
      comm->all_to_all(there, recv, back, send)->wait();
      EXPECT_EQ(back.to_floats(), tokens.to_floats()) << "rank " << r << " hidden " << hidden;
    }
  });
}

TEST(CommGloo, ExchangeCountsIsExactBeyondTwoToThe24) {
  constexpr int kWorld = 3;
  // What rank `from` sends rank `to`: above 2^24 (where f32 stops counting by ones) and above 2^32.
  auto count = [](int from, int to) -> int64_t {
    return to == 1 ? int64_t{5'000'000'001} + from : (int64_t{1} << 24) + 1 + from * 1000 + to;
  };
  auto store = make_hash_store();
  run_ranks(kWorld, [&](int r) {
    auto comm = join(store, "counts", first_ranks(kWorld), r);
    std::vector<int64_t> send;
    for (int q = 0; q < kWorld; ++q) send.push_back(count(r, q));
    const std::vector<int64_t> recv = exchange_counts(*comm, send);
    ASSERT_EQ(recv.size(), size_t{kWorld});
    for (int q = 0; q < kWorld; ++q) EXPECT_EQ(recv[static_cast<size_t>(q)], count(q, r)) << "rank " << r;
  });
}

// A group of one copies its own block: Gloo's, the one-rank communicator's, and a staged wrapper's whose
// tensors are foreign (native cuda, tensors on the host: no copy through the device is made, so no GPU is needed).
TEST(CommGloo, AllToAllInAGroupOfOneIsALocalCopy) {
  auto store = make_hash_store();
  std::vector<std::unique_ptr<Communicator>> comms;
  comms.push_back(join(store, "alone", {0}, 0));
  comms.push_back(make_self_communicator("self[0]"));
  comms.push_back(make_staged_communicator(join(store, "staged", {0}, 0), Device::cuda));
  for (auto& comm : comms) {
    EXPECT_EQ(comm->size(), 1);
    EXPECT_EQ(exchange_counts(*comm, {6}), (std::vector<int64_t>{6}));
    for (DType t : {DType::f32, DType::bf16}) {
      Tensor in = tensor_of({1, 2, 3, 4, 5, 6, 7, 8}, t);
      Tensor out = tensor_of(std::vector<float>(9, -1.f), t);
      comm->all_to_all(in, {6}, out, {6})->wait();
      EXPECT_EQ(out.to_floats(), (std::vector<float>{1, 2, 3, 4, 5, 6, -1, -1, -1})) << comm->name();
    }
  }
}

TEST(CommGloo, AllToAllMisuseNamesTheGroupTheOpAndTheRank) {
  auto store = make_hash_store();
  run_ranks(2, [&](int r) {
    auto comm = join(store, "ep[0,1]", {0, 1}, r);
    Tensor x = Tensor::zeros({8}, DType::f32);
    Tensor y = Tensor::zeros({8}, DType::f32);
    Tensor half = Tensor::zeros({8}, DType::bf16);
    const std::string where = "ep[0,1]: all_to_all on rank " + std::to_string(r);
    auto comm_error = [&](auto&& f) -> std::string {
      try {
        f();
      } catch (const CommError& e) {
        return e.what();
      }
      return "(no CommError)";
    };
    try {
      comm->all_to_all(x, {1, 1, 1}, y, {1, 1});
      ADD_FAILURE() << "three counts for two ranks accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(where + ": 3 send counts and 2 receive counts for a group of 2"),
                std::string::npos)
          << e.what();
    }
    EXPECT_THROW(exchange_counts(*comm, {1}), std::invalid_argument);
    EXPECT_NE(comm_error([&] {
                comm->all_to_all(x, {4, 5}, y, {4, 4});
              }).find(where + ": send counts [4, 5] sum to 9"),
              std::string::npos);
    EXPECT_NE(comm_error([&] {
                comm->all_to_all(x, {4, 4}, y, {4, 5});
              }).find(where + ": receive counts [4, 5]"),
              std::string::npos);
    EXPECT_NE(comm_error([&] {
                comm->all_to_all(x, {1, -1}, y, {1, 1});
              }).find(where + ": negative count"),
              std::string::npos);
    EXPECT_NE(comm_error([&] {
                comm->all_to_all(x, {1, 1}, half, {1, 1});
              }).find(where + ": input"),
              std::string::npos);
    std::vector<int64_t> own_mismatch{1, 1};
    own_mismatch[static_cast<size_t>(r)] = 2;
    EXPECT_NE(comm_error([&] {
                comm->all_to_all(x, own_mismatch, y, {1, 1});
              }).find("sends itself 2 elements"),
              std::string::npos);
    comm->barrier();  // misuse never reached the wire: the group still works
  });
}

}  // namespace
}  // namespace mt

// The shared-memory rounds (parallel/comm/shared_rounds.h) of groups on one host: the same bits as Gloo's TCP path for
// every collective, sizes at and past the 64 KiB a part holds; failures named as Gloo's are.
namespace mt {
namespace {

// Runs `op` on a communicator through shared memory and on one over TCP only; the tensors it returns must agree
// bit for bit.
void expect_same_bits(int world, const std::function<std::vector<Tensor>(Communicator&, int)>& op) {
  auto store = make_hash_store();
  run_ranks(world, [&](int r) {
    auto shm = join(store, "shm", first_ranks(world), r);
    auto tcp = join(store, "tcp", first_ranks(world), r, 10s, /*shared_memory=*/false);
    std::vector<Tensor> a = op(*shm, r), b = op(*tcp, r);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].nbytes(), b[i].nbytes());
      EXPECT_EQ(std::memcmp(a[i].raw(), b[i].raw(), static_cast<size_t>(a[i].nbytes())), 0)
          << "result " << i << " on rank " << r << " of " << world;
    }
  });
}

TEST(CommGlooSharedMemory, EveryCollectiveGivesTheBitsOfTheTcpPath) {
  // 16384 f32 fill a part exactly; 16385 go over to Gloo on both.
  const std::vector<int64_t> sizes = {1, 1001, 16384, 16385};
  for (int world : {2, 3, 4}) {
    expect_same_bits(world, [&](Communicator& c, int r) {
      std::vector<Tensor> got;
      for (int64_t n : sizes)
        for (DType t : {DType::f32, DType::bf16, DType::f64})
          for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
            if (t == DType::f64 && op == ReduceOp::max) continue;
            std::vector<float> v = rank_values(r, n);
            for (auto& x : v) x = x / 7.f + 1e-3f * static_cast<float>(r);  // sums that round
            Tensor x = Tensor::from_floats(v, {n}, t);
            c.all_reduce(x, op)->wait();
            got.push_back(x);
          }
      for (int64_t m : {int64_t{5}, int64_t{16384 / 4}, int64_t{5000}}) {  // blocks of reduce_scatter
        std::vector<float> v = rank_values(r, m * c.size());
        for (auto& x : v) x = x / 3.f;
        Tensor in = Tensor::from_floats(v, {m * c.size()}, DType::f32);
        Tensor out = Tensor::zeros({m}, DType::f32);
        c.reduce_scatter(in, out)->wait();
        got.push_back(out);
        Tensor all = Tensor::zeros({m * c.size()}, DType::f32);
        c.all_gather(out, all)->wait();
        got.push_back(all);
      }
      for (int64_t n : {int64_t{3}, int64_t{16384}, int64_t{20000}}) {
        Tensor b = Tensor::from_floats(rank_values(r, n), {n}, DType::f32);
        c.broadcast(b, c.size() - 1)->wait();
        got.push_back(b);
      }
      for (int64_t hidden : {int64_t{3}, int64_t{3000}}) {  // 3000: some ranks' blocks do not fit a part
        const std::vector<int64_t> send = send_counts_of(r, c.size(), hidden),
                                   recv = recv_counts_of(r, c.size(), hidden);
        Tensor in = dispatch_input(r, c.size(), hidden, 5, DType::bf16);
        Tensor out = tensor_of(std::vector<float>(static_cast<size_t>(total(recv) + 7), -1.f), DType::bf16);
        c.all_to_all(in, send, out, recv)->wait();
        got.push_back(out);
      }
      c.barrier();
      return got;
    });
  }
}

TEST(CommGlooSharedMemory, ARankThatDoesNotWantItMakesTheGroupUseTcp) {
  auto store = make_hash_store();
  run_ranks(3, [&](int r) {
    auto comm = join(store, "mixed", first_ranks(3), r, 10s, /*shared_memory=*/r != 1);
    Tensor x = Tensor::from_floats(rank_values(r, 100), {100}, DType::f32);
    comm->all_reduce(x, ReduceOp::sum)->wait();
    std::vector<float> got = x.to_floats();
    for (int64_t i = 0; i < 100; ++i)
      ASSERT_EQ(got[i], (rank_values(0, 100)[i] + rank_values(1, 100)[i]) + rank_values(2, 100)[i]);
  });
}

TEST(CommGlooSharedMemory, TheSegmentIsUnlinkedOnceEveryRankHasMappedIt) {
  auto store = make_hash_store();
  auto segments = [] {  // this process's segments in /dev/shm
    int count = 0;
    const std::string mine = "megatrain-" + std::to_string(::getpid()) + "-";
    for (const auto& e : std::filesystem::directory_iterator("/dev/shm"))
      count += e.path().filename().string().starts_with(mine);
    return count;
  };
  run_ranks(4, [&](int r) {
    auto comm = join(store, "tp", first_ranks(4), r);
    comm->barrier();
    EXPECT_EQ(segments(), 0);
    Tensor x = Tensor::from_floats(std::vector<float>(8, 1.f), {8}, DType::f32);
    comm->all_reduce(x, ReduceOp::sum)->wait();
    EXPECT_EQ(x.to_floats()[0], 4.f);
  });
}

TEST(CommGlooSharedMemory, AnAbsentRankTimesOutNamedAndLaterOpsFailAtOnce) {
  auto store = make_hash_store();
  std::promise<void> finished;
  std::shared_future<void> done = finished.get_future().share();
  std::atomic<int> failed{0};
  run_ranks(3, [&](int r) {
    auto comm = join(store, "tp[0,1,2]", first_ranks(3), r, 500ms);
    if (r == 2) {  // joined, never reaches the collective
      done.wait();
      return;
    }
    Tensor x = Tensor::zeros({1000}, DType::f32);
    auto t0 = Clock::now();
    try {
      comm->all_reduce(x, ReduceOp::sum)->wait();
      ADD_FAILURE() << "all_reduce without rank 2 returned";
    } catch (const CommError& e) {
      std::string msg = e.what();
      // The first rank to time out names rank 2; the other may instead see that one give up first.
      EXPECT_NE(msg.find("tp[0,1,2]: all_reduce"), std::string::npos) << msg;
      const bool named = msg.find("timed out after 0.5 s on rank " + std::to_string(r)) != std::string::npos &&
                         msg.find("rank 2 (global 2)") != std::string::npos;
      EXPECT_TRUE(named || msg.find("gave up first") != std::string::npos) << msg;
    }
    EXPECT_LT(seconds_since(t0), 2.0);
    auto t1 = Clock::now();
    EXPECT_THROW(comm->barrier(), CommError);
    EXPECT_LT(seconds_since(t1), 0.5);
    if (++failed == 2) finished.set_value();
  });
}

// A rank that fails (here a recv that times out on its shorter timeout) releases the ranks waiting for it in a
// shared round at once, not after their own timeout.
TEST(CommGlooSharedMemory, ARankThatFailsReleasesThoseWaitingForIt) {
  auto store = make_hash_store();
  run_ranks(3, [&](int r) {
    auto comm = join(store, "dp[0,1,2]", first_ranks(3), r, r == 2 ? 300ms : 20s);
    auto t0 = Clock::now();
    if (r == 2) {
      Tensor x = Tensor::zeros({4}, DType::f32);
      EXPECT_THROW(comm->recv(x, 0, 7)->wait(), CommError);
      return;
    }
    Tensor x = Tensor::zeros({64}, DType::f32);
    try {
      comm->all_reduce(x, ReduceOp::sum)->wait();
      ADD_FAILURE() << "all_reduce returned without rank 2";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("rank 2 (global 2) gave up first"), std::string::npos) << e.what();
    }
    EXPECT_LT(seconds_since(t0), 5.0) << "the 20 s timeout must not be needed";
  });
}

TEST(CommGlooSharedMemory, RanksThatDisagreeOnTheSizeFailNamingBoth) {
  auto store = make_hash_store();
  run_ranks(2, [&](int r) {
    auto comm = join(store, "mismatch", first_ranks(2), r, 5s);
    Tensor t = Tensor::zeros({r == 0 ? int64_t(4) : int64_t(4096)}, DType::f32);
    try {
      comm->all_reduce(t, ReduceOp::sum)->wait();
      ADD_FAILURE() << "all_reduce of different sizes returned on rank " << r;
    } catch (const CommError& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find("the ranks disagree on the collective's size"), std::string::npos) << msg;
      EXPECT_NE(msg.find("16 bytes"), std::string::npos) << msg;
      EXPECT_NE(msg.find("16384 bytes"), std::string::npos) << msg;
    }
  });
}

}  // namespace
}  // namespace mt
