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
#include "parallel/communicator.h"
#include "parallel/group.h"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "megatrain needs NCCL 2.18 or newer (non-blocking communicators, ncclCommFinalize, ncclCommSplit)"
#endif

namespace mt {
namespace {

using Clock = std::chrono::steady_clock;
using nccl_raw::DeviceBuffer;

std::string seconds_str(Millis t) { return fmt::format("{:g} s", static_cast<double>(t.count()) / 1000.0); }
std::string cuda_text(cudaError_t e) { return fmt::format("{} ({})", cudaGetErrorName(e), cudaGetErrorString(e)); }

// Polls fast at first (a tensor-parallel all-reduce finishes in microseconds), then backs off to 1 ms.
class Backoff {
 public:
  void pause() {
    if (++polls_ < 64) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, std::chrono::microseconds(1000));
  }

 private:
  int polls_ = 0;
  std::chrono::microseconds sleep_{10};
};

// Makes `device` current for the scope and restores the caller's device afterwards.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : device_(device) {
    // Bind this thread to the process's device first (core/cuda/runtime), so that the restore below never
    // leaves the thread on another device than the one the runtime believes it is bound to.
    try {
      cuda::current_device();
    } catch (const std::exception&) {
      // no usable device: the cudaSetDevice below reports it
    }
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device_) status_ = cudaSetDevice(device_);
  }
  ~DeviceGuard() {
    if (previous_ >= 0 && previous_ != device_ && status_ == cudaSuccess) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  cudaError_t status() const { return status_; }

 private:
  int device_;
  int previous_ = -1;
  cudaError_t status_ = cudaSuccess;
};

// What every message names: the group, this rank, its GPU, the timeout.
struct GroupInfo {
  std::string name;
  std::vector<int> members;  // global ranks
  int rank = 0;              // within the group
  int device = 0;            // CUDA ordinal
  Millis timeout{0};

  std::string who(int r) const { return fmt::format("rank {} (global {})", r, members.at(r)); }
  std::string here() const { return fmt::format("{} on GPU {}", who(rank), device); }
  CommError misuse(std::string_view op, const std::string& what) const {
    return CommError(fmt::format("{}: {} on {}: {}", name, op, who(rank), what));
  }
};

// One op on the stream: issued (done != nullptr) or, for send/recv, queued until the batch is issued.
struct OpRecord {
  OpRecord() = default;
  OpRecord(const OpRecord&) = delete;
  OpRecord& operator=(const OpRecord&) = delete;
  ~OpRecord() {
    if (done) cudaEventDestroy(done);
  }
  std::string op;               // for messages: "all_reduce", "send to rank 1 (global 3)"
  cudaEvent_t done = nullptr;   // recorded on the stream right after the op
  Clock::time_point issued_at;  // when it was enqueued (the watchdog's timeout runs from here)
  // Queued send/recv only.
  std::vector<Tensor> tensors;  // kept alive until issued, then marked for the allocator and released
  bool is_send = false;
  int peer = -1;
  DeviceBuffer buf;
};

// The state a communicator and its Works share. Every member below `mu` is guarded by it, and every
// method expects it held: Works may be waited on from another thread than the one posting ops.
class NcclGroup {
 public:
  explicit NcclGroup(GroupInfo info_) : info(std::move(info_)) {}
  ~NcclGroup();
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  const GroupInfo info;
  std::mutex mu;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;                 // all of this communicator's ops, in posting order
  cudaEvent_t inputs_ready = nullptr;            // orders each op after the work queued on the default stream
  float* scratch = nullptr;                      // (1) on the device, for barrier
  std::string first_failure;                     // the message of the first failure; the group is aborted from then on
  std::deque<std::shared_ptr<OpRecord>> queued;  // send/recv posted, not yet issued
  std::deque<std::shared_ptr<OpRecord>> in_flight;  // issued, maybe not complete, in stream order (watchdog)

  // Aborts the communicator (so peers' ops fail instead of hanging), remembers the first failure and
  // returns the error to throw. `verb` is "failed" or "timed out after N s".
  CommError fail(std::string_view op, std::string_view verb, const std::string& what) {
    std::string message = fmt::format("{}: {} {} on {}: {}", info.name, op, verb, info.here(), what);
    if (comm) {
      const char* last = ncclGetLastError(comm);
      if (last && *last && message.find(last) == std::string::npos) message += fmt::format(" (NCCL: {})", last);
      ncclResult_t r = ncclCommAbort(comm);
      if (r != ncclSuccess) spdlog::warn("{}: ncclCommAbort on {}: {}", info.name, info.here(), ncclGetErrorString(r));
      comm = nullptr;
    }
    if (first_failure.empty()) first_failure = message;
    return CommError(message);
  }

