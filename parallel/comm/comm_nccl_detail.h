// comm_nccl_detail.h: the NCCL group state (NcclGroup: communicator, stream, ops in flight) and the watchdog.
// Shared by comm_nccl.cpp (the communicator and its ops) and comm_nccl_group.cpp (a group's setup and teardown).
// Not an interface: parallel/comm/communicator.h is.
#pragma once
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
#include "parallel/comm/communicator.h"
#include "parallel/comm/group.h"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "megatrain needs NCCL 2.18 or newer (non-blocking communicators, ncclCommFinalize, ncclCommSplit)"
#endif

namespace mt::nccl_detail {

using Clock = std::chrono::steady_clock;
using nccl_raw::DeviceBuffer;

inline std::string seconds_str(Millis t) { return fmt::format("{:g} s", static_cast<double>(t.count()) / 1000.0); }
inline std::string cuda_text(cudaError_t e) {
  return fmt::format("{} ({})", cudaGetErrorName(e), cudaGetErrorString(e));
}

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

// Waits (bounded by g.timeout) for rank 0 to publish the group's NCCL id under `key`.
ncclUniqueId fetch_unique_id(Store& store, const std::string& key, const GroupInfo& g);

// The stream, event and barrier scratch every group owns, created on its device.
void create_group_resources(NcclGroup& g, const char* op);

// The communicator over a group whose NCCL communicator is ready, put under the watchdog's eye (comm_nccl.cpp).
std::unique_ptr<Communicator> communicator_of(std::shared_ptr<NcclGroup> group);
// The group of the NCCL communicator behind `comm`, looking through wrappers; `op` names the caller in the error
// when there is none (comm_nccl.cpp).
NcclGroup& group_of(Communicator& comm, std::string_view op);

}  // namespace mt::nccl_detail
