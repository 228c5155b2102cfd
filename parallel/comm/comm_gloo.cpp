// comm_gloo.cpp: the Gloo communicator (CPU ranks over TCP; small collectives through shared memory on one host).
// Collectives run on the calling thread and return an already-completed Work; send and recv are posted at once and
// complete in Work::wait(), so a pipeline stage can post both directions before waiting on either. The rendezvous
// that makes it: comm_gloo_rendezvous.cpp.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/transport/unbound_buffer.h>

#include "parallel/comm/comm_gloo_detail.h"
#include "parallel/comm/communicator.h"
#include "parallel/comm/group.h"
#include "parallel/comm/shared_rounds.h"

namespace mt {
namespace {

using gloo_detail::GroupInfo;
using gloo_detail::mentions_timeout;
using gloo_detail::seconds_str;

// Slots of our own transfers. Gloo's collectives put a prefix 0x01..0x08 in the slot's top byte and the tag
// below it; ours use prefixes of their own so a user tag never meets a collective's traffic.
constexpr uint64_t kSendRecvSlot = 0x40ull << 56;       // | tag (32 bits)
constexpr uint64_t kReduceScatterSlot = 0x41ull << 56;  // | collective tag << 16
constexpr uint64_t kAllToAllSlot = 0x42ull << 56;       // | collective tag << 16
constexpr uint64_t kAllReduceSlot = 0x43ull << 56;      // | collective tag << 16

// All-reduces of at most this many bytes exchange whole buffers in one round (GlooCommunicator::all_reduce).
constexpr size_t kDirectAllReduceBytes = 64 << 10;

// Element-wise reductions for gloo::allreduce: c = a op b over n floats (F: float or double).
template <class F>
void sum_of(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<F*>(c);
  auto* x = static_cast<const F*>(a);
  auto* y = static_cast<const F*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = x[i] + y[i];
}
// Propagates NaN whichever operand holds it (std::max would drop a NaN in its second argument), so an
// inf/NaN check reduced with max sees every rank's NaN.
template <class F>
void max_of(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<F*>(c);
  auto* x = static_cast<const F*>(a);
  auto* y = static_cast<const F*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = (x[i] != x[i] || x[i] > y[i]) ? x[i] : y[i];
}
void sum_f32(void* c, const void* a, const void* b, size_t n) { sum_of<float>(c, a, b, n); }

class CompletedWork final : public Work {
 public:
  void wait() override {}
};

// A posted send or recv; wait() blocks on the transport. Dropping it unwaited abandons the transfer
// without blocking (the transport holds only weak references to the buffer), which is what unwinding
// after another error needs.
class SendRecvWork final : public Work {
 public:
  SendRecvWork(std::shared_ptr<const GroupInfo> group, std::shared_ptr<gloo::Context> context, Tensor tensor,
               std::unique_ptr<gloo::transport::UnboundBuffer> buffer, bool is_send, int peer)
      : group_(std::move(group)), context_(std::move(context)), tensor_(std::move(tensor)), buffer_(std::move(buffer)),
        is_send_(is_send), peer_(peer) {}

  void wait() override {
    if (error_) std::rethrow_exception(error_);
    if (done_) return;
    try {
      bool completed = is_send_ ? buffer_->waitSend(group_->timeout) : buffer_->waitRecv(group_->timeout);
      if (!completed) throw std::runtime_error("aborted");
      done_ = true;
    } catch (const std::exception& e) {
      try {
        group_->throw_if_broken(fmt::format("{} {}", is_send_ ? "send to" : "recv from", group_->who(peer_)));
        error_ = std::make_exception_ptr(failure(e));
      } catch (const CommError&) {
        error_ = std::current_exception();
      }
      std::rethrow_exception(error_);
    }
  }

 private:
  CommError failure(const std::exception& e) const {
    const GroupInfo& g = *group_;
    bool timed_out = mentions_timeout(e.what());
    CommError error(fmt::format("{}: {} {} {} on {}: {}", g.name, is_send_ ? "send to" : "recv from", g.who(peer_),
                                timed_out ? "timed out after " + seconds_str(g.timeout) : std::string("failed"),
                                g.who(g.rank), e.what()));
    g.record_failure(error.what());
    return error;
  }

