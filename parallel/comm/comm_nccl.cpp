// comm_nccl.cpp: the NCCL communicator (GPU ranks). Every op is enqueued on the communicator's own CUDA
// stream after the work already queued on the compute stream (an event), and Work::wait() makes the compute
// stream wait for it in turn (cudaStreamWaitEvent): the host never waits for a transfer inside a step. The
// tensors an op uses are marked for the caching allocator (record_stream), so their blocks are not reused
// before the op is done even if the tensors are freed first.
//
// Nothing hangs: a watchdog thread (one per process) watches every communicator's ops in flight and NCCL's
// asynchronous errors; an op that has not completed within the timeout, or an error, aborts the
// communicator (ncclCommAbort ends its kernels, so a stream or host waiting on them moves on), and every
// later op of that communicator throws CommError naming the first failure. The barrier is the one op whose
// wait blocks the host, polling against the timeout itself. The communicator is non-blocking
// (ncclConfig_t::blocking = 0) for the same reason: init, split and enqueue can be abandoned when they do
// not finish in time.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <string_view>
#include <thread>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "core/cuda/runtime.h"
#include "parallel/comm/communicator.h"
#include "parallel/comm/comm_nccl_detail.h"
#include "parallel/comm/group.h"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "megatrain needs NCCL 2.18 or newer (non-blocking communicators, ncclCommFinalize, ncclCommSplit)"
#endif

namespace mt {

using namespace nccl_detail;  // NOLINT(google-build-using-namespace): the group state and the watchdog

namespace {

class CompletedWork final : public Work {
 public:
  void wait() override {}
};

// How a Work's wait() waits: the compute stream waits for the op (every op inside a step), or the host does
// (the barrier, which is host-side synchronisation by definition).
enum class WaitOn { stream, host };

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<NcclGroup> group, std::shared_ptr<OpRecord> rec, WaitOn on = WaitOn::stream)
      : group_(std::move(group)), rec_(std::move(rec)), on_(on) {}

  // A send/recv dropped before it was issued is abandoned (as with Gloo); an issued op stays in the group's
  // in-flight list for the watchdog, and its tensors' blocks stay reserved until it completes (record_stream).
  ~NcclWork() override {
    std::lock_guard lock(group_->mu);
    if (!rec_->done) std::erase(group_->queued, rec_);
  }

  void wait() override {
    if (error_) std::rethrow_exception(error_);
    if (done_) return;
    try {
      if (on_ == WaitOn::host)
        wait_until_complete();
      else
        order_compute_stream_after();
      done_ = true;
    } catch (const CommError&) {
      error_ = std::current_exception();
      throw;
    }
  }

  // Issues a queued send/recv (with the rest of its batch) on the comm stream now: the context-parallel ring posts
  // the next block's transfer and starts it before computing the current block, so the two overlap.
  void start() override {
    NcclGroup& g = *group_;
    std::lock_guard lock(g.mu);
    g.throw_if_broken(rec_->op);
    if (rec_->done) return;
    DeviceGuard device(g.info.device);
    g.check_cuda(device.status(), "cudaSetDevice", rec_->op);
    g.issue_queued();
  }

 private:
  // Issues the op if it is a queued send/recv, then makes the compute stream wait for it. No host wait: a
  // stall or failure is the watchdog's to find, and shows here (or at the next op) as CommError.
  void order_compute_stream_after() {
    NcclGroup& g = *group_;
    std::lock_guard lock(g.mu);
    g.throw_if_broken(rec_->op);
    DeviceGuard device(g.info.device);
    g.check_cuda(device.status(), "cudaSetDevice", rec_->op);
    if (!rec_->done) g.issue_queued();
    g.check_cuda(cudaStreamWaitEvent(static_cast<cudaStream_t>(cuda::compute_stream()), rec_->done, 0),
                 "cudaStreamWaitEvent", rec_->op);
  }

  void wait_until_complete() {
    NcclGroup& g = *group_;
    const auto deadline = Clock::now() + g.info.timeout;
    Backoff backoff;
    for (;;) {
      {
        std::lock_guard lock(g.mu);
        g.throw_if_broken(rec_->op);
        if (!rec_->done) {  // a queued send/recv: issue its batch now
          DeviceGuard device(g.info.device);
          g.check_cuda(device.status(), "cudaSetDevice", rec_->op);
          g.issue_queued();
        }
        cudaError_t q = cudaEventQuery(rec_->done);
        if (q == cudaSuccess) {
          g.prune();
          return;
        }
        if (q != cudaErrorNotReady) throw g.fail(rec_->op, "failed", fmt::format("cudaEventQuery: {}", cuda_text(q)));
        ncclResult_t state = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(g.comm, &state);
        if (r != ncclSuccess)
          throw g.fail(rec_->op, "failed", fmt::format("ncclCommGetAsyncError: {}", ncclGetErrorString(r)));
        if (state != ncclSuccess && state != ncclInProgress)
          throw g.fail(rec_->op, "failed", fmt::format("NCCL asynchronous error: {}", ncclGetErrorString(state)));
        if (Clock::now() >= deadline)
          throw g.fail(rec_->op, "timed out after " + seconds_str(g.info.timeout),
                       "the op did not complete (a peer stopped, or the ranks posted different ops)");
      }
      backoff.pause();
    }
  }

