// comm_staged.cpp: a communicator made to take tensors on any device by copying them through the device its
// backend moves: inputs are copied there before the op, outputs back when it completes.
//  * Gloo (host memory) with CUDA tensors: how several ranks that share one GPU (which NCCL refuses) still
//    run every parallel code path with CUDA compute, and the fallback where NCCL is missing.
//  * NCCL (device memory) with host tensors: the few small host-side exchanges (loss sums, counters).
// Tensors already on the backend's device pass straight through.
#include <utility>

#include "parallel/comm/communicator.h"
#include "parallel/comm/group.h"

namespace mt {

namespace {

// Waits for the inner op, then copies its staged result back into the caller's tensor.
class StagedWork final : public Work {
 public:
  StagedWork(std::unique_ptr<Work> inner, Tensor host, Tensor device)
      : inner_(std::move(inner)), host_(std::move(host)), device_(std::move(device)) {}
  void wait() override {
    if (done_) return;
    inner_->wait();
    if (device_.defined()) device_.copy_from(host_);
    done_ = true;
  }

 private:
  std::unique_ptr<Work> inner_;
  Tensor host_;    // the staged tensor the inner op reads or writes; also keeps a send's copy alive
  Tensor device_;  // the caller's tensor, where the result goes (undefined for sends)
  bool done_ = false;
};

// A group of one: the op was a local copy, done before it returned.
class LocalWork final : public Work {
 public:
  void wait() override {}
};

class StagedCommunicator final : public Communicator {
 public:
  StagedCommunicator(std::unique_ptr<Communicator> inner, Device native) : inner_(std::move(inner)), native_(native) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }

  std::unique_ptr<Work> all_reduce(Tensor& t, ReduceOp op) override {
    if (!foreign(t)) return inner_->all_reduce(t, op);
    Tensor h = staged_copy(t);
    return staged(inner_->all_reduce(h, op), h, t);
  }
  std::unique_ptr<Work> reduce_scatter(const Tensor& in, Tensor& out) override {
    if (!foreign(in) && !foreign(out)) return inner_->reduce_scatter(in, out);
    Tensor hin = foreign(in) ? staged_copy(in) : in, hout = staged_like(out);
    return staged(inner_->reduce_scatter(hin, hout), hout, out);
  }
  std::unique_ptr<Work> all_gather(const Tensor& in, Tensor& out) override {
    if (!foreign(in) && !foreign(out)) return inner_->all_gather(in, out);
    Tensor hin = foreign(in) ? staged_copy(in) : in, hout = staged_like(out);
    return staged(inner_->all_gather(hin, hout), hout, out);
  }
  std::unique_ptr<Work> broadcast(Tensor& t, int root) override {
    if (!foreign(t)) return inner_->broadcast(t, root);
    Tensor h = staged_copy(t);
    return staged(inner_->broadcast(h, root), h, t);
  }
  std::unique_ptr<Work> send(const Tensor& t, int peer, int tag) override {
    if (!foreign(t)) return inner_->send(t, peer, tag);
    Tensor h = staged_copy(t);
    return staged(inner_->send(h, peer, tag), h, Tensor());
  }
  std::unique_ptr<Work> recv(Tensor& t, int peer, int tag) override {
    if (!foreign(t)) return inner_->recv(t, peer, tag);
    Tensor h = staged_like(t);
    return staged(inner_->recv(h, peer, tag), h, t);
  }
  // Stages only the blocks that move (elements past the counts stay untouched); a group of one copies locally,
  // on the tensors' own devices.
  std::unique_ptr<Work> all_to_all(const Tensor& in, const std::vector<int64_t>& send_counts, Tensor& out,
                                   const std::vector<int64_t>& recv_counts) override {
    if (!foreign(in) && !foreign(out)) return inner_->all_to_all(in, send_counts, out, recv_counts);
    const AllToAllTotals totals = check_all_to_all(*this, in, send_counts, out, recv_counts);
    if (size() == 1) {
      copy_elements(in, 0, out, 0, send_counts[0]);
      return std::make_unique<LocalWork>();
    }
    Tensor sent = in.view({in.numel()}).slice(0, totals.sent);            // (sent)
    Tensor received = out.view({out.numel()}).slice(0, totals.received);  // (received)
    Tensor hin = foreign(in) ? staged_copy(sent) : sent;
    Tensor hout = foreign(out) ? staged_like(received) : received;
    return staged(inner_->all_to_all(hin, send_counts, hout, recv_counts), hout, foreign(out) ? received : Tensor());
  }
  void barrier() override { inner_->barrier(); }
  bool collectives_block_caller() const override { return inner_->collectives_block_caller(); }
  Communicator& backend() override { return inner_->backend(); }

 private:
  static std::unique_ptr<Work> staged(std::unique_ptr<Work> inner, Tensor host, Tensor device) {
    return std::make_unique<StagedWork>(std::move(inner), std::move(host), std::move(device));
  }
  bool foreign(const Tensor& t) const { return t.defined() && t.device() != native_; }
  Tensor staged_copy(const Tensor& t) const { return t.to(native_, MemKind::workspace); }
  Tensor staged_like(const Tensor& t) const { return Tensor::empty(t.shape(), t.dtype(), native_, MemKind::workspace); }

  std::unique_ptr<Communicator> inner_;
  Device native_;
};

}  // namespace

std::unique_ptr<Communicator> make_staged_communicator(std::unique_ptr<Communicator> inner, Device native) {
  return std::make_unique<StagedCommunicator>(std::move(inner), native);
}

}  // namespace mt