  std::shared_ptr<const GroupInfo> group_;
  std::shared_ptr<gloo::Context> context_;  // keeps the pairs alive while the transfer is in flight
  Tensor tensor_;                           // keeps the storage alive likewise
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer_;
  bool is_send_;
  int peer_;
  bool done_ = false;
  std::exception_ptr error_;
};

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<const GroupInfo> group, std::shared_ptr<gloo::Context> context)
      : group_(std::move(group)), context_(std::move(context)), shm_(group_->shm.get()) {}

  int rank() const override { return group_->rank; }
  int size() const override { return static_cast<int>(group_->members.size()); }
  const std::string& name() const override { return group_->name; }

  std::unique_ptr<Work> all_reduce(Tensor& t, ReduceOp op) override {
    check_host(t, "all_reduce", /*reduction=*/true);
    uint32_t tag = next_tag_++;
    if (size() == 1 || t.numel() == 0) return done();
    // F: float or double; `data` holds n elements, reduced in place on every rank.
    auto reduce = [&]<class F>(F* data, size_t n) {
      if (n * sizeof(F) <= kDirectAllReduceBytes) return direct_all_reduce(data, n, op, tag);
      guarded("all_reduce", [&] {
        gloo::AllreduceOptions o(context_);
        o.setOutput(data, n);
        o.setReduceFunction(op == ReduceOp::sum ? &sum_of<F> : &max_of<F>);
        o.setTag(tag);
        o.setTimeout(group_->timeout);
        gloo::allreduce(o);
      });
    };
    if (t.dtype() == DType::f64) {  // sums of doubles (losses, grad-norm partials) stay doubles
      reduce(t.data<double>(), static_cast<size_t>(t.numel()));
      return done();
    }
    // Gloo has no bf16: 16-bit types are reduced in fp32 and rounded back once (nearest even).
    Tensor acc = t;
    if (t.dtype() != DType::f32) {
      acc = Tensor::empty({t.numel()}, DType::f32, Device::cpu, MemKind::workspace);
      acc.copy_from(t);
    }
    reduce(acc.data<float>(), static_cast<size_t>(acc.numel()));
    if (t.dtype() != DType::f32) t.copy_from(acc);
    return done();
  }

