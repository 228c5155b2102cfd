// test_grad_buffer.cpp: the one gradient buffer. Its layout (whole parameters in buckets, in reverse order;
// padded per bucket and sharded rank by rank with the distributed optimizer); its threading (with a
// communicator whose collectives are enqueued and return at once, NCCL, every bucket is issued by the thread
// that marks it ready, in the order backward finishes the buckets, as NCCL can deadlock when two threads
// issue collectives in different orders on different ranks; with one whose collectives block the caller,
// Gloo, a worker thread runs them), checked with a recording communicator; and its sums, with threads as
// ranks over Gloo, against one flat all-reduce of the whole gradient.
#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "parallel/sharding/grad_buffer.h"
#include "parallel/comm/thread_ranks.h"

namespace mt {
namespace {

// Records each collective: its communicator, the thread that issued it, the range of the flat buffer it
// covers (by its first element's value, which the tests set to the element's index), where a reduce-scatter
// writes, and how many Works were waited on. Several communicators may share one log.
struct Log {
  struct Call {
    std::string comm;
    std::thread::id thread;
    float first = 0;
    int64_t numel = 0;
    int64_t out_offset = -1;  // reduce_scatter: the output's offset from the input, in elements
  };
  std::mutex mu;
  std::vector<Call> calls;
  int waits = 0;
};

class RecordingCommunicator final : public Communicator {
 public:
  RecordingCommunicator(std::string name, bool blocks_caller, int rank = 0, std::shared_ptr<Log> log = nullptr)
      : log(log ? log : std::make_shared<Log>()), name_(std::move(name)), blocks_caller_(blocks_caller), rank_(rank) {}
  std::shared_ptr<Log> log;

  int rank() const override { return rank_; }
  int size() const override { return 2; }
  const std::string& name() const override { return name_; }
  std::unique_ptr<Work> all_reduce(Tensor& t, ReduceOp) override { return record(t, -1); }
  std::unique_ptr<Work> reduce_scatter(const Tensor& in, Tensor& out) override {
    return record(in, (static_cast<const char*>(out.raw()) - static_cast<const char*>(in.raw())) / 4);
  }
  std::unique_ptr<Work> all_gather(const Tensor&, Tensor&) override { throw CommError("unused"); }
  std::unique_ptr<Work> broadcast(Tensor&, int) override { throw CommError("unused"); }
  std::unique_ptr<Work> send(const Tensor&, int, int) override { throw CommError("unused"); }
  std::unique_ptr<Work> recv(Tensor&, int, int) override { throw CommError("unused"); }
  std::unique_ptr<Work> all_to_all(const Tensor&, const std::vector<int64_t>&, Tensor&,
                                   const std::vector<int64_t>&) override {
    throw CommError("unused");
  }
  void barrier() override {}
  bool collectives_block_caller() const override { return blocks_caller_; }

 private:
  struct CountingWork final : Work {
    explicit CountingWork(std::shared_ptr<Log> l) : log(std::move(l)) {}
    void wait() override {
      std::lock_guard lock(log->mu);
      ++log->waits;
    }
    std::shared_ptr<Log> log;
  };
  std::unique_ptr<Work> record(const Tensor& t, int64_t out_offset) {
    std::lock_guard lock(log->mu);
    log->calls.push_back({name_, std::this_thread::get_id(), t.data<float>()[0], t.numel(), out_offset});
    return std::make_unique<CountingWork>(log);
  }
  std::string name_;
  bool blocks_caller_;
  int rank_;
};

// Parameters of the given sizes (values only: the buffer gives them their gradients).
struct Model {
  std::vector<Parameter> params;
  explicit Model(const std::vector<int64_t>& sizes) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      Parameter p;
      p.name = "p" + std::to_string(i);
      p.value = Tensor::zeros({sizes[i]}, DType::f32);
      params.push_back(std::move(p));
    }
  }
  std::vector<Parameter*> pointers() {
    std::vector<Parameter*> out;
    for (Parameter& p : params) out.push_back(&p);
    return out;
  }
};

