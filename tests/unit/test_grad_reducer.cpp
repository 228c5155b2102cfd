// test_grad_reducer.cpp: the bucketed data-parallel gradient reducer. With a communicator whose collectives
// are enqueued and return at once (NCCL), every bucket must be issued by the thread that marks it ready, in
// the order backward finishes the buckets (NCCL can deadlock when two threads issue collectives in different
// orders on different ranks); with one whose collectives block the caller (Gloo), a worker thread runs them.
// A recording communicator stands in for both, so these run on every machine.
#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "parallel/grad_reducer.h"

namespace mt {
namespace {

// Records each all-reduce: the thread that issued it and the range of the flat buffer it covers (by the
// first element's value, which the test sets to its index), and when its Work was waited on.
class RecordingCommunicator final : public Communicator {
 public:
  explicit RecordingCommunicator(bool blocks_caller) : blocks_caller_(blocks_caller) {}
  struct Call {
    std::thread::id thread;
    float first = 0;  // value of the bucket's first element: its offset in the flat buffer
    int64_t numel = 0;
  };
  struct Log {
    std::mutex mu;
    std::vector<Call> calls;
    int waits = 0;
  };
  std::shared_ptr<Log> log = std::make_shared<Log>();

  int rank() const override { return 0; }
  int size() const override { return 2; }
  const std::string& name() const override { return name_; }
  std::unique_ptr<Work> all_reduce(Tensor& t, ReduceOp) override {
    std::lock_guard lock(log->mu);
    log->calls.push_back({std::this_thread::get_id(), t.data<float>()[0], t.numel()});
    return std::make_unique<CountingWork>(log);
  }
  std::unique_ptr<Work> reduce_scatter(const Tensor&, Tensor&) override { throw CommError("unused"); }
  std::unique_ptr<Work> all_gather(const Tensor&, Tensor&) override { throw CommError("unused"); }
  std::unique_ptr<Work> broadcast(Tensor&, int) override { throw CommError("unused"); }
  std::unique_ptr<Work> send(const Tensor&, int, int) override { throw CommError("unused"); }
  std::unique_ptr<Work> recv(Tensor&, int, int) override { throw CommError("unused"); }
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
  bool blocks_caller_;
  std::string name_ = "dp[0,1]";
};

struct Model {
  std::vector<Parameter> params;
  Tensor flat;
  explicit Model(const std::vector<int64_t>& sizes) {
    int64_t total = 0;
    for (int64_t n : sizes) total += n;
    flat = Tensor::zeros({total}, DType::f32);
    for (int64_t i = 0; i < total; ++i) flat.data<float>()[i] = static_cast<float>(i);
    int64_t offset = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      Parameter p;
      p.name = "p" + std::to_string(i);
      p.grad = flat.slice(offset, offset + sizes[i]);
      offset += sizes[i];
      params.push_back(std::move(p));
    }
  }
  std::vector<Parameter*> pointers() {
    std::vector<Parameter*> out;
    for (Parameter& p : params) out.push_back(&p);
    return out;
  }
};

TEST(GradReducer, AsynchronousCollectivesAreIssuedByTheMarkingThreadInBackwardOrder) {
  Model m({4, 4, 4, 4});  // buckets of >= 8 elements: [8, 16) then [0, 8)
  auto comm = std::make_unique<RecordingCommunicator>(false);
  auto log = comm->log;
  BucketedGradReducer reducer(m.pointers(), m.flat, std::move(comm), 8);
  ASSERT_EQ(reducer.num_buckets(), 2u);
  for (int step = 0; step < 2; ++step) {
    reducer.begin_step();
    reducer.mark_ready({&m.params[3]});
    EXPECT_EQ(log->calls.size(), 2u * step);  // the bucket is not complete yet
    reducer.mark_ready({&m.params[2]});
    ASSERT_EQ(log->calls.size(), 2u * step + 1);  // issued at once, on this thread
    reducer.finish_step();                        // marks p1, p0 and issues the last bucket
    ASSERT_EQ(log->calls.size(), 2u * step + 2);
    EXPECT_EQ(log->waits, 2 * step + 2);
  }
  for (size_t i = 0; i < log->calls.size(); ++i) {
    EXPECT_EQ(log->calls[i].thread, std::this_thread::get_id()) << "call " << i;
    EXPECT_EQ(log->calls[i].first, i % 2 == 0 ? 8.f : 0.f) << "call " << i;
    EXPECT_EQ(log->calls[i].numel, 8) << "call " << i;
  }
}

TEST(GradReducer, BlockingCollectivesRunOnTheWorkerThread) {
  Model m({3, 5, 2});
  auto comm = std::make_unique<RecordingCommunicator>(true);
  auto log = comm->log;
  BucketedGradReducer reducer(m.pointers(), m.flat, std::move(comm), 1);  // one bucket per parameter
  ASSERT_EQ(reducer.num_buckets(), 3u);
  reducer.begin_step();
  reducer.mark_ready({&m.params[2]});
  reducer.finish_step();
  ASSERT_EQ(log->calls.size(), 3u);
  const std::vector<float> firsts{8.f, 3.f, 0.f};  // reverse buffer order
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_NE(log->calls[i].thread, std::this_thread::get_id()) << "call " << i;
    EXPECT_EQ(log->calls[i].first, firsts[i]) << "call " << i;
  }
}

}  // namespace
}  // namespace mt