  // Every element is summed in rank order, ((x_0 + x_1) + x_2) + ..., whichever block (owner) it falls in, so
  // the result does not depend on how a caller cuts a buffer into blocks (the distributed optimizer shards
  // per gradient bucket, and layouts must agree bit for bit). Each rank sends block j straight to its owner
  // j and the owner adds the size contributions in rank order: every rank sends (size - 1) / size of the
  // buffer once, the bytes of a ring (a ring's sum order depends on the block's position in the ring). The
  // 2022 Gloo has no options-style reduce-scatter.
  std::unique_ptr<Work> reduce_scatter(const Tensor& in, Tensor& out) override {
    check_host(in, "reduce_scatter", true);
    check_host(out, "reduce_scatter", true);
    if (in.dtype() != out.dtype() || in.numel() != size() * out.numel())
      throw group_->misuse("reduce_scatter", fmt::format("input {} is not {} blocks of output {}", in.describe(),
                                                         size(), out.describe()));
    uint32_t tag = next_tag_++;
    const int64_t m = out.numel();  // elements per block
    if (size() == 1) {
      out.copy_from(in);
      return done();
    }
    if (m == 0) return done();
    const int n = size(), r = rank();
    // What is sent: `in` itself when it is f32 (the gradient buffer's case: no copy of the bucket), else an f32
    // copy. Every send completes before `out`, which may be a block of `in`, is written.
    Tensor mine;  // (n * m) f32
    if (in.dtype() == DType::f32) {
      mine = in.view({in.numel()});
    } else {
      mine = Tensor::empty({in.numel()}, DType::f32, Device::cpu, MemKind::workspace);
      mine.copy_from(in);
    }
    // Block r of every rank, in rank order (the same workspace on both paths: the planner's memory model counts it).
    Tensor blocks = Tensor::empty({n * m}, DType::f32, Device::cpu, MemKind::workspace);
    const size_t block_bytes = static_cast<size_t>(m) * sizeof(float);
    if (shm_fits(static_cast<size_t>(mine.nbytes()))) {  // every rank's whole buffer is its part
      guarded("reduce_scatter", [&] { shm_->round(mine.raw(), static_cast<size_t>(mine.nbytes())); });
      for (int j = 0; j < n; ++j)
        std::memcpy(blocks.data<float>() + static_cast<int64_t>(j) * m, shm_->part(j) + r * block_bytes, block_bytes);
    } else {
      guarded("reduce_scatter", [&] {
        auto send_buf = context_->createUnboundBuffer(mine.raw(), mine.nbytes());
        auto recv_buf = context_->createUnboundBuffer(blocks.raw(), blocks.nbytes());
        const uint64_t slot = kReduceScatterSlot | (static_cast<uint64_t>(tag) << 16);
        for (int j = 0; j < n; ++j) {
          if (j == r) continue;
          recv_buf->recv(j, slot, static_cast<size_t>(j) * block_bytes, block_bytes);
          send_buf->send(j, slot, static_cast<size_t>(j) * block_bytes, block_bytes);
        }
        for (int k = 0; k < n - 1; ++k)
          if (!recv_buf->waitRecv(group_->timeout) || !send_buf->waitSend(group_->timeout))
            throw std::runtime_error("aborted");
      });
      blocks.slice(r * m, (r + 1) * m).copy_from(mine.slice(r * m, (r + 1) * m));
    }
    float* sum = blocks.data<float>();  // rank 0's block accumulates those of ranks 1 .. n-1, in rank order
    for (int j = 1; j < n; ++j) sum_f32(sum, sum, sum + static_cast<int64_t>(j) * m, static_cast<size_t>(m));
    out.copy_from(blocks.slice(0, m));
    return done();
  }

  std::unique_ptr<Work> all_gather(const Tensor& in, Tensor& out) override {
    check_host(in, "all_gather", false);
    check_host(out, "all_gather", false);
    if (in.dtype() != out.dtype() || out.numel() != size() * in.numel())
      throw group_->misuse(
          "all_gather", fmt::format("output {} is not {} blocks of input {}", out.describe(), size(), in.describe()));
    uint32_t tag = next_tag_++;
    if (size() == 1) {
      out.copy_from(in);
      return done();
    }
    if (in.numel() == 0) return done();
    if (shm_fits(static_cast<size_t>(in.nbytes())) ||
        static_cast<size_t>(out.nbytes()) <= kDirectAllReduceBytes) {  // one round, as direct_all_reduce
      exchange_blocks("all_gather", in.raw(), static_cast<size_t>(in.nbytes()), out.raw(), tag);
      return done();
    }
    guarded("all_gather", [&] {
      gloo::AllgatherOptions o(context_);
      o.setInput(in.data<uint8_t>(), in.nbytes());
      o.setOutput(out.data<uint8_t>(), out.nbytes());
      o.setTag(tag);
      o.setTimeout(group_->timeout);
      gloo::allgather(o);
    });
    return done();
  }

  std::unique_ptr<Work> broadcast(Tensor& t, int root) override {
    check_host(t, "broadcast", false);
    if (root < 0 || root >= size())
      throw group_->misuse("broadcast", fmt::format("root {} is outside the group of {}", root, size()));
    uint32_t tag = next_tag_++;
    if (size() == 1 || t.numel() == 0) return done();
    if (const size_t bytes = static_cast<size_t>(t.nbytes()); shm_fits(bytes)) {
      const bool root_here = rank() == root;
      guarded("broadcast", [&] {
        shm_->round(root_here ? t.raw() : nullptr, root_here ? bytes : 0, /*same_size=*/false);
        if (shm_->part_bytes(root) != bytes)
          throw SharedRoundError(fmt::format("the root, {}, broadcasts {} bytes, this rank expects {}",
                                             group_->who(root), shm_->part_bytes(root), bytes));
      });
      if (!root_here) std::memcpy(t.raw(), shm_->part(root), bytes);
      return done();
    }
    guarded("broadcast", [&] {
      gloo::BroadcastOptions o(context_);
      o.setOutput(t.data<uint8_t>(), t.nbytes());
      o.setRoot(root);
      o.setTag(tag);
      o.setTimeout(group_->timeout);
      gloo::broadcast(o);
    });
    return done();
  }