// Sets every element of the buffer to its index, so a recorded call names its range.
void number_elements(const GradBuffer& buffer) {
  Tensor flat = buffer.data();
  for (int64_t i = 0; i < flat.numel(); ++i) flat.data<float>()[i] = static_cast<float>(i);
}

TEST(GradBuffer, GradientsAreViewsOfOneBufferInBucketsOfWholeParametersFromTheEnd) {
  Model m({4, 4, 4, 4, 3});
  GradBuffer buffer(m.pointers(), Device::cpu, nullptr, {.bucket_elements = 8});
  ASSERT_EQ(buffer.buckets().size(), 2u);  // [p3 p4] has 7 < 8 elements and takes p2 too, then [p0 p1]
  EXPECT_EQ(buffer.buckets()[0].params, (std::vector<Parameter*>{&m.params[2], &m.params[3], &m.params[4]}));
  EXPECT_EQ(buffer.buckets()[1].params, (std::vector<Parameter*>{&m.params[0], &m.params[1]}));
  ASSERT_EQ(buffer.data().numel(), 19);
  for (size_t i = 0; i < m.params.size(); ++i) {
    EXPECT_EQ(buffer.offset(&m.params[i]), 4 * static_cast<int64_t>(i));
    EXPECT_EQ(m.params[i].grad.raw(), buffer.data().slice(4 * i, 4 * i + 1).raw()) << "p" << i;
  }
}

TEST(GradBuffer, ShardedBucketsArePaddedToTheGroupSizeAndReduceScatteredInPlace) {
  Model m({3, 4});  // one bucket each: p0 [0, 3) padded to [0, 4), p1 [4, 8)
  auto comm = std::make_unique<RecordingCommunicator>("dp", false, /*rank=*/1);
  auto log = comm->log;
  GradBuffer buffer(m.pointers(), Device::cpu, std::move(comm), {.bucket_elements = 1, .shard = true});
  ASSERT_EQ(buffer.buckets().size(), 2u);
  EXPECT_EQ(buffer.data().numel(), 8);
  EXPECT_EQ(buffer.offset(&m.params[1]), 4);
  EXPECT_EQ(buffer.buckets()[0].begin, 4);
  EXPECT_EQ(buffer.buckets()[1].end, 4);
  EXPECT_EQ(buffer.buckets()[1].shard, 2);
  buffer.begin_step();
  number_elements(buffer);
  buffer.finalize();
  ASSERT_EQ(log->calls.size(), 2u);
  EXPECT_EQ(log->calls[0].first, 4.f);
  EXPECT_EQ(log->calls[1].first, 0.f);
  for (const auto& c : log->calls) {
    EXPECT_EQ(c.numel, 4);
    EXPECT_EQ(c.out_offset, 2) << "rank 1 owns block 1 of the bucket, inside the bucket";
  }
}

TEST(GradBuffer, AsynchronousCollectivesAreIssuedByTheMarkingThreadInBackwardOrder) {
  Model m({4, 4, 4, 4});  // buckets of >= 8 elements: [8, 16) then [0, 8)
  auto comm = std::make_unique<RecordingCommunicator>("dp", false);
  auto log = comm->log;
  GradBuffer buffer(m.pointers(), Device::cpu, std::move(comm), {.bucket_elements = 8});
  ASSERT_EQ(buffer.buckets().size(), 2u);
  for (int step = 0; step < 2; ++step) {
    buffer.begin_step();
    number_elements(buffer);
    buffer.mark_ready({&m.params[3]});
    EXPECT_EQ(log->calls.size(), 2u * step);  // the bucket is not complete yet
    buffer.mark_ready({&m.params[2]});
    ASSERT_EQ(log->calls.size(), 2u * step + 1);  // issued at once, on this thread
    buffer.finalize();                            // marks p1, p0 and issues the last bucket
    ASSERT_EQ(log->calls.size(), 2u * step + 2);
    EXPECT_EQ(log->waits, 2 * step + 2);
  }
  for (size_t i = 0; i < log->calls.size(); ++i) {
    EXPECT_EQ(log->calls[i].thread, std::this_thread::get_id()) << "call " << i;
    EXPECT_EQ(log->calls[i].first, i % 2 == 0 ? 8.f : 0.f) << "call " << i;
    EXPECT_EQ(log->calls[i].numel, 8) << "call " << i;
  }
}

