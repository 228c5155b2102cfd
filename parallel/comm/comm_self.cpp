// comm_self.cpp: the communicator of a group of one rank. Every collective is at most a local copy (done when it
// returns, on whatever device the tensors live), so a size-1 group costs no rendezvous, no socket and no NCCL
// split: the expert-parallel group of a job without expert parallelism.
#include <utility>

#include <fmt/format.h>

#include "parallel/comm/communicator.h"
#include "parallel/comm/group.h"

namespace mt {
namespace {

class CompletedWork final : public Work {
 public:
  void wait() override {}
};

class SelfCommunicator final : public Communicator {
 public:
  explicit SelfCommunicator(std::string name) : name_(std::move(name)) {}

  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }

  std::unique_ptr<Work> all_reduce(Tensor& t, ReduceOp) override {
    check(t, "all_reduce");
    return done();
  }
  std::unique_ptr<Work> reduce_scatter(const Tensor& in, Tensor& out) override {
    return copy(in, out, "reduce_scatter");
  }
  std::unique_ptr<Work> all_gather(const Tensor& in, Tensor& out) override { return copy(in, out, "all_gather"); }
  std::unique_ptr<Work> broadcast(Tensor& t, int root) override {
    check(t, "broadcast");
    if (root != 0) throw misuse("broadcast", fmt::format("root {} is outside the group of 1", root));
    return done();
  }
  std::unique_ptr<Work> send(const Tensor&, int peer, int) override {
    throw misuse("send", fmt::format("peer {} is not another rank of the group of 1", peer));
  }
  std::unique_ptr<Work> recv(Tensor&, int peer, int) override {
    throw misuse("recv", fmt::format("peer {} is not another rank of the group of 1", peer));
  }
  std::unique_ptr<Work> all_to_all(const Tensor& in, const std::vector<int64_t>& send_counts, Tensor& out,
                                   const std::vector<int64_t>& recv_counts) override {
    check_all_to_all(*this, in, send_counts, out, recv_counts);
    copy_elements(in, 0, out, 0, send_counts[0]);
    return done();
  }
  void barrier() override {}
  bool collectives_block_caller() const override { return false; }

 private:
  static std::unique_ptr<Work> done() { return std::make_unique<CompletedWork>(); }
  CommError misuse(std::string_view op, const std::string& what) const {
    return CommError(fmt::format("{}: {} on rank 0: {}", name_, op, what));
  }
  void check(const Tensor& t, std::string_view op) const {
    if (!t.defined()) throw misuse(op, "undefined tensor");
  }
  std::unique_ptr<Work> copy(const Tensor& in, Tensor& out, std::string_view op) {
    check(in, op);
    check(out, op);
    if (in.dtype() != out.dtype() || in.numel() != out.numel())
      throw misuse(op, fmt::format("input {} and output {} differ", in.describe(), out.describe()));
    if (in.numel() > 0) out.copy_from(in);
    return done();
  }

  std::string name_;
};

}  // namespace

std::unique_ptr<Communicator> make_self_communicator(std::string name) {
  return std::make_unique<SelfCommunicator>(std::move(name));
}

}  // namespace mt