  std::shared_ptr<NcclGroup> group_;
  std::shared_ptr<OpRecord> rec_;
  WaitOn on_;
  bool done_ = false;
  std::exception_ptr error_;
};

ncclDataType_t reduction_type(DType t) {
  switch (t) {
    case DType::f32:
      return ncclFloat32;
    case DType::bf16:
      return ncclBfloat16;
    case DType::f16:
      return ncclFloat16;
    case DType::f64:
      return ncclFloat64;
    default:
      return ncclNumTypes;
  }
}

class NcclCommunicator final : public Communicator {
 public:
  // Takes a group whose communicator is ready, and puts it under the watchdog's eye.
  explicit NcclCommunicator(std::shared_ptr<NcclGroup> group) : group_(std::move(group)) {
    Watchdog::instance().add(group_.get());
  }
  const std::shared_ptr<NcclGroup>& group() const { return group_; }

  int rank() const override { return group_->info.rank; }
  int size() const override { return static_cast<int>(group_->info.members.size()); }
  const std::string& name() const override { return group_->info.name; }

  std::unique_ptr<Work> all_reduce(Tensor& t, ReduceOp op) override {
    return raw_all_reduce(device_buffer(t, "all_reduce"), op, {t});
  }
  std::unique_ptr<Work> reduce_scatter(const Tensor& in, Tensor& out) override {
    return raw_reduce_scatter(device_buffer(in, "reduce_scatter"), device_buffer(out, "reduce_scatter"), {in, out});
  }
  std::unique_ptr<Work> all_gather(const Tensor& in, Tensor& out) override {
    return raw_all_gather(device_buffer(in, "all_gather"), device_buffer(out, "all_gather"), {in, out});
  }
  std::unique_ptr<Work> broadcast(Tensor& t, int root) override {
    return raw_broadcast(device_buffer(t, "broadcast"), root, {t});
  }
  std::unique_ptr<Work> send(const Tensor& t, int peer, int tag) override {
    return raw_post(device_buffer(t, "send"), peer, tag, true, {t});
  }
  std::unique_ptr<Work> recv(Tensor& t, int peer, int tag) override {
    return raw_post(device_buffer(t, "recv"), peer, tag, false, {t});
  }

  // One NCCL group of a send and a receive per peer with a nonzero count (itself included: NCCL copies a
  // rank's block to itself), enqueued like a collective: after any queued send/recv, on the comm stream.
  std::unique_ptr<Work> all_to_all(const Tensor& in, const std::vector<int64_t>& send_counts, Tensor& out,
                                   const std::vector<int64_t>& recv_counts) override {
    const DeviceBuffer src = device_buffer(in, "all_to_all"), dst = device_buffer(out, "all_to_all");
    const AllToAllTotals totals = check_all_to_all(*this, in, send_counts, out, recv_counts);
    const size_t element = dtype_size(in.dtype());
    const std::vector<int64_t> send_at = block_offsets(send_counts), recv_at = block_offsets(recv_counts);
    return collective(
        "all_to_all", {in, out}, totals.sent == 0 && totals.received == 0, "ncclSend/ncclRecv group",
        [&](ncclComm_t comm, cudaStream_t s) {
          auto* from = static_cast<const char*>(src.ptr);
          auto* to = static_cast<char*>(dst.ptr);
          ncclResult_t first = ncclGroupStart();
          if (first != ncclSuccess) return first;
          auto keep_first = [&first](ncclResult_t r) {
            if (r != ncclSuccess && r != ncclInProgress && first == ncclSuccess) first = r;
          };
          for (size_t p = 0; p < send_counts.size(); ++p) {
            const int peer = static_cast<int>(p);
            if (send_counts[p] > 0)
              keep_first(ncclSend(from + send_at[p] * element, send_counts[p] * element, ncclUint8, peer, comm, s));
            if (recv_counts[p] > 0)
              keep_first(ncclRecv(to + recv_at[p] * element, recv_counts[p] * element, ncclUint8, peer, comm, s));
          }
          ncclResult_t end = ncclGroupEnd();  // always closes the group, even after a failed call
          return first != ncclSuccess ? first : end;
        });
  }