  void throw_if_broken(std::string_view op) const {
    if (!first_failure.empty())
      throw CommError(fmt::format("{}: {} on {}: the communicator is unusable after an earlier failure: {}", info.name,
                                  op, info.here(), first_failure));
  }

  void check_cuda(cudaError_t e, std::string_view call, std::string_view op) {
    if (e != cudaSuccess) throw fail(op, "failed", fmt::format("{}: {}", call, cuda_text(e)));
  }

  // A non-blocking communicator may return ncclInProgress before the op is enqueued (or init is done); it
  // is safe to touch the stream or call NCCL again only once its state leaves ncclInProgress.
  void check_nccl(ncclResult_t r, std::string_view call, std::string_view op, Clock::time_point deadline) {
    Backoff backoff;
    while (r == ncclInProgress && comm) {
      if (Clock::now() >= deadline)
        throw fail(op, "timed out after " + seconds_str(info.timeout),
                   fmt::format("{} still in progress (has every member of the group joined?)", call));
      backoff.pause();
      ncclResult_t state = ncclSuccess;
      ncclResult_t q = ncclCommGetAsyncError(comm, &state);
      if (q != ncclSuccess) throw fail(op, "failed", fmt::format("ncclCommGetAsyncError: {}", ncclGetErrorString(q)));
      r = state;
    }
    if (r != ncclSuccess) throw fail(op, "failed", fmt::format("{}: {}", call, ncclGetErrorString(r)));
  }

  // The comm stream waits for the work already queued on the compute stream (where the tensors were
  // produced), without making the compute stream wait for communication.
  void order_after_inputs(std::string_view op) {
    check_cuda(cudaEventRecord(inputs_ready, static_cast<cudaStream_t>(cuda::compute_stream())), "cudaEventRecord", op);
    check_cuda(cudaStreamWaitEvent(stream, inputs_ready, 0), "cudaStreamWaitEvent", op);
  }

  void record_done(OpRecord& rec) {
    check_cuda(cudaEventCreateWithFlags(&rec.done, cudaEventDisableTiming), "cudaEventCreateWithFlags", rec.op);
    check_cuda(cudaEventRecord(rec.done, stream), "cudaEventRecord", rec.op);
    rec.issued_at = Clock::now();
  }

  // Releases the ops known complete; the stream runs in order, so the first incomplete one stops the scan.
  void prune() {
    while (!in_flight.empty() && cudaEventQuery(in_flight.front()->done) == cudaSuccess) in_flight.pop_front();
  }

  // Issues one collective after any queued send/recv (posting order is the order on the stream).
  template <class Enqueue>
  std::shared_ptr<OpRecord> issue(std::string op, const std::vector<Tensor>& tensors, std::string_view call,
                                  Enqueue&& enqueue) {
    issue_queued();
    prune();
    auto rec = std::make_shared<OpRecord>();
    rec->op = std::move(op);
    order_after_inputs(rec->op);
    check_nccl(enqueue(comm, stream), call, rec->op, Clock::now() + info.timeout);
    record_done(*rec);
    mark_stream_use(tensors);
    in_flight.push_back(rec);
    return rec;
  }

  // The caching allocator must not hand these tensors' blocks out again before this stream is done with them.
  void mark_stream_use(const std::vector<Tensor>& tensors) {
    for (const Tensor& t : tensors)
      if (t.defined() && t.numel() > 0) cuda::record_stream(t.raw(), stream);
  }

  // The watchdog's check: a failure (timeout of the oldest op in flight, or an asynchronous NCCL error)
  // aborts the communicator; returns the failure's message, or "" when all is well.
  std::string watch(Clock::time_point now) {
    if (!comm || !first_failure.empty()) return "";
    prune();
    try {
      ncclResult_t state = ncclSuccess;
      ncclResult_t r = ncclCommGetAsyncError(comm, &state);
      if (r != ncclSuccess)
        throw fail("watchdog", "failed", fmt::format("ncclCommGetAsyncError: {}", ncclGetErrorString(r)));
      if (state != ncclSuccess && state != ncclInProgress)
        throw fail("watchdog", "failed", fmt::format("NCCL asynchronous error: {}", ncclGetErrorString(state)));
      if (!in_flight.empty() && now - in_flight.front()->issued_at > info.timeout)
        throw fail(in_flight.front()->op, "timed out after " + seconds_str(info.timeout),
                   "the op did not complete (a peer stopped, or the ranks posted different ops); the watchdog "
                   "aborted the communicator");
    } catch (const CommError& e) {
      return e.what();
    }
    return "";
  }

