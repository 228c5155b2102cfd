#include "parallel/comm/comm_counted.h"

#include <fmt/format.h>

#include <atomic>
#include <list>
#include <mutex>
#include <utility>

#include "parallel/comm/flight_recorder.h"

namespace mt {

namespace {

struct Counters {
  std::string kind;
  std::array<std::atomic<int64_t>, kCommOps> bytes{};
};

// Never shrinks: a communicator keeps a pointer to its kind's counters.
std::mutex g_mu;
std::list<Counters> g_counters;

Counters& counters_of(const std::string& kind) {
  std::lock_guard lock(g_mu);
  for (Counters& c : g_counters)
    if (c.kind == kind) return c;
  g_counters.emplace_back();
  g_counters.back().kind = kind;
  return g_counters.back();
}

class CountedCommunicator final : public Communicator {
 public:
  CountedCommunicator(std::unique_ptr<Communicator> inner, Counters* counters)
      : inner_(std::move(inner)), counters_(counters) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }

  std::unique_ptr<Work> all_reduce(Tensor& t, ReduceOp op) override {
    add(t.dtype() == DType::f64 ? CommOp::scalars : CommOp::all_reduce, 2 * share(t.nbytes()));
    const uint64_t slot = record("all_reduce", t.nbytes());
    const CommWaitTimer blocked;  // Gloo runs the op here
    return recorded(inner_->all_reduce(t, op), slot);
  }
  std::unique_ptr<Work> reduce_scatter(const Tensor& in, Tensor& out) override {
    add(CommOp::reduce_scatter, share(in.nbytes()));
    const uint64_t slot = record("reduce_scatter", in.nbytes());
    const CommWaitTimer blocked;  // Gloo runs the op here
    return recorded(inner_->reduce_scatter(in, out), slot);
  }
  std::unique_ptr<Work> all_gather(const Tensor& in, Tensor& out) override {
    add(CommOp::all_gather, share(out.nbytes()));
    const uint64_t slot = record("all_gather", out.nbytes());
    const CommWaitTimer blocked;  // Gloo runs the op here
    return recorded(inner_->all_gather(in, out), slot);
  }
  std::unique_ptr<Work> broadcast(Tensor& t, int root) override {
    add(CommOp::other, share(t.nbytes()));
    const uint64_t slot = record("broadcast", t.nbytes());
    const CommWaitTimer blocked;  // Gloo runs the op here
    return recorded(inner_->broadcast(t, root), slot);
  }
  // Point-to-point ops are not numbered in the group's order (each pair has its own), so the recorder keeps
  // their peer in the op's name.
  std::unique_ptr<Work> send(const Tensor& t, int peer, int tag) override {
    add(CommOp::other, static_cast<int64_t>(t.nbytes()));
    const uint64_t slot = record(fmt::format("send to {}", peer), t.nbytes(), false);
    const CommWaitTimer blocked;  // Gloo runs the op here
    return recorded(inner_->send(t, peer, tag), slot);
  }
  std::unique_ptr<Work> recv(Tensor& t, int peer, int tag) override {
    const uint64_t slot = record(fmt::format("recv from {}", peer), t.nbytes(), false);
    const CommWaitTimer blocked;  // Gloo runs the op here
    return recorded(inner_->recv(t, peer, tag), slot);
  }
  std::unique_ptr<Work> all_to_all(const Tensor& in, const std::vector<int64_t>& send_counts, Tensor& out,
                                   const std::vector<int64_t>& recv_counts) override {
    int64_t sent = 0;
    for (size_t r = 0; r < send_counts.size(); ++r)
      if (static_cast<int>(r) != rank()) sent += send_counts[r];
    add(CommOp::other, sent * static_cast<int64_t>(dtype_size(in.dtype())));
    const uint64_t slot = record("all_to_all", in.nbytes());
    const CommWaitTimer blocked;  // Gloo runs the op here
    return recorded(inner_->all_to_all(in, send_counts, out, recv_counts), slot);
  }
  void barrier() override {
    const uint64_t slot = record("barrier", 0);
    {
      const CommWaitTimer blocked;
      inner_->barrier();
    }
    flight_recorder().finished(slot);
  }
  bool collectives_block_caller() const override { return inner_->collectives_block_caller(); }
  Communicator& backend() override { return inner_->backend(); }

 private:
  // (n - 1) / n of a buffer: what each rank sends of it (exact: the buffers are n blocks, or counted as such).
  int64_t share(size_t bytes) const {
    const int64_t n = size();
    return static_cast<int64_t>(bytes) * (n - 1) / n;
  }
  // The flight recorder's entry of an op issued now: collectives numbered in the group's order (0 for point to
  // point). A group of one is recorded too (it is cheap, and a dump then shows every op the rank reached).
  uint64_t record(const std::string& op, size_t bytes, bool collective = true) {
    return flight_recorder().queued(name(), collective ? ++seq_ : 0, op, static_cast<int64_t>(bytes));
  }
  static std::unique_ptr<Work> recorded(std::unique_ptr<Work> inner, uint64_t slot);
  void add(CommOp op, int64_t bytes) {
    if (counters_ && size() > 1) counters_->bytes[static_cast<size_t>(op)].fetch_add(bytes, std::memory_order_relaxed);
  }

  std::unique_ptr<Communicator> inner_;
  Counters* counters_;           // null: recorded, not counted
  std::atomic<int64_t> seq_{0};  // the gradient reducer's thread issues on its own communicator, but be safe
};

// An op's Work whose completion the recorder learns (a wait that throws leaves it unfinished: what a dump shows).
class RecordedWork final : public Work {
 public:
  RecordedWork(std::unique_ptr<Work> inner, uint64_t slot) : inner_(std::move(inner)), slot_(slot) {}
  void wait() override {
    {
      const CommWaitTimer blocked;
      inner_->wait();
    }
    flight_recorder().finished(slot_);
  }
  void start() override { inner_->start(); }

 private:
  std::unique_ptr<Work> inner_;
  uint64_t slot_;
};

std::unique_ptr<Work> CountedCommunicator::recorded(std::unique_ptr<Work> inner, uint64_t slot) {
  return std::make_unique<RecordedWork>(std::move(inner), slot);
}

}  // namespace

CommBytes comm_bytes_moved() {
  CommBytes out;
  std::lock_guard lock(g_mu);
  for (const Counters& c : g_counters) {
    auto& row = out[c.kind];
    for (int i = 0; i < kCommOps; ++i) row[i] = c.bytes[i].load(std::memory_order_relaxed);
  }
  return out;
}

std::unique_ptr<Communicator> make_counted_communicator(std::unique_ptr<Communicator> inner, std::string kind,
                                                        bool count_bytes) {
  return std::make_unique<CountedCommunicator>(std::move(inner), count_bytes ? &counters_of(kind) : nullptr);
}

}  // namespace mt