  void barrier() override {
    float* one = group_->scratch;  // (1)
    collective(
        "barrier", {}, false, "ncclAllReduce",
        [one](ncclComm_t comm, cudaStream_t s) { return ncclAllReduce(one, one, 1, ncclFloat32, ncclSum, comm, s); },
        WaitOn::host)
        ->wait();
  }

  bool collectives_block_caller() const override { return false; }

  // The ops on device buffers; `tensors` are the tensors (if any) the buffers belong to.
  std::unique_ptr<Work> raw_all_reduce(DeviceBuffer b, ReduceOp op, std::vector<Tensor> tensors) {
    check_reduction(b, "all_reduce");
    const ncclRedOp_t nccl_op = op == ReduceOp::sum ? ncclSum : ncclMax;
    return collective(
        "all_reduce", std::move(tensors), b.numel == 0, "ncclAllReduce", [b, nccl_op](ncclComm_t comm, cudaStream_t s) {
          return ncclAllReduce(b.ptr, b.ptr, static_cast<size_t>(b.numel), reduction_type(b.dtype), nccl_op, comm, s);
        });
  }

  std::unique_ptr<Work> raw_reduce_scatter(DeviceBuffer in, DeviceBuffer out, std::vector<Tensor> tensors) {
    check_reduction(in, "reduce_scatter");
    check_reduction(out, "reduce_scatter");
    if (in.dtype != out.dtype || in.numel != size() * out.numel)
      throw misuse("reduce_scatter", fmt::format("input {}[{}] is not {} blocks of output {}[{}]", dtype_name(in.dtype),
                                                 in.numel, size(), dtype_name(out.dtype), out.numel));
    return collective("reduce_scatter", std::move(tensors), out.numel == 0, "ncclReduceScatter",
                      [in, out](ncclComm_t comm, cudaStream_t s) {
                        return ncclReduceScatter(in.ptr, out.ptr, static_cast<size_t>(out.numel),
                                                 reduction_type(out.dtype), ncclSum, comm, s);
                      });
  }

  std::unique_ptr<Work> raw_all_gather(DeviceBuffer in, DeviceBuffer out, std::vector<Tensor> tensors) {
    check_device(in, "all_gather");
    check_device(out, "all_gather");
    if (in.dtype != out.dtype || out.numel != size() * in.numel)
      throw misuse("all_gather", fmt::format("output {}[{}] is not {} blocks of input {}[{}]", dtype_name(out.dtype),
                                             out.numel, size(), dtype_name(in.dtype), in.numel));
    const size_t bytes = static_cast<size_t>(in.numel) * dtype_size(in.dtype);  // per rank
    return collective("all_gather", std::move(tensors), bytes == 0, "ncclAllGather",
                      [in, out, bytes](ncclComm_t comm, cudaStream_t s) {
                        return ncclAllGather(in.ptr, out.ptr, bytes, ncclUint8, comm, s);
                      });
  }

  std::unique_ptr<Work> raw_broadcast(DeviceBuffer b, int root, std::vector<Tensor> tensors) {
    check_device(b, "broadcast");
    if (root < 0 || root >= size())
      throw misuse("broadcast", fmt::format("root {} is outside the group of {}", root, size()));
    const size_t bytes = static_cast<size_t>(b.numel) * dtype_size(b.dtype);
    return collective("broadcast", std::move(tensors), bytes == 0, "ncclBroadcast",
                      [b, bytes, root](ncclComm_t comm, cudaStream_t s) {
                        return ncclBroadcast(b.ptr, b.ptr, bytes, ncclUint8, root, comm, s);
                      });
  }

  std::unique_ptr<Work> raw_post(DeviceBuffer b, int peer, int tag, bool is_send, std::vector<Tensor> tensors) {
    const char* op = is_send ? "send" : "recv";
    check_device(b, op);
    if (peer < 0 || peer >= size() || peer == rank())
      throw misuse(op, fmt::format("peer {} is not another rank of the group of {}", peer, size()));
    if (tag < 0) throw misuse(op, fmt::format("tag {} is negative", tag));
    if (b.numel == 0) return std::make_unique<CompletedWork>();
    auto rec = std::make_shared<OpRecord>();
    rec->op = fmt::format("{} {}", is_send ? "send to" : "recv from", group_->info.who(peer));
    rec->tensors = std::move(tensors);
    rec->is_send = is_send;
    rec->peer = peer;
    rec->buf = b;
    std::lock_guard lock(group_->mu);
    group_->throw_if_broken(rec->op);
    group_->queued.push_back(rec);
    return std::make_unique<NcclWork>(group_, std::move(rec));
  }