  // Issues the queued send/recv as one NCCL group, so that transfers in both directions progress together.
  void issue_queued() {
    if (queued.empty()) return;
    std::vector<std::string> names;
    for (const auto& rec : queued) names.push_back(rec->op);
    const std::string op = names.size() == 1 ? names[0] : fmt::format("send/recv batch [{}]", fmt::join(names, ", "));
    order_after_inputs(op);
    const auto deadline = Clock::now() + info.timeout;
    check_nccl(ncclGroupStart(), "ncclGroupStart", op, deadline);
    ncclResult_t first_error = ncclSuccess;
    std::string failed_call;
    for (const auto& rec : queued) {
      const size_t bytes = static_cast<size_t>(rec->buf.numel) * dtype_size(rec->buf.dtype);
      ncclResult_t r = rec->is_send ? ncclSend(rec->buf.ptr, bytes, ncclUint8, rec->peer, comm, stream)
                                    : ncclRecv(rec->buf.ptr, bytes, ncclUint8, rec->peer, comm, stream);
      if (r != ncclSuccess && r != ncclInProgress && first_error == ncclSuccess) {
        first_error = r;
        failed_call = fmt::format("{} ({})", rec->is_send ? "ncclSend" : "ncclRecv", rec->op);
      }
    }
    ncclResult_t end = ncclGroupEnd();  // always closes the group, even after a failed call inside it
    if (first_error != ncclSuccess)
      throw fail(op, "failed", fmt::format("{}: {}", failed_call, ncclGetErrorString(first_error)));
    check_nccl(end, "ncclGroupEnd", op, deadline);
    for (const auto& rec : queued) {
      record_done(*rec);
      in_flight.push_back(rec);
    }
    for (const auto& rec : queued) {
      mark_stream_use(rec->tensors);
      rec->tensors.clear();
    }
    queued.clear();
  }
};

// Watches every live group (see the file comment): every kPeriod, each group's oldest op in flight against
// its timeout and NCCL's asynchronous errors. One per process, started with the first group; never destroyed
// (its thread is detached, and groups of static objects may outlive main).
class Watchdog {
 public:
  static Watchdog& instance() {
    static Watchdog* w = new Watchdog();
    return *w;
  }
  void add(NcclGroup* g) {
    std::lock_guard lock(mu_);
    groups_.push_back(g);
    if (!started_) {
      std::thread([this] { run(); }).detach();
      started_ = true;
    }
  }
  // After remove() returns the watchdog no longer touches g (a check in progress holds mu_).
  void remove(NcclGroup* g) {
    std::lock_guard lock(mu_);
    std::erase(groups_, g);
  }

 private:
  static constexpr auto kPeriod = std::chrono::milliseconds(100);

  void run() {
    for (;;) {
      std::this_thread::sleep_for(kPeriod);
      std::lock_guard lock(mu_);
      const auto now = Clock::now();
      for (NcclGroup* g : groups_) {
        // Never block on a group while holding mu_: a thread creating a communicator holds its parent's
        // lock and then registers here. A group busy now is checked next round (the thread holding it
        // is bounded by its own deadline).
        std::unique_lock group_lock(g->mu, std::try_to_lock);
        if (!group_lock.owns_lock()) continue;
        std::string failure;
        {
          DeviceGuard device(g->info.device);
          if (device.status() == cudaSuccess) failure = g->watch(now);
        }
        group_lock.unlock();
        if (!failure.empty()) spdlog::error("{}", failure);
      }
    }
  }

  std::mutex mu_;
  std::vector<NcclGroup*> groups_;
  bool started_ = false;
};