  // Each rank posts a receive for every peer that sends it something and a send for every peer it sends
  // something, on one unbound buffer each (gloo::alltoallv's pattern, without zero-length messages), and
  // copies its own block locally. Counts that disagree between two ranks break the protocol: the receiver
  // times out, or a peer's transport fails (see on_terminate below).
  std::unique_ptr<Work> all_to_all(const Tensor& in, const std::vector<int64_t>& send_counts, Tensor& out,
                                   const std::vector<int64_t>& recv_counts) override {
    check_host(in, "all_to_all", false);
    check_host(out, "all_to_all", false);
    const AllToAllTotals totals = check_all_to_all(*this, in, send_counts, out, recv_counts);
    uint32_t tag = next_tag_++;
    const int n = size(), r = rank();
    const std::vector<int64_t> send_at = block_offsets(send_counts), recv_at = block_offsets(recv_counts);
    copy_elements(in, send_at[r], out, recv_at[r], send_counts[r]);
    if (n == 1) return done();
    const size_t element = dtype_size(in.dtype());
    if (shm_ && shared_all_to_all(in, send_counts, totals.sent, out, recv_at, recv_counts, element)) return done();
    if (totals.sent + totals.received == send_counts[r] + recv_counts[r]) return done();
    guarded("all_to_all", [&] {
      std::unique_ptr<gloo::transport::UnboundBuffer> send_buf, recv_buf;
      if (totals.sent > 0)
        send_buf = context_->createUnboundBuffer(in.raw(), static_cast<size_t>(totals.sent) * element);
      if (totals.received > 0)
        recv_buf = context_->createUnboundBuffer(out.raw(), static_cast<size_t>(totals.received) * element);
      const uint64_t slot = kAllToAllSlot | (static_cast<uint64_t>(tag) << 16);
      int sends = 0, recvs = 0;
      for (int k = 1; k < n; ++k) {  // peers in ring order from this rank, so no peer is everyone's first
        const int to = (r + k) % n, from = (r + n - k) % n;
        if (recv_counts[from] > 0) {
          recv_buf->recv(from, slot, static_cast<size_t>(recv_at[from]) * element,
                         static_cast<size_t>(recv_counts[from]) * element);
          ++recvs;
        }
        if (send_counts[to] > 0) {
          send_buf->send(to, slot, static_cast<size_t>(send_at[to]) * element,
                         static_cast<size_t>(send_counts[to]) * element);
          ++sends;
        }
      }
      for (int k = 0; k < recvs; ++k)
        if (!recv_buf->waitRecv(group_->timeout)) throw std::runtime_error("aborted");
      for (int k = 0; k < sends; ++k)
        if (!send_buf->waitSend(group_->timeout)) throw std::runtime_error("aborted");
    });
    return done();
  }

