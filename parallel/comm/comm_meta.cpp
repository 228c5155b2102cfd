// comm_meta.cpp: the communicator of a meta run (core/meta/meta.h): one rank of a group that is not there. Every op
// checks its arguments, moves no data and is done when it returns (on the calling thread, in program order, so a
// measured step is the same every time); outputs with memory behind them get this rank's own data, as if every
// rank of the group held what this one holds: balanced by construction. It mirrors the workspaces a real Gloo
// group allocates inside its ops (the fp32 copies of 16-bit reductions and the reduce-scatter's blocks,
// parallel/comm/comm_gloo.cpp); an NCCL group allocates none.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "core/meta/meta.h"
#include "parallel/comm/communicator.h"
#include "parallel/comm/group.h"

namespace mt {
namespace {

class CompletedWork final : public Work {
 public:
  void wait() override {}
};

bool backed(const Tensor& t) { return t.defined() && t.numel() > 0 && !meta::is_unbacked(t.raw()); }

class MetaCommunicator final : public Communicator {
 public:
  explicit MetaCommunicator(MetaCommOptions opt) : opt_(std::move(opt)) {
    if (opt_.size < 1 || opt_.rank < 0 || opt_.rank >= opt_.size)
      throw CommError(fmt::format("{}: rank {} of a group of {}", opt_.name, opt_.rank, opt_.size));
  }

  int rank() const override { return opt_.rank; }
  int size() const override { return opt_.size; }
  const std::string& name() const override { return opt_.name; }

  std::unique_ptr<Work> all_reduce(Tensor& t, ReduceOp op) override {
    check(t, "all_reduce");
    if (opt_.gloo && size() > 1 && is_16bit(t)) gloo_workspace({t.numel()}, t);
    if (op == ReduceOp::sum && size() > 1 && backed(t) && t.dtype() == DType::f64) gather_by_sum(t);
    return done();
  }
  std::unique_ptr<Work> reduce_scatter(const Tensor& in, Tensor& out) override {
    check(in, "reduce_scatter");
    check(out, "reduce_scatter");
    if (in.dtype() != out.dtype() || in.numel() != size() * out.numel())
      throw misuse("reduce_scatter",
                   fmt::format("input {} is not {} blocks of output {}", in.describe(), size(), out.describe()));
    if (opt_.gloo && size() > 1 && out.numel() > 0) {
      Tensor mine = is_16bit(in) ? gloo_workspace({in.numel()}, in) : Tensor();
      Tensor blocks = gloo_workspace({in.numel()}, in);
    }
    if (backed(in) && backed(out))
      out.copy_from(in.view({in.numel()}).slice(rank() * out.numel(), (rank() + 1) * out.numel()));
    return done();
  }
  std::unique_ptr<Work> all_gather(const Tensor& in, Tensor& out) override {
    check(in, "all_gather");
    check(out, "all_gather");
    if (in.dtype() != out.dtype() || out.numel() != size() * in.numel())
      throw misuse("all_gather",
                   fmt::format("output {} is not {} blocks of input {}", out.describe(), size(), in.describe()));
    if (!backed(out) || in.numel() == 0) return done();
    const int64_t n = in.numel();
    Tensor flat = out.view({out.numel()});
    for (int q = 0; q < size(); ++q) flat.slice(q * n, (q + 1) * n).copy_from(in.view({n}));
    return done();
  }
  std::unique_ptr<Work> broadcast(Tensor& t, int root) override {
    check(t, "broadcast");
    if (root < 0 || root >= size()) throw misuse("broadcast", fmt::format("root {} is outside the group", root));
    return done();
  }
  std::unique_ptr<Work> send(const Tensor& t, int peer, int) override {
    check(t, "send");
    check_peer(peer, "send");
    return done();
  }
  std::unique_ptr<Work> recv(Tensor& t, int peer, int) override {
    check(t, "recv");
    check_peer(peer, "recv");
    return done();
  }
  std::unique_ptr<Work> all_to_all(const Tensor& in, const std::vector<int64_t>& send_counts, Tensor& out,
                                   const std::vector<int64_t>& recv_counts) override {
    check_all_to_all(*this, in, send_counts, out, recv_counts);
    return done();
  }
  void barrier() override {}
  bool collectives_block_caller() const override { return false; }

 private:
  static std::unique_ptr<Work> done() { return std::make_unique<CompletedWork>(); }
  // A sum of doubles (sum_doubles) that gathers: every rank fills its own block and leaves the
  // others zero (the MoE layer's counts per rank and expert, models/moe_mlp.cpp plan_exchange). Every block gets
  // this rank's, the others' raised by receive_factor's share. A sum of anything else is left as this rank's.
  void gather_by_sum(Tensor& t) const {
    if (t.numel() % size() != 0) return;
    const int64_t n = t.numel() / size();
    auto* v = static_cast<double*>(t.raw());
    for (int64_t i = 0; i < t.numel(); ++i)
      if (v[i] != 0 && i / n != rank()) return;
    const double g = (opt_.receive_factor * size() - 1) / (size() - 1);
    for (int q = 0; q < size(); ++q)
      if (q != rank())
        for (int64_t i = 0; i < n; ++i) v[q * n + i] = std::round(v[rank() * n + i] * g);
  }
  static bool is_16bit(const Tensor& t) { return t.dtype() == DType::bf16 || t.dtype() == DType::f16; }
  // An fp32 workspace where Gloo makes one, on the device of the tensor it stands beside.
  static Tensor gloo_workspace(const Shape& shape, const Tensor& beside) {
    return Tensor::empty(shape, DType::f32, beside.device(), MemKind::workspace);
  }
  CommError misuse(std::string_view op, const std::string& what) const {
    return CommError(fmt::format("{}: {} on rank {}: {}", opt_.name, op, opt_.rank, what));
  }
  void check(const Tensor& t, std::string_view op) const {
    if (!t.defined()) throw misuse(op, "undefined tensor");
  }
  void check_peer(int peer, std::string_view op) const {
    if (peer < 0 || peer >= size() || peer == rank())
      throw misuse(op, fmt::format("peer {} is not another rank of the group of {}", peer, size()));
  }

  MetaCommOptions opt_;
};

}  // namespace

std::unique_ptr<Communicator> make_meta_communicator(MetaCommOptions opt) {
  return std::make_unique<MetaCommunicator>(std::move(opt));
}

}  // namespace mt