NcclGroup::~NcclGroup() {
  Watchdog::instance().remove(this);
  DeviceGuard device(info.device);
  queued.clear();  // never issued: nothing to wait for
  if (comm) {
    // Finalize flushes the issued ops and waits for the group to quiesce, bounded by the timeout. An op still
    // running here was never waited on (unwinding after another error): abort rather than wait for peers.
    auto running = std::find_if(in_flight.begin(), in_flight.end(),
                                [](const auto& rec) { return cudaEventQuery(rec->done) != cudaSuccess; });
    ncclResult_t r = ncclInvalidUsage;
    if (running == in_flight.end()) {
      const auto deadline = Clock::now() + info.timeout;
      r = ncclCommFinalize(comm);
      Backoff backoff;
      while (r == ncclInProgress && Clock::now() < deadline) {
        backoff.pause();
        ncclResult_t q = ncclCommGetAsyncError(comm, &r);
        if (q != ncclSuccess) r = q;
      }
      if (r == ncclSuccess) r = ncclCommDestroy(comm);
      if (r != ncclSuccess)
        spdlog::warn("{}: closing the NCCL communicator on {}: ncclCommFinalize/ncclCommDestroy: {}; aborting it",
                     info.name, info.here(), ncclGetErrorString(r));
    } else {
      spdlog::warn("{}: destroying the NCCL communicator on {} while {} is still running: aborting it", info.name,
                   info.here(), (*running)->op);
    }
    if (r != ncclSuccess) {
      ncclResult_t a = ncclCommAbort(comm);
      if (a != ncclSuccess) spdlog::warn("{}: ncclCommAbort on {}: {}", info.name, info.here(), ncclGetErrorString(a));
    }
    comm = nullptr;
  }
  in_flight.clear();  // the communicator is gone, so no op touches these tensors any more
  if (scratch) cudaFree(scratch);
  if (inputs_ready) cudaEventDestroy(inputs_ready);
  if (stream) cudaStreamDestroy(stream);
}

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

ncclUniqueId fetch_unique_id(Store& store, const std::string& key, const GroupInfo& g) {
  Bytes bytes;
  try {
    bytes = store.get(key, g.timeout);
  } catch (const StoreError& e) {
    throw CommError(fmt::format("{}: rendezvous timed out after {} on {}: {} never published the NCCL id ('{}'): {}",
                                g.name, seconds_str(g.timeout), g.who(g.rank), g.who(0), key, e.what()));
  }
  ncclUniqueId id;
  if (bytes.size() != sizeof(id))
    throw CommError(fmt::format("{}: rendezvous on {}: the NCCL id under '{}' has {} bytes, expected {}", g.name,
                                g.who(g.rank), key, bytes.size(), sizeof(id)));
  std::memcpy(&id, bytes.data(), sizeof(id));
  return id;
}

// The stream, event and barrier scratch every group owns, created on its device.
void create_group_resources(NcclGroup& g, const char* op) {
  g.check_cuda(cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags", op);
  g.check_cuda(cudaEventCreateWithFlags(&g.inputs_ready, cudaEventDisableTiming), "cudaEventCreateWithFlags", op);
  g.check_cuda(cudaMalloc(reinterpret_cast<void**>(&g.scratch), sizeof(float)), "cudaMalloc", op);
  g.check_cuda(cudaMemset(g.scratch, 0, sizeof(float)), "cudaMemset", op);
}

// The NCCL communicator behind `comm`, looking through wrappers (a staged communicator around NCCL is what
// init_distributed hands out).
NcclCommunicator& nccl_of(Communicator& comm, std::string_view op) {
  auto* nccl = dynamic_cast<NcclCommunicator*>(&comm.backend());
  if (!nccl) throw CommError(fmt::format("{}: {} on raw device buffers needs an NCCL communicator", comm.name(), op));
  return *nccl;
}

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(std::shared_ptr<Store> store, const NcclOptions& opt) {
  GroupInfo info;
  info.name = opt.name.empty() ? fmt::format("nccl[{}]", fmt::join(opt.members, ",")) : opt.name;
  info.members = opt.members;
  info.device = opt.device;
  info.timeout = opt.timeout;
  const std::string& name = info.name;

  info.rank = rank_in_group(name, opt.members, opt.global_rank, opt.timeout, store.get());
  if (opt.device < 0) throw CommError(fmt::format("{}: CUDA device {} is negative", name, opt.device));
  const int rank = info.rank;
  const int size = static_cast<int>(opt.members.size());

  const int64_t instance = group_instance(*store, "nccl", name, opt.global_rank);
  const std::string id_key = fmt::format("nccl/{}/{}/id", name, instance);

  auto group = std::make_shared<NcclGroup>(std::move(info));
  NcclGroup& g = *group;
  ncclUniqueId id{};
  if (rank != 0) id = fetch_unique_id(*store, id_key, g.info);  // before touching the device

  std::lock_guard lock(g.mu);  // the group's helpers expect it held
  const char* op = "init";
  DeviceGuard device(g.info.device);
  g.check_cuda(device.status(), fmt::format("cudaSetDevice({})", g.info.device), op);
  create_group_resources(g, op);
  if (rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) throw g.fail(op, "failed", fmt::format("ncclGetUniqueId: {}", ncclGetErrorString(r)));
    try {
      const auto* p = reinterpret_cast<const uint8_t*>(&id);
      store->set(id_key, Bytes(p, p + sizeof(id)));
    } catch (const StoreError& e) {
      throw g.fail(op, "failed", fmt::format("publishing the NCCL id under '{}': {}", id_key, e.what()));
    }
  }

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // init and ops return at once, so a missing peer is a timeout, not a hang
  config.commName = g.info.name.c_str();
  ncclResult_t r = ncclCommInitRankConfig(&g.comm, size, id, rank, &config);
  g.check_nccl(r, "ncclCommInitRankConfig", op, Clock::now() + g.info.timeout);
  return std::make_unique<NcclCommunicator>(std::move(group));  // registers with the watchdog
}