TEST(GradBuffer, BlockingCollectivesRunOnTheWorkerThread) {
  Model m({3, 5, 2});
  auto comm = std::make_unique<RecordingCommunicator>("dp", true);
  auto log = comm->log;
  GradBuffer buffer(m.pointers(), Device::cpu, std::move(comm), {.bucket_elements = 1});  // a bucket each
  ASSERT_EQ(buffer.buckets().size(), 3u);
  buffer.begin_step();
  number_elements(buffer);
  buffer.mark_ready({&m.params[2]});
  buffer.finalize();
  ASSERT_EQ(log->calls.size(), 3u);
  const std::vector<float> firsts{8.f, 3.f, 0.f};  // reverse buffer order
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_NE(log->calls[i].thread, std::this_thread::get_id()) << "call " << i;
    EXPECT_EQ(log->calls[i].first, firsts[i]) << "call " << i;
  }
}

// A gradient that other groups still sum (grad_sums) joins its data-parallel bucket only in finalize(),
// after those sums: marking it ready early does not start its bucket.
TEST(GradBuffer, FinalizeSumsOverTheTensorAndEmbeddingGroupsBeforeTheirBuckets) {
  Model m({4, 4, 4});
  m.params[0].grad_sums.embedding = true;
  m.params[1].grad_sums.tensor = true;
  auto log = std::make_shared<Log>();
  RecordingCommunicator tp("tp", false, 0, log), emb("emb", false, 0, log);
  GradBuffer buffer(m.pointers(), Device::cpu, std::make_unique<RecordingCommunicator>("dp", false, 0, log),
                    {.bucket_elements = 1, .tensor = &tp, .embedding = &emb});
  buffer.begin_step();
  number_elements(buffer);
  buffer.mark_ready({&m.params[2], &m.params[1], &m.params[0]});
  ASSERT_EQ(log->calls.size(), 1u);  // p2's bucket only
  buffer.finalize();
  std::vector<std::string> order;
  for (const auto& c : log->calls) order.push_back(c.comm + "@" + std::to_string(static_cast<int>(c.first)));
  EXPECT_EQ(order, (std::vector<std::string>{"dp@8", "tp@4", "emb@0", "dp@4", "dp@0"}));
}

// Exact in fp32 (quarters of small integers), so every order of summation gives the same bits.
float grad_value(int rank, size_t param, int64_t element, int step) {
  return static_cast<float>((rank * 7 + static_cast<int64_t>(param) * 3 + element * 5 + step) % 17 - 8) * 0.25f;
}

enum class Marking { backward_order, forward_order, only_finalize };

// Every rank's gradients reduced through the buffer equal one flat all-reduce of the whole gradient (its own
// block of every bucket, when sharded), over two steps.
void expect_matches_flat_all_reduce(int world, bool shard, int64_t bucket_elements, Marking marking) {
  const std::vector<int64_t> sizes{5, 12, 3, 8, 1, 9, 4};
  auto store = make_hash_store();
  run_ranks(world, [&](int r) {
    auto flat_comm = join_gloo(store, "flat", first_ranks(world), r);
    Model m(sizes);
    GradBuffer buffer(m.pointers(), Device::cpu, join_gloo(store, "dp", first_ranks(world), r),
                      {.bucket_elements = bucket_elements, .shard = shard});
    const std::string what = "world " + std::to_string(world) + (shard ? " sharded" : " all-reduce") + ", buckets of " +
                             std::to_string(bucket_elements) + ", marking " +
                             std::to_string(static_cast<int>(marking)) + ", rank " + std::to_string(r);
    for (int step = 0; step < 2; ++step) {
      buffer.begin_step();
      std::vector<float> flat;
      for (size_t i = 0; i < m.params.size(); ++i)
        for (int64_t e = 0; e < sizes[i]; ++e) {
          m.params[i].grad.data<float>()[e] = grad_value(r, i, e, step);
          flat.push_back(grad_value(r, i, e, step));
        }
      Tensor expected = Tensor::from_floats(flat, {static_cast<int64_t>(flat.size())});
      flat_comm->all_reduce(expected, ReduceOp::sum)->wait();
      if (marking == Marking::backward_order)
        for (size_t i = m.params.size(); i-- > 0;) buffer.mark_ready({&m.params[i]});
      if (marking == Marking::forward_order)
        for (Parameter& p : m.params) buffer.mark_ready({&p});
      buffer.finalize();
      int64_t at = 0;  // the parameter's first element in `expected`
      for (size_t i = 0; i < m.params.size(); ++i) {
        const int64_t o = buffer.offset(&m.params[i]);
        int64_t lo = o, hi = o + sizes[i];  // the part this rank holds reduced
        if (shard)
          for (const GradBuffer::Bucket& b : buffer.buckets())
            if (o >= b.begin && o < b.end) {
              lo = std::max(lo, b.begin + r * b.shard);
              hi = std::min(hi, b.begin + (r + 1) * b.shard);
            }
        for (int64_t x = lo; x < hi; ++x)
          ASSERT_EQ(buffer.data().data<float>()[x], expected.data<float>()[at + x - o])
              << what << ", step " << step << ", p" << i << " element " << x - o;
        at += sizes[i];
      }
    }
  });
}

