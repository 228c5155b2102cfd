#include "parallel/comm/comm_counted.h"

#include <atomic>
#include <list>
#include <mutex>
#include <utility>

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
  CountedCommunicator(std::unique_ptr<Communicator> inner, Counters& counters)
      : inner_(std::move(inner)), counters_(counters) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }

  std::unique_ptr<Work> all_reduce(Tensor& t, ReduceOp op) override {
    add(t.dtype() == DType::f64 ? CommOp::scalars : CommOp::all_reduce, 2 * share(t.nbytes()));
    return inner_->all_reduce(t, op);
  }
  std::unique_ptr<Work> reduce_scatter(const Tensor& in, Tensor& out) override {
    add(CommOp::reduce_scatter, share(in.nbytes()));
    return inner_->reduce_scatter(in, out);
  }
  std::unique_ptr<Work> all_gather(const Tensor& in, Tensor& out) override {
    add(CommOp::all_gather, share(out.nbytes()));
    return inner_->all_gather(in, out);
  }
  std::unique_ptr<Work> broadcast(Tensor& t, int root) override {
    add(CommOp::other, share(t.nbytes()));
    return inner_->broadcast(t, root);
  }
  std::unique_ptr<Work> send(const Tensor& t, int peer, int tag) override {
    add(CommOp::other, static_cast<int64_t>(t.nbytes()));
    return inner_->send(t, peer, tag);
  }
  std::unique_ptr<Work> recv(Tensor& t, int peer, int tag) override { return inner_->recv(t, peer, tag); }
  std::unique_ptr<Work> all_to_all(const Tensor& in, const std::vector<int64_t>& send_counts, Tensor& out,
                                   const std::vector<int64_t>& recv_counts) override {
    int64_t sent = 0;
    for (size_t r = 0; r < send_counts.size(); ++r)
      if (static_cast<int>(r) != rank()) sent += send_counts[r];
    add(CommOp::other, sent * static_cast<int64_t>(dtype_size(in.dtype())));
    return inner_->all_to_all(in, send_counts, out, recv_counts);
  }
  void barrier() override { inner_->barrier(); }
  bool collectives_block_caller() const override { return inner_->collectives_block_caller(); }
  Communicator& backend() override { return inner_->backend(); }

 private:
  // (n - 1) / n of a buffer: what each rank sends of it (exact: the buffers are n blocks, or counted as such).
  int64_t share(size_t bytes) const {
    const int64_t n = size();
    return static_cast<int64_t>(bytes) * (n - 1) / n;
  }
  void add(CommOp op, int64_t bytes) {
    if (size() > 1) counters_.bytes[static_cast<size_t>(op)].fetch_add(bytes, std::memory_order_relaxed);
  }

  std::unique_ptr<Communicator> inner_;
  Counters& counters_;
};

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

std::unique_ptr<Communicator> make_counted_communicator(std::unique_ptr<Communicator> inner, std::string kind) {
  return std::make_unique<CountedCommunicator>(std::move(inner), counters_of(kind));
}

}  // namespace mt