std::unique_ptr<Communicator> split_nccl_communicator(Communicator& parent, const NcclOptions& opt) {
  auto& p = nccl_of(parent, "split");
  NcclGroup& pg = *p.group();
  const char* op = "split";
  std::lock_guard parent_lock(pg.mu);
  pg.throw_if_broken(op);
  DeviceGuard device(pg.info.device);
  pg.check_cuda(device.status(), fmt::format("cudaSetDevice({})", pg.info.device), op);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const auto deadline = Clock::now() + pg.info.timeout;

  // A non-blocking split may return before it is done: the parent (and the child, when there is one) report
  // ncclInProgress until then, and the next split or op must not use the parent before. Poll both.
  if (opt.members.empty()) {  // this rank joins no group of this split: it still takes part in the call
    ncclComm_t none = nullptr;
    ncclResult_t r = ncclCommSplit(pg.comm, NCCL_SPLIT_NOCOLOR, pg.info.rank, &none, &config);
    if (r != ncclSuccess && r != ncclInProgress)
      throw pg.fail(op, "failed", fmt::format("ncclCommSplit (no color): {}", ncclGetErrorString(r)));
    pg.check_nccl(ncclInProgress, "ncclCommSplit (no color), parent", op, deadline);
    return nullptr;
  }
  GroupInfo info;
  info.name = opt.name.empty() ? fmt::format("nccl[{}]", fmt::join(opt.members, ",")) : opt.name;
  info.members = opt.members;
  info.device = pg.info.device;
  info.timeout = opt.timeout;
  // rank_in_group wants a store only to check that one exists; a split needs none.
  static std::shared_ptr<Store> no_store = make_hash_store();
  info.rank = rank_in_group(info.name, opt.members, opt.global_rank, opt.timeout, no_store.get());
  auto group = std::make_shared<NcclGroup>(std::move(info));
  NcclGroup& g = *group;
  std::lock_guard lock(g.mu);
  create_group_resources(g, op);
  config.commName = g.info.name.c_str();
  // Color: the group's first global rank (unique per group of one split); key: the rank within the group.
  ncclResult_t r = ncclCommSplit(pg.comm, g.info.members.front(), g.info.rank, &g.comm, &config);
  if (r != ncclSuccess && r != ncclInProgress)
    throw g.fail(op, "failed", fmt::format("ncclCommSplit of {}: {}", pg.info.name, ncclGetErrorString(r)));
  if (!g.comm) throw g.fail(op, "failed", fmt::format("ncclCommSplit of {} returned no communicator", pg.info.name));
  g.check_nccl(ncclInProgress, "ncclCommSplit, child", op, deadline);
  pg.check_nccl(ncclInProgress, "ncclCommSplit, parent", op, deadline);
  return std::make_unique<NcclCommunicator>(std::move(group));
}

std::string nccl_version() {
  auto text = [](int code) {  // NCCL_VERSION_CODE since 2.9: major * 10000 + minor * 100 + patch
    return fmt::format("{}.{}.{}", code / 10000, code / 100 % 100, code % 100);
  };
  int loaded = 0;
  const std::string built = text(NCCL_VERSION_CODE);
  if (ncclGetVersion(&loaded) != ncclSuccess) return fmt::format("unknown (built with {})", built);
  return fmt::format("{} (built with {})", text(loaded), built);
}

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