  // all_to_all through the shared segment: each rank's part is its total element count (-1 when its blocks do not
  // fit), its send counts and its blocks. Every rank sees every part's count, so all go back to Gloo (false) alike
  // when one did not fit. A peer whose count for this rank differs from recv_counts breaks the protocol: CommError.
  bool shared_all_to_all(const Tensor& in, const std::vector<int64_t>& send_counts, int64_t sent, Tensor& out,
                         const std::vector<int64_t>& recv_at, const std::vector<int64_t>& recv_counts, size_t element) {
    const int n = size(), r = rank();
    const size_t head = sizeof(int64_t) * static_cast<size_t>(n + 1);
    const bool fits = head + static_cast<size_t>(sent) * element <= SharedRounds::kSlotBytes;
    std::vector<std::byte> part(fits ? head + static_cast<size_t>(sent) * element : head);
    const int64_t total = fits ? sent : -1;
    std::memcpy(part.data(), &total, sizeof total);
    std::memcpy(part.data() + sizeof total, send_counts.data(), sizeof(int64_t) * static_cast<size_t>(n));
    if (fits && sent > 0) std::memcpy(part.data() + head, in.raw(), static_cast<size_t>(sent) * element);
    guarded("all_to_all", [&] { shm_->round(part.data(), part.size(), /*same_size=*/false); });
    std::vector<std::vector<int64_t>> counts(static_cast<size_t>(n));  // rank j's send counts
    for (int j = 0; j < n; ++j) {
      const auto* head_j = reinterpret_cast<const int64_t*>(shm_->part(j));
      if (head_j[0] < 0) return false;
      counts[static_cast<size_t>(j)].assign(head_j + 1, head_j + 1 + n);
    }
    for (int j = 0; j < n; ++j) {
      if (j == r) continue;
      const std::vector<int64_t>& c = counts[static_cast<size_t>(j)];
      if (c[static_cast<size_t>(r)] != recv_counts[j]) {
        CommError e =
            group_->misuse("all_to_all", fmt::format("{} sends {} elements, this rank expects {}: the counts disagree",
                                                     group_->who(j), c[static_cast<size_t>(r)], recv_counts[j]));
        group_->record_failure(e.what());
        throw e;
      }
      if (recv_counts[j] > 0)  // rank j's block for this rank, where block_offsets puts it among j's blocks
        std::memcpy(static_cast<std::byte*>(out.raw()) + static_cast<size_t>(recv_at[j]) * element,
                    shm_->part(j) + head + static_cast<size_t>(block_offsets(c)[static_cast<size_t>(r)]) * element,
                    static_cast<size_t>(recv_counts[j]) * element);
    }
    return true;
  }