TEST(GradBuffer, AllReducedBucketsEqualOneFlatAllReduce) {
  for (int world : {2, 3})
    for (int64_t bucket : {1, 10, 1000})
      for (Marking marking : {Marking::backward_order, Marking::forward_order, Marking::only_finalize})
        expect_matches_flat_all_reduce(world, false, bucket, marking);
}

TEST(GradBuffer, ReduceScatteredBucketsEqualOneFlatAllReduceOnEachRanksBlocks) {
  for (int world : {2, 3})
    for (int64_t bucket : {1, 10, 1000})
      for (Marking marking : {Marking::backward_order, Marking::forward_order, Marking::only_finalize})
        expect_matches_flat_all_reduce(world, true, bucket, marking);
}

// Two by two ranks (tensor-parallel pairs {0, 1}, {2, 3}; data-parallel pairs {0, 2}, {1, 3}; the embedding
// group here the tensor-parallel pair): flagged gradients are summed over their group and then over data
// parallelism, the others over data parallelism only.
TEST(GradBuffer, FlaggedGradientsAreSummedOverTheirGroupsThenOverDataParallelism) {
  for (bool shard : {false, true}) {
    auto store = make_hash_store();
    run_ranks(4, [&](int r) {
      const std::vector<int> pair{r / 2 * 2, r / 2 * 2 + 1}, dp_pair{r % 2, r % 2 + 2};
      auto tp = join_gloo(store, "tp" + std::to_string(r / 2), pair, r);
      auto emb = join_gloo(store, "emb" + std::to_string(r / 2), pair, r);
      Model m({6, 6, 6});
      m.params[0].grad_sums.tensor = true;
      m.params[1].grad_sums.embedding = true;
      GradBuffer buffer(m.pointers(), Device::cpu, join_gloo(store, "dp" + std::to_string(r % 2), dp_pair, r),
                        {.bucket_elements = 4, .shard = shard, .tensor = tp.get(), .embedding = emb.get()});
      buffer.begin_step();
      for (size_t i = 0; i < 3; ++i)
        for (int64_t e = 0; e < 6; ++e) m.params[i].grad.data<float>()[e] = grad_value(r, i, e, 0);
      buffer.mark_ready({&m.params[2], &m.params[1], &m.params[0]});
      buffer.finalize();
      for (size_t i = 0; i < 3; ++i)
        for (int64_t e = 0; e < 6; ++e) {
          if (shard && e / 3 != r / 2) continue;  // a bucket each, 3 elements per data-parallel rank
          float want = 0;
          for (int q : i == 2 ? dp_pair : std::vector<int>{0, 1, 2, 3}) want += grad_value(q, i, e, 0);
          ASSERT_EQ(m.params[i].grad.data<float>()[e], want) << "rank " << r << " p" << i << " element " << e;
        }
    });
  }
}

}  // namespace
}  // namespace mt