  // Raw buffers come without a device tag: ask CUDA whether the pointer is device memory.
  void check_pointer(const DeviceBuffer& b, std::string_view op) const {
    if (b.numel < 0) throw misuse(op, fmt::format("negative element count {}", b.numel));
    if (b.numel == 0) return;
    cudaPointerAttributes attr{};
    cudaError_t e = cudaPointerGetAttributes(&attr, b.ptr);
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear it: this error is the caller's, not the device's
      throw misuse(op, fmt::format("cudaPointerGetAttributes: {}", cuda_text(e)));
    }
    if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
      throw misuse(op, fmt::format("buffer {} is not CUDA device memory", b.ptr));
  }

 private:
  CommError misuse(std::string_view op, const std::string& what) const { return group_->info.misuse(op, what); }

  DeviceBuffer device_buffer(const Tensor& t, std::string_view op) const {
    if (!t.defined()) throw misuse(op, "undefined tensor");
    if (t.device() != Device::cuda)
      throw misuse(
          op, fmt::format("NCCL moves CUDA tensors only, got a {} tensor {}", device_name(t.device()), t.describe()));
    return DeviceBuffer{t.numel() == 0 ? nullptr : t.raw(), t.numel(), t.dtype()};
  }

  void check_device(const DeviceBuffer& b, std::string_view op) const {
    if (b.numel > 0 && !b.ptr) throw misuse(op, "null buffer");
  }
  void check_reduction(const DeviceBuffer& b, std::string_view op) const {
    check_device(b, op);
    if (!is_floating(b.dtype) && b.dtype != DType::f64)
      throw misuse(op, fmt::format("reductions take f32, bf16, f16 or f64 buffers, got {}", dtype_name(b.dtype)));
  }

  template <class Enqueue>
  std::unique_ptr<Work> collective(std::string_view op, std::vector<Tensor> tensors, bool empty, std::string_view call,
                                   Enqueue&& enqueue, WaitOn on = WaitOn::stream) {
    std::lock_guard lock(group_->mu);
    group_->throw_if_broken(op);
    if (empty) return std::make_unique<CompletedWork>();
    DeviceGuard device(group_->info.device);
    group_->check_cuda(device.status(), "cudaSetDevice", op);
    auto rec = group_->issue(std::string(op), tensors, call, std::forward<Enqueue>(enqueue));
    return std::make_unique<NcclWork>(group_, std::move(rec), on);
  }

  std::shared_ptr<NcclGroup> group_;
};
// The NCCL communicator behind `comm`, looking through wrappers (a staged communicator around NCCL is what
// init_distributed hands out).
NcclCommunicator& nccl_of(Communicator& comm, std::string_view op) {
  auto* nccl = dynamic_cast<NcclCommunicator*>(&comm.backend());
  if (!nccl) throw CommError(fmt::format("{}: {} on raw device buffers needs an NCCL communicator", comm.name(), op));
  return *nccl;
}

}  // namespace

namespace nccl_detail {

std::unique_ptr<Communicator> communicator_of(std::shared_ptr<NcclGroup> group) {
  return std::make_unique<NcclCommunicator>(std::move(group));  // registers with the watchdog
}

NcclGroup& group_of(Communicator& comm, std::string_view op) { return *nccl_of(comm, op).group(); }

}  // namespace nccl_detail

namespace nccl_raw {

std::unique_ptr<Work> all_reduce(Communicator& comm, DeviceBuffer buf, ReduceOp op) {
  auto& c = nccl_of(comm, "all_reduce");
  c.check_pointer(buf, "all_reduce");
  return c.raw_all_reduce(buf, op, {});
}

std::unique_ptr<Work> reduce_scatter(Communicator& comm, DeviceBuffer in, DeviceBuffer out) {
  auto& c = nccl_of(comm, "reduce_scatter");
  c.check_pointer(in, "reduce_scatter");
  c.check_pointer(out, "reduce_scatter");
  return c.raw_reduce_scatter(in, out, {});
}

std::unique_ptr<Work> all_gather(Communicator& comm, DeviceBuffer in, DeviceBuffer out) {
  auto& c = nccl_of(comm, "all_gather");
  c.check_pointer(in, "all_gather");
  c.check_pointer(out, "all_gather");
  return c.raw_all_gather(in, out, {});
}

std::unique_ptr<Work> broadcast(Communicator& comm, DeviceBuffer buf, int root) {
  auto& c = nccl_of(comm, "broadcast");
  c.check_pointer(buf, "broadcast");
  return c.raw_broadcast(buf, root, {});
}

std::unique_ptr<Work> send(Communicator& comm, DeviceBuffer buf, int peer, int tag) {
  auto& c = nccl_of(comm, "send");
  c.check_pointer(buf, "send");
  return c.raw_post(buf, peer, tag, true, {});
}

std::unique_ptr<Work> recv(Communicator& comm, DeviceBuffer buf, int peer, int tag) {
  auto& c = nccl_of(comm, "recv");
  c.check_pointer(buf, "recv");
  return c.raw_post(buf, peer, tag, false, {});
}

}  // namespace nccl_raw
}  // namespace mt