  // A small all-reduce (tensor-parallel activations on CPU ranks, losses, norms, small gradient buckets): each rank
  // sends its whole buffer to every other in one round and combines all of them in rank order, ((x_0 + x_1) + x_2)
  // + ..., as reduce_scatter does. A ring takes 2 (n - 1) rounds, and with more ranks than cores each round waits for
  // a scheduler wake-up (4 tensor ranks on 2 cores: 1.1 s an iteration of the layout matrix's model against 0.1 s
  // with 2). Every rank combines the same buffers in the same order: the results agree bit for bit. The n copies are
  // at most n * kDirectAllReduceBytes, outside the allocator as Gloo's own ring buffers are.
  template <class F>
  void direct_all_reduce(F* data, size_t n, ReduceOp op, uint32_t tag) {
    const int size = this->size();
    std::vector<F> all(static_cast<size_t>(size) * n);  // rank j's buffer at j * n
    exchange_blocks("all_reduce", data, n * sizeof(F), all.data(), tag);
    const auto combine = op == ReduceOp::sum ? &sum_of<F> : &max_of<F>;
    std::copy(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n), data);
    for (int j = 1; j < size; ++j) combine(data, data, all.data() + static_cast<size_t>(j) * n, n);
  }

  // Every rank's `bytes` at `mine` into block j of `all` (size * bytes) on every rank, rank j's block j: one shared
  // round, or one round of a send to and a receive from each peer (guarded: a failure is a CommError naming `op`).
  // `mine` may be this rank's block of `all`.
  void exchange_blocks(std::string_view op, const void* mine, size_t bytes, void* all, uint32_t tag) {
    const int size = this->size(), r = rank();
    if (shm_fits(bytes)) {
      guarded(op, [&] { shm_->round(mine, bytes); });
      for (int j = 0; j < size; ++j)
        std::memcpy(static_cast<char*>(all) + static_cast<size_t>(j) * bytes, shm_->part(j), bytes);
      return;
    }
    std::memmove(static_cast<char*>(all) + static_cast<size_t>(r) * bytes, mine, bytes);
    guarded(op, [&] {
      auto send_buf = context_->createUnboundBuffer(const_cast<void*>(mine), bytes);
      auto recv_buf = context_->createUnboundBuffer(all, static_cast<size_t>(size) * bytes);
      const uint64_t slot = kAllReduceSlot | (static_cast<uint64_t>(tag) << 16);
      for (int k = 1; k < size; ++k) {  // peers in ring order from this rank, so no peer is everyone's first
        const int to = (r + k) % size, from = (r + size - k) % size;
        recv_buf->recv(from, slot, static_cast<size_t>(from) * bytes, bytes);
        send_buf->send(to, slot, 0, bytes);
      }
      for (int k = 1; k < size; ++k)
        if (!recv_buf->waitRecv(group_->timeout) || !send_buf->waitSend(group_->timeout))
          throw std::runtime_error("aborted");
    });
  }

  std::unique_ptr<Work> send(const Tensor& t, int peer, int tag) override { return post(t, peer, tag, true); }
  std::unique_ptr<Work> recv(Tensor& t, int peer, int tag) override { return post(t, peer, tag, false); }

  bool collectives_block_caller() const override { return true; }

  void barrier() override {
    uint32_t tag = next_tag_++;
    if (size() == 1) return;
    if (shm_) {
      guarded("barrier", [&] { shm_->round(nullptr, 0); });
      return;
    }
    guarded("barrier", [&] {
      gloo::BarrierOptions o(context_);
      o.setTag(tag);
      o.setTimeout(group_->timeout);
      gloo::barrier(o);
    });
  }

 private:
  static std::unique_ptr<Work> done() { return std::make_unique<CompletedWork>(); }

  // Whether a collective whose part per rank is `bytes` (the same on every rank) goes through shared memory.
  bool shm_fits(size_t bytes) const { return shm_ && bytes <= SharedRounds::kSlotBytes; }

  void check_host(const Tensor& t, std::string_view op, bool reduction) const {
    if (!t.defined()) throw group_->misuse(op, "undefined tensor");
    if (t.device() != Device::cpu)
      throw group_->misuse(op, fmt::format("Gloo moves host tensors only, got a {} tensor", device_name(t.device())));
    if (reduction && !is_floating(t.dtype()) && !(op == "all_reduce" && t.dtype() == DType::f64))
      throw group_->misuse(
          op, fmt::format("reductions take f32, bf16 or f16 tensors (and all_reduce f64), got {}", t.describe()));
  }

  template <class F>
  void guarded(std::string_view op, F&& f) {
    group_->throw_if_broken(op);
    try {
      f();
    } catch (const std::exception& e) {  // gloo::IoException, gloo::Exception, gloo::EnforceNotMet, ...
      group_->throw_if_broken(op);       // a pair closed by an earlier failure: report that one
      throw group_->failure(op, e);
    }
  }

  std::unique_ptr<Work> post(const Tensor& t, int peer, int tag, bool is_send) {
    const char* op = is_send ? "send" : "recv";
    check_host(t, op, false);
    if (peer < 0 || peer >= size() || peer == rank())
      throw group_->misuse(op, fmt::format("peer {} is not another rank of the group of {}", peer, size()));
    if (tag < 0) throw group_->misuse(op, fmt::format("tag {} is negative", tag));
    if (t.nbytes() == 0) return done();
    const uint64_t slot = kSendRecvSlot | static_cast<uint32_t>(tag);
    std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
    guarded(op, [&] {
      buffer = context_->createUnboundBuffer(t.raw(), t.nbytes());
      if (is_send)
        buffer->send(peer, slot);
      else
        buffer->recv(peer, slot);
    });
    return std::make_unique<SendRecvWork>(group_, context_, t, std::move(buffer), is_send, peer);
  }

  std::shared_ptr<const GroupInfo> group_;
  std::shared_ptr<gloo::Context> context_;
  SharedRounds* shm_;      // group_->shm
  uint32_t next_tag_ = 0;  // collectives run in the same order on every rank, so the tags agree
};
}  // namespace

namespace gloo_detail {
std::unique_ptr<Communicator> make_communicator(std::shared_ptr<const GroupInfo> group,
                                                std::shared_ptr<gloo::Context> context) {
  return std::make_unique<GlooCommunicator>(std::move(group), std::move(context));
}
}  // namespace gloo_detail

}  // namespace mt
